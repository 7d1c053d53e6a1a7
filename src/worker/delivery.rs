//! Running one delivery: learn its count, read the job, run it (or, out of deliveries, only
//! look for an earlier commit), and ask a dependency it stopped at whether it is down. What
//! that comes to is an [`Outcome`]; `settle` decides what it means and `complete.rs` acts.

use tracing::Instrument;

use super::consumer::{Consumer, WorkerError};
use super::dead_reason::DeadReason;
use super::gate::{MODEL, POSTGRES};
use super::handler::handle_summary_job;
use super::settle::{Admission, Limits, Outcome, Probe, admit, settle};
use super::take::Taken;
use crate::db::summaries;
use crate::domain::Job;
use crate::resilience::failure::{Classify, Disposition};
use crate::stream::consumer_group as group;
use crate::stream::job_entry;

impl Consumer {
    /// Run `taken` and carry out what its outcome means. `Err` only when Redis failed on
    /// the way: the entry is still this consumer's then.
    pub(super) async fn deliver(
        &mut self,
        conn: &mut deadpool_redis::Connection,
        taken: &Taken,
    ) -> Result<(), WorkerError> {
        let delivery = &taken.delivery;
        let deliveries = match taken.deliveries {
            Some(count) => count,
            None => match group::delivery_count(conn, &self.services.keys, &delivery.id).await? {
                Some(count) => count,
                // Acknowledged by another consumer since we took it: nothing left to do.
                None => return Ok(()),
            },
        };
        let limits = Limits {
            max_deliveries: self.config.max_deliveries,
        };
        let job = match job_entry::from_fields(&delivery.fields) {
            Ok(job) => job,
            Err(malformed) => {
                return self
                    .dead_letter(conn, delivery, &DeadReason::malformed(malformed))
                    .await;
            }
        };
        let span =
            tracing::info_span!("job", job_id = %job.job_id, msg_id = %delivery.id, deliveries);
        async {
            let outcome = match admit(deliveries, &limits) {
                Admission::Run => self.run_job(conn, &delivery.id, &job).await,
                Admission::GiveUp => self.look_for_commit(&job).await,
            };
            let settlement = settle(outcome, &limits);
            self.carry_out(conn, delivery, &job, settlement).await
        }
        .instrument(span)
        .await
    }

    /// The job, its claim extended while it runs.
    async fn run_job(
        &self,
        conn: &mut deadpool_redis::Connection,
        msg_id: &str,
        job: &Job,
    ) -> Outcome {
        let services = self.services.clone();
        let handled = self
            .with_claim_extended(conn, msg_id, handle_summary_job(&services, job))
            .await;
        match handled {
            Ok(finished) => Outcome::Finished(finished),
            Err(err) => match err.disposition() {
                Disposition::Transient { .. } => Outcome::Failed(err.to_string()),
                Disposition::Unavailable => {
                    self.stopped_at(err.dependency(), err.to_string()).await
                }
                Disposition::Permanent => Outcome::Rejected(err.dead_reason()),
            },
        }
    }

    /// Out of deliveries: whether an earlier delivery committed the job.
    async fn look_for_commit(&self, job: &Job) -> Outcome {
        match summaries::exists(&self.services.pg, job.job_id).await {
            Ok(true) => Outcome::CommittedEarlier,
            Ok(false) => Outcome::Exhausted,
            Err(e) if e.is_unavailable() => self.stopped_at(POSTGRES, e.to_string()).await,
            Err(e) => Outcome::Unchecked(e.to_string()),
        }
    }

    /// The delivery stopped at `dependency`; whether that means the dependency is down is
    /// for a probe right now to say, since the failure may also be this job's own.
    async fn stopped_at(&self, dependency: &'static str, reason: String) -> Outcome {
        let probe = match self.probe(dependency).await {
            Ok(()) => Probe::Answers,
            Err(down) => Probe::Down(down),
        };
        Outcome::Unavailable {
            dependency,
            reason,
            probe,
        }
    }

    /// Whether `dependency` answers right now (`Err` with why not). Dependencies this
    /// consumer cannot check count as answering.
    async fn probe(&self, dependency: &'static str) -> Result<(), String> {
        match dependency {
            POSTGRES => summaries::probe(&self.services.pg)
                .await
                .map_err(|e| e.to_string()),
            MODEL if self.services.model.all_open() => Err(self.services.model.outage_reason()),
            _ => Ok(()),
        }
    }
}
