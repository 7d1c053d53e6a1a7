//! `[redis]`: TLS material for `rediss://` URLs (`SUMMARYD_REDIS_*_FILE`). Only the paths:
//! the files are read and checked by `infra`, before anything connects.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Files for TLS to Redis; only valid with a `rediss://` URL.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsSettings {
    /// PEM CA bundle the server's certificate must chain to; none = the system trust store.
    pub(crate) ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) and key, for servers that require mutual TLS.
    pub(crate) client_cert_file: Option<PathBuf>,
    pub(crate) client_key_file: Option<PathBuf>,
}
