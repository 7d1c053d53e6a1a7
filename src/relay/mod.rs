//! The outbox relay: hands every committed email intent to the mail provider until it is
//! accepted, always with the row's dedupe key (at-least-once sends, provider-deduplicated).
//!
//! - `pass`: one claim-send-record round (`relay_once`), what tests call directly.
//! - `run`: the long-running loop with idle polling, database backoff and shutdown.

mod pass;
mod run;

pub use pass::{PassReport, relay_once, relay_pass};
pub use run::run;

use crate::db::DbError;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Claiming or recording failed. Rows already sent but not recorded are sent again
    /// (with the same dedupe key) once their lease runs out.
    #[error("outbox relay database error: {0}")]
    Db(#[from] DbError),
}
