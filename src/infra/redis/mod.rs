//! Building the Redis client every Redis handle shares (the deadpool pool and the API's
//! multiplexed connections), plain or over TLS, and the one connection made at startup to
//! find a TLS misconfiguration before any request does.
//!
//! `redis://` is plain TCP. `rediss://` is TLS through rustls, verifying the server against
//! `SUMMARYD_REDIS_CA_FILE` (a private CA, as managed Redis offerings use) or the system's
//! trust store; `SUMMARYD_REDIS_CLIENT_CERT_FILE` + `_KEY_FILE` add a client certificate for
//! servers that require mutual TLS.

//!
//! `redis+cluster://host:port[,host:port...]` (`rediss+cluster://` with TLS), or a plain URL
//! with `SUMMARYD_REDIS_CLUSTER`, is a Redis Cluster: the same TLS material applies to every
//! node the cluster reports.

mod cluster_url;
pub mod conn;
pub(crate) mod durability;
pub mod routed;
pub mod script_call;

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, TlsCertificates};
use secrecy::ExposeSecret;

pub use cluster_url::ClusterUrlError;
pub use conn::{ClusterManager, Conn, RedisPool};

use crate::config::{RedisTlsSettings, Settings};
use crate::infra::tls::{self, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    /// The redis crate's parse errors name the problem, never the URL (so never its password).
    #[error("SUMMARYD_REDIS_URL is invalid: {0}")]
    Url(#[source] redis::RedisError),
    #[error(transparent)]
    ClusterUrl(#[from] ClusterUrlError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(
        "{0} is set but SUMMARYD_REDIS_URL does not start with rediss://, so it would be ignored"
    )]
    TlsWithoutRediss(&'static str),
    #[error(
        "SUMMARYD_REDIS_CLIENT_CERT_FILE and SUMMARYD_REDIS_CLIENT_KEY_FILE must be set together"
    )]
    HalfClientCert,
    /// A TLS failure does not heal by retrying, so startup stops and says where it went.
    /// `reason` is the rustls error found inside `source`, whose chain skips it.
    #[error("TLS to Redis at {addr} failed: {reason}")]
    Handshake {
        addr: String,
        reason: String,
        #[source]
        source: redis::RedisError,
    },
}

/// What every Redis handle of a process is built from: one server's client, or a cluster's
/// seed nodes and TLS material.
#[derive(Clone)]
pub enum RedisClient {
    Single(redis::Client),
    Cluster(ClusterSeed),
}

/// A cluster's seed nodes (credentials included) and the TLS material for every node.
#[derive(Clone)]
pub struct ClusterSeed {
    nodes: Vec<ConnectionInfo>,
    certs: Option<TlsCertificates>,
}

impl ClusterSeed {
    /// A cluster client whose node connections use these timeouts. The response timeout is
    /// per node and also bounds a command's redirections and retries.
    pub fn client(
        &self,
        connect: Duration,
        response: Duration,
    ) -> redis::RedisResult<ClusterClient> {
        let mut builder = ClusterClientBuilder::new(self.nodes.clone())
            .connection_timeout(connect)
            .response_timeout(response);
        if let Some(certs) = &self.certs {
            builder = builder.certs(certs.clone());
        }
        builder.build()
    }
}

impl ClusterSeed {
    /// A single-server client for the first seed node, with the same TLS material.
    fn first_seed(&self) -> redis::RedisResult<redis::Client> {
        let Some(node) = self.nodes.first().cloned() else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no seed node",
            )));
        };
        match &self.certs {
            Some(certs) => redis::Client::build_with_tls(node, certs.clone()),
            None => redis::Client::open(node),
        }
    }
}

