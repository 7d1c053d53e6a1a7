//! Batched acknowledgements: the finished jobs of one worker process are acknowledged
//! together, one MULTI/EXEC per shard for whatever acknowledgements are queued, instead of
//! one round trip each.
//!
//! Why: group commit (`committer.rs`) answers a whole batch of consumers at once, and each
//! would then send its own acknowledgement. Sent together they cost Redis one round trip
//! and one transaction for the batch, and with `SUMMARYD_REDIS_MIN_REPLICAS_ACK` one WAIT
//! for the batch instead of one per job.
//!
//! Nothing in the guarantees changes: a delivery's acknowledgement is handed over only
//! after its job's row is committed, and what Redis answers is settled by its consumer
//! (`finishing.rs`); the
//! batch is all or nothing (an error leaves every entry of it pending, and each job's next
//! delivery finds its row and acknowledges it as a duplicate); a crash before the batch
//! reaches Redis leaves the same. Acknowledgements wait for nothing but a batch being
//! written: they arrive together from a group commit, so no wait is added.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::batching::{Batching, gather};
use crate::domain::Job;
use crate::infra::keys::Shards;
use crate::infra::metrics::Metrics;
use crate::infra::redis::{Conn, RedisPool};
use crate::stream::budget::Settle;
use crate::stream::consumer_group::{self as group, Ack, Delivery};
use crate::stream::replicas::{self, ReplicaAcks};

/// Acknowledgements that may wait for the acker: one per consumer of a large process.
const QUEUE: usize = 1024;

/// The handle consumers acknowledge through; cheap to clone. Without an acker (batches of 1
/// asked for, or no runtime to run one on) each consumer acknowledges on its own connection.
#[derive(Clone)]
pub(crate) struct Acker {
    requests: Option<mpsc::Sender<Request>>,
    keys: Shards,
    acks: Option<ReplicaAcks>,
    metrics: Arc<Metrics>,
}

struct Request {
    shard: u16,
    msg_id: String,
    job: Job,
    settle: Option<Settle>,
    reply: oneshot::Sender<redis::RedisResult<()>>,
}

impl Acker {
    /// Start the acker task of this process (on the current Tokio runtime); batches of at
    /// most `max`.
    pub(crate) fn start(
        redis: RedisPool,
        keys: Shards,
        max: usize,
        acks: Option<ReplicaAcks>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let batching = Batching {
            max,
            wait: Duration::ZERO,
        };
        let requests =
            (batching.batches() && tokio::runtime::Handle::try_current().is_ok()).then(|| {
                let (tx, rx) = mpsc::channel(QUEUE);
                let acker = Self {
                    requests: None,
                    keys: keys.clone(),
                    acks,
                    metrics: metrics.clone(),
                };
                tokio::spawn(acker.run(redis, rx, batching));
                tx
            });
        Self {
            requests,
            keys,
            acks,
            metrics,
        }
    }

    /// Acknowledge `delivery` of the finished `job`, settling its budget (`settle`), and
    /// answer once Redis has done it (and, with replica acks asked for, the replicas were
    /// waited for: a write they do not confirm in time stays done, logged and counted).
    /// `conn` is the consumer's own, used when there is no acker.
    pub(crate) async fn ack(
        &self,
        conn: &mut Conn,
        delivery: &Delivery,
        job: &Job,
        settle: Option<Settle>,
    ) -> redis::RedisResult<()> {
        if self.requests.is_none() {
            let keys = self.keys.get(delivery.shard);
            group::ack_settling(conn, keys, &delivery.id, job, settle.as_ref()).await?;
            self.confirm(conn, delivery.shard, "ack").await;
            return Ok(());
        }
        self.ack_batched(delivery, job, settle).await
    }

    /// Whether acknowledgements go through the acker task, so a caller needs no Redis
    /// connection of its own for them.
    pub(crate) fn batches(&self) -> bool {
        self.requests.is_some()
    }

    /// [`Acker::ack`] through the acker task; an error when there is none
    /// ([`Acker::batches`]).
    pub(crate) async fn ack_batched(
        &self,
        delivery: &Delivery,
        job: &Job,
        settle: Option<Settle>,
    ) -> redis::RedisResult<()> {
        let Some(requests) = &self.requests else {
            return Err(stopped());
        };
        let (reply, answer) = oneshot::channel();
        let request = Request {
            shard: delivery.shard,
            msg_id: delivery.id.clone(),
            job: job.clone(),
            settle,
            reply,
        };
        if requests.send(request).await.is_err() {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    async fn run(
        self,
        redis: RedisPool,
        mut requests: mpsc::Receiver<Request>,
        batching: Batching,
    ) {
        let mut batch = Vec::with_capacity(batching.max);
        while let Some(first) = requests.recv().await {
            batch.push(first);
            gather(&mut requests, &mut batch, batching, None).await;
            self.metrics.ack_batch_jobs.observe(batch.len() as f64);
            let mut by_shard: BTreeMap<u16, Vec<Request>> = BTreeMap::new();
            for request in batch.drain(..) {
                by_shard.entry(request.shard).or_default().push(request);
            }
            for (shard, requests) in by_shard {
                let result = self.ack_shard(&redis, shard, &requests).await;
                for request in requests {
                    // A consumer that stopped waiting (cut short at shutdown) is not told.
                    let _ = request.reply.send(result.clone());
                }
            }
        }
    }

    /// One shard's acknowledgements in one MULTI/EXEC, then the replicas' WAIT for them.
    async fn ack_shard(
        &self,
        redis: &RedisPool,
        shard: u16,
        requests: &[Request],
    ) -> redis::RedisResult<()> {
        let mut conn = redis.get().await.map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::Io,
                "no Redis connection for the acknowledgements",
                e.to_string(),
            ))
        })?;
        let acks: Vec<Ack<'_>> = requests
            .iter()
            .map(|r| Ack {
                msg_id: &r.msg_id,
                job: &r.job,
                settle: r.settle.as_ref(),
            })
            .collect();
        group::ack_many(&mut conn, self.keys.get(shard), &acks).await?;
        self.confirm(&mut conn, shard, "ack").await;
        Ok(())
    }

    /// With `SUMMARYD_REDIS_MIN_REPLICAS_ACK` set, wait for the replicas to confirm the
    /// finishing writes (`op`: `ack`, `dead_letter`) just made on `conn` for `shard`. A
    /// write they do not confirm in time stays done: the jobs' effects are committed in
    /// Postgres exactly once, and doing it again would not make the acknowledgement any
    /// safer. The risk left is a failover before the replicas catch up, which redelivers
    /// the jobs; their next deliveries find the summaries and acknowledge them as
    /// duplicates. So it is logged and counted.
    pub(crate) async fn confirm(&self, conn: &mut Conn, shard: u16, op: &'static str) {
        let Some(acks) = self.acks else {
            return;
        };
        // The shard's stream names the primary that took the write (on a cluster).
        let route_key = self.keys.get(shard).stream();
        if let Err(e) = replicas::confirm(conn, &route_key, acks).await {
            self.metrics
                .replica_ack_timeouts
                .with_label_values(&[op])
                .inc();
            tracing::warn!(error = %e, op, "finishing write not confirmed by the replicas in time; kept");
        }
    }
}

/// The acker stops only with its process; the entry stays pending for the next delivery.
fn stopped() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "the process is stopping: acknowledgement not sent",
    ))
}
