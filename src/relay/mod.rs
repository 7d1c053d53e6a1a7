//! The outbox relay: hands every committed effect to its receiver until it is accepted,
//! always with the row's dedupe key: emails to the mail provider (its idempotency key), and
//! signed webhooks to the client's endpoint (the webhook-id). At-least-once sends,
//! deduplicated by the receiver.
//!
//! - `relay_pass` (here): one round, what tests call directly: the emails' half (`pass`)
//!   and the webhooks' half (`webhooks`) claim their own rows and run side by side.
//! - `pass`: claim-send-record for emails.
//! - `webhooks`: claim-sign-send-record for webhooks, and the endpoint's disabling.
//! - `run`: the long-running loop with idle polling, database backoff and shutdown.
//! - `mail_breaker`: the pause while the mail provider refuses us as misconfigured.

mod mail_breaker;
mod pass;
mod run;
mod webhooks;

pub use mail_breaker::MailBreaker;
pub use pass::PassReport;
pub use run::run;

use std::sync::Arc;

use crate::config::Settings;
use crate::db::DbError;
use crate::domain::{TenantId, WebhookSecrets};
use crate::infra::metrics::Metrics;
use crate::mail::Mailer;
use crate::webhook::WebhookClient;

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
    pub(crate) webhooks: Arc<WebhookClient>,
    /// Each tenant's webhook secrets, looked up at every attempt (rotation applies at once).
    pub(crate) signing: Arc<dyn SigningSecrets>,
}

/// Where the relay finds the secrets that sign a tenant's webhooks. The process wiring
/// (`app/`) implements it over the tokens file or header mode's secrets file; the relay
/// needs nothing else of either.
pub trait SigningSecrets: Send + Sync {
    /// `None`: the tenant has no secret, and its webhooks cannot be signed.
    fn secrets(&self, tenant: &TenantId) -> Option<Arc<WebhookSecrets>>;
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

/// Claim due rows, send them, record the outcomes. Returns the number of rows sent.
pub async fn relay_once(services: &RelayServices) -> Result<usize, RelayError> {
    Ok(relay_pass(services).await?.sent)
}

/// `relay_once` with the full report: the emails and the webhooks, claimed apart and sent
/// at the same time, so a paused mail provider or a slow receiver holds only its own rows.
pub async fn relay_pass(services: &RelayServices) -> Result<PassReport, RelayError> {
    let (mail, webhooks) =
        tokio::join!(pass::mail_pass(services), webhooks::webhook_pass(services));
    let (mail, webhooks) = (mail?, webhooks?);
    Ok(PassReport {
        claimed: mail.claimed + webhooks.claimed,
        sent: mail.sent + webhooks.sent,
        retrying: mail.retrying + webhooks.retrying,
        stuck: mail.stuck + webhooks.stuck,
        lost_claims: mail.lost_claims + webhooks.lost_claims,
        waiting: mail.waiting,
        skipped: webhooks.skipped,
        // Paused only when neither half has work: a paused mail provider leaves the
        // webhooks' pacing alone.
        paused: mail.paused && webhooks.claimed == 0,
        probe_in: mail.probe_in,
    })
}
