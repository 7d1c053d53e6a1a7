//! `[console]`: the operator console on the ops listener (`SUMMARYD_CONSOLE_*`). It is on
//! only when both a users file and `SUMMARYD_OPS_LISTEN` are given: the console must never
//! share the public listener with the tenants' API.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSettings {
    /// TOML file of `[users.NAME]` with `password_argon2` or `password_sha256` and `role`
    /// (`docs/console.md`). Unset: no console.
    pub users_file: Option<PathBuf>,
    /// A session unused this long is signed out.
    pub session_idle_s: u64,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        Self {
            users_file: None,
            // Half an hour: an on-call shift's pauses between looks stay signed in, a
            // laptop left open overnight does not.
            session_idle_s: 1800,
        }
    }
}

impl ConsoleSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.session_idle_s == 0 {
            return Err(invalid(
                "SUMMARYD_CONSOLE_SESSION_IDLE_S",
                "must be positive",
            ));
        }
        // A week at most: a session is a bearer credential, and a longer one outlives the
        // reason it was opened for.
        if self.session_idle_s > 7 * 24 * 3600 {
            return Err(invalid(
                "SUMMARYD_CONSOLE_SESSION_IDLE_S",
                "must be at most 604800 (a week)",
            ));
        }
        Ok(())
    }
}
