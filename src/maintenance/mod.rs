//! The one periodic housekeeping task of a worker or relay process: refresh the
//! cluster-wide gauges `/metrics` serves, remove finished stream entries left behind, and
//! (one replica at a time) apply retention and remove consumers that are gone.
//!
//! Every replica refreshes the gauges itself, so every replica exports the same
//! cluster-wide values (aggregate them with `max`, never `sum`). The gauges are cached in
//! the metrics registry; a scrape only renders them, so no number of scrapes can load
//! Redis or Postgres.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use crate::config::roles::{Role, Roles};
use crate::config::{RetentionSettings, Settings};
use crate::db::{self, DbError};
use crate::infra::keys::RedisKeys;
use crate::infra::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::stream::{consumer_group, dead_letters};

/// Rows deleted per statement: each batch is a short transaction that holds few row locks
/// and little WAL, so retention never competes with the relay and the workers for long.
const DELETE_BATCH: i64 = 500;
/// Rows one pass deletes at most per table; the rest waits for the next pass, so a first
/// run on a large backlog is spread out instead of one long burst of deletes.
const MAX_DELETES_PER_PASS: u64 = 50_000;

/// Advisory lock key of the retention pass ("summaryd" in ASCII). Advisory locks are per
/// database, so deployments on separate databases never contend.
///
/// A Postgres advisory lock rather than a Redis lease: every role that runs maintenance
/// has Postgres (a relay-only process has no Redis); Postgres releases the lock itself
/// when the holder's connection ends, so a killed replica never blocks the others until a
/// lease runs out and no lease length or clock has to be trusted; and taken with
/// `pg_try_advisory_xact_lock` it belongs to a transaction, so it cannot leak on a pooled
/// connection. The steps under it are safe without it too (every delete counts only what
/// it removed); the lock keeps replicas from doing the same work at once.
const RETENTION_LOCK: i64 = 0x7375_6d6d_6172_7964;

#[derive(Debug, thiserror::Error)]
pub enum MaintenanceError {
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("could not get a Redis connection: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for MaintenanceError {
    fn from(e: tokio_postgres::Error) -> Self {
        MaintenanceError::Db(DbError::Query(e))
    }
}

impl From<deadpool_postgres::PoolError> for MaintenanceError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        MaintenanceError::Db(DbError::Pool(e))
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// This process held the retention lock and applied retention.
    pub led: bool,
    pub stream_entries: u64,
    pub dead_letters: u64,
    pub outbox_sent: u64,
    pub summaries: u64,
    pub consumers: u64,
}

impl Report {
    fn removed(&self) -> [(&'static str, u64); 5] {
        [
            ("stream_entries", self.stream_entries),
            ("dead_letters", self.dead_letters),
            ("outbox_sent", self.outbox_sent),
            ("summaries", self.summaries),
            ("consumers", self.consumers),
        ]
    }
}

/// The handles maintenance uses, and nothing else.
#[derive(Clone)]
pub struct Maintenance {
    pg: deadpool_postgres::Pool,
    /// Only with the worker role: a relay-only process has no Redis to look after.
    redis: Option<deadpool_redis::Pool>,
    keys: RedisKeys,
    metrics: Arc<Metrics>,
    retention: RetentionSettings,
    consumer_gc: Duration,
    interval: Duration,
}

impl Maintenance {
    /// `redis` only when the process runs the worker role.
    pub fn new(
        settings: &Settings,
        pg: deadpool_postgres::Pool,
        redis: Option<deadpool_redis::Pool>,
        keys: RedisKeys,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            pg,
            redis,
            keys,
            metrics,
            retention: settings.retention.clone(),
            consumer_gc: settings.worker.consumer_gc,
            interval: settings.maintenance.interval,
        }
    }

    /// Whether these roles run maintenance at all (the api role alone does not).
    pub fn enabled_for(roles: Roles) -> bool {
        roles.has(Role::Worker) || roles.has(Role::Relay)
    }

    /// One pass at the current time.
    pub async fn run_once(&self) -> Result<Report, MaintenanceError> {
        self.run_at(Utc::now()).await
    }

