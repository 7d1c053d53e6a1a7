//! `[redis]`: TLS material for `rediss://` URLs (`SUMMARYD_REDIS_*_FILE`), the cluster
//! switch, and how many replicas must confirm a write before it counts
//! (`SUMMARYD_REDIS_MIN_REPLICAS_ACK`). Only values: the files are read and checked by
//! `infra`, before anything connects.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid};

/// How summaryd talks to Redis beyond the URL.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsSettings {
    /// PEM CA bundle the server's certificate must chain to; none = the system trust store.
    pub(crate) ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) and key, for servers that require mutual TLS.
    pub(crate) client_cert_file: Option<PathBuf>,
    pub(crate) client_key_file: Option<PathBuf>,
    /// Use a cluster connection even when the URL says `redis://` or `rediss://` (a managed
    /// cluster's configuration endpoint); a `redis+cluster://` URL implies it.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub cluster: bool,
    /// Replicas that must confirm an accept (and the worker's finishing writes) before they
    /// count: `WAIT n ack_timeout` after the write. 0 = the primary's word is enough.
    pub min_replicas_ack: u32,
    /// How long a write waits for those replicas; past it the API answers 503 and the
    /// client's retry replays the same job.
    #[serde(rename = "ack_timeout_ms", with = "Millis")]
    pub ack_timeout: Duration,
}

impl Default for RedisTlsSettings {
    fn default() -> Self {
        Self {
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            cluster: false,
            min_replicas_ack: 0,
            ack_timeout: Duration::from_millis(100),
        }
    }
}

/// The longest replica wait: the API's shared Redis connection gives up on a reply after
/// 2 s, so a wait that long would fail as a broken connection rather than as a refusal.
pub const MAX_ACK_TIMEOUT: Duration = Duration::from_millis(1500);

impl RedisTlsSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.ack_timeout > MAX_ACK_TIMEOUT {
            return Err(invalid(
                "SUMMARYD_REDIS_ACK_TIMEOUT_MS",
                &format!(
                    "must be at most {} (the API's Redis reply timeout is 2000; a replica wait \
                     holds the other requests on its connection, so keep it short)",
                    MAX_ACK_TIMEOUT.as_millis()
                ),
            ));
        }
        if self.min_replicas_ack > 0 && self.ack_timeout.is_zero() {
            // WAIT with a timeout of 0 blocks forever.
            return Err(invalid(
                "SUMMARYD_REDIS_ACK_TIMEOUT_MS",
                "must be positive when SUMMARYD_REDIS_MIN_REPLICAS_ACK is set (0 would wait forever)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    #[test]
    fn replica_acks_and_the_cluster_switch_come_from_the_environment() {
        let s = load(
            "",
            &[
                ("SUMMARYD_REDIS_MIN_REPLICAS_ACK", "2"),
                ("SUMMARYD_REDIS_ACK_TIMEOUT_MS", "250"),
                ("SUMMARYD_REDIS_CLUSTER", "1"),
            ],
        )
        .unwrap();
        assert_eq!(s.redis.min_replicas_ack, 2);
        assert_eq!(s.redis.ack_timeout, Duration::from_millis(250));
        assert!(s.redis.cluster);
        let d = RedisTlsSettings::default();
        assert_eq!(
            (d.min_replicas_ack, d.ack_timeout, d.cluster),
            (0, Duration::from_millis(100), false)
        );
        let err = load("[redis]\nmin_replicas_ack = 1\nack_timeout_ms = 0\n", &[]).unwrap_err();
        assert!(err.contains("SUMMARYD_REDIS_ACK_TIMEOUT_MS"), "{err}");
        assert!(load("[redis]\nack_timeout_ms = 0\n", &[]).is_ok());
        assert!(load("[redis]\nack_timeout_ms = 1500\n", &[]).is_ok());
        let err = load("", &[("SUMMARYD_REDIS_ACK_TIMEOUT_MS", "1501")]).unwrap_err();
        assert!(
            err.contains("SUMMARYD_REDIS_ACK_TIMEOUT_MS") && err.contains("1500"),
            "{err}"
        );
    }
}
