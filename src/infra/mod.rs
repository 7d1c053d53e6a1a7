//! What every adapter and role stands on: connections to Redis and Postgres, TLS, the Redis
//! key names, redaction, telemetry and metrics. Nothing here knows what a job is for.

pub mod cleartext;
pub mod connections;
pub(crate) mod http_client;
pub mod keys;
pub mod log_key;
pub mod metrics;
pub mod postgres;
pub mod redact;
pub mod redis;
pub(crate) mod retry_after;
pub mod telemetry;
pub(crate) mod tls;

use crate::config::Settings;

/// `localhost`, 127.0.0.0/8 and ::1 (also as an IPv4-mapped address), with or without the
/// brackets a URL puts around IPv6 literals.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    literal
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// A TLS file the settings name that cannot be used. Worded as the settings loader words
/// its errors: to the operator it is one more wrong setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsFilesError {
    #[error("invalid configuration: {0}")]
    Redis(#[source] redis::RedisSetupError),
    #[error("invalid configuration: {0}")]
    Database(#[source] tls::TlsError),
}

/// Reads and parses every TLS file the settings name, right after they are loaded, so a
/// wrong path, a file without a certificate or a Redis CA without `rediss://` stops the
/// command before it connects anywhere, naming the setting (exit 2 like any other).
pub fn check_tls_files(settings: &Settings) -> Result<(), TlsFilesError> {
    use secrecy::ExposeSecret;
    let is_tls = redis::url_is_tls(settings.redis_url.expose_secret());
    redis::tls_certificates(&settings.redis, is_tls).map_err(TlsFilesError::Redis)?;
    // The URL's own sslmode/sslrootcert are checked where it is parsed (`PgTarget::parse`).
    if let Some(ca) = &settings.database.ca_file {
        tls::certificates("SUMMARYD_DATABASE_CA_FILE", ca).map_err(TlsFilesError::Database)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn refusal(settings: &Settings) -> String {
        check_tls_files(settings)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn unusable_tls_files_are_configuration_errors_naming_the_setting() {
        assert!(check_tls_files(&Settings::default()).is_ok());
        let mut s = Settings::default();
        s.redis.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        let err = refusal(&s);
        assert!(
            err.starts_with("invalid configuration: SUMMARYD_REDIS_CA_FILE is set but")
                && err.contains("rediss://"),
            "{err}"
        );
        s.redis_url = " rediss://cache:6380".into();
        let err = refusal(&s);
        assert!(
            err.starts_with("invalid configuration: SUMMARYD_REDIS_CA_FILE: cannot read"),
            "{err}"
        );

        let mut s = Settings::default();
        s.database.ca_file = Some(PathBuf::from("/nonexistent/db-ca.pem"));
        let err = refusal(&s);
        assert!(
            err.starts_with("invalid configuration: SUMMARYD_DATABASE_CA_FILE: cannot read"),
            "{err}"
        );
        let not_pem = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(not_pem.path(), "no certificate here").unwrap();
        s.database.ca_file = Some(not_pem.path().to_path_buf());
        let err = refusal(&s);
        assert!(err.contains("holds no usable PEM certificate"), "{err}");
    }
}
