//! The HTTP side: `POST/GET /v1/summaries` (role api) and the operations routes every role
//! serves (`/healthz`, `/readyz`, `/metrics`, `/openapi.json`).
//!
//! Every error is an [`ApiError`], rendered once as RFC 9457 problem details.

pub mod auth;
pub mod body;
pub mod connection;
pub mod health;
pub mod idempotency;
pub mod metrics;
pub mod openapi;
pub mod problem;
pub mod server;
pub mod state;
pub mod summaries;
pub mod tenant;

pub use idempotency::{IdempotencyStore, Outcome, StoreError, StoredResponse};
pub use problem::{ApiError, Problem};
pub use server::{HttpServers, app, build_server, configure, serve_until_shutdown};
pub use state::{ApiServices, ApiState};
pub use tenant::Tenant;
