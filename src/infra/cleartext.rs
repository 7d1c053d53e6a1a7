//! Startup warnings for connections whose credentials or data could be read on the network:
//! a database URL whose `sslmode` checks no certificate or allows cleartext, and a plain
//! `redis://` URL carrying a password to another host. They are warnings, not refusals: a
//! private network or a service mesh may already encrypt the path, which summaryd cannot
//! see. SMTP is refused instead (`config::MailSettings`), because there the password is
//! sent verbatim (AUTH PLAIN) rather than as a challenge response.
//!
//! Connections to this machine are never warned about: loopback traffic and Unix sockets do
//! not leave the host, and the default local development setup (`postgres://…@127.0.0.1`
//! with libpq's `prefer`, `redis://127.0.0.1`) must not greet every developer with warnings.

use secrecy::ExposeSecret;
use std::fmt;

use crate::config::Settings;
use crate::infra::is_loopback_host;
use crate::infra::postgres::PgTransport;

/// One connection setting that exposes credentials or data, and what to use instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleartextWarning {
    /// The env name of the setting.
    pub setting: &'static str,
    /// The host it reaches (never the URL, which may carry the password).
    pub host: String,
    pub risk: &'static str,
    pub instead: &'static str,
}

impl fmt::Display for CleartextWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reaches {}: {}; {}",
            self.setting, self.host, self.risk, self.instead
        )
    }
}

/// `SUMMARYD_DATABASE_URL`: any TCP host off this machine with `sslmode` `disable`,
/// `prefer` (also the default without a CA) or `require` without a CA. A URL that does not
/// parse gets no warning: the pool reports it as the configuration error it is.
pub fn postgres_warning(url: &str, ca_file: Option<&std::path::Path>) -> Option<CleartextWarning> {
    let transport = PgTransport::parse(url, ca_file).ok()?;
    let risk = transport.risk()?;
    Some(CleartextWarning {
        setting: "SUMMARYD_DATABASE_URL",
        host: transport.remote_hosts.first()?.clone(),
        risk,
        instead: "use sslmode=verify-full (with SUMMARYD_DATABASE_CA_FILE or sslrootcert= \
                  for a private CA)",
    })
}

/// `SUMMARYD_REDIS_URL`: `redis://` (no TLS) with a password to a host off this machine.
/// The password goes out verbatim in AUTH, and every job's text after it.
pub fn redis_warning(url: &str) -> Option<CleartextWarning> {
    let parsed = reqwest::Url::parse(url.trim()).ok()?;
    if !matches!(parsed.scheme(), "redis" | "valkey") || parsed.password().is_none() {
        return None;
    }
    let host = parsed.host_str()?;
    if is_loopback_host(host) {
        return None;
    }
    Some(CleartextWarning {
        setting: "SUMMARYD_REDIS_URL",
        host: host.to_owned(),
        risk: "redis:// sends the password and every job's text in cleartext",
        instead: "use rediss:// (with SUMMARYD_REDIS_CA_FILE for a private CA)",
    })
}

/// The exposed connections this process will open; `uses_redis` is false for processes
/// that never connect to Redis (the relay, `migrate`).
pub fn warnings(settings: &Settings, uses_redis: bool) -> Vec<CleartextWarning> {
    let postgres = postgres_warning(
        settings.database_url.expose_secret(),
        settings.database.ca_file.as_deref(),
    );
    let redis = uses_redis
        .then(|| redis_warning(settings.redis_url.expose_secret()))
        .flatten();
    [postgres, redis].into_iter().flatten().collect()
}

