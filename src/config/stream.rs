//! `[stream]`: how the job stream is laid out in Redis (`SUMMARYD_STREAM_*`).

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

/// Most shards a deployment may have: each is one hash slot's worth of keys, and every
/// consumer visits each in turn, so past a few dozen the visits cost more than they spread.
pub const MAX_SHARDS: u16 = 64;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSettings {
    /// How many shards the job stream and everything a script touches with it (lanes, job
    /// states, idempotency records, tenants' limits) are split into, each under its own hash
    /// tag so that one Redis Cluster node holds all of a shard. 1 = today's key names.
    pub shards: u16,
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self { shards: 1 }
    }
}

impl StreamSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(invalid(
                "SUMMARYD_STREAM_SHARDS",
                &format!("must be between 1 and {MAX_SHARDS}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::MAX_SHARDS;

    #[test]
    fn shards_are_one_by_default_and_bounded() {
        assert_eq!(load("", &[]).unwrap().stream.shards, 1);
        let s = load("", &[("SUMMARYD_STREAM_SHARDS", "8")]).unwrap();
        assert_eq!(s.stream.shards, 8);
        assert!(load(&format!("[stream]\nshards = {MAX_SHARDS}\n"), &[]).is_ok());
        for bad in ["0", "65"] {
            let err = load("", &[("SUMMARYD_STREAM_SHARDS", bad)]).unwrap_err();
            assert!(err.contains("SUMMARYD_STREAM_SHARDS"), "{bad}: {err}");
        }
    }
}
