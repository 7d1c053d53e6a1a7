//! `[webhook]`: where signed webhooks may go, how long one request may take, and when the
//! relay stops trying (`SUMMARYD_WEBHOOK_*`). In token mode each tenant's `webhook_url` and
//! `webhook_secrets` in the tokens file come first; `secrets_file` is header mode's.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid};
use crate::domain::WebhookRules;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Header mode: a file of `whsec_` secrets, one a line; the first signs, every one
    /// produces a signature (rotation without a gap).
    pub secrets_file: Option<PathBuf>,
    /// Targets may be loopback, private, link-local, shared or multicast addresses. Off by
    /// default: a webhook target is chosen by a client, and without this rule any tenant
    /// could make the relay call the deployment's own internal services.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub allow_private: bool,
    /// Targets may use plain `http` (a private network, tests).
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub allow_http: bool,
    /// Wall-clock cap on one webhook request, connection and answer included.
    #[serde(rename = "timeout_ms", with = "Millis")]
    pub timeout: Duration,
    /// A webhook failing this long after its first failure needs a person (`webhook
    /// deliveries --failed`, `webhook replay`).
    pub give_up_s: u64,
    /// An endpoint whose deliveries have all failed for this long is disabled for its
    /// tenant: later events to it are recorded as skipped (`webhook enable` undoes it).
    pub disable_after_s: u64,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            secrets_file: None,
            allow_private: false,
            allow_http: false,
            timeout: Duration::from_secs(15),
            // Three days: a receiver down over a weekend still gets its events.
            give_up_s: 259_200,
            disable_after_s: 432_000,
        }
    }
}

impl WebhookSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.timeout.is_zero() {
            return Err(invalid("SUMMARYD_WEBHOOK_TIMEOUT_MS", "must be positive"));
        }
        if self.give_up_s == 0 {
            return Err(invalid("SUMMARYD_WEBHOOK_GIVE_UP_S", "must be positive"));
        }
        if self.disable_after_s == 0 {
            return Err(invalid(
                "SUMMARYD_WEBHOOK_DISABLE_AFTER_S",
                "must be positive",
            ));
        }
        Ok(())
    }

    /// What a target must satisfy, at intake and again when the relay connects.
    pub fn rules(&self) -> WebhookRules {
        WebhookRules {
            allow_http: self.allow_http,
            allow_private: self.allow_private,
        }
    }

    pub fn give_up(&self) -> Duration {
        Duration::from_secs(self.give_up_s)
    }

    pub fn disable_after(&self) -> Duration {
        Duration::from_secs(self.disable_after_s)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    #[test]
    fn defaults_are_the_contract_s() {
        let s = WebhookSettings::default();
        assert_eq!(s.timeout, Duration::from_millis(15_000));
        assert_eq!(s.give_up(), Duration::from_secs(259_200));
        assert_eq!(s.disable_after(), Duration::from_secs(432_000));
        assert_eq!(s.rules(), WebhookRules::default());
        assert!(s.check().is_ok());
    }

    #[test]
    fn settings_are_read_from_the_environment_and_the_file() {
        let s = load(
            "[webhook]\ntimeout_ms = 250\ngive_up_s = 60\n",
            &[
                ("SUMMARYD_WEBHOOK_ALLOW_PRIVATE", "1"),
                ("SUMMARYD_WEBHOOK_ALLOW_HTTP", "true"),
                ("SUMMARYD_WEBHOOK_DISABLE_AFTER_S", "120"),
                ("SUMMARYD_WEBHOOK_SECRETS_FILE", "/run/secrets/whsec"),
            ],
        )
        .unwrap();
        assert_eq!(s.webhook.timeout, Duration::from_millis(250));
        assert_eq!(s.webhook.give_up(), Duration::from_secs(60));
        assert_eq!(s.webhook.disable_after(), Duration::from_secs(120));
        assert_eq!(
            s.webhook.rules(),
            WebhookRules {
                allow_http: true,
                allow_private: true
            }
        );
        assert_eq!(
            s.webhook.secrets_file.as_deref(),
            Some(std::path::Path::new("/run/secrets/whsec"))
        );
    }

    #[test]
    fn zero_durations_are_refused_by_name() {
        for (name, adjust) in [
            (
                "SUMMARYD_WEBHOOK_TIMEOUT_MS",
                (|s: &mut WebhookSettings| s.timeout = Duration::ZERO) as fn(&mut _),
            ),
            ("SUMMARYD_WEBHOOK_GIVE_UP_S", |s| s.give_up_s = 0),
            ("SUMMARYD_WEBHOOK_DISABLE_AFTER_S", |s| {
                s.disable_after_s = 0
            }),
        ] {
            let mut s = WebhookSettings::default();
            adjust(&mut s);
            let err = s.check().unwrap_err().to_string();
            assert!(err.contains(name), "{name}: {err}");
        }
    }
}
