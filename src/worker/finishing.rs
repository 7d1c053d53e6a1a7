//! Finishing a delivery after its consumer moved on: the commit of its summary and its
//! acknowledgement go on in a task of their own while the consumer takes its next job.
//!
//! Why: a consumer that waits for its job's commit and acknowledgement before it takes
//! the next spends the group commit's wait, a transaction and a round trip per job doing
//! nothing. With a slow model that is a few percent of every model call's time; with a
//! fast one it is most of the consumer's cycle. The finisher overlaps them with the next
//! job's take, pre-check and model call.
//!
//! How: once a delivery's summary is in hand (and the budget reservation its
//! acknowledgement settles is read, on the consumer's connection), a finisher task sends
//! it to the group commit, extends the entry's claim while it waits (on a pooled
//! connection, checked out only when an extension is due), and acknowledges it through
//! the acker task. A consumer has at most one finisher: before it starts the next, it
//! waits for the one before and settles what that one left, as if the delivery had ended
//! in line. What a finisher leaves (a commit that failed, was cut short or lost its claim;
//! an acknowledgement Redis refused) is settled by its consumer exactly as in line: the
//! same decisions (`settle.rs`), refunds and held retries. Without the acker task (acks
//! of one at a time asked for), every delivery ends in line.
//!
//! Nothing in the guarantees changes (`docs/delivery.md`, "Finishing after the consumer
//! moved on"): the entry is acknowledged only after its row is committed; it stays
//! claimed by its consumer until then (a finisher extends the claim as the delivery did);
//! a crash leaves it pending as before; and a shutdown waits for the finisher, cut short
//! at the same moment a delivery is.

use std::time::Duration;

use tracing::Instrument;

use super::WorkerServices;
use super::batching::Joining;
use super::complete::acknowledge_batched;
use super::consumer::{Consumer, Finisher, Left, Ran, Spans, Unsettled, Work, WorkerError};
use super::handler;
use super::liveness::{ClaimConn, Claimant};
use super::settle::{Finish, Settlement};
use crate::domain::{Job, ModelSummary};
use crate::stream::consumer_group::Delivery;
use crate::stream::job_state::Reservation;

/// A delivery whose summary is ready to commit, for a finisher.
pub(super) struct Finishing {
    pub(super) delivery: Delivery,
    pub(super) job: Job,
    pub(super) deliveries: u64,
    pub(super) summary: ModelSummary,
    pub(super) joining: Joining,
    /// What the job reserved of its tenant's budget, read before the commit.
    pub(super) reservation: Option<Reservation>,
    pub(super) spans: Spans,
}

impl Consumer {
    /// Hand `finishing` to a finisher of its own, then wait for the finisher before it and
    /// settle what that one left (`Err` when Redis failed doing so: that entry is held).
    pub(super) async fn finish_later(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        finishing: Finishing,
    ) -> Result<(), WorkerError> {
        let spans = finishing.spans.clone();
        let task = finish(self.services.clone(), self.claimant(), finishing)
            .instrument(spans.job)
            .instrument(spans.deliver);
        let before = self.finisher.replace(Finisher(tokio::spawn(task)));
        match before {
            Some(before) => self.settle_left(conn, before).await,
            None => Ok(()),
        }
    }

    /// Whether this consumer's finisher has ended, so waiting for it costs nothing.
    pub(super) fn finisher_ended(&self) -> bool {
        self.finisher
            .as_ref()
            .is_some_and(|Finisher(task)| task.is_finished())
    }

    /// Wait for this consumer's finisher, if it has one, and settle what it left.
    pub(super) async fn finish_pending(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
    ) -> Result<(), WorkerError> {
        match self.finisher.take() {
            Some(finisher) => self.settle_left(conn, finisher).await,
            None => Ok(()),
        }
    }

    async fn settle_left(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        Finisher(task): Finisher,
    ) -> Result<(), WorkerError> {
        let left = match task.await {
            Ok(left) => left,
            // Aborted with its runtime, or a bug: the entry is still pending, and its
            // claim lapses into a redelivery.
            Err(e) => {
                tracing::error!(error = %e, "a delivery's finisher ended without an answer; the job is redelivered");
                return Ok(());
            }
        };
        match left {
            Left::Nothing => Ok(()),
            Left::Settle(unsettled) => {
                let Unsettled {
                    delivery,
                    job,
                    deliveries,
                    ran,
                    spans,
                } = *unsettled;
                async {
                    // The summary took the delivery's calls along: none are left here.
                    let outcome = self.handled(ran, &job, Vec::new()).await;
                    self.conclude(conn, delivery, &job, deliveries, outcome, &spans.deliver)
                        .await
                }
                .instrument(spans.job.clone())
                .instrument(spans.deliver.clone())
                .await
            }
            Left::Hold {
                delivery,
                deliveries,
                finish,
                error,
            } => {
                let redo = Work::Settle(Settlement::Ack(finish));
                self.hold(delivery, Some(deliveries), redo, Duration::ZERO);
                Err(error)
            }
        }
    }
}

/// Commit the delivery's summary (its claim extended meanwhile) and acknowledge it.
async fn finish(services: WorkerServices, claimant: Claimant, finishing: Finishing) -> Left {
    let Finishing {
        delivery,
        job,
        deliveries,
        summary,
        joining,
        reservation,
        spans,
    } = finishing;
    let commit = handler::commit(&services, joining, &job, summary);
    let ran = claimant
        .extend_while(ClaimConn::Pool(&services.redis), &delivery, commit)
        .await;
    let finish = match ran {
        Ran::Finished(Ok(finished)) => Finish::of(finished),
        ran => {
            return Left::Settle(Box::new(Unsettled {
                delivery,
                job,
                deliveries,
                ran,
                spans,
            }));
        }
    };
    match acknowledge_batched(&services, &delivery, &job, finish, reservation).await {
        Ok(()) => Left::Nothing,
        Err(error) => Left::Hold {
            delivery,
            deliveries,
            finish,
            error,
        },
    }
}
