//! One consumer of the job stream: reclaim idle work, else read new work, and act on what
//! the handler decided. Concurrency comes from running several of these, each its own task.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::WorkerServices;
use super::handler::{JobOutcome, handle_summary_job};
use crate::backoff::{Backoff, Jitter};
use crate::config::WorkerSettings;
use crate::db::summaries;
use crate::domain::Job;
use crate::failure::Failure;
use crate::shutdown::Shutdown;
use crate::stream::consumer_group::{self as group, CURSOR_START, Delivery};
use crate::stream::{dead_letters, job_entry};

/// Entries taken per read or claim. One: a consumer processes its entries one after the
/// other, so a prefetched entry would sit idle in our PEL and could be reclaimed (and paid
/// for twice) while it waits. Parallelism comes from more consumers instead.
const BATCH: usize = 1;
/// Pause after a failed pass, from 1 s doubling up to 10 s, so a Redis outage is not a busy
/// loop of errors and a Redis that is back is used again within seconds. No jitter: every
/// consumer has its own loop and its own moment of failure.
const ERROR_BACKOFF: Backoff = Backoff::new(
    Duration::from_secs(1),
    Duration::from_secs(10),
    Jitter::None,
);
/// How often each consumer removes dead consumers: a couple of cheap commands, and dead
/// consumers only cost a line in XINFO meanwhile.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("could not get a Redis connection: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
}

/// The knobs of one consumer; from `WorkerSettings`, adjustable per consumer in tests.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// XAUTOCLAIM min idle time; must exceed the slowest successful job, or a live worker's
    /// job is reclaimed from under it (still correct, but the model is paid twice).
    pub claim_idle_ms: u64,
    /// Deliveries after which a job is dead-lettered instead of run again.
    pub max_deliveries: u64,
    /// XREADGROUP BLOCK; also bounds how long a shutdown waits for an idle consumer.
    pub block_ms: u64,
    /// Consumers idle this long with nothing pending are removed from the group.
    pub consumer_gc_ms: u64,
}

impl From<&WorkerSettings> for ConsumerConfig {
    fn from(s: &WorkerSettings) -> Self {
        Self {
            claim_idle_ms: s.claim_idle_ms,
            max_deliveries: s.max_deliveries,
            block_ms: s.block_ms,
            consumer_gc_ms: s.consumer_gc_ms,
        }
    }
}

pub struct Consumer {
    services: WorkerServices,
    name: String,
    pub config: ConsumerConfig,
    /// XAUTOCLAIM cursor, kept across calls so each call continues the scan instead of
    /// rescanning the whole PEL from the start.
    cursor: String,
}

/// `host-pid-index`: unique per process and task, so two consumers never share a PEL.
pub fn consumer_name(index: usize) -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}-{}-{index}", std::process::id())
}

