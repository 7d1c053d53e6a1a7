//! `[shutdown]`: how long in-flight work may finish after a stop signal
//! (`SUMMARYD_SHUTDOWN_GRACE_MS`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Millis;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    #[serde(rename = "grace_ms", with = "Millis")]
    pub grace: Duration,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(25),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    #[test]
    fn the_grace_is_milliseconds() {
        let s = load("[shutdown]\ngrace_ms = 1500\n", &[]).unwrap();
        assert_eq!(s.shutdown.grace, Duration::from_millis(1_500));
        let s = load("", &[("SUMMARYD_SHUTDOWN_GRACE_MS", "0")]).unwrap();
        assert_eq!(s.shutdown.grace, Duration::ZERO);
        assert_eq!(ShutdownSettings::default().grace, Duration::from_secs(25));
    }
}
