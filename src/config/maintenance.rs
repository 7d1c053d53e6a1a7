//! `[maintenance]`: the housekeeping every process runs
//! (`SUMMARYD_MAINTENANCE_*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceSettings {
    /// How often the maintenance task refreshes the cluster-wide gauges and applies retention.
    #[serde(rename = "interval_ms", with = "Millis")]
    pub interval: Duration,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
        }
    }
}

impl MaintenanceSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.interval.is_zero() {
            return Err(invalid(
                "SUMMARYD_MAINTENANCE_INTERVAL_MS",
                "must be positive",
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
    fn the_interval_is_milliseconds_and_positive() {
        let s = load("", &[("SUMMARYD_MAINTENANCE_INTERVAL_MS", "250")]).unwrap();
        assert_eq!(s.maintenance.interval, Duration::from_millis(250));
        assert!(MaintenanceSettings::default().check().is_ok());
        let err = load("[maintenance]\ninterval_ms = 0\n", &[]).unwrap_err();
        assert!(err.contains("SUMMARYD_MAINTENANCE_INTERVAL_MS"), "{err}");
    }
}
