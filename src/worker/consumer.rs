//! One consumer of the job stream: retry what it holds, else reclaim idle work, else read
//! new work, and act on what the handler decided. Concurrency comes from running several of
//! these, each its own task. What spends a delivery and what does not: `docs/delivery.md`.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::WorkerServices;
use super::dead_reason::DeadReason;
use super::gate::{DependencyGate, MODEL, POSTGRES};
use super::handler::{JobError, JobOutcome, handle_summary_job};
use crate::config::WorkerSettings;
use crate::db::summaries;
use crate::domain::Job;
use crate::resilience::backoff::{Backoff, Jitter};
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
/// Pause between probes of a dependency that is down, from 200 ms doubling up to 2 s. Short:
/// once it is back, the entries the consumers hold are retried within this long, and a
/// probe is one cheap statement. No jitter, for the same reason as above.
const PROBE_BACKOFF: Backoff = Backoff::new(
    Duration::from_millis(200),
    Duration::from_secs(2),
    Jitter::None,
);
/// At most this long between two runs of consumer cleanup: a couple of cheap commands, and
/// gone consumers only cost a line in XINFO meanwhile. Shorter when `consumer_gc_ms` is.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);
/// Floor on how often a running delivery extends its claim, so a tiny `claim_idle_ms` (as
/// in tests that reclaim at once) does not turn the extension into a busy loop.
const MIN_EXTEND_EVERY: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("could not get a Redis connection: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    /// A dependency a delivery needs is down: no work is taken until it answers again.
    #[error("not taking work while {dependency} is down: {reason}")]
    Paused {
        dependency: &'static str,
        reason: String,
    },
}

impl WorkerError {
    /// The `kind` label of `summaryd_loop_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkerError::Redis(e) if e.code().is_some() => "redis_error",
            WorkerError::Redis(_) | WorkerError::Pool(_) => "redis_unavailable",
            WorkerError::Paused {
                dependency: POSTGRES,
                ..
            } => "postgres_unavailable",
            WorkerError::Paused { .. } => "dependency_unavailable",
        }
    }

    /// How long to wait after `failures` failed passes in a row (0 for the first).
    fn wait(&self, failures: u32) -> Duration {
        match self {
            WorkerError::Paused { .. } => PROBE_BACKOFF.delay(failures),
            _ => ERROR_BACKOFF.delay(failures),
        }
    }
}

/// The knobs of one consumer; from `WorkerSettings`, adjustable per consumer in tests.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// XAUTOCLAIM min idle time: how soon a dead worker's entry is taken over. A running
    /// delivery re-claims its entry every third of it, so it need not exceed the slowest job.
    pub claim_idle: Duration,
    /// Deliveries after which a job is dead-lettered instead of run again.
    pub max_deliveries: u64,
    /// XREADGROUP BLOCK; also bounds how long a shutdown waits for an idle consumer.
    pub block: Duration,
    /// How long a consumer's liveness mark lasts without a refresh; consumers without a
    /// mark, idle this long, with nothing pending, are removed from the group.
    pub consumer_gc: Duration,
}

impl ConsumerConfig {
    /// A running delivery re-claims its entry this often: a third of `claim_idle_ms`, so two
    /// extensions can be late (a slow Redis, a pause) before the entry looks idle.
    pub fn extend_every(&self) -> Duration {
        (self.claim_idle / 3).max(MIN_EXTEND_EVERY)
    }

    /// Consumer cleanup runs this often, so a gone consumer is removed within about two
    /// `consumer_gc_ms` of its last mark.
    pub fn maintenance_every(&self) -> Duration {
        (self.consumer_gc / 2).clamp(MIN_EXTEND_EVERY, MAINTENANCE_EVERY)
    }

    /// The liveness mark is refreshed this often: three times per lifetime, so a live
    /// process misses two refreshes before its consumer could look gone.
    fn mark_every(&self) -> Duration {
        (self.consumer_gc / 3).max(MIN_EXTEND_EVERY)
    }
}