impl Consumer {
    pub fn new(services: WorkerServices, name: impl Into<String>) -> Self {
        let config = ConsumerConfig::from(&services.settings.worker);
        Self {
            services,
            name: name.into(),
            config,
            cursor: CURSOR_START.into(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn ensure_group(&self) -> Result<(), WorkerError> {
        let mut conn = self.services.redis.get().await?;
        group::ensure_group(&mut conn, &self.services.keys).await?;
        Ok(())
    }

    /// One pass: take over entries idle past `claim_idle_ms`, otherwise wait up to
    /// `block_ms` for new ones; handle what was taken. Returns how many entries were taken.
    pub async fn run_once(&mut self) -> Result<usize, WorkerError> {
        let mut conn = self.services.redis.get().await?;
        let mut deliveries = self.claim_idle(&mut conn).await?;
        if deliveries.is_empty() {
            deliveries = group::read_new(
                &mut conn,
                &self.services.keys,
                &self.name,
                BATCH,
                self.config.block_ms,
            )
            .await?;
        }
        let taken = deliveries.len();
        for delivery in deliveries {
            self.process(&mut conn, delivery).await?;
        }
        Ok(taken)
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
                self.config.claim_idle_ms,
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

    async fn process(
        &self,
        conn: &mut deadpool_redis::Connection,
        delivery: Delivery,
    ) -> Result<(), WorkerError> {
        let keys = &self.services.keys;
        let Some(deliveries) = group::delivery_count(conn, keys, &delivery.id).await? else {
            // Acknowledged by another consumer since we took it: nothing left to do.
            return Ok(());
        };
        let job = match job_entry::from_fields(&delivery.fields) {
            Ok(job) => job,
            Err(malformed) => {
                return self
                    .dead_letter(conn, &delivery, &malformed.to_string())
                    .await;
            }
        };
        let span =
            tracing::info_span!("job", job_id = %job.job_id, msg_id = %delivery.id, deliveries);
        self.process_job(conn, &delivery, &job, deliveries)
            .instrument(span)
            .await
    }

    async fn process_job(
        &self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        job: &Job,
        deliveries: u64,
    ) -> Result<(), WorkerError> {
        if deliveries > self.config.max_deliveries {
            return self.give_up(conn, delivery, job).await;
        }
        match handle_summary_job(&self.services, job).await {
            Ok(outcome) => {
                group::ack_done(conn, &self.services.keys, &delivery.id, job.job_id).await?;
                let label = match outcome {
                    JobOutcome::Done => "done",
                    JobOutcome::Duplicate => "duplicate",
                };
                self.count(label);
                tracing::info!(outcome = label, "job finished");
                Ok(())
            }
            Err(Failure::Transient(reason)) => {
                // Leave it pending: XAUTOCLAIM redelivers it after claim_idle_ms, which
                // doubles as a coarse backoff between deliveries.
                self.count("retry");
                tracing::warn!(%reason, "job failed; will be redelivered");
                Ok(())
            }
            Err(e @ Failure::Permanent(_)) => {
                self.dead_letter(conn, delivery, &e.to_string()).await
            }
        }
    }

    /// Out of deliveries. A job whose summary is committed is done however often its ack
    /// was lost, so it is acknowledged, not dead-lettered.
    async fn give_up(
        &self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        job: &Job,
    ) -> Result<(), WorkerError> {
        match summaries::exists(&self.services.pg, job.job_id).await {
            Ok(true) => {
                group::ack_done(conn, &self.services.keys, &delivery.id, job.job_id).await?;
                self.count("duplicate");
                Ok(())
            }
            Ok(false) => {
                let reason = format!("exceeded {} deliveries", self.config.max_deliveries);
                self.dead_letter(conn, delivery, &reason).await
            }
            Err(e) => {
                self.count("retry");
                tracing::warn!(error = %e, "cannot check for a summary; will be redelivered");
                Ok(())
            }
        }
    }

    async fn dead_letter(
        &self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        reason: &str,
    ) -> Result<(), WorkerError> {
        dead_letters::add(
            conn,
            &self.services.keys,
            &delivery.id,
            &delivery.fields,
            reason,
        )
        .await?;
        self.count("dead_lettered");
        tracing::error!(msg_id = %delivery.id, %reason, "job dead-lettered");
        Ok(())
    }

    fn count(&self, outcome: &str) {
        self.services
            .metrics
            .jobs
            .with_label_values(&[outcome])
            .inc();
    }

    /// Remove consumers that are gone. (The stream gauges are read when `/metrics` is
    /// scraped, so nothing here polls them.)
    pub async fn maintain(&self) -> Result<(), WorkerError> {
        let keys = &self.services.keys;
        let mut conn = self.services.redis.get().await?;
        let removed =
            group::remove_idle_consumers(&mut conn, keys, &self.name, self.config.consumer_gc_ms)
                .await?;
        if !removed.is_empty() {
            tracing::info!(consumers = ?removed, "removed idle consumers with nothing pending");
        }
        Ok(())
    }
}

/// Run one consumer until shutdown. Shutdown is checked between passes: no new work is
/// taken after it, and the job in hand finishes (the supervisor aborts us after the grace
/// period; an aborted job simply stays pending and is reclaimed).
pub async fn run(
    services: WorkerServices,
    name: String,
    shutdown: Shutdown,
) -> Result<(), WorkerError> {
    let mut consumer = Consumer::new(services, name);
    let mut failures = 0;
    let mut group_ready = false;
    let mut next_maintenance = Instant::now();
    tracing::info!(consumer = %consumer.name(), "consumer started");
    while !shutdown.is_triggered() {
        let result = async {
            if !group_ready {
                consumer.ensure_group().await?;
                group_ready = true;
            }
            if Instant::now() >= next_maintenance {
                next_maintenance = Instant::now() + MAINTENANCE_EVERY;
                consumer.maintain().await?;
            }
            consumer.run_once().await
        }
        .await;
        match result {
            Ok(_) => failures = 0,
            Err(e) => {
                let wait = ERROR_BACKOFF.delay(failures);
                failures = failures.saturating_add(1);
                tracing::warn!(consumer = %consumer.name(), error = %e, retry_in_ms = wait.as_millis() as u64, "consumer pass failed");
                // The group may be gone (Redis restarted without persistence): recreate it.
                group_ready = false;
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.wait() => {}
                }
            }
        }
    }
    tracing::info!(consumer = %consumer.name(), "consumer stopped");
    Ok(())
}
