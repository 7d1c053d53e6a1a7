//! `[auth]`: how clients authenticate (`SUMMARYD_AUTH_TOKENS_FILE`). The file itself is read
//! by the api role, which is the only one that needs it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub tokens_file: Option<PathBuf>,
}
