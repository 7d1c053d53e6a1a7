//! Taking work: nothing while the gate is closed; else an entry this consumer holds and
//! whose retry is due, else one idle past `claim_idle` (its worker died), else a new one.

use std::time::Duration;

use tokio::time::Instant;

use super::consumer::{Consumer, Held, Work, WorkerError};
use super::gate::{MODEL, POSTGRES};
use super::settle::Probe;
use crate::infra::keys::RedisKeys;
use crate::stream::consumer_group::{self as group, CURSOR_START, ClaimCount, Delivery};

/// Entries taken per read or claim. One: a consumer processes its entries one after the
/// other, so a prefetched entry would sit idle in our PEL and could be reclaimed (and paid
/// for twice) while it waits. Parallelism comes from more consumers instead.
const BATCH: usize = 1;
/// The shortest wait on one shard's doorbell when `block` is shared among many shards: a
/// consumer that finds no work anywhere sleeps at least this long between rounds.
const MIN_SHARD_WAIT: Duration = Duration::from_millis(100);

/// An entry handed to this consumer.
pub(super) struct Taken {
    pub(super) delivery: Delivery,
    /// Its delivery count, when taking it told us: 1 for an entry read new, the count a
    /// re-claim of a held entry set; `None` for an idle entry claimed (the PEL says).
    pub(super) deliveries: Option<u64>,
    pub(super) work: Work,
}

impl Consumer {
    /// A held entry that is due, else an entry idle past `claim_idle`, else whatever new
    /// entry arrives within `block` (or until a held entry is due). Only with the gate open
    /// ([`Self::check_gate`]). After a held entry the next take looks for other work first,
    /// so entries that keep being held cannot starve new ones.
    pub(super) async fn take(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
    ) -> Result<Vec<Taken>, WorkerError> {
        let now = Instant::now();
        let due = self.held.iter().position(|held| held.due <= now);
        if let Some(index) = due.filter(|_| !self.took_held)
            && let Some(held) = self.held.remove(index)
        {
            self.took_held = true;
            return self.retake(conn, held).await;
        }
        self.took_held = false;
        // Wait for new work only until the next held entry is due (not at all when one is
        // due already).
        let block = self
            .held
            .iter()
            .map(|held| held.due.saturating_duration_since(now))
            .min()
            .map_or(self.config.block, |until| until.min(self.config.block));
        let (claimed, mut new) = if self.services.keys.count() == 1 {
            self.claim_idle_and_dispatch(conn, block).await?
        } else {
            let claimed = self.claim_idle(conn).await?;
            let new = if claimed.is_empty() {
                self.read_new(conn, block).await?
            } else {
                Vec::new()
            };
            (claimed, new)
        };
        // Our own claim of an entry we hold (it sat idle past `claim_idle`) supersedes the
        // held retry, which would otherwise run it twice. Ids are per shard.
        self.held.retain(|held| {
            !claimed
                .iter()
                .any(|d| d.id == held.delivery.id && d.shard == held.delivery.shard)
        });
        if !claimed.is_empty() {
            // Taken together with a claim, a new entry waits while the claimed one runs, and
            // nothing extends its claim meanwhile: it is held, due now, so the next take
            // re-claims it first (it runs only while still ours) instead of running it here
            // after a job that may outlast `claim_idle`.
            for delivery in new.drain(..) {
                self.held.push_front(Held {
                    delivery,
                    count: None,
                    work: Work::Run(None),
                    due: now,
                });
            }
        }
        // An entry read new (XREADGROUP `>`, which every read here is) has been delivered
        // exactly once, by this read; only a claim moves the count to something the PEL
        // must be asked for. Known, it saves the delivery its XPENDING round trip.
        let taken = |deliveries| {
            move |delivery| Taken {
                delivery,
                deliveries,
                work: Work::Run(None),
            }
        };
        Ok(claimed
            .into_iter()
            .map(taken(None))
            .chain(new.into_iter().map(taken(Some(1))))
            .collect())
    }

    /// One shard: its idle entries and a new one asked for in one round trip
    /// ([`group::autoclaim_and_dispatch`]); when neither is there, the wait for new work
    /// ([`Self::read_new`]'s, without its first read, which this was).
    async fn claim_idle_and_dispatch(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        block: Duration,
    ) -> Result<(Vec<Delivery>, Vec<Delivery>), WorkerError> {
        let shards = self.services.keys.clone();
        let keys = shards.get(0);
        let started_at_beginning = self.cursors[0] == CURSOR_START;
        let found = group::autoclaim_and_dispatch(
            conn,
            keys,
            &self.name,
            self.config.claim_idle,
            &self.cursors[0],
        )
        .await?;
        report_deleted(&found.deleted, 0);
        self.cursors[0] = found.next_cursor;
        let mut claimed = found.claimed;
        let mut new: Vec<Delivery> = found.new.into_iter().collect();
        if claimed.is_empty()
            && new.is_empty()
            && !started_at_beginning
            && self.cursors[0] == CURSOR_START
        {
            // The scan ended without a claim and there is nothing new to run: rescan once
            // from the start, as `claim_idle_in` does. With a new entry in hand the rescan
            // is the next take's, whose scan starts from the start anyway.
            claimed = self.claim_idle_in(conn, keys).await?;
        }
        if claimed.is_empty() && new.is_empty() && group::wait_for_work(conn, keys, block).await? {
            new = group::read_now(conn, keys, &self.name, BATCH).await?;
        }
        Ok((claimed, new))
    }

