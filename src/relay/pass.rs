//! One relay pass: claim a small batch under a lease, send each row, record each outcome.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;
use tracing::{Instrument, error, info, warn};

use super::mail_breaker::{Admission, ProbeTicket};
use super::{RelayError, RelayServices};
use crate::config::RelaySettings;
use crate::db::outbox::{self, OutboxRow};
use crate::domain::{InvalidEvent, JobId, SummaryReady, TenantId};
use crate::infra::redact;
use crate::infra::telemetry::{self, otel_span};
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
    pub retrying: usize,
    /// Rows that failed permanently or past the give-up horizon: they need a person.
    pub stuck: usize,
    /// Rows whose lease ran out before the outcome was recorded (another relay owns them).
    pub(crate) lost_claims: usize,
    /// Rows the mail provider refused as misconfigured: released to wait for it, not
    /// counted as failures.
    pub waiting: usize,
    /// Webhooks not sent because their endpoint is disabled.
    pub skipped: usize,
    /// The mail breaker is open and this pass claimed nothing.
    pub paused: bool,
    /// While paused: how long until the next probe may start (`None` while another relay
    /// task of this process runs it).
    pub(crate) probe_in: Option<Duration>,
}

/// The emails' half. While the mail breaker is open it claims nothing, except the one pass
/// per cooldown that sends a single due row as the probe.
pub(super) async fn mail_pass(services: &RelayServices) -> Result<PassReport, RelayError> {
    let relay = &services.settings.relay;
    let (batch, probe) = match services.mail_breaker.admit(Instant::now()) {
        Admission::Claim => (relay.batch, None),
        Admission::Probe(ticket) => (1, Some(ticket)),
        Admission::Paused { probe_in } => {
            return Ok(PassReport {
                paused: true,
                probe_in,
                ..PassReport::default()
            });
        }
    };
    // A failed claim, or no due row to probe with, drops the ticket: the next pass probes.
    let rows = outbox::claim_due(&services.pg, SummaryReady::TOPIC, batch, relay.lease).await?;
    // The rows of a batch go out concurrently, so the whole batch ends within about one
    // mail timeout, inside the lease (config requires lease > mail timeout). One after the
    // other, a slow provider could let the lease of the last rows run out before their turn
    // and another relay would send them too.
    let outcomes = join_all(rows.iter().map(|row| deliver(services, row))).await;
    let mut report = PassReport {
        claimed: rows.len(),
        ..PassReport::default()
    };
    // Sent but not recorded (Postgres failed): their leases run out and they are sent
    // again, with the same dedupe key, which the provider recognises. The pass still
    // judges the provider on what it answered.
    let mut first_error = record_sent(services, &rows, &outcomes).await.err();
    let mut misconfigured = None;
    // A probe claims one row: its outcome is the probe's verdict.
    let mut verdict = None;
    for outcome in outcomes {
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        match &outcome {
            Outcome::Sent | Outcome::Accepted { .. } => report.sent += 1,
            Outcome::Retrying => report.retrying += 1,
            Outcome::Stuck => report.stuck += 1,
            Outcome::LostClaim => report.lost_claims += 1,
            Outcome::Waiting { reason, recorded } => {
                if *recorded {
                    report.waiting += 1;
                } else {
                    report.lost_claims += 1;
                }
                misconfigured.get_or_insert_with(|| reason.clone());
            }
        }
        verdict.get_or_insert(outcome);
    }
    let now = Instant::now();
    match (probe, misconfigured) {
        (Some(ticket), _) => judge_probe(services, ticket, verdict, now),
        (None, Some(reason)) => {
            if services.mail_breaker.trip(now, &reason) {
                services.metrics.set_mail_breaker(Some(&reason));
                error!(error = %reason,
                    "the mail provider refuses the relay as misconfigured (credentials or URL); the relay is paused, every unsent row waits and none is parked; one row is sent as a probe after each cooldown");
            }
        }
        (None, None) => {}
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// The probe's row decides: refused as misconfigured again, the breaker stays open and the
/// next probe waits longer; sent, or failing for another reason (the provider now answers
/// about the row, and the row's own backoff governs again), it closes. A row that never
/// reached the provider (parked for its own content, or a lost claim) says nothing, and
/// the next pass probes with another row.
fn judge_probe(
    services: &RelayServices,
    ticket: ProbeTicket<'_>,
    verdict: Option<Outcome>,
    now: Instant,
) {
    match verdict {
        Some(Outcome::Waiting { reason, .. }) => {
            warn!(error = %reason, "mail provider probe refused as misconfigured; the relay stays paused");
            services.metrics.set_mail_breaker(Some(&reason));
            ticket.failed(now, &reason);
        }
        Some(Outcome::Sent | Outcome::Accepted { .. } | Outcome::Retrying) => {
            ticket.passed();
            services.metrics.set_mail_breaker(None);
            info!("the mail provider accepts the relay again; the relay resumed");
        }
        Some(Outcome::Stuck | Outcome::LostClaim) | None => drop(ticket),
    }
}

pub(super) enum Outcome {
    /// Handed over and recorded as sent.
    Sent,
    /// The mail provider accepted the email; the row is recorded as sent with the pass's
    /// other accepted rows (`record_sent`). `accepted_at`: when the API accepted its job.
    Accepted {
        accepted_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    Retrying,
    Stuck,
    LostClaim,
    /// The provider refused the send as misconfigured (`reason`, free of credentials); the
    /// row waits for it. `recorded` is false when the lease had run out meanwhile.
    Waiting {
        reason: String,
        recorded: bool,
    },
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
        // Recorded with the pass's other sent rows, in one statement (`record_sent`).
        Ok(event) => {
            return Ok(Outcome::Accepted {
                accepted_at: event.accepted_at,
            });
        }
        Err(failed) => failed,
    };
    let err = failed.to_string();
    let failures = u32::try_from(row.attempts).unwrap_or(0);
    match failed.disposition() {
        // The provider refuses us, not this row (credentials, URL): the row waits for the
        // fix, however long it takes, without an attempt counted or its horizon started.
        // Its backoff stays where its own failures left it; the breaker paces the probes.
        Disposition::Unavailable => {
            let backoff = row_backoff(relay).delay(failures);
            let recorded =
                outbox::mark_provider_unavailable(pg, row.id, row.claim_token, &err, backoff)
                    .await?;
            if recorded {
                warn!(id = row.id, dedupe_key = %row.dedupe_key, error = %err,
                    "outbox send refused: the mail provider is misconfigured; the row waits");
            } else {
                log_lost_claim(row, &err);
            }
            // Scrubbed where it was made (mail/); scrubbed again because `/readyz` shows it
            // to whoever can reach the ops port.
            let reason = redact::secrets(&err, None);
            Ok(Outcome::Waiting { reason, recorded })
        }
        // Provider down, slow or rate-limiting: resend after the row's backoff. Only a
        // failure past the give-up horizon (counted from the row's first failure) parks it.
        Disposition::Transient { .. } => {
            // Capped (SUMMARYD_RELAY_MAX_BACKOFF_MS) and unbounded in count: a provider outage
            // of any length shorter than the give-up horizon ends with the row sent.
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
                        "outbox row still failing past the give-up horizon since its first failure; it needs a person (summaryd outbox stuck / retry)");
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

/// Record the pass's sent rows in one statement, then count and log each. Until this
/// returns they are leased and unrecorded: a crash in between sends them again after
/// their leases, with the same dedupe key (the provider's idempotency key).
async fn record_sent(
    services: &RelayServices,
    rows: &[OutboxRow],
    outcomes: &[Result<Outcome, RelayError>],
) -> Result<(), RelayError> {
    let sent: Vec<(&OutboxRow, Option<chrono::DateTime<chrono::Utc>>)> = rows
        .iter()
        .zip(outcomes)
        .filter_map(|(row, outcome)| match outcome {
            Ok(Outcome::Accepted { accepted_at }) => Some((row, *accepted_at)),
            _ => None,
        })
        .collect();
    let ids: Vec<i64> = sent.iter().map(|(row, _)| row.id).collect();
    let recorded = outbox::mark_sent_many(&services.pg, &ids).await?;
    for (row, accepted_at) in sent {
        if recorded.contains(&row.id) {
            services.metrics.outbox_sent.inc();
            if let Some(accepted_at) = accepted_at {
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
    }
    Ok(())
}

/// Per row, from `relay.backoff_ms` doubling up to `relay.max_backoff_ms`. Equal jitter: a row
/// has a limited number of attempts (see [`Jitter::Equal`]).
pub(super) fn row_backoff(relay: &RelaySettings) -> Backoff {
    Backoff::new(relay.backoff, relay.max_backoff, Jitter::Equal)
}

pub(super) fn lost_claim(row: &OutboxRow, err: &str) -> Outcome {
    log_lost_claim(row, err);
    Outcome::LostClaim
}

pub(super) fn log_lost_claim(row: &OutboxRow, err: &str) {
    warn!(id = row.id, dedupe_key = %row.dedupe_key, error = %err,
        "outbox lease expired before the failure was recorded; the row's new owner decides");
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
    // key, so a resend after a crash between send and its record is recognisably a duplicate.
    let span = send_span(row, event.job_id, &event.tenant);
    let sent = tokio::time::timeout(timeout, services.mailer.send(&email, &row.dedupe_key))
        .instrument(span.clone())
        .await;
    let sent = match sent {
        Ok(result) => result.map(|()| event).map_err(SendError::from),
        Err(_) => Err(MailError::Timeout { after: timeout }.into()),
    };
    if let Err(e) = &sent {
        telemetry::fail(&span, e.disposition().class());
    }
    sent
}

/// The `send` span of one outbox row, a child of the step that wrote the row (the commit),
/// so the email or webhook is the last step of the job's trace.
pub(super) fn send_span(row: &OutboxRow, job_id: JobId, tenant: &TenantId) -> tracing::Span {
    let span = otel_span!(
        "send",
        "producer",
        job_id,
        tenant,
        "summaryd.topic" = %row.topic,
        "summaryd.outbox_id" = row.id
    );
    if let Some(trace) = &row.trace {
        telemetry::continue_from(&span, trace);
    }
    span
}
