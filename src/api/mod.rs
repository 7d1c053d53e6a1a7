//! The HTTP side: `POST/GET /v1/summaries` (role api) and the operations routes every role
//! serves (`/healthz`, `/readyz`, `/metrics`, `/openapi.json`).
//!
//! Every error is an [`ApiError`], rendered once as RFC 9457 problem details.

pub mod auth;
pub mod body;
pub(crate) mod connection;
pub(crate) mod head;
pub(crate) mod health;
pub mod idempotency;
pub mod metrics;
pub(crate) mod openapi;
pub(crate) mod problem;
pub(crate) mod server;
pub(crate) mod slots;
pub(crate) mod state;
pub mod summaries;
pub mod tenant;

pub use idempotency::{IdempotencyStore, Outcome, StoreError, StoredResponse};
pub use problem::{ApiError, Problem};
pub use server::{HttpServers, OpsRoutes, app, build_server, configure, serve_until_shutdown};
pub use state::{ApiServices, ApiState};
