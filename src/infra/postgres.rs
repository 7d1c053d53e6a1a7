//! How summaryd reaches Postgres: the pool, the database URL with libpq's `sslmode` and `sslrootcert`
//! honoured (tokio-postgres knows only disable/prefer/require and no root certificate), and
//! the rustls connector every connection uses: the pool's, migrations', and `migrate`'s
//! create-database step.
//!
//! `sslmode`, with libpq's meaning:
//! - `disable`: cleartext.
//! - `prefer` (libpq's default): TLS when the server offers it, cleartext when it refuses
//!   TLS (never after a failed handshake: that would let an attacker force cleartext). A
//!   cleartext fallback is logged as a warning when migrations run.
//! - `require`: TLS or no connection; the certificate is not checked unless a CA is given
//!   (then like `verify-ca`, as libpq does with a root certificate present).
//! - `verify-ca`: TLS, the chain must lead to the CA; the host name is not compared.
//! - `verify-full`: chain and host name.
//!
//! With no `sslmode` in the URL, a given CA (`SUMMARYD_DATABASE_CA_FILE` or `sslrootcert=`)
//! means `verify-full`: a CA is given only to authenticate the server, and libpq's `prefer`
//! would drop to cleartext without a word. Without a CA the default stays `prefer`, so a
//! local Postgres without TLS keeps working. The CA is the URL's `sslrootcert`, else the
//! setting; without either, `verify-*` trust webpki's bundled public roots (managed
//! databases with publicly issued certificates need no file).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig};
use percent_encoding::percent_decode_str;
use tokio_postgres::config::{Host, SslMode as PgSslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use deadpool_postgres::{Pool, RecyclingMethod, Runtime};

use crate::infra::tls::{self, TlsError, Verification};

/// Connecting must fail fast when Postgres is down so callers can answer 503 or retry.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A request waits this long for a free connection before it counts as unavailable.
const POOL_WAIT: Duration = Duration::from_secs(5);

/// Why no connection to Postgres could be set up or made.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// Text, not the parser's error: that may quote part of the URL, password included.
    #[error("SUMMARYD_DATABASE_URL is invalid: {0}")]
    InvalidUrl(String),
    #[error("could not build the Postgres pool: {0}")]
    Build(#[source] deadpool_postgres::BuildError),
    /// A CA file that cannot be read or parsed; the message names the setting.
    #[error(transparent)]
    TlsConfig(#[from] TlsError),
    /// `reason` is the TLS error found inside `source` (a rustls error the driver's own
    /// chain does not lead to directly).
    #[error("TLS to Postgres at {addr} failed (sslmode={mode}): {reason}")]
    Tls {
        addr: String,
        mode: &'static str,
        reason: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// Postgres did not accept the connection: down, starting, refusing the credentials.
    #[error("Postgres error: {0}")]
    Connect(#[source] tokio_postgres::Error),
}

impl PostgresError {
    /// Whether the server could not be reached or would not talk to us, as opposed to a
    /// setting that is wrong and stays wrong until someone edits it.
    pub(crate) fn is_unavailable(&self) -> bool {
        match self {
            Self::Tls { .. } | Self::Connect(_) => true,
            Self::InvalidUrl(_) | Self::Build(_) | Self::TlsConfig(_) => false,
        }
    }
}

/// Build the pool; it connects lazily, so this succeeds while Postgres is down.
pub fn pool(url: &str, ca_file: Option<&Path>, max_size: usize) -> Result<Pool, PostgresError> {
    let target = PgTarget::parse(url, ca_file)?;
    // Verified recycling costs a round trip per checkout; a closed connection is detected
    // by `is_closed` and a broken one surfaces as a query error that callers handle anyway.
    let manager = target.manager(ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    });
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(PostgresError::Build)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, PostgresError> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            // libpq's `allow` prefers cleartext; nothing here should.
            other => {
                return Err(PostgresError::InvalidUrl(format!(
                    "sslmode={other} is not supported; use disable, prefer, require, verify-ca or verify-full"
                )));
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// A parsed database URL and the TLS connector its `sslmode` asks for.
#[derive(Clone)]
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    pub mode: SslMode,
    tls: MakeRustlsConnect,
}

impl PgTarget {
    /// `ca_file` is `SUMMARYD_DATABASE_CA_FILE`; the URL's `sslrootcert` wins over it.
    pub fn parse(url: &str, ca_file: Option<&Path>) -> Result<Self, PostgresError> {
        let (rest, sslmode, sslrootcert) = take_tls_params(url);
        let mut config = tokio_postgres::Config::from_str(&rest)
            .map_err(|e| PostgresError::InvalidUrl(e.to_string()))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("summaryd");
        }
        let (ca, ca_setting): (Option<PathBuf>, &'static str) = match sslrootcert.as_deref() {
            // libpq's word for "the system's roots": the bundled public roots here.
            Some("system") => (None, "sslrootcert"),
            Some(path) => (Some(PathBuf::from(path)), "sslrootcert"),
            None => (ca_file.map(Path::to_owned), "SUMMARYD_DATABASE_CA_FILE"),
        };
        let mode = effective_mode(sslmode.as_deref(), ca.is_some() || sslrootcert.is_some())?;
        let verification = match mode {
            SslMode::VerifyFull => Verification::Full,
            SslMode::VerifyCa => Verification::Chain,
            SslMode::Prefer | SslMode::Require if ca.is_some() => Verification::Chain,
            SslMode::Disable | SslMode::Prefer | SslMode::Require => Verification::None,
        };
        config.ssl_mode(match mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        });
        let roots = match mode {
            // Never used for a cleartext connection; no file is read for it.
            SslMode::Disable => rustls::RootCertStore::empty(),
            _ => tls::root_store(ca_setting, ca.as_deref())?,
        };
        let client = tls::client_config(verification, roots)?;
        Ok(Self {
            config,
            mode,
            tls: MakeRustlsConnect::new(client),
        })
    }

    /// The same server and settings, another database (for `CREATE DATABASE`).
    pub(crate) fn with_dbname(&self, dbname: &str) -> Self {
        let mut other = self.clone();
        other.config.dbname(dbname);
        other
    }

    /// A deadpool manager connecting with this target's TLS.
    pub(crate) fn manager(&self, config: ManagerConfig) -> Manager {
        Manager::from_config(self.config.clone(), self.tls.clone(), config)
    }

    /// One connection, its driver task spawned; abort the handle when done with the client.
    pub async fn connect(
        &self,
    ) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), PostgresError> {
        let (client, connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.classify(e))?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((client, task))
    }

    /// `host:port` for messages (never the URL: it may carry the password).
    pub(crate) fn address(&self) -> String {
        let host = match self.config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        format!("{host}:{port}")
    }

    /// TLS failures become [`PostgresError::Tls`]: they name the server and the mode, and are not
    /// retried (a certificate does not fix itself), unlike a Postgres that is still starting.
    pub(crate) fn classify(&self, e: tokio_postgres::Error) -> PostgresError {
        match tls_reason(&e) {
            Some(reason) => PostgresError::Tls {
                addr: self.address(),
                mode: self.mode.as_str(),
                reason,
                source: e,
            },
            None => PostgresError::Connect(e),
        }
    }

    /// With `prefer`, say so when the server answered in cleartext (libpq stays silent).
    pub(crate) async fn warn_if_cleartext(&self, client: &tokio_postgres::Client) {
        if self.mode != SslMode::Prefer {
            return;
        }
        let ssl: Result<Option<tokio_postgres::Row>, _> = client
            .query_opt(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await;
        if let Ok(Some(row)) = ssl
            && !row.get::<_, bool>(0)
        {
            tracing::warn!(
                postgres = %self.address(),
                "Postgres refused TLS and sslmode=prefer fell back to cleartext: passwords and \
                 job data cross the network unencrypted; set sslmode=verify-full (or disable, \
                 to say cleartext is intended)"
            );
        }
    }
}

/// The `sslmode` a URL gets: its own, else `verify-full` when a CA is named (a CA exists
/// only to authenticate the server), else libpq's `prefer`.
fn effective_mode(sslmode: Option<&str>, has_ca: bool) -> Result<SslMode, PostgresError> {
    match sslmode {
        Some(value) => SslMode::parse(value),
        None if has_ca => Ok(SslMode::VerifyFull),
        None => Ok(SslMode::Prefer),
    }
}

/// What a database URL asks of the connection, read without touching a file or a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTransport {
    pub mode: SslMode,
    /// A CA is named (`sslrootcert=` or `SUMMARYD_DATABASE_CA_FILE`): `require` then checks
    /// the chain, as libpq does.
    pub has_ca: bool,
    /// The hosts (or `hostaddr`s, which are what is dialled when given) outside this
    /// machine; a Unix socket is on it.
    pub remote_hosts: Vec<String>,
}

impl PgTransport {
    pub fn parse(url: &str, ca_file: Option<&Path>) -> Result<Self, PostgresError> {
        let (rest, sslmode, sslrootcert) = take_tls_params(url);
        let config = tokio_postgres::Config::from_str(&rest)
            .map_err(|e| PostgresError::InvalidUrl(e.to_string()))?;
        let has_ca = sslrootcert.is_some() || ca_file.is_some();
        let mode = effective_mode(sslmode.as_deref(), has_ca)?;
        let remote_hosts = if config.get_hostaddrs().is_empty() {
            config
                .get_hosts()
                .iter()
                .filter_map(|host| match host {
                    Host::Tcp(name) if !crate::infra::is_loopback_host(name) => Some(name.clone()),
                    _ => None,
                })
                .collect()
        } else {
            config
                .get_hostaddrs()
                .iter()
                .filter(|ip| !ip.to_canonical().is_loopback())
                .map(ToString::to_string)
                .collect()
        };
        Ok(Self {
            mode,
            has_ca,
            remote_hosts,
        })
    }

    /// Why this connection may be read or impersonated on the network, if it can be.
    pub fn risk(&self) -> Option<&'static str> {
        match self.mode {
            SslMode::Disable => Some("sslmode=disable sends passwords and job data in cleartext"),
            SslMode::Prefer => Some(
                "sslmode=prefer (the default without a CA) checks no certificate and falls \
                 back to cleartext when the server, or anyone on the path, declines TLS",
            ),
            SslMode::Require if !self.has_ca => Some(
                "sslmode=require encrypts but checks no certificate, so anyone on the path \
                 can impersonate the server and read the password",
            ),
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => None,
        }
    }
}

