//! Running one delivery: learn its count, read the job, run it (or, out of deliveries, only
//! look for an earlier commit), and ask a dependency it stopped at whether it is down. What
//! that comes to is an [`Outcome`]; `settle` decides what it means and `complete.rs` acts.

use std::collections::HashMap;
use std::time::Duration;

use tracing::{Instrument, Span};

use super::consumer::{Consumer, Ran, Spans, Work, WorkerError};
use super::dead_reason::DeadReason;
use super::finishing::Finishing;
use super::gate::{MODEL, POSTGRES};
use super::handler::{self, JobOutcome, Prepared, Unfinished};
use super::job_error::JobError;
use super::settle::{
    Admission, Limits, ModelCheck, Outcome, Probe, Settlement, admit, model_check, settle,
};
use super::take::Taken;
use crate::db::summaries;
use crate::domain::{CallLog, Job, ModelCall, ModelSummary, ReasonClass};
use crate::infra::telemetry::{self, otel_span};
use crate::resilience::failure::{Classify, Disposition};
use crate::stream::consumer_group::{self as group, Delivery};
use crate::stream::{job_entry, job_state};

impl Consumer {
    /// Run `taken` and carry out what its outcome means. `Err` only when Redis failed on
    /// the way: the entry is then held to retry what was left.
    pub(super) async fn deliver(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        taken: Taken,
    ) -> Result<(), WorkerError> {
        let Taken {
            delivery,
            deliveries,
            work,
        } = taken;
        let job = match job_entry::from_fields(&delivery.fields) {
            Ok(job) => job,
            Err(malformed) => {
                let reason = DeadReason::malformed(malformed);
                return match self.dead_letter(conn, &delivery, None, &reason).await {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        let redo = Work::Settle(Settlement::DeadLetter(reason));
                        self.hold(delivery, None, redo, Duration::ZERO);
                        Err(e)
                    }
                };
            }
        };
        let summary = match work {
            Work::Settle(settlement) => {
                return self
                    .settle_or_hold(conn, delivery, &job, deliveries, settlement)
                    .await;
            }
            Work::Run(summary) => summary,
        };
        let deliveries = match deliveries {
            Some(count) => count,
            None => match group::delivery_count(
                conn,
                self.services.keys.get(delivery.shard),
                &delivery.id,
            )
            .await
            {
                Ok(Some(count)) => count,
                // Acknowledged by another consumer since we took it: nothing left to do.
                Ok(None) => return Ok(()),
                Err(e) => {
                    // Not tried: the retry takes this delivery's place, with its count.
                    self.hold(delivery, None, Work::Run(summary), Duration::ZERO);
                    return Err(e.into());
                }
            },
        };
        let limits = self.limits();
        let deliver = deliver_span(&job, deliveries, &delivery.fields);
        // Inside `deliver`, so a log line of the delivery finds its trace through it.
        let span = deliver.in_scope(
            || tracing::info_span!("job", job_id = %job.job_id, msg_id = %delivery.id, deliveries),
        );
        let spans = Spans { deliver, job: span };
        async {
            let outcome = match admit(deliveries, &limits) {
                Admission::Run => {
                    let ran = self
                        .run_job(conn, &delivery, &job, summary, deliveries, &spans)
                        .await;
                    match ran {
                        Ok(outcome) => outcome,
                        // Its commit goes on without this consumer (`finishing.rs`).
                        Err(handed) => return handed,
                    }
                }
                Admission::GiveUp => self.look_for_commit(conn, &job).await,
            };
            self.conclude(conn, delivery, &job, deliveries, outcome, &spans.deliver)
                .await
        }
        .instrument(spans.job.clone())
        .instrument(spans.deliver.clone())
        .await
    }

    /// Settle a delivery that came to `outcome`, marking its span with why it failed.
    pub(super) async fn conclude(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        delivery: Delivery,
        job: &Job,
        deliveries: u64,
        outcome: Outcome,
        deliver: &Span,
    ) -> Result<(), WorkerError> {
        if let Some(class) = failure_class(&outcome) {
            telemetry::fail(deliver, class);
        }
        let settlement = settle(outcome, deliveries, &self.limits());
        self.settle_or_hold(conn, delivery, job, Some(deliveries), settlement)
            .await
    }

    /// Carry `settlement` out; when Redis fails on the way, hold the entry to carry it out
    /// again, not to run the job again.
    pub(super) async fn settle_or_hold(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        delivery: Delivery,
        job: &Job,
        deliveries: Option<u64>,
        settlement: Settlement,
    ) -> Result<(), WorkerError> {
        match self
            .carry_out(conn, &delivery, job, settlement.clone())
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => {
                self.hold(
                    delivery,
                    deliveries,
                    Work::Settle(settlement),
                    Duration::ZERO,
                );
                Err(e)
            }
        }
    }

    pub(super) fn limits(&self) -> Limits {
        Limits::new(self.config.max_deliveries, self.config.claim_idle)
    }

    /// The job, its claim extended while it runs, starting from `summary` when an earlier
    /// delivery got one; `deliveries` is this delivery's number. `Err` when its summary's
    /// commit was handed to a finisher (`finishing.rs`), with what settling the delivery
    /// before it came to.
    async fn run_job(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        job: &Job,
        summary: Option<ModelSummary>,
        deliveries: u64,
        spans: &Spans,
    ) -> Result<Outcome, Result<(), WorkerError>> {
        let services = self.services.clone();
        let calls = CallLog::new(deliveries).for_job(job.job_id, job.tenant.clone());
        let prepared = self
            .with_claim_extended(
                conn,
                delivery,
                handler::prepare(&services, job, summary, &calls),
            )
            .await;
        let (summary, joining) = match prepared {
            Ran::Finished(Ok(Prepared::Ready(summary, joining))) => (summary, joining),
            // Nothing to commit: a duplicate, a failure, a cut or a lost claim.
            ended => {
                let ran = match ended {
                    Ran::Finished(Ok(_)) => Ran::Finished(Ok(JobOutcome::Duplicate)),
                    Ran::Finished(Err(unfinished)) => Ran::Finished(Err(unfinished)),
                    Ran::CutShort => Ran::CutShort,
                    Ran::ClaimLost => Ran::ClaimLost,
                };
                return Ok(self.handled(ran, job, calls.take()).await);
            }
        };
        if self.services.acker.batches() {
            // The budget reservation its acknowledgement settles, known now (read with
            // the entry, or here on this consumer's connection): the finisher then needs
            // no connection of its own. Unread, the job commits here instead.
            if let Ok(reservation) = self.reservation(conn, delivery, job).await {
                let finishing = Finishing {
                    delivery: delivery.clone(),
                    job: job.clone(),
                    deliveries,
                    summary,
                    joining,
                    reservation,
                    spans: spans.clone(),
                };
                return Err(self.finish_later(conn, finishing).await);
            }
        }
        let committed = self
            .with_claim_extended(
                conn,
                delivery,
                handler::commit(&services, joining, job, summary),
            )
            .await;
        Ok(self.handled(committed, job, calls.take()).await)
    }

    /// What a delivery whose job ran (`ran`) comes to. A committed summary took this
    /// delivery's calls along; whatever is left (`left`: a delivery that failed, was cut
    /// short or lost its claim) is kept here, before it is settled.
    pub(super) async fn handled(
        &self,
        ran: Ran<Result<JobOutcome, Unfinished>>,
        job: &Job,
        left: Vec<ModelCall>,
    ) -> Outcome {
        let handled = match ran {
            Ran::Finished(handled) => handled,
            Ran::CutShort => {
                self.keep_calls(job, left, None).await;
                return Outcome::CutShort;
            }
            Ran::ClaimLost => {
                self.keep_calls(job, left, None).await;
                return Outcome::ClaimLost;
            }
        };
        match handled {
            Ok(finished) => {
                self.keep_calls(job, left, None).await;
                Outcome::Finished(finished)
            }
            Err(Unfinished {
                error,
                mut summary,
                progressed,
            }) => {
                // Postgres known down: the write would only wait to fail; the calls stay
                // with the summary (when there is one) and are committed with it.
                let postgres_down = error.dependency() == POSTGRES && error.is_unavailable();
                if postgres_down {
                    self.calls_kept_with(summary.as_mut(), left);
                } else {
                    self.keep_calls(job, left, summary.as_mut()).await;
                }
                self.unfinished(error, summary, progressed).await
            }
        }
    }

    /// What a delivery that did not finish its job comes to.
    async fn unfinished(
        &self,
        error: JobError,
        summary: Option<ModelSummary>,
        progressed: bool,
    ) -> Outcome {
        match error.disposition() {
            Disposition::Transient { .. } if progressed => Outcome::Progressed(error.to_string()),
            Disposition::Transient { .. } => Outcome::Failed(error.to_string()),
            Disposition::Unavailable => {
                let probe = self.probe_after(&error).await;
                Outcome::Unavailable {
                    dependency: error.dependency(),
                    reason: error.to_string(),
                    probe,
                    summary,
                }
            }
            Disposition::Permanent => Outcome::Rejected(error.dead_reason()),
        }
    }

    /// Out of deliveries: whether an earlier delivery committed the job.
    async fn look_for_commit(&self, conn: &mut crate::infra::redis::Conn, job: &Job) -> Outcome {
        match summaries::exists(&self.services.pg, job.job_id).await {
            Ok(true) => Outcome::CommittedEarlier,
            Ok(false) => {
                // The dead letter says why, where the last failure was noted; without it, it
                // still goes (its reason only says less).
                let keys = self.services.keys.of_tenant(job.tenant.as_str());
                let last = job_state::get(conn, keys, job.job_id)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|state| state.last_failure);
                Outcome::Exhausted(last)
            }
            Err(e) if e.is_unavailable() => Outcome::Unavailable {
                dependency: POSTGRES,
                probe: self.probe_postgres().await,
                reason: e.to_string(),
                summary: None,
            },
            Err(e) => Outcome::Unchecked(e.to_string()),
        }
    }

    /// Whether the dependency `error` stopped at is down, asked right now, since the failure
    /// may also be the job's own.
    ///
    /// The model: a delivery that called no provider (every breaker was open before it
    /// could) did not try the job, so the model counts as down. One whose own calls opened
    /// the last breaker asks a probe at once: a provider that answers it means this job
    /// is at fault (a text a guardrail refuses, or that makes the model fail), and its
    /// breaker closes again so the other jobs go on.
    async fn probe_after(&self, error: &JobError) -> Probe {
        if error.dependency() == POSTGRES {
            return self.probe_postgres().await;
        }
        match model_check(error.called_model()) {
            ModelCheck::Confirm => match self.services.model.confirm_outage().await {
                Ok(()) => {
                    // Wake the consumers that paused when the breaker opened.
                    self.gate.open(MODEL);
                    Probe::Answers
                }
                Err(down) => Probe::Down(down),
            },
            ModelCheck::Down => Probe::Down(self.services.model.outage_reason()),
        }
    }

    /// Postgres's write path, as a delivery uses it (`summaries::probe`).
    pub(super) async fn probe_postgres(&self) -> Probe {
        match summaries::probe(&self.services.pg).await {
            Ok(()) => Probe::Answers,
            Err(e) => Probe::Down(e.to_string()),
        }
    }
}

