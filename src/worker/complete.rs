//! Carrying a [`Settlement`] out: the Redis calls, metrics and log lines each decision of
//! `settle.rs` stands for, and nothing that decides.

use chrono::Utc;

use super::WorkerServices;
use super::consumer::{Consumer, Work, WorkerError};
use super::dead_reason::DeadReason;
use super::gate::POSTGRES;
use super::settle::{Finish, Pending, Refund, RefundOf, Settlement, retry_after};
use crate::db::{model_calls, outbox, summaries};
use crate::domain::{Job, ModelCall, ModelSummary, WebhookEvent};
use crate::stream::consumer_group::{self as group, Delivery};
use crate::stream::job_state::Reservation;
use crate::stream::{budget, dead_letters, job_state};

/// Where a finished job's spend is read from (`settle_of`).
#[derive(Debug, Clone, Copy)]
enum Spent {
    Summary,
    Calls,
}

impl Consumer {
    /// `Err` when Redis failed: the entry is still this consumer's then.
    pub(super) async fn carry_out(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        job: &Job,
        settlement: Settlement,
    ) -> Result<(), WorkerError> {
        match settlement {
            Settlement::Ack(finish) => {
                let reservation = self.reservation(conn, delivery, job).await?;
                let settle = settle_of(&self.services, job, reservation, Spent::Summary).await;
                // With the others of its group commit, in one round trip (`acker.rs`).
                self.services.acker.ack(conn, delivery, job, settle).await?;
                acked(&self.services, job, finish);
            }
            Settlement::LeavePending(Pending::Failed(reason)) => {
                self.count("retry");
                tracing::warn!(%reason, "job failed; will be redelivered");
                self.note_failure(conn, delivery, job, &reason).await;
            }
            Settlement::LeavePending(Pending::Unchecked(error)) => {
                self.count("retry");
                tracing::warn!(%error, "cannot check for a summary; will be redelivered");
            }
            Settlement::RefundAndHold {
                dependency,
                down,
                reason,
                refund,
                summary,
            } => {
                self.count("retry");
                self.gate.close(dependency, down);
                let refunded = self.refund(conn, delivery, refund).await;
                if let Some(retry) = retry_after(refunded, refund, &self.limits()) {
                    if refunded == Refund::Denied {
                        tracing::warn!(dependency, %reason, count = retry.count, "job not finished: dependency down; the job has had its refunds, so this delivery counts");
                        self.note_failure(conn, delivery, job, &reason).await;
                    } else {
                        tracing::warn!(dependency, %reason, "job not finished: dependency down; it is retried once it is back, and this delivery does not count");
                    }
                    let work = Work::Run(summary);
                    self.hold(delivery.clone(), Some(retry.count), work, retry.wait);
                }
            }
            Settlement::RetryCounted {
                dependency,
                reason,
                retry,
                summary,
            } => {
                self.count("retry");
                tracing::warn!(dependency, %reason, retry_in_ms = retry.wait.as_millis() as u64, "job failed on a dependency that answers; retrying it as another delivery");
                let why = format!(
                    "{reason} ({dependency} answered a probe right after: the job is at fault)"
                );
                self.note_failure(conn, delivery, job, &why).await;
                self.hold(
                    delivery.clone(),
                    Some(retry.count),
                    Work::Run(summary),
                    retry.wait,
                );
            }
            Settlement::Continue { reason, retry } => {
                self.count("retry");
                tracing::info!(%reason, "job in parts stopped after storing new parts; it goes on at once, and this delivery does not count");
                self.hold(
                    delivery.clone(),
                    Some(retry.count),
                    Work::Run(None),
                    retry.wait,
                );
            }
            Settlement::Refund(refund) => {
                self.count("retry");
                let refunded = self.refund(conn, delivery, refund).await;
                tracing::warn!(
                    ?refunded,
                    "delivery cut short by shutdown; the entry is left for the next consumer"
                );
            }
            Settlement::Drop => {}
            Settlement::DeadLetter(reason) => {
                self.dead_letter(conn, delivery, Some(job), &reason).await?;
            }
        }
        Ok(())
    }

