//! `[ops]`: where the operations routes are served (`SUMMARYD_OPS_LISTEN`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsSettings {
    /// Own listener for /healthz, /readyz, /metrics and /openapi.json, so the public
    /// listener serves /v1 only; none = everything on `listen`.
    pub listen: Option<SocketAddr>,
}
