//! `[idempotency]`: how long accepted keys are remembered (`SUMMARYD_IDEMPOTENCY_*`).

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    /// No effect: POST accepts a key in one atomic step (see `api::idempotency`), so there
    /// is no in-progress marker. Kept because the contract names the variable (a warning
    /// says so at startup), and not required in a file.
    #[serde(default = "IdempotencySettings::lock_ttl_s_default")]
    pub(crate) lock_ttl_s: u64,
    pub(crate) result_ttl_s: u64,
}

impl Default for IdempotencySettings {
    fn default() -> Self {
        Self {
            lock_ttl_s: Self::lock_ttl_s_default(),
            result_ttl_s: 86_400,
        }
    }
}

impl IdempotencySettings {
    fn lock_ttl_s_default() -> u64 {
        30
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.lock_ttl_s == 0 {
            return Err(invalid(
                "SUMMARYD_IDEMPOTENCY_LOCK_TTL_S",
                "must be positive",
            ));
        }
        if self.result_ttl_s == 0 {
            return Err(invalid(
                "SUMMARYD_IDEMPOTENCY_RESULT_TTL_S",
                "must be positive",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ttl_error_names_its_own_setting() {
        assert!(IdempotencySettings::default().check().is_ok());
        let refusal = |s: IdempotencySettings| s.check().err().map(|e| e.to_string());
        let err = refusal(IdempotencySettings {
            result_ttl_s: 0,
            ..IdempotencySettings::default()
        });
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S")),
            "{err:?}"
        );
        let err = refusal(IdempotencySettings {
            lock_ttl_s: 0,
            ..IdempotencySettings::default()
        });
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("SUMMARYD_IDEMPOTENCY_LOCK_TTL_S")),
            "{err:?}"
        );
    }

    /// A file may leave out the setting without effect; its contract default stays.
    #[test]
    fn lock_ttl_is_not_required_in_a_file() {
        let s: IdempotencySettings = toml::from_str("result_ttl_s = 60\n").unwrap();
        assert_eq!(s.lock_ttl_s, 30);
        assert_eq!(s.result_ttl_s, 60);
        assert_eq!(IdempotencySettings::default().lock_ttl_s, 30);
    }
}
