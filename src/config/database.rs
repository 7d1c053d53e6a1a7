//! `[database]`: TLS material for Postgres (`SUMMARYD_DATABASE_CA_FILE`). Only the path: the
//! file is read and checked by `infra`, the URL's own `sslmode`/`sslrootcert` by `db`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// PEM CA for `sslmode=verify-ca|verify-full` (the URL's `sslrootcert=` wins over it).
    pub ca_file: Option<PathBuf>,
}