    /// One pass: gauges, then retention under the lock (horizons measured back from `now`).
    /// A failing step does not stop the others; the first error is returned after all ran.
    pub async fn run_at(&self, now: DateTime<Utc>) -> Result<Report, MaintenanceError> {
        let mut report = Report::default();
        let mut first_error = None;
        if let Err(e) = self.refresh_gauges(&mut report).await {
            first_error.get_or_insert(e);
        }
        if let Err(e) = self.retain(now, &mut report).await {
            first_error.get_or_insert(e);
        }
        for (what, n) in report.removed() {
            self.metrics
                .maintenance_removed
                .with_label_values(&[what])
                .inc_by(n);
        }
        let outcome = match (&first_error, report.led) {
            (Some(_), _) => "error",
            (None, true) => "done",
            (None, false) => "skipped",
        };
        self.metrics
            .maintenance_runs
            .with_label_values(&[outcome])
            .inc();
        if report.removed().iter().any(|(_, n)| *n > 0) {
            info!(
                stream_entries = report.stream_entries,
                dead_letters = report.dead_letters,
                outbox_sent = report.outbox_sent,
                summaries = report.summaries,
                consumers = report.consumers,
                "maintenance removed finished work"
            );
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Read the cluster-wide values into the gauges. Each source is read separately, so
    /// Redis being down does not stop the outbox gauge and vice versa; a gauge whose
    /// source fails keeps its last value (and the refresh timestamp says how old it is).
    async fn refresh_gauges(&self, report: &mut Report) -> Result<(), MaintenanceError> {
        let m = &self.metrics;
        let mut result = Ok(());
        if let Some(redis) = &self.redis {
            let redis_part = async {
                let mut conn = redis.get().await?;
                let backlog = consumer_group::backlog_and_trim(&mut conn, &self.keys).await?;
                let dead = dead_letters::count(&mut conn, &self.keys).await?;
                Ok::<_, MaintenanceError>((backlog, dead))
            };
            match redis_part.await {
                Ok((backlog, dead)) => {
                    if let Some(lag) = backlog.lag {
                        m.stream_lag.set(clamp(lag));
                    }
                    m.stream_pending.set(clamp(backlog.pending));
                    m.oldest_queued_age
                        .set(Duration::from_millis(backlog.oldest_age_ms).as_secs_f64());
                    m.dead_letters.set(clamp(dead));
                    report.stream_entries = backlog.trimmed;
                    if backlog.trimmed > 0 {
                        warn!(
                            entries = backlog.trimmed,
                            "trimmed finished stream entries an acknowledgement left behind"
                        );
                    }
                }
                Err(e) => result = Err(e),
            }
        }
        match db::outbox::count_unsent(&self.pg).await {
            Ok(n) => m.outbox_unsent.set(n),
            Err(e) => {
                result = result.and(Err(e.into()));
            }
        }
        if result.is_ok() {
            let now = Utc::now();
            m.gauges_refreshed
                .set(now.timestamp_millis() as f64 / 1000.0);
        }
        result
    }

    /// Retention and consumer cleanup, by whichever replica holds the lock.
    async fn retain(
        &self,
        now: DateTime<Utc>,
        report: &mut Report,
    ) -> Result<(), MaintenanceError> {
        let mut client = self.pg.get().await?;
        let lock = client.transaction().await?;
        let held: bool = lock
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&RETENTION_LOCK])
            .await?
            .try_get(0)?;
        if !held {
            return Ok(());
        }
        report.led = true;
        let mut first_error = None;
        if let Some(redis) = &self.redis
            && let Err(e) = self.retain_redis(redis, now, report).await
        {
            first_error.get_or_insert(e);
        }
        let horizon = |s: u64| (s > 0).then(|| now - chrono::Duration::seconds(clamp(s)));
        if let Some(cutoff) = horizon(self.retention.outbox_sent_s) {
            match delete_in_batches(|| {
                db::outbox::delete_sent_before(&self.pg, cutoff, DELETE_BATCH)
            })
            .await
            {
                Ok(n) => report.outbox_sent = n,
                Err(e) => {
                    first_error.get_or_insert(e.into());
                }
            }
        }
        if let Some(cutoff) = horizon(self.retention.summaries_s) {
            match delete_in_batches(|| {
                db::summaries::delete_completed_before(&self.pg, cutoff, DELETE_BATCH)
            })
            .await
            {
                Ok(n) => report.summaries = n,
                Err(e) => {
                    first_error.get_or_insert(e.into());
                }
            }
        }
        // Ending the transaction releases the lock.
        lock.commit().await?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn retain_redis(
        &self,
        redis: &deadpool_redis::Pool,
        now: DateTime<Utc>,
        report: &mut Report,
    ) -> Result<(), MaintenanceError> {
        let mut conn = redis.get().await?;
        // No consumer of this process is exempt by name: each live consumer keeps its own
        // liveness mark fresh, and the cleanup never removes a consumer that has one.
        let removed =
            consumer_group::remove_idle_consumers(&mut conn, &self.keys, "", self.consumer_gc)
                .await?;
        if !removed.is_empty() {
            info!(consumers = ?removed, "removed gone consumers with nothing pending");
        }
        report.consumers = removed.len() as u64;
        if self.retention.dead_letters_s > 0 {
            let cutoff = now - chrono::Duration::seconds(clamp(self.retention.dead_letters_s));
            let cutoff_ms = u64::try_from(cutoff.timestamp_millis()).unwrap_or(0);
            report.dead_letters =
                dead_letters::purge_before(&mut conn, &self.keys, cutoff_ms).await?;
        }
        Ok(())
    }

    /// Run passes every interval until shutdown. A failed pass is logged and counted; the
    /// next one comes at the normal interval (the work is periodic anyway).
    pub async fn run(self, shutdown: Shutdown) -> Result<(), MaintenanceError> {
        info!(
            interval_ms = self.interval.as_millis() as u64,
            "maintenance started"
        );
        while !shutdown.is_triggered() {
            if let Err(e) = self.run_once().await {
                warn!(error = %e, "maintenance pass failed");
            }
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
        info!("maintenance stopped");
        Ok(())
    }
}

/// Delete batch after batch until one comes back short or the pass's cap is reached.
async fn delete_in_batches<F, Fut>(mut batch: F) -> Result<u64, DbError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, DbError>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?;
        total += n;
        if n < DELETE_BATCH as u64 || total >= MAX_DELETES_PER_PASS {
            return Ok(total);
        }
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
