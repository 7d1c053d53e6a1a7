//! Taking work: nothing while the gate is closed; else an entry this consumer holds, else
//! one idle past `claim_idle` (its worker died), else a new one.

use super::consumer::{Consumer, WorkerError};
use super::gate::{MODEL, POSTGRES};
use crate::db::summaries;
use crate::stream::consumer_group::{self as group, CURSOR_START, Delivery};

/// Entries taken per read or claim. One: a consumer processes its entries one after the
/// other, so a prefetched entry would sit idle in our PEL and could be reclaimed (and paid
/// for twice) while it waits. Parallelism comes from more consumers instead.
const BATCH: usize = 1;

/// An entry handed to this consumer.
pub(super) struct Taken {
    pub(super) delivery: Delivery,
    /// Its delivery count, when taking it told us (re-claiming a held entry does).
    pub(super) deliveries: Option<u64>,
}

impl Consumer {
    /// One held entry, else an entry idle past `claim_idle`, else whatever new entry
    /// arrives within `block`. Only with the gate open ([`Self::check_gate`]).
    pub(super) async fn take(
        &mut self,
        conn: &mut deadpool_redis::Connection,
    ) -> Result<Vec<Taken>, WorkerError> {
        if let Some(held) = self.held.pop_front() {
            let id = held.delivery.id.clone();
            let recounted = group::claim_own(
                conn,
                &self.services.keys,
                &self.name,
                &id,
                held.recount.delta(),
            )
            .await;
            return match recounted {
                Ok(Some(count)) => Ok(vec![Taken {
                    delivery: held.delivery,
                    deliveries: Some(count),
                }]),
                // Finished or reclaimed elsewhere meanwhile: not ours to retry.
                Ok(None) => Ok(Vec::new()),
                Err(e) => {
                    self.held.push_front(held);
                    Err(e.into())
                }
            };
        }
        let mut deliveries = self.claim_idle(conn).await?;
        if deliveries.is_empty() {
            deliveries = group::read_new(
                conn,
                &self.services.keys,
                &self.name,
                BATCH,
                self.config.block,
            )
            .await?;
        }
        Ok(deliveries
            .into_iter()
            .map(|delivery| Taken {
                delivery,
                deliveries: None,
            })
            .collect())
    }

    /// Probe the dependencies that are down and this consumer can check; `Paused` while any
    /// dependency is still down. The model is down while every provider's breaker is open:
    /// then no entry is taken or claimed, so no delivery count moves during the outage.
    pub(super) async fn check_gate(&self) -> Result<(), WorkerError> {
        if self.gate.is_down(POSTGRES) {
            match summaries::probe(&self.services.pg).await {
                Ok(()) => {
                    self.gate.open(POSTGRES);
                }
                Err(e) => self.gate.close(POSTGRES, e.to_string()),
            }
        }
        let model = &self.services.model;
        // Breakers whose cooldown is over get their probe, in its own task.
        model.probe_due();
        if model.all_open() {
            self.gate.close(MODEL, model.outage_reason());
        } else {
            self.gate.open(MODEL);
        }
        match self.gate.down().into_iter().next() {
            Some((dependency, reason)) => Err(WorkerError::Paused { dependency, reason }),
            None => Ok(()),
        }
    }

    /// XAUTOCLAIM from the kept cursor. When that scan reaches the end without claiming
    /// anything, rescan once from the start, so claimable work before the cursor is not
    /// left waiting for another whole pass.
    async fn claim_idle(
        &mut self,
        conn: &mut deadpool_redis::Connection,
    ) -> Result<Vec<Delivery>, WorkerError> {
        loop {
            let started_at_beginning = self.cursor == CURSOR_START;
            let (next, claimed, deleted) = group::autoclaim(
                conn,
                &self.services.keys,
                &self.name,
                self.config.claim_idle,
                &self.cursor,
                BATCH,
            )
            .await?;
            if !deleted.is_empty() {
                // Pending entries trimmed from the stream; the job they carried is gone.
                tracing::error!(ids = ?deleted, "pending stream entries were deleted before being processed");
            }
            self.cursor = next;
            if !claimed.is_empty() || started_at_beginning || self.cursor != CURSOR_START {
                return Ok(claimed);
            }
        }
    }
}