    /// Refund a delivery (`claim_own`): what became of the refund.
    async fn refund(
        &self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        refund: RefundOf,
    ) -> Refund {
        let claim = refund.claim();
        match group::claim_own(
            conn,
            self.services.keys.get(delivery.shard),
            &self.name,
            delivery,
            claim,
        )
        .await
        {
            Ok(Some(reclaimed)) if reclaimed.refunded => Refund::Refunded,
            Ok(Some(_)) => Refund::Denied,
            Ok(None) => Refund::NotOurs,
            Err(e) => {
                tracing::warn!(error = %e, "could not refund the delivery; its retry takes its place");
                Refund::Failed
            }
        }
    }

    /// Dead-letter the entry; a job with a webhook first gets its `summary.failed` event in
    /// the outbox. First, because Postgres and Redis share no transaction: an event
    /// committed before a dead letter that then fails is written again (the same webhook-id,
    /// so once) by the retry of this settlement, while a dead letter made before a crash
    /// would have no event at all. `job` is `None` for an entry that is no job.
    pub(super) async fn dead_letter(
        &self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        job: Option<&Job>,
        reason: &DeadReason,
    ) -> Result<(), WorkerError> {
        if let Some(job) = job
            && let Some(url) = &job.webhook
        {
            let event = WebhookEvent::failed(job, url.clone(), &reason.tenant, Utc::now());
            outbox::record_event(&self.services.pg, &event)
                .await
                .map_err(|e| WorkerError::Paused {
                    dependency: POSTGRES,
                    reason: format!("recording the job's summary.failed webhook: {e}"),
                })?;
        }
        let settle = match job {
            Some(job) => {
                let reservation = self.reservation(conn, delivery, job).await?;
                settle_of(&self.services, job, reservation, Spent::Calls).await
            }
            None => None,
        };
        let moved = dead_letters::add_settling(
            conn,
            self.services.keys.get(delivery.shard),
            &self.name,
            &delivery.id,
            &delivery.fields,
            dead_letters::Why {
                reason: &reason.operator,
                class: reason.class,
                tenant_error: &reason.tenant,
            },
            settle.as_ref(),
        )
        .await?;
        if moved {
            // Confirmed by the replicas as an acknowledgement is (`acker.rs`).
            self.services
                .acker
                .confirm(conn, delivery.shard, "dead_letter")
                .await;
            self.count("dead_lettered");
            tracing::error!(msg_id = %delivery.id, reason = %reason.operator, "job dead-lettered");
        } else {
            tracing::warn!(msg_id = %delivery.id, reason = %reason.operator, "not dead-lettered: the entry is no longer pending for this consumer");
        }
        Ok(())
    }