    /// Hand a held entry out again, with the count its retry carries; nothing when it is no
    /// longer ours (finished or reclaimed elsewhere meanwhile).
    async fn retake(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        held: Held,
    ) -> Result<Vec<Taken>, WorkerError> {
        if let Work::Settle(_) = held.work {
            // What is left is owner-checked or idempotent by itself.
            return Ok(vec![Taken {
                delivery: held.delivery,
                deliveries: held.count,
                work: held.work,
            }]);
        }
        let count = held.count.map_or(ClaimCount::Keep, ClaimCount::Set);
        let keys = self.services.keys.get(held.delivery.shard);
        match group::claim_own(conn, keys, &self.name, &held.delivery, count).await {
            Ok(Some(reclaimed)) => Ok(vec![Taken {
                delivery: held.delivery,
                deliveries: Some(reclaimed.count),
                work: held.work,
            }]),
            Ok(None) => Ok(Vec::new()),
            Err(e) => {
                // The count is set, not moved: sending the same claim again is safe.
                self.held.push_front(held);
                Err(e.into())
            }
        }
    }

    /// Probe the dependencies that are down and this consumer can check; `Paused` while any
    /// dependency is still down. The model is down while every provider's breaker is open:
    /// then no entry is taken or claimed, so no delivery count moves during the outage.
    pub(super) async fn check_gate(&self) -> Result<(), WorkerError> {
        if self.gate.is_down(POSTGRES) {
            match self.probe_postgres().await {
                Probe::Answers => {
                    self.gate.open(POSTGRES);
                }
                Probe::Down(why) => self.gate.close(POSTGRES, why),
            }
        }
        let model = &self.services.model;
        // The fleet's breakers first: a worker started during an outage takes no job.
        model.sync_shared().await;
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

    /// New work from the shards in turn, starting with the one whose turn it is; when none
    /// has any, wait on one shard's doorbell (the next turn's), for `block` shared out
    /// among the shards so a job on a shard nobody waits on is found within about `block`.
    async fn read_new(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        block: Duration,
    ) -> Result<Vec<Delivery>, WorkerError> {
        let shards = self.services.keys.clone();
        if shards.count() == 1 {
            return Ok(group::read_new(conn, shards.get(0), &self.name, BATCH, block).await?);
        }
        for _ in 0..shards.count() {
            let keys = shards.get(self.next_shard);
            self.next_shard = next(self.next_shard, shards.count());
            let taken = group::read_now(conn, keys, &self.name, BATCH).await?;
            if !taken.is_empty() {
                return Ok(taken);
            }
        }
        let keys = shards.get(self.next_shard);
        let wait = (block / shards.count() as u32).max(MIN_SHARD_WAIT.min(block));
        if group::wait_for_work(conn, keys, wait).await? {
            return Ok(group::read_now(conn, keys, &self.name, BATCH).await?);
        }
        Ok(Vec::new())
    }

    /// XAUTOCLAIM from one shard per take, the shards in turn: an entry a dead worker left
    /// is found within as many takes as there are shards, and a take costs one XAUTOCLAIM
    /// however many shards there are.
    async fn claim_idle(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
    ) -> Result<Vec<Delivery>, WorkerError> {
        let shards = self.services.keys.clone();
        let keys = shards.get(self.claim_shard);
        self.claim_shard = next(self.claim_shard, shards.count());
        self.claim_idle_in(conn, keys).await
    }

    /// XAUTOCLAIM from the shard's kept cursor. When that scan reaches the end without
    /// claiming anything, rescan once from the start, so claimable work before the cursor
    /// is not left waiting for another whole pass.
    async fn claim_idle_in(
        &mut self,
        conn: &mut crate::infra::redis::Conn,
        keys: &RedisKeys,
    ) -> Result<Vec<Delivery>, WorkerError> {
        let shard = usize::from(keys.shard());
        loop {
            let cursor = &mut self.cursors[shard];
            let started_at_beginning = *cursor == CURSOR_START;
            let (next, claimed, deleted) = group::autoclaim(
                conn,
                keys,
                &self.name,
                self.config.claim_idle,
                cursor,
                BATCH,
            )
            .await?;
            report_deleted(&deleted, shard);
            *cursor = next;
            if !claimed.is_empty() || started_at_beginning || *cursor != CURSOR_START {
                return Ok(claimed);
            }
        }
    }
}

/// Pending entries a claim found trimmed from the stream: the jobs they carried are gone.
fn report_deleted(ids: &[String], shard: usize) {
    if !ids.is_empty() {
        tracing::error!(
            ?ids,
            shard,
            "pending stream entries were deleted before being processed"
        );
    }
}

/// The shard after `shard`, round the ring.
fn next(shard: u16, count: usize) -> u16 {
    u16::try_from((usize::from(shard) + 1) % count.max(1)).unwrap_or(0)
}