/// The TLS part of a connection error, if it is one: the rustls error when there is one,
/// else tokio-postgres's own words (e.g. "server does not support TLS").
fn tls_reason(e: &tokio_postgres::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        source = s.source();
    }
    let shown = e.to_string();
    shown
        .starts_with("error performing TLS handshake")
        .then_some(shown)
}

/// Split `sslmode` and `sslrootcert` off a URL (`postgres://…?sslmode=…`) or a libpq
/// key/value string (`host=… sslmode=…`), returning what tokio-postgres should parse.
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut sslmode, mut sslrootcert) = (None, None);
    let mut take = |key: &str, value: Cow<'_, str>| match key {
        "sslmode" => {
            sslmode = Some(value.into_owned());
            true
        }
        "sslrootcert" => {
            sslrootcert = Some(value.into_owned());
            true
        }
        _ => false,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        !take(k, percent_decode_str(v).decode_utf8_lossy())
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        url.split_whitespace()
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k, Cow::Borrowed(v.trim_matches('\'')))
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    (rest, sslmode, sslrootcert)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_params_are_taken_from_urls_and_key_value_strings() {
        let (rest, mode, root) = take_tls_params(
            "postgres://u:p@db:5432/x?application_name=a&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@db:5432/x?application_name=a");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
        let (rest, mode, root) = take_tls_params("host=db sslmode=require dbname=x");
        assert_eq!(rest, "host=db dbname=x");
        assert_eq!(mode.as_deref(), Some("require"));
        assert_eq!(root, None);
        let (rest, mode, _) = take_tls_params("postgres://db/x?sslmode=disable");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("postgres://db/x", Some("disable"))
        );
    }

    #[test]
    fn the_default_is_prefer_without_a_ca_and_verify_full_with_one() {
        let t = PgTarget::parse("postgres://db/x", None).unwrap();
        assert_eq!(t.mode, SslMode::Prefer);
        assert_eq!(t.config.get_ssl_mode(), PgSslMode::Prefer);
        let t = PgTarget::parse("postgres://db/x?sslrootcert=system", None).unwrap();
        assert_eq!(t.mode, SslMode::VerifyFull);
        assert_eq!(t.config.get_ssl_mode(), PgSslMode::Require);
        let t = PgTarget::parse("postgres://db/x?sslmode=verify-ca", None).unwrap();
        assert_eq!(t.config.get_ssl_mode(), PgSslMode::Require);
    }

    #[test]
    fn unsupported_modes_and_missing_ca_files_name_the_problem() {
        let e = PgTarget::parse("postgres://db/x?sslmode=allow", None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("sslmode=allow"), "{e}");
        let e = PgTarget::parse("postgres://db/x", Some(Path::new("/nonexistent/ca.pem")))
            .err()
            .unwrap();
        assert!(e.to_string().contains("SUMMARYD_DATABASE_CA_FILE"), "{e}");
    }

    #[test]
    fn the_address_never_carries_the_password() {
        let t = PgTarget::parse("postgres://u:hunter2@db.internal:6432/x", None).unwrap();
        assert_eq!(t.address(), "db.internal:6432");
    }
}
