//! `[relay]`: how outbox rows are claimed, sent and given up on (`SUMMARYD_RELAY_*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySettings {
    pub tasks: usize,
    /// No effect: transient failures never make a row stuck, only `give_up_s` does. Kept
    /// so configurations that set it stay valid (a warning says so at startup), and not
    /// required in a file.
    #[serde(default = "RelaySettings::max_attempts_default")]
    pub max_attempts: i32,
    /// A row failing transiently for longer than this since its first failure needs a
    /// person: the next failure parks it (`outbox stuck`), and it is no longer sent by itself.
    pub(crate) give_up_s: u64,
    #[serde(rename = "poll_ms", with = "Millis")]
    pub poll: Duration,
    #[serde(rename = "backoff_ms", with = "Millis")]
    pub backoff: Duration,
    #[serde(rename = "max_backoff_ms", with = "Millis")]
    pub max_backoff: Duration,
    /// Rows claimed per pass; small so one slow provider holds few rows.
    pub batch: i64,
    /// How long a claimed row is reserved for one relay; must exceed `mail.timeout_ms`.
    #[serde(rename = "lease_ms", with = "Millis")]
    pub lease: Duration,
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            tasks: 1,
            max_attempts: Self::max_attempts_default(),
            // A day: any mail outage the on-call can be expected to notice and fix.
            give_up_s: 86_400,
            poll: Duration::from_millis(500),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            batch: 10,
            lease: Duration::from_secs(60),
        }
    }
}

impl RelaySettings {
    fn max_attempts_default() -> i32 {
        10
    }

    pub fn give_up(&self) -> Duration {
        Duration::from_secs(self.give_up_s)
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.tasks == 0 {
            return Err(invalid("SUMMARYD_RELAY_TASKS", "must be at least 1"));
        }
        if self.backoff > self.max_backoff {
            return Err(invalid(
                "SUMMARYD_RELAY_BACKOFF_MS",
                "must not exceed SUMMARYD_RELAY_MAX_BACKOFF_MS",
            ));
        }
        if self.give_up_s == 0 {
            return Err(invalid("SUMMARYD_RELAY_GIVE_UP_S", "must be positive"));
        }
        if self.batch < 1 {
            return Err(invalid("SUMMARYD_RELAY_BATCH", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    /// A change that breaks one setting.
    type Adjust = fn(&mut RelaySettings);

    fn refusal(relay: &RelaySettings) -> String {
        relay
            .check()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn durations_are_milliseconds_in_the_file_and_the_environment() {
        let s = load(
            "[relay]\npoll_ms = 20\nlease_ms = 120000\n",
            &[
                ("SUMMARYD_RELAY_BACKOFF_MS", "0"),
                ("SUMMARYD_RELAY_MAX_BACKOFF_MS", "1500"),
            ],
        )
        .unwrap();
        assert_eq!(s.relay.poll, Duration::from_millis(20));
        assert_eq!(s.relay.lease, Duration::from_secs(120));
        assert_eq!(s.relay.backoff, Duration::ZERO);
        assert_eq!(s.relay.max_backoff, Duration::from_millis(1_500));
        assert_eq!(s.relay.give_up(), Duration::from_secs(86_400));
    }

    /// A file may leave out the setting without effect; its contract default stays.
    #[test]
    fn max_attempts_is_not_required_in_a_file() {
        let relay: RelaySettings = toml::from_str(
            "tasks = 1\ngive_up_s = 60\npoll_ms = 1\nbackoff_ms = 1\nmax_backoff_ms = 1\n\
             batch = 1\nlease_ms = 1\n",
        )
        .unwrap();
        assert_eq!(relay.max_attempts, 10);
        assert_eq!(relay.give_up(), Duration::from_secs(60));
        assert_eq!(RelaySettings::default().max_attempts, 10);
    }

    #[test]
    fn counts_and_waits_must_be_usable() {
        assert!(RelaySettings::default().check().is_ok());
        let cases: [(&str, Adjust); 3] = [
            ("SUMMARYD_RELAY_TASKS", |s| s.tasks = 0),
            ("SUMMARYD_RELAY_GIVE_UP_S", |s| s.give_up_s = 0),
            ("SUMMARYD_RELAY_BATCH", |s| s.batch = 0),
        ];
        for (setting, adjust) in cases {
            let mut relay = RelaySettings::default();
            adjust(&mut relay);
            assert!(refusal(&relay).contains(setting), "{setting}");
        }
        let mut relay = RelaySettings {
            batch: 1,
            ..RelaySettings::default()
        };
        assert!(relay.check().is_ok(), "one row a pass");
        relay.backoff = relay.max_backoff;
        assert!(relay.check().is_ok(), "a backoff at its cap");
        relay.backoff = relay.max_backoff + Duration::from_millis(1);
        assert!(refusal(&relay).contains("SUMMARYD_RELAY_BACKOFF_MS"));
    }
}
