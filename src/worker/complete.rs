//! Carrying a [`Settlement`] out: the Redis calls, metrics and log lines each decision of
//! `settle.rs` stands for, and nothing that decides.

use super::consumer::{Consumer, WorkerError};
use super::dead_reason::DeadReason;
use super::settle::{Finish, Pending, Recount, Refund, Settlement, retry_after};
use crate::domain::Job;
use crate::stream::consumer_group::{self as group, Delivery};
use crate::stream::dead_letters;

impl Consumer {
    /// `Err` when Redis failed: the entry is still this consumer's then.
    pub(super) async fn carry_out(
        &mut self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        job: &Job,
        settlement: Settlement,
    ) -> Result<(), WorkerError> {
        match settlement {
            Settlement::Ack(finish) => {
                group::ack_done(conn, &self.services.keys, &delivery.id, job).await?;
                match finish {
                    Finish::Summarised => {
                        self.services
                            .metrics
                            .job_latency
                            .with_label_values(&["summarised"])
                            .observe(crate::infra::metrics::seconds_since(job.created_at));
                        self.count("done");
                        tracing::info!(outcome = "done", "job finished");
                    }
                    Finish::Duplicate => {
                        self.count("duplicate");
                        tracing::info!(outcome = "duplicate", "job finished");
                    }
                    Finish::AckLost => self.count("duplicate"),
                }
            }
            Settlement::LeavePending(Pending::Failed(reason)) => {
                self.count("retry");
                tracing::warn!(%reason, "job failed; will be redelivered");
            }
            Settlement::LeavePending(Pending::Unchecked(error)) => {
                self.count("retry");
                tracing::warn!(%error, "cannot check for a summary; will be redelivered");
            }
            Settlement::RefundAndHold {
                dependency,
                down,
                reason,
            } => {
                self.count("retry");
                self.gate.close(dependency, down);
                let refund = match group::claim_own(
                    conn,
                    &self.services.keys,
                    &self.name,
                    &delivery.id,
                    Recount::Refund.delta(),
                )
                .await
                {
                    Ok(Some(_)) => Refund::Refunded,
                    Ok(None) => Refund::NotOurs,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not refund the delivery; its retry takes its place");
                        Refund::Failed
                    }
                };
                if let Some(recount) = retry_after(refund) {
                    tracing::warn!(dependency, %reason, "job not tried: dependency down; it is retried once it is back, and this delivery does not count");
                    self.hold(delivery.clone(), recount);
                }
            }
            Settlement::RetryCounted { dependency, reason } => {
                self.count("retry");
                tracing::warn!(dependency, %reason, "job failed on a dependency that answers again; retrying it as another delivery");
                self.hold(delivery.clone(), Recount::Count);
            }
            Settlement::DeadLetter(reason) => self.dead_letter(conn, delivery, &reason).await?,
        }
        Ok(())
    }

    pub(super) async fn dead_letter(
        &self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        reason: &DeadReason,
    ) -> Result<(), WorkerError> {
        let moved = dead_letters::add(
            conn,
            &self.services.keys,
            &self.name,
            &delivery.id,
            &delivery.fields,
            &reason.operator,
            &reason.tenant,
        )
        .await?;
        if moved {
            self.count("dead_lettered");
            tracing::error!(msg_id = %delivery.id, reason = %reason.operator, "job dead-lettered");
        } else {
            tracing::warn!(msg_id = %delivery.id, reason = %reason.operator, "not dead-lettered: the entry is no longer pending for this consumer");
        }
        Ok(())
    }

    /// `summaryd_jobs_total{outcome}`.
    fn count(&self, outcome: &str) {
        self.services
            .metrics
            .jobs
            .with_label_values(&[outcome])
            .inc();
    }
}
