//! The outbox relay: hands every committed email intent to the mail provider until it is
//! accepted, always with the row's dedupe key (at-least-once sends, provider-deduplicated).
//!
//! - `pass`: one claim-send-record round (`relay_once`), what tests call directly.
//! - `run`: the long-running loop with idle polling, database backoff and shutdown.
//! - `mail_breaker`: the pause while the mail provider refuses us as misconfigured.

mod mail_breaker;
mod pass;
mod run;

pub use mail_breaker::MailBreaker;
pub use pass::{PassReport, relay_once, relay_pass};
pub use run::run;

use std::sync::Arc;

use crate::config::Settings;
use crate::db::DbError;
use crate::infra::metrics::Metrics;
use crate::mail::Mailer;

/// What the relay uses: the outbox table (Postgres) and the mail provider. No Redis: the
/// relay starts where the worker's commit ends.
#[derive(Clone)]
pub struct RelayServices {
    pub settings: Arc<Settings>,
    pub pg: deadpool_postgres::Pool,
    pub(crate) mailer: Arc<dyn Mailer>,
    pub metrics: Arc<Metrics>,
    /// Open while the mail provider refuses us as misconfigured: one per process, so every
    /// relay task pauses when one of them meets the refusal.
    pub(crate) mail_breaker: Arc<MailBreaker>,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Claiming or recording failed. Rows already sent but not recorded are sent again
    /// (with the same dedupe key) once their lease runs out.
    #[error("outbox relay database error: {0}")]
    Db(#[from] DbError),
}

impl RelayError {
    /// The `kind` label of `summaryd_loop_errors_total`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            RelayError::Db(DbError::Query(e)) if e.code().is_some() => "postgres_error",
            RelayError::Db(_) => "postgres_unavailable",
        }
    }
}