impl RedisClient {
    /// `host:port` of the server or of each seed node: what an error may say about where it
    /// connected (never the credentials).
    pub fn address(&self) -> String {
        match self {
            RedisClient::Single(client) => address(client),
            RedisClient::Cluster(seed) => seed
                .nodes
                .iter()
                .map(|n| n.addr().to_string())
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// The client for `settings.redis_url` (and `settings.redis.cluster`), with TLS material
/// attached for `rediss://`.
pub(crate) fn client(settings: &Settings) -> Result<RedisClient, RedisSetupError> {
    let url = settings.redis_url.expose_secret();
    match cluster_url::target(url, settings.redis.cluster)? {
        cluster_url::Target::Single => single_client(settings).map(RedisClient::Single),
        cluster_url::Target::Cluster(urls) => {
            let nodes = urls
                .iter()
                .map(|u| u.as_str().into_connection_info())
                .collect::<Result<Vec<_>, _>>()
                .map_err(RedisSetupError::Url)?;
            let is_tls = nodes
                .first()
                .is_some_and(|n| matches!(n.addr(), ConnectionAddr::TcpTls { .. }));
            let seed = ClusterSeed {
                certs: tls_certificates(&settings.redis, is_tls)?,
                nodes,
            };
            // Building checks what can be checked without connecting (the nodes agree on
            // credentials and TLS), so a mismatch stops startup here.
            seed.client(PROBE_TIMEOUT, PROBE_TIMEOUT)
                .map_err(RedisSetupError::Url)?;
            Ok(RedisClient::Cluster(seed))
        }
    }
}

/// Whether the URL asks for TLS, in any of its forms (`rediss://`, `rediss+cluster://`).
pub(crate) fn url_is_tls(url: &str) -> bool {
    let url = url.trim_start();
    ["rediss://", "rediss+cluster://"].iter().any(|scheme| {
        url.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    })
}

fn single_client(settings: &Settings) -> Result<redis::Client, RedisSetupError> {
    let plain =
        redis::Client::open(settings.redis_url.expose_secret()).map_err(RedisSetupError::Url)?;
    let is_tls = matches!(
        plain.get_connection_info().addr(),
        ConnectionAddr::TcpTls { .. }
    );
    let certificates = tls_certificates(&settings.redis, is_tls)?;
    match certificates {
        Some(certs) => redis::Client::build_with_tls(plain.get_connection_info().clone(), certs)
            .map_err(RedisSetupError::Url),
        None => Ok(plain),
    }
}

/// Reads and checks the files the settings name; `None` when the URL is plain (and then no
/// file may be named: a CA that is silently unused would hide a cleartext connection).
pub(crate) fn tls_certificates(
    settings: &RedisTlsSettings,
    is_tls: bool,
) -> Result<Option<TlsCertificates>, RedisSetupError> {
    if !is_tls {
        for (name, set) in [
            ("SUMMARYD_REDIS_CA_FILE", settings.ca_file.is_some()),
            (
                "SUMMARYD_REDIS_CLIENT_CERT_FILE",
                settings.client_cert_file.is_some(),
            ),
            (
                "SUMMARYD_REDIS_CLIENT_KEY_FILE",
                settings.client_key_file.is_some(),
            ),
        ] {
            if set {
                return Err(RedisSetupError::TlsWithoutRediss(name));
            }
        }
        return Ok(None);
    }
    let root_cert = match &settings.ca_file {
        Some(path) => {
            // Parsed here so a wrong file is reported with the setting's name.
            tls::certificates("SUMMARYD_REDIS_CA_FILE", path)?;
            Some(tls::read_pem("SUMMARYD_REDIS_CA_FILE", path)?)
        }
        None => None,
    };
    let client_tls = match (&settings.client_cert_file, &settings.client_key_file) {
        (Some(cert), Some(key)) => {
            tls::certificates("SUMMARYD_REDIS_CLIENT_CERT_FILE", cert)?;
            Some(ClientTlsConfig {
                client_cert: tls::read_pem("SUMMARYD_REDIS_CLIENT_CERT_FILE", cert)?,
                client_key: tls::check_private_key("SUMMARYD_REDIS_CLIENT_KEY_FILE", key)?,
            })
        }
        (None, None) => None,
        _ => return Err(RedisSetupError::HalfClientCert),
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// `host:port` of the client's server: what an error may say about where it connected.
pub(crate) fn address(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// How long the startup probe waits; a Redis that is merely down is not a startup failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection attempt at startup. A TLS failure (unknown CA, wrong host name, a client
/// certificate the server refuses) is returned as an error, because no retry will fix it;
/// a Redis that is down or slow is only logged, since the roles cope with that already.
/// Returns the connection when one was made, for the durability check. A cluster connection
/// connects to every node in the slot map, so TLS is checked against each of them.
pub(crate) async fn probe(client: &RedisClient) -> Result<Option<Probed>, RedisSetupError> {
    match client {
        RedisClient::Single(single) => Ok(probe_single(single).await?.map(Probed::Single)),
        RedisClient::Cluster(seed) => {
            // The cluster client reports a failed handshake as text only, so TLS is first
            // checked on a direct connection to the first seed, where the error stays typed.
            let first = seed.first_seed().map_err(RedisSetupError::Url)?;
            if probe_single(&first).await?.is_none() {
                return Ok(None);
            }
            let connected = match seed.client(PROBE_TIMEOUT, PROBE_TIMEOUT) {
                Ok(cluster) => cluster.get_async_connection().await,
                Err(e) => Err(e),
            };
            match connected {
                Ok(conn) => Ok(Some(Probed::Cluster(conn))),
                Err(e) => {
                    unreachable_at_startup(&client.address(), &e);
                    Ok(None)
                }
            }
        }
    }
}

async fn probe_single(
    client: &redis::Client,
) -> Result<Option<redis::aio::MultiplexedConnection>, RedisSetupError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(PROBE_TIMEOUT))
        .set_response_timeout(Some(PROBE_TIMEOUT));
    match client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    {
        Ok(conn) => Ok(Some(conn)),
        Err(e) => match tls_failure(&e) {
            Some(reason) => Err(RedisSetupError::Handshake {
                addr: address(client),
                reason,
                source: e,
            }),
            None => {
                unreachable_at_startup(&address(client), &e);
                Ok(None)
            }
        },
    }
}

fn unreachable_at_startup(addr: &str, e: &redis::RedisError) {
    tracing::warn!(
        redis = %addr,
        error = %e,
        "Redis is not reachable at startup; carrying on (readiness reports it)"
    );
}

/// The connection the startup probe made.
pub(crate) enum Probed {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// The rustls error inside `err`, described. The redis crate keeps the I/O error behind an
/// `Arc<dyn Error>` whose `source()` skips the rustls error, so the chain is unwrapped by hand.
fn tls_failure(err: &redis::RedisError) -> Option<String> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        let e = match e.downcast_ref::<Shared>() {
            Some(shared) => shared.as_ref() as &(dyn std::error::Error + 'static),
            None => e,
        };
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        source = e.source();
    }
    None
}

/// The startup step for every role that uses Redis: probe the connection (a TLS failure
/// stops startup) and, for roles that accept or take jobs, report the durability settings.
pub(crate) async fn check_at_startup(
    settings: &Settings,
    check_durability: bool,
) -> Result<(), RedisSetupError> {
    let client = client(settings)?;
    match probe(&client).await? {
        Some(Probed::Single(mut conn)) if check_durability => durability::report(&mut conn).await,
        Some(Probed::Cluster(mut conn)) if check_durability => {
            durability::report_masters(&mut conn).await;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn tls_files_need_a_rediss_url_and_come_as_a_cert_key_pair() {
        let ca = RedisTlsSettings {
            ca_file: Some(PathBuf::from("/etc/ca.pem")),
            ..Default::default()
        };
        let err = tls_certificates(&ca, false).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("SUMMARYD_REDIS_CA_FILE") && e.contains("rediss://")),
            "{err:?}"
        );
        let half = RedisTlsSettings {
            client_cert_file: Some(PathBuf::from("/etc/client.pem")),
            ..Default::default()
        };
        assert!(matches!(
            tls_certificates(&half, true),
            Err(RedisSetupError::HalfClientCert)
        ));
        let missing = RedisTlsSettings {
            ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..Default::default()
        };
        let err = tls_certificates(&missing, true)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("SUMMARYD_REDIS_CA_FILE: cannot read")),
            "{err:?}"
        );
        assert!(matches!(
            tls_certificates(&RedisTlsSettings::default(), false),
            Ok(None)
        ));
    }

    fn with_url(url: &str, cluster: bool) -> Settings {
        let mut settings = Settings {
            redis_url: url.into(),
            ..Settings::default()
        };
        settings.redis.cluster = cluster;
        settings
    }

    #[test]
    fn cluster_urls_and_the_cluster_setting_select_a_cluster_client() {
        let single = client(&with_url("redis://a:1", false));
        assert!(matches!(single, Ok(RedisClient::Single(_))));
        for (url, flag, nodes) in [
            ("redis+cluster://u:pw@a:1,b:2", false, "a:1,b:2"),
            ("redis://a:1", true, "a:1"),
            ("rediss+cluster://b:2", false, "b:2"),
        ] {
            match client(&with_url(url, flag)) {
                Ok(c @ RedisClient::Cluster(_)) => assert_eq!(c.address(), nodes),
                Ok(RedisClient::Single(_)) => panic!("{url}: single"),
                Err(e) => panic!("{url}: {e}"),
            }
        }
        assert!(url_is_tls(" rediss+cluster://b:2") && url_is_tls("rediss://b:2"));
        assert!(!url_is_tls("redis+cluster://b:2"));

        // TLS files with a plain cluster URL would be ignored: refused as for one server.
        let mut plain = with_url("redis+cluster://a:1", false);
        plain.redis.ca_file = Some(PathBuf::from("/etc/ca.pem"));
        assert!(matches!(
            client(&plain),
            Err(RedisSetupError::TlsWithoutRediss("SUMMARYD_REDIS_CA_FILE"))
        ));
    }

    #[test]
    fn a_bad_cluster_url_is_reported_without_the_password() {
        for url in [
            "redis+cluster://user:hunter2@a:1,b:notaport",
            "redis+cluster://user:hunter2@a:1,,b:2",
            "redis+cluster://user:hunter2@",
        ] {
            let err = client(&with_url(url, false))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("SUMMARYD_REDIS_URL"), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn a_bad_url_is_reported_without_the_password() {
        let settings = Settings {
            redis_url: "redis://user:hunter2@host:notaport".into(),
            ..Settings::default()
        };
        let err = client(&settings)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("SUMMARYD_REDIS_URL"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