    /// Keep the model calls of a delivery that did not commit its job, with those of the
    /// summary it wrote (`summary`: its commit failed), in one write before the delivery is
    /// settled. A failed write never holds the settlement up: it is logged and counted, and
    /// the calls stay with the summary, when there is one, to be committed with it.
    pub(super) async fn keep_calls(
        &self,
        job: &Job,
        mut calls: Vec<ModelCall>,
        mut summary: Option<&mut ModelSummary>,
    ) {
        if let Some(summary) = summary.as_deref_mut() {
            calls.append(&mut summary.calls);
        }
        if calls.is_empty() {
            return;
        }
        match model_calls::record(&self.services.pg, job.job_id, &job.tenant, &calls).await {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, calls = calls.len(), "could not record the delivery's model calls");
                self.calls_kept_with(summary, calls);
            }
        }
    }

    /// Keep `calls` with `summary` to be committed with it; without one they are lost,
    /// and counted (`summaryd_model_calls_unrecorded_total`).
    pub(super) fn calls_kept_with(
        &self,
        summary: Option<&mut ModelSummary>,
        mut calls: Vec<ModelCall>,
    ) {
        match summary {
            Some(summary) => summary.calls.append(&mut calls),
            None if calls.is_empty() => {}
            None => {
                tracing::warn!(
                    calls = calls.len(),
                    "the delivery's model calls are not recorded: Postgres could not take them"
                );
                self.services
                    .metrics
                    .model_calls_unrecorded
                    .inc_by(calls.len() as u64);
            }
        }
    }

    /// Keep why a counted delivery failed for the dead letter's reason. Best effort: a
    /// Redis that fails here fails the next step too, and the reason only says less.
    async fn note_failure(
        &self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        job: &Job,
        reason: &str,
    ) {
        let keys = self.services.keys.get(delivery.shard);
        if let Err(e) = job_state::note_failure(conn, keys, job.job_id, reason).await {
            tracing::debug!(error = %e, "could not note why the delivery failed");
        }
    }

    /// `summaryd_jobs_total{outcome}`.
    fn count(&self, outcome: &str) {
        count(&self.services, outcome);
    }

    /// What `job` holds reserved of its tenant's budget (`None`: no budget, or settled):
    /// as the dispatch that handed the entry out read it, else from the job state.
    pub(super) async fn reservation(
        &self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        job: &Job,
    ) -> redis::RedisResult<Option<Reservation>> {
        if let Some(seen) = delivery.reservation.of(job.job_id) {
            return Ok(seen);
        }
        let keys = self.services.keys.get(delivery.shard);
        job_state::reservation(conn, keys, job.job_id).await
    }
}

/// Acknowledge the finished `job` through the acker task (`Acker::batches`), its budget
/// settled with `reservation`, read before: what a delivery whose commit finishes after
/// its consumer moved on does (`finishing.rs`).
pub(super) async fn acknowledge_batched(
    services: &WorkerServices,
    delivery: &Delivery,
    job: &Job,
    finish: Finish,
    reservation: Option<Reservation>,
) -> Result<(), WorkerError> {
    let settle = settle_of(services, job, reservation, Spent::Summary).await;
    services.acker.ack_batched(delivery, job, settle).await?;
    acked(services, job, finish);
    Ok(())
}

/// The metrics and log line of an acknowledged job.
fn acked(services: &WorkerServices, job: &Job, finish: Finish) {
    match finish {
        Finish::Summarised => {
            services
                .metrics
                .job_latency
                .with_label_values(&["summarised"])
                .observe(crate::infra::metrics::seconds_since(job.created_at));
            count(services, "done");
            tracing::info!(outcome = "done", "job finished");
        }
        Finish::Duplicate => {
            count(services, "duplicate");
            tracing::info!(outcome = "duplicate", "job finished");
        }
        Finish::AckLost => count(services, "duplicate"),
    }
}

fn count(services: &WorkerServices, outcome: &str) {
    services.metrics.jobs.with_label_values(&[outcome]).inc();
}

/// How the job's budget reservation is settled when it finishes, if it holds one
/// (`reservation`, read from its state): `Spent::Summary`, the usage its committed summary
/// reports (the whole job, parts included, whichever delivery committed it);
/// `Spent::Calls`, what its recorded model calls reported (a dead letter). When Postgres
/// cannot say, the reservation is charged in full: a budget is never under-charged, and
/// the job is not held up for it.
async fn settle_of(
    services: &WorkerServices,
    job: &Job,
    reservation: Option<Reservation>,
    spent: Spent,
) -> Option<budget::Settle> {
    let reservation = reservation?;
    let pg = &services.pg;
    let reported = match spent {
        Spent::Summary => summaries::spent_tokens(pg, job.job_id).await,
        Spent::Calls => model_calls::for_job(pg, &job.job_id).await.map(|calls| {
            Some(
                calls
                    .iter()
                    .map(|c| {
                        u64::from(c.prompt_tokens.unwrap_or(0))
                            + u64::from(c.completion_tokens.unwrap_or(0))
                    })
                    .sum(),
            )
        }),
    };
    let spent = reported.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not read what the job spent; its budget is charged the whole reservation");
        None
    });
    Some(budget::Settle { reservation, spent })
}
