//! One relay pass: claim a small batch under a lease, send each row, record each outcome.

use futures_util::future::join_all;
use tracing::{error, info, warn};

use super::{RelayError, RelayServices};
use crate::config::RelaySettings;
use crate::db::outbox::{self, OutboxRow};
use crate::domain::{InvalidEvent, SummaryReady};
use crate::mail::{MailError, summary_ready_email};
use crate::resilience::backoff::{Backoff, Jitter};
use crate::resilience::failure::{Classify, Disposition};

/// What one pass did, for the loop's pacing and for logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Rows leased by this pass.
    pub claimed: usize,
    /// Rows the provider accepted.
    pub sent: usize,
    /// Rows that failed transiently and wait for their backoff.
    pub(crate) retrying: usize,
    /// Rows that failed permanently or past the give-up horizon: they need a person.
    pub stuck: usize,
    /// Rows whose lease ran out before the outcome was recorded (another relay owns them).
    pub(crate) lost_claims: usize,
}

/// Claim due rows, send them, record the outcomes. Returns the number of rows sent.
pub async fn relay_once(services: &RelayServices) -> Result<usize, RelayError> {
    Ok(relay_pass(services).await?.sent)
}

/// `relay_once` with the full report.
pub async fn relay_pass(services: &RelayServices) -> Result<PassReport, RelayError> {
    let relay = &services.settings.relay;
    let rows = outbox::claim_due(&services.pg, relay.batch, relay.give_up(), relay.lease).await?;
    // The rows of a batch go out concurrently, so the whole batch ends within about one
    // mail timeout, inside the lease (config requires lease > mail timeout). One after the
    // other, a slow provider could let the lease of the last rows run out before their turn
    // and another relay would send them too.
    let outcomes = join_all(rows.iter().map(|row| deliver(services, row))).await;
    let mut report = PassReport {
        claimed: rows.len(),
        ..PassReport::default()
    };
    let mut first_error = None;
    for outcome in outcomes {
        match outcome {
            Ok(Outcome::Sent) => report.sent += 1,
            Ok(Outcome::Retrying) => report.retrying += 1,
            Ok(Outcome::Stuck) => report.stuck += 1,
            Ok(Outcome::LostClaim) => report.lost_claims += 1,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

enum Outcome {
    Sent,
    Retrying,
    Stuck,
    LostClaim,
}

/// Why a row was not handed over: its own content, or the mail provider's answer. The
/// Display is the row's `last_error`.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("no email is defined for outbox topic {0:?}")]
    UnknownTopic(String),
    #[error(transparent)]
    Payload(#[from] InvalidEvent),
    #[error(transparent)]
    Mail(#[from] MailError),
}

impl Classify for SendError {
    /// A row the relay cannot turn into an email fails the same way on every pass.
    fn disposition(&self) -> Disposition {
        match self {
            SendError::UnknownTopic(_) | SendError::Payload(_) => Disposition::Permanent,
            SendError::Mail(e) => e.disposition(),
        }
    }
}

async fn deliver(services: &RelayServices, row: &OutboxRow) -> Result<Outcome, RelayError> {
    let relay = &services.settings.relay;
    let pg = &services.pg;
    let failed = match send(services, row).await {
        Ok(event) => {
            if outbox::mark_sent(pg, row.id).await? {
                services.metrics.outbox_sent.inc();
                if let Some(accepted_at) = event.accepted_at {
                    services
                        .metrics
                        .job_latency
                        .with_label_values(&["emailed"])
                        .observe(crate::infra::metrics::seconds_since(accepted_at));
                }
                info!(id = row.id, dedupe_key = %row.dedupe_key, "outbox row sent");
            } else {
                // Another relay (whose lease we outlived, or who outlived ours) recorded it.
                info!(id = row.id, dedupe_key = %row.dedupe_key, "outbox row sent again; already recorded");
            }
            return Ok(Outcome::Sent);
        }
        Err(failed) => failed,
    };
    let err = failed.to_string();
    match failed.disposition() {
        // Provider down, slow or rate-limiting: resend after the row's backoff. An outage
        // of any length never parks a row either (only the give-up horizon does).
        Disposition::Transient { .. } | Disposition::Unavailable => {
            // Capped (SUMMARYD_RELAY_MAX_BACKOFF_MS) and unbounded in count: a provider outage
            // of any length shorter than the give-up horizon ends with the row sent.
            let failures = u32::try_from(row.attempts).unwrap_or(0);
            let backoff = row_backoff(relay).delay(failures);
            let mark = outbox::mark_failed_transient(
                pg,
                row.id,
                row.claim_token,
                &err,
                backoff,
                relay.give_up(),
            )
            .await?;
            match mark {
                None => Ok(lost_claim(row, &err)),
                Some(mark) if mark.past_give_up => {
                    error!(id = row.id, dedupe_key = %row.dedupe_key, attempts = mark.attempts, error = %err,
                        give_up_s = relay.give_up_s,
                        "outbox row still failing past the give-up horizon; it needs a person (summaryd outbox stuck / retry)");
                    Ok(Outcome::Stuck)
                }
                Some(outbox::TransientMark { attempts, .. }) => {
                    warn!(id = row.id, dedupe_key = %row.dedupe_key, attempts, error = %err,
                        retry_in_ms = backoff.as_millis() as u64, "outbox send failed; will retry");
                    Ok(Outcome::Retrying)
                }
            }
        }
        // The same email would fail the same way every time: no futile attempts.
        Disposition::Permanent => {
            if !outbox::mark_failed_permanent(pg, row.id, row.claim_token, &err).await? {
                return Ok(lost_claim(row, &err));
            }
            error!(id = row.id, dedupe_key = %row.dedupe_key, error = %err,
                "outbox send failed permanently; it needs a person (summaryd outbox stuck / retry)");
            Ok(Outcome::Stuck)
        }
    }
}

/// Per row, from `relay.backoff_ms` doubling up to `relay.max_backoff_ms`. Equal jitter: a row
/// has a limited number of attempts (see [`Jitter::Equal`]).
fn row_backoff(relay: &RelaySettings) -> Backoff {
    Backoff::new(relay.backoff, relay.max_backoff, Jitter::Equal)
}

fn lost_claim(row: &OutboxRow, err: &str) -> Outcome {
    warn!(id = row.id, dedupe_key = %row.dedupe_key, error = %err,
        "outbox lease expired before the failure was recorded; the row's new owner decides");
    Outcome::LostClaim
}

/// Compose and hand the row to the provider once, under a wall-clock cap. Returns the
/// event that was sent.
async fn send(services: &RelayServices, row: &OutboxRow) -> Result<SummaryReady, SendError> {
    if row.topic != SummaryReady::TOPIC {
        return Err(SendError::UnknownTopic(row.topic.clone()));
    }
    let event = SummaryReady::decode(&row.payload)?;
    let mail = &services.settings.mail;
    let email = summary_ready_email(&mail.from, &event);
    // Wall-clock cap on the whole call: client timeouts are per phase, and a provider that
    // trickles bytes would otherwise hold the row past its lease.
    let timeout = mail.timeout;
    // The dedupe key is the provider's idempotency key: the same row always sends the same
    // key, so a resend after a crash between send and mark_sent is recognisably a duplicate.
    match tokio::time::timeout(timeout, services.mailer.send(&email, &row.dedupe_key)).await {
        Ok(result) => Ok(result.map(|()| event)?),
        Err(_) => Err(MailError::Timeout { after: timeout }.into()),
    }
}
