//! The webhooks' half of a relay pass: claim due webhook rows, sign and post each, record
//! what the receiver answered, and disable an endpoint that asked for it (410 Gone) or that
//! has failed every delivery for `SUMMARYD_WEBHOOK_DISABLE_AFTER_S`.

use futures_util::future::join_all;
use tracing::{Instrument, error, info, warn};

use super::pass::{Outcome, PassReport, lost_claim, row_backoff, send_span};
use super::{RelayError, RelayServices};
use crate::db::outbox::{self, Failure, OutboxRow};
use crate::db::webhooks;
use crate::domain::WebhookEvent;
use crate::infra::telemetry;
use crate::resilience::failure::{Classify, Disposition};
use crate::webhook::WebhookError;

/// What became of one webhook row in this pass.
enum Sent {
    Row(Outcome),
    /// Its endpoint is disabled: recorded as skipped, not sent.
    Skipped,
}

pub(super) async fn webhook_pass(services: &RelayServices) -> Result<PassReport, RelayError> {
    let relay = &services.settings.relay;
    let rows =
        outbox::claim_due(&services.pg, WebhookEvent::TOPIC, relay.batch, relay.lease).await?;
    // Concurrently, as emails are: the batch ends within about one webhook timeout, inside
    // the lease (config requires lease > webhook timeout).
    let outcomes = join_all(rows.iter().map(|row| deliver(services, row))).await;
    let mut report = PassReport {
        claimed: rows.len(),
        ..PassReport::default()
    };
    let mut first_error = None;
    for outcome in outcomes {
        match outcome {
            Ok(Sent::Row(Outcome::Sent | Outcome::Accepted { .. })) => report.sent += 1,
            Ok(Sent::Row(Outcome::Retrying)) => report.retrying += 1,
            Ok(Sent::Row(Outcome::Stuck)) => report.stuck += 1,
            Ok(Sent::Row(Outcome::LostClaim | Outcome::Waiting { .. })) => {
                report.lost_claims += 1;
            }
            Ok(Sent::Skipped) => report.skipped += 1,
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

fn count(services: &RelayServices, result: &str) {
    services
        .metrics
        .webhook_deliveries
        .with_label_values(&[result])
        .inc();
}

async fn deliver(services: &RelayServices, row: &OutboxRow) -> Result<Sent, RelayError> {
    let pg = &services.pg;
    let id = row.dedupe_key.as_str();
    let event = match WebhookEvent::decode(&row.payload) {
        Ok(event) => event,
        Err(invalid) => {
            let failure = Failure {
                error: &invalid.to_string(),
                status: None,
            };
            return refused(services, row, failure).await;
        }
    };
    let url = event.url.as_str();
    let endpoint = webhooks::endpoint(pg, &event.tenant, url).await?;
    if let Some(disabled) = endpoint.disabled {
        let error = format!(
            "not sent: the endpoint is disabled for tenant {} since {} ({}); \
             `summaryd webhook enable` and `summaryd webhook replay` send it",
            event.tenant, disabled.at, disabled.reason
        );
        let failure = Failure {
            error: &error,
            status: None,
        };
        return skip(services, row, failure).await;
    }
    let span = send_span(row, event.body.data.job_id, &event.tenant);
    let sent = match services.signing.secrets(&event.tenant) {
        // The request carries this span's context as its `traceparent`.
        Some(secrets) => {
            services
                .webhooks
                .send(&event, id, &secrets)
                .instrument(span.clone())
                .await
        }
        None => Err(WebhookError::NoSecrets {
            tenant: event.tenant.to_string(),
        }),
    };
    if let Err(e) = &sent {
        telemetry::fail(&span, e.disposition().class());
    }
    let failed = match sent {
        Ok(delivered) => {
            let status = Some(i32::from(delivered.status));
            if outbox::mark_delivered(pg, row.id, status).await? {
                info!(
                    id = row.id,
                    webhook_id = id,
                    status = delivered.status,
                    "webhook delivered"
                );
            } else {
                info!(
                    id = row.id,
                    webhook_id = id,
                    "webhook delivered again; already recorded"
                );
            }
            if endpoint.failing {
                webhooks::note_success(pg, &event.tenant, url).await?;
            }
            count(services, "delivered");
            return Ok(Sent::Row(Outcome::Sent));
        }
        Err(failed) => failed,
    };
    let error = failed.to_string();
    let failure = Failure {
        error: &error,
        status: failed.status().map(i32::from),
    };
    if failed.is_gone() {
        if webhooks::disable(pg, &event.tenant, url, "410 Gone").await? {
            warn!(tenant = %event.tenant, webhook_id = id,
                "webhook endpoint answered 410 Gone: disabled for this tenant; later events to it are skipped");
        }
        return skip(services, row, failure).await;
    }
    match failed.disposition() {
        Disposition::Permanent => refused(services, row, failure).await,
        Disposition::Transient { retry_after } => {
            let relay = &services.settings.relay;
            let failures = u32::try_from(row.attempts).unwrap_or(0);
            // The receiver's own wait, capped like every other wait of the relay.
            let backoff = retry_after.map_or_else(
                || row_backoff(relay).delay(failures),
                |wait| wait.min(relay.max_backoff),
            );
            let give_up = services.settings.webhook.give_up();
            let mark =
                outbox::mark_attempt_failed(pg, row.id, row.claim_token, failure, backoff, give_up)
                    .await?;
            let disable_after = services.settings.webhook.disable_after();
            if let Some(reason) =
                webhooks::note_failure(pg, &event.tenant, url, disable_after).await?
            {
                error!(tenant = %event.tenant, reason,
                    "webhook endpoint disabled for this tenant; later events to it are skipped");
            }
            match mark {
                None => Ok(Sent::Row(lost_claim(row, &error))),
                Some(mark) if mark.past_give_up => {
                    error!(id = row.id, webhook_id = id, attempts = mark.attempts, error = %error,
                        "webhook still failing past SUMMARYD_WEBHOOK_GIVE_UP_S since its first failure; it needs a person (summaryd webhook deliveries --failed / replay)");
                    count(services, "stuck");
                    Ok(Sent::Row(Outcome::Stuck))
                }
                Some(mark) => {
                    warn!(id = row.id, webhook_id = id, attempts = mark.attempts, error = %error,
                        retry_in_ms = backoff.as_millis() as u64, "webhook failed; will retry");
                    count(services, "retrying");
                    Ok(Sent::Row(Outcome::Retrying))
                }
            }
        }
        // A receiver never makes the whole relay wait; nothing maps here.
        Disposition::Unavailable => refused(services, row, failure).await,
    }
}

/// No attempt can change it: parked for a person.
async fn refused(
    services: &RelayServices,
    row: &OutboxRow,
    failure: Failure<'_>,
) -> Result<Sent, RelayError> {
    if !outbox::mark_attempt_refused(&services.pg, row.id, row.claim_token, failure).await? {
        return Ok(Sent::Row(lost_claim(row, failure.error)));
    }
    error!(id = row.id, webhook_id = %row.dedupe_key, error = failure.error,
        "webhook failed permanently; it needs a person (summaryd webhook deliveries --failed / replay)");
    count(services, "stuck");
    Ok(Sent::Row(Outcome::Stuck))
}

async fn skip(
    services: &RelayServices,
    row: &OutboxRow,
    failure: Failure<'_>,
) -> Result<Sent, RelayError> {
    if !outbox::mark_skipped(&services.pg, row.id, row.claim_token, failure).await? {
        return Ok(Sent::Row(lost_claim(row, failure.error)));
    }
    info!(id = row.id, webhook_id = %row.dedupe_key, error = failure.error, "webhook skipped");
    count(services, "skipped");
    Ok(Sent::Skipped)
}
