//! `[worker]`: how consumers take, claim and give up jobs (`SUMMARYD_WORKER_*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid};

/// Longest group-commit wait accepted: a finished job waits this long at most before its
/// transaction starts; more would only hold acknowledgements and claims.
const MAX_COMMIT_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    #[serde(rename = "claim_idle_ms", with = "Millis")]
    pub claim_idle: Duration,
    pub max_deliveries: u64,
    pub consumers: usize,
    #[serde(rename = "consumer_gc_ms", with = "Millis")]
    pub consumer_gc: Duration,
    /// XREADGROUP BLOCK: how long an idle consumer waits for new work per call.
    #[serde(rename = "block_ms", with = "Millis")]
    pub block: Duration,
    /// Group commit: most finished jobs of a process committed in one transaction (and
    /// acknowledged in one Redis round trip); 1 = each job its own.
    pub commit_batch: usize,
    /// Group commit: how long a batch that is not full waits for more jobs once it has
    /// one, while another job of the process is in hand; the most it adds to a job's
    /// latency.
    #[serde(rename = "commit_wait_ms", with = "Millis")]
    pub commit_wait: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            claim_idle: Duration::from_secs(120),
            max_deliveries: 5,
            consumers: 4,
            consumer_gc: Duration::from_secs(600),
            block: Duration::from_secs(2),
            commit_batch: 64,
            commit_wait: Duration::from_millis(2),
        }
    }
}

impl WorkerSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.consumers == 0 {
            return Err(invalid("SUMMARYD_WORKER_CONSUMERS", "must be at least 1"));
        }
        if self.commit_batch == 0 {
            return Err(invalid(
                "SUMMARYD_WORKER_COMMIT_BATCH",
                "must be at least 1 (1 commits each job alone)",
            ));
        }
        if self.commit_wait > MAX_COMMIT_WAIT {
            return Err(invalid(
                "SUMMARYD_WORKER_COMMIT_WAIT_MS",
                "must be at most 1000: every finished job may wait this long for its commit",
            ));
        }
        if self.max_deliveries == 0 {
            return Err(invalid(
                "SUMMARYD_WORKER_MAX_DELIVERIES",
                "must be at least 1",
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
    fn durations_are_milliseconds_in_the_file_and_the_environment() {
        let s = load(
            "[worker]\nblock_ms = 50\n",
            &[
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "30000"),
                ("SUMMARYD_WORKER_CONSUMER_GC_MS", "0"),
            ],
        )
        .unwrap();
        assert_eq!(s.worker.claim_idle, Duration::from_secs(30));
        assert_eq!(s.worker.block, Duration::from_millis(50));
        assert_eq!(s.worker.consumer_gc, Duration::ZERO);
    }

    #[test]
    fn counts_must_be_at_least_one() {
        assert!(WorkerSettings::default().check().is_ok());
        let refusal =
            |w: WorkerSettings| w.check().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            refusal(WorkerSettings {
                consumers: 0,
                ..WorkerSettings::default()
            })
            .contains("SUMMARYD_WORKER_CONSUMERS")
        );
        assert!(
            refusal(WorkerSettings {
                max_deliveries: 0,
                ..WorkerSettings::default()
            })
            .contains("SUMMARYD_WORKER_MAX_DELIVERIES")
        );
    }
}