/// The `deliver` span. The first delivery continues the accept's trace (the context the
/// entry carries); a redelivery starts a trace of its own, linked to that one, so the
/// accept's trace is not stretched over the hours a job may wait between deliveries and
/// each delivery reads as one whole trace (`docs/tracing.md`).
fn deliver_span(job: &Job, deliveries: u64, fields: &HashMap<String, redis::Value>) -> Span {
    let span = otel_span!(
        "deliver",
        "consumer",
        job.job_id,
        job.tenant,
        // As an int attribute: the OpenTelemetry layer writes u64 values as strings.
        "summaryd.deliveries" = i64::try_from(deliveries).unwrap_or(i64::MAX),
        "messaging.system" = "redis"
    );
    if let Some(accepted) = job_entry::trace_context(fields) {
        if deliveries <= 1 {
            telemetry::continue_from(&span, &accepted);
        } else {
            telemetry::link_to(&span, &accepted);
        }
    }
    span
}

/// The class a delivery that did not finish its job is marked with.
fn failure_class(outcome: &Outcome) -> Option<&'static str> {
    match outcome {
        Outcome::Finished(_) | Outcome::CommittedEarlier => None,
        Outcome::Failed(_) | Outcome::Progressed(_) => Some(Disposition::TRANSIENT.class()),
        Outcome::Unavailable { .. } => Some(Disposition::Unavailable.class()),
        Outcome::Rejected(reason) => Some(reason.class.as_str()),
        Outcome::CutShort => Some("cut_short"),
        Outcome::ClaimLost => Some("claim_lost"),
        Outcome::Exhausted(_) => Some(ReasonClass::MaxDeliveries.as_str()),
        Outcome::Unchecked(_) => Some(Disposition::TRANSIENT.class()),
    }
}