/// Logs [`warnings`], one line each, before anything connects.
pub fn warn_at_startup(settings: &Settings, uses_redis: bool) {
    for warning in warnings(settings, uses_redis) {
        tracing::warn!(
            setting = %warning.setting,
            host = %warning.host,
            "credentials or data may cross the network readably: {warning}"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn loopback_hosts_are_this_machine() {
        for host in [
            "localhost",
            "LOCALHOST.",
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        assert!(is_loopback_host("::ffff:127.0.0.1"));
        for host in [
            "db.internal",
            "10.0.0.1",
            "0.0.0.0",
            "[2001:db8::1]",
            "localhost.evil",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn remote_postgres_without_a_checked_certificate_is_warned_about() {
        for (url, mode) in [
            (
                "postgres://u:pw@db.internal/x?sslmode=disable",
                "sslmode=disable",
            ),
            (
                "postgres://u:pw@db.internal/x?sslmode=prefer",
                "sslmode=prefer",
            ),
            ("postgres://u:pw@db.internal/x", "sslmode=prefer"),
            (
                "postgres://u:pw@10.0.0.5:6432/x?sslmode=require",
                "sslmode=require",
            ),
            (
                "host=db.internal user=u password=pw sslmode=require",
                "sslmode=require",
            ),
            ("postgres://u:pw@127.0.0.1,db.internal/x", "sslmode=prefer"),
        ] {
            let w = postgres_warning(url, None).unwrap_or_else(|| panic!("{url}"));
            assert_eq!(w.setting, "SUMMARYD_DATABASE_URL");
            let shown = w.to_string();
            assert!(
                shown.contains(mode) && shown.contains("verify-full") && !shown.contains("pw"),
                "{url}: {shown}"
            );
        }
        let w = postgres_warning("postgres://u:pw@127.0.0.1,db.internal/x", None).unwrap();
        assert_eq!(w.host, "db.internal");
        // A prefer connection may still fall back to cleartext with a CA.
        let ca = Some(Path::new("/etc/ca.pem"));
        assert!(postgres_warning("postgres://db.internal/x?sslmode=prefer", ca).is_some());
    }

    #[test]
    fn checked_or_local_postgres_is_not_warned_about() {
        let ca = Some(Path::new("/etc/ca.pem"));
        for (url, ca) in [
            ("postgres://u:pw@db.internal/x?sslmode=verify-full", None),
            ("postgres://u:pw@db.internal/x?sslmode=verify-ca", None),
            // A CA makes require check the chain, and no sslmode mean verify-full.
            ("postgres://u:pw@db.internal/x?sslmode=require", ca),
            ("postgres://u:pw@db.internal/x", ca),
            (
                "postgres://u:pw@db.internal/x?sslrootcert=%2Fetc%2Fca.pem",
                None,
            ),
            // The development default and other local connections, whatever the mode.
            ("postgres://postgres@127.0.0.1:5432/summaryd", None),
            ("postgres://u:pw@localhost/x?sslmode=disable", None),
            ("postgres://u:pw@[::1]/x?sslmode=require", None),
            ("host=/var/run/postgresql user=u sslmode=disable", None),
            // hostaddr is what is dialled; host then only names the certificate.
            (
                "host=db.internal hostaddr=127.0.0.1 user=u sslmode=disable",
                None,
            ),
            // Not a URL the pool accepts: reported there, not here.
            ("postgres://u:pw@db.internal/x?sslmode=allow", None),
        ] {
            assert_eq!(postgres_warning(url, ca), None, "{url}");
        }
        assert!(
            postgres_warning("host=localhost hostaddr=10.0.0.9 sslmode=disable", None).is_some()
        );
    }

    #[test]
    fn a_redis_password_in_cleartext_to_another_host_is_warned_about() {
        for url in [
            "redis://:pw@redis.internal:6379",
            "redis://default:pw@10.0.0.7:6379/0",
            " redis://:pw@[2001:db8::7]:6379",
        ] {
            let w = redis_warning(url).unwrap_or_else(|| panic!("{url}"));
            let shown = w.to_string();
            assert!(
                shown.starts_with("SUMMARYD_REDIS_URL reaches ")
                    && shown.contains("rediss://")
                    && !shown.contains("pw"),
                "{url}: {shown}"
            );
        }
        for url in [
            "rediss://:pw@redis.internal:6380",
            "redis://redis.internal:6379",
            "redis://:pw@127.0.0.1:6379",
            "redis://:pw@localhost:6379",
            "redis://:pw@[::1]:6379",
            "redis+unix:///run/redis.sock?pass=pw",
            "not a url",
        ] {
            assert_eq!(redis_warning(url), None, "{url}");
        }
    }

    #[test]
    fn a_process_is_warned_only_about_the_connections_it_opens() {
        assert!(warnings(&Settings::default(), true).is_empty());
        let s = Settings {
            redis_url: "redis://:redis-pw@redis.internal:6379".into(),
            database_url: "postgres://u:pg-pw@db.internal/x?sslmode=require".into(),
            ..Settings::default()
        };
        let settings: Vec<&str> = warnings(&s, true).iter().map(|w| w.setting).collect();
        assert_eq!(settings, ["SUMMARYD_DATABASE_URL", "SUMMARYD_REDIS_URL"]);
        // A relay or `migrate` never connects to Redis.
        let settings: Vec<&str> = warnings(&s, false).iter().map(|w| w.setting).collect();
        assert_eq!(settings, ["SUMMARYD_DATABASE_URL"]);
    }
}