impl From<&WorkerSettings> for ConsumerConfig {
    fn from(s: &WorkerSettings) -> Self {
        Self {
            claim_idle: s.claim_idle,
            max_deliveries: s.max_deliveries,
            block: s.block,
            consumer_gc: s.consumer_gc,
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
    /// Entries in this consumer's PEL that a dependency outage (or a Redis error) kept from
    /// being tried. They are retried before any other work as soon as the gate is open, so
    /// they wait seconds after a recovery, not `claim_idle_ms`.
    held: VecDeque<Held>,
    /// Shared by every consumer of the process: one consumer seeing Postgres down stops all.
    gate: Arc<DependencyGate>,
}

/// An entry this consumer still holds, to retry.
struct Held {
    delivery: Delivery,
    /// Change to its delivery count when it is handed out again (see
    /// `group::claim_own`): `+1` when the untried delivery was refunded (the retry is a
    /// delivery of its own), `0` when the refund did not happen (the retry takes its place).
    adjust: i64,
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
        let gate = services.gate.clone();
        Self {
            services,
            name: name.into(),
            config,
            cursor: CURSOR_START.into(),
            held: VecDeque::new(),
            gate,
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

    /// One pass. With the gate closed (a dependency is down), probe what this consumer can
    /// probe and take nothing while it stays down: `WorkerError::Paused`. Otherwise retry one
    /// held entry, else take over an entry idle past `claim_idle_ms`, else wait up to
    /// `block_ms` for a new one; handle what was taken. Returns how many entries were taken.
    pub async fn run_once(&mut self) -> Result<usize, WorkerError> {
        self.check_gate().await?;
        let mut conn = self.services.redis.get().await?;
        let taken = match self.held.pop_front() {
            Some(held) => {
                let id = held.delivery.id.clone();
                let adjusted =
                    group::claim_own(&mut conn, &self.services.keys, &self.name, &id, held.adjust)
                        .await;
                match adjusted {
                    Ok(Some(count)) => vec![(held.delivery, Some(count))],
                    // Finished or reclaimed elsewhere meanwhile: not ours to retry.
                    Ok(None) => Vec::new(),
                    Err(e) => {
                        self.held.push_front(held);
                        return Err(e.into());
                    }
                }
            }
            None => {
                let mut deliveries = self.claim_idle(&mut conn).await?;
                if deliveries.is_empty() {
                    deliveries = group::read_new(
                        &mut conn,
                        &self.services.keys,
                        &self.name,
                        BATCH,
                        self.config.block,
                    )
                    .await?;
                }
                deliveries.into_iter().map(|d| (d, None)).collect()
            }
        };
        let n = taken.len();
        for (delivery, count) in taken {
            if let Err(e) = self.process(&mut conn, &delivery, count).await {
                // Redis failed mid-delivery: the entry is still ours; retry it once Redis
                // answers, in place of this delivery (it may not have been tried).
                self.held.push_back(Held {
                    delivery,
                    adjust: 0,
                });
                return Err(e);
            }
        }
        Ok(n)
    }

    /// Probe the dependencies that are down and this consumer can check; `Paused` while any
    /// dependency is still down. The model is down while every provider's breaker is open:
    /// then no entry is taken or claimed, so no delivery count moves during the outage.
    async fn check_gate(&self) -> Result<(), WorkerError> {
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

    async fn process(
        &mut self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        count: Option<u64>,
    ) -> Result<(), WorkerError> {
        let keys = &self.services.keys;
        let deliveries = match count {
            Some(count) => count,
            None => match group::delivery_count(conn, keys, &delivery.id).await? {
                Some(count) => count,
                // Acknowledged by another consumer since we took it: nothing left to do.
                None => return Ok(()),
            },
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
        self.process_job(conn, delivery, &job, deliveries)
            .instrument(span)
            .await
    }

    async fn process_job(
        &mut self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        job: &Job,
        deliveries: u64,
    ) -> Result<(), WorkerError> {
        if deliveries > self.config.max_deliveries {
            return self.give_up(conn, delivery, job).await;
        }
        let services = self.services.clone();
        let handled = self
            .with_claim_extended(conn, &delivery.id, handle_summary_job(&services, job))
            .await;
        match handled {
            Ok(outcome) => {
                group::ack_done(conn, &self.services.keys, &delivery.id, job).await?;
                let label = match outcome {
                    JobOutcome::Done => {
                        self.services
                            .metrics
                            .job_latency
                            .with_label_values(&["summarised"])
                            .observe(crate::infra::metrics::seconds_since(job.created_at));
                        "done"
                    }
                    JobOutcome::Duplicate => "duplicate",
                };
                self.count(label);
                tracing::info!(outcome = label, "job finished");
                Ok(())
            }
            Err(JobError::Retry(reason)) => {
                // Leave it pending: XAUTOCLAIM redelivers it after claim_idle_ms, which
                // doubles as a coarse backoff between deliveries.
                self.count("retry");
                tracing::warn!(%reason, "job failed; will be redelivered");
                Ok(())
            }
            Err(JobError::Unavailable { dependency, reason }) => {
                self.not_tried(conn, delivery, dependency, &reason).await
            }
            Err(JobError::Dead(reason)) => self.dead_letter(conn, delivery, &reason).await,
        }
    }

    /// Run `work` (one delivery) while re-claiming its entry every `extend_every`, so the
    /// entry never looks idle to XAUTOCLAIM while the delivery runs: a delivery slower than
    /// `claim_idle_ms` is neither reclaimed nor dead-lettered under it, and `claim_idle_ms`
    /// only bounds how soon a dead worker's job is picked up. The re-claim is owner-checked
    /// (`group::claim_own`): an entry that was taken from us meanwhile stays with its taker.
    async fn with_claim_extended<T>(
        &self,
        conn: &mut deadpool_redis::Connection,
        msg_id: &str,
        work: impl Future<Output = T>,
    ) -> T {
        let every = self.config.extend_every();
        let mut work = std::pin::pin!(work);
        let mut next = Instant::now() + every;
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = tokio::time::sleep_until(next) => {
                    next = Instant::now() + every;
                    match group::claim_own(conn, &self.services.keys, &self.name, msg_id, 0).await {
                        Ok(Some(_)) => {}
                        // Finishing is still right: the commit is idempotent.
                        Ok(None) => tracing::warn!("entry no longer pending for this consumer while its delivery runs"),
                        Err(e) => tracing::warn!(error = %e, "could not extend the claim of a running delivery"),
                    }
                }
            }
        }
    }

    /// The delivery stopped at a dependency before the job was tried to the end. If the
    /// dependency is really down, the delivery does not count: refund it, close the gate for
    /// every consumer of the process, and hold the entry to retry as soon as the dependency
    /// answers. If it answers right away, the failure may be this job's own, so the delivery
    /// counts (the retry soon after is a counted delivery too, and the delivery limit still
    /// ends a job that fails this way every time).
    async fn not_tried(
        &mut self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        dependency: &'static str,
        reason: &str,
    ) -> Result<(), WorkerError> {
        self.count("retry");
        if let Err(down) = self.probe(dependency).await {
            self.gate.close(dependency, down);
            let refund =
                group::claim_own(conn, &self.services.keys, &self.name, &delivery.id, -1).await;
            let adjust = match refund {
                Ok(Some(_)) => 1,
                // Finished or reclaimed elsewhere meanwhile: nothing of ours to retry.
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::warn!(error = %e, "could not refund the delivery; its retry takes its place");
                    0
                }
            };
            tracing::warn!(dependency, %reason, "job not tried: dependency down; it is retried once it is back, and this delivery does not count");
            self.held.push_back(Held {
                delivery: delivery.clone(),
                adjust,
            });
        } else {
            tracing::warn!(dependency, %reason, "job failed on a dependency that answers again; retrying it as another delivery");
            self.held.push_back(Held {
                delivery: delivery.clone(),
                adjust: 1,
            });
        }
        Ok(())
    }

    /// Out of deliveries. A job whose summary is committed is done however often its ack
    /// was lost, so it is acknowledged, not dead-lettered.
    async fn give_up(
        &mut self,
        conn: &mut deadpool_redis::Connection,
        delivery: &Delivery,
        job: &Job,
    ) -> Result<(), WorkerError> {
        match summaries::exists(&self.services.pg, job.job_id).await {
            Ok(true) => {
                group::ack_done(conn, &self.services.keys, &delivery.id, job).await?;
                self.count("duplicate");
                Ok(())
            }
            Ok(false) => {
                let reason = DeadReason::exhausted(self.config.max_deliveries);
                self.dead_letter(conn, delivery, &reason).await
            }
            Err(e) if e.is_unavailable() => {
                self.not_tried(conn, delivery, POSTGRES, &e.to_string())
                    .await
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

    fn count(&self, outcome: &str) {
        self.services
            .metrics
            .jobs
            .with_label_values(&[outcome])
            .inc();
    }

    /// Remove consumers that are gone, at the cadence `consumer_gc_ms` asks for (the
    /// maintenance task runs the same cleanup at its own, usually longer, interval).
    pub async fn maintain(&self) -> Result<(), WorkerError> {
        let keys = &self.services.keys;
        let mut conn = self.services.redis.get().await?;
        let removed =
            group::remove_idle_consumers(&mut conn, keys, &self.name, self.config.consumer_gc)
                .await?;
        if !removed.is_empty() {
            tracing::info!(consumers = ?removed, "removed gone consumers with nothing pending");
        }
        Ok(())
    }

    /// Keep this consumer's liveness mark fresh until the returned guard is dropped (the
    /// consumer stops, or the process dies and takes the task with it).
    pub fn keep_alive(&self) -> AliveMark {
        let (services, name) = (self.services.clone(), self.name.clone());
        let ttl = self.config.consumer_gc.max(Duration::from_millis(1));
        let every = self.config.mark_every();
        AliveMark(tokio::spawn(async move {
            loop {
                let marked = async {
                    let mut conn = services.redis.get().await?;
                    group::mark_alive(&mut conn, &services.keys, &name, ttl).await?;
                    Ok::<(), WorkerError>(())
                }
                .await;
                // After a failure (Redis down) try again soon: the mark may have lapsed.
                let wait = match marked {
                    Ok(()) => every,
                    Err(_) => every.min(ERROR_BACKOFF.base),
                };
                tokio::time::sleep(wait).await;
            }
        }))
    }
}

/// Refreshes a consumer's liveness mark while it lives; stops when dropped.
pub struct AliveMark(tokio::task::JoinHandle<()>);

impl Drop for AliveMark {
    fn drop(&mut self) {
        self.0.abort();
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
    let metrics = services.metrics.clone();
    let gate = services.gate.clone();
    let mut consumer = Consumer::new(services.clone(), name);
    let alive = consumer.keep_alive();
    let mut failures: u32 = 0;
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
                next_maintenance = Instant::now() + consumer.config.maintenance_every();
                consumer.maintain().await?;
            }
            consumer.run_once().await
        }
        .await;
        match result {
            Ok(_) => {
                failures = 0;
                metrics.loop_succeeded("worker");
            }
            Err(e) => {
                // Waiting out a model outage is the loop doing its job: every provider's
                // breaker is open, which restarting this process would not fix, so it
                // does not count against readiness (`/readyz` shows the breakers).
                if !matches!(
                    e,
                    WorkerError::Paused {
                        dependency: MODEL,
                        ..
                    }
                ) {
                    metrics.loop_failed("worker", e.kind(), &e.to_string());
                }
                let wait = e.wait(failures);
                failures = failures.saturating_add(1);
                if matches!(e, WorkerError::Paused { .. }) {
                    // The gate logged the outage once; a line per probe would only be noise.
                    tracing::debug!(consumer = %consumer.name(), error = %e, "consumer paused");
                } else {
                    tracing::warn!(consumer = %consumer.name(), error = %e, retry_in_ms = wait.as_millis() as u64, "consumer pass failed");
                    // The group may be gone (Redis restarted without persistence): recreate it.
                    group_ready = false;
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = gate.reopened() => {}
                    _ = shutdown.wait() => {}
                }
            }
        }
    }
    drop(alive);
    // A clean stop: the consumer's mark goes with it, so cleanup need not wait for it to
    // lapse. Best effort; the mark expires by itself anyway.
    if let Ok(mut conn) = services.redis.get().await {
        let _ = group::clear_alive(&mut conn, &services.keys, consumer.name()).await;
    }
    tracing::info!(consumer = %consumer.name(), "consumer stopped");
    Ok(())
}
