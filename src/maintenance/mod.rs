//! The one periodic housekeeping task of every process, one file per service: `gauges.rs`
//! refreshes the cluster-wide gauges `/metrics` serves, `cleanup.rs` removes finished
//! stream entries left behind and consumers that are gone, `retention.rs` deletes what is
//! past its retention horizon, and `in_flight.rs` removes tenants' in-flight members whose
//! job finished or is gone. This file runs them: every pass refreshes the gauges on every
//! replica, then one replica at a time (the one holding the advisory lock below) does the
//! rest.
//!
//! Every role runs it, with what the role has: the api and the worker have Redis and
//! Postgres, a relay-only process only Postgres (outbox gauge and Postgres retention). So
//! an api replica reports the queue it feeds even when no worker runs at all, which is
//! exactly when the queue alerts must see it.

mod cleanup;
mod gauges;
mod in_flight;
mod retention;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use crate::config::{RetentionSettings, Settings};
use crate::db::DbError;
use crate::infra::keys::Shards;
use crate::infra::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::stream::lanes;

/// Advisory lock key of the retention pass ("summaryd" in ASCII). Advisory locks are per
/// database, so deployments on separate databases never contend.
///
/// A Postgres advisory lock rather than a Redis lease: every role that runs maintenance
/// has Postgres (a relay-only process may have no Redis); Postgres releases the lock itself
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
    /// Summary texts removed (their rows stay); `what="summaries"` in the metric.
    pub summaries: u64,
    pub consumers: u64,
    /// Members of tenants' in-flight sets whose job had finished or was gone.
    pub in_flight: u64,
    /// Members of tenants' running sets (`max_concurrent`) no longer pending.
    pub running: u64,
    /// Texts stored at intake of jobs that never finished (`what="job_texts"`).
    pub job_texts: u64,
    /// Stored parts of long texts whose summary text is gone, or whose job never finished
    /// (`what="summary_parts"`).
    pub summary_parts: u64,
    /// Model calls as old as a dead letter may be (`what="model_calls"`); those that go
    /// with their summary's text are not counted apart.
    pub model_calls: u64,
}

impl Report {
    fn removed(&self) -> [(&'static str, u64); 10] {
        [
            ("stream_entries", self.stream_entries),
            ("dead_letters", self.dead_letters),
            ("outbox_sent", self.outbox_sent),
            ("summaries", self.summaries),
            ("consumers", self.consumers),
            ("in_flight", self.in_flight),
            ("running", self.running),
            ("job_texts", self.job_texts),
            ("summary_parts", self.summary_parts),
            ("model_calls", self.model_calls),
        ]
    }
}

/// The handles maintenance uses, and nothing else.
#[derive(Clone)]
pub struct Maintenance {
    pg: deadpool_postgres::Pool,
    /// With the api or worker role; a relay-only process has no Redis to read or look after,
    /// so it never exports the stream gauges.
    redis: Option<crate::infra::redis::RedisPool>,
    keys: Shards,
    metrics: Arc<Metrics>,
    retention: RetentionSettings,
    consumer_gc: Duration,
    interval: Duration,
    /// Where the in-flight sweep's SCAN of the keyspace goes on at the next pass, per
    /// shard: one pass scans a bounded part of it (`in_flight.rs`).
    sweep_cursors: Arc<[AtomicU64]>,
    /// The tenants with a budget, as the tokens file holds them now, for the budget gauge
    /// (`gauges.rs`); a process without the tokens file does not export that gauge.
    budgets: Option<BudgetSource>,
}

/// Reads the tenants that have a budget (with their budgets) from the tokens file as it
/// is loaded now; given by `app/`, which holds the file (roles do not import each other).
pub type BudgetSource = Arc<dyn Fn() -> Vec<(String, crate::domain::Budget)> + Send + Sync>;

impl Maintenance {
    /// `redis` only when the process has Redis (the api or worker role).
    pub fn new(
        settings: &Settings,
        pg: deadpool_postgres::Pool,
        redis: Option<crate::infra::redis::RedisPool>,
        keys: Shards,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            pg,
            redis,
            sweep_cursors: (0..keys.count()).map(|_| AtomicU64::new(0)).collect(),
            keys,
            metrics,
            retention: settings.retention.clone(),
            consumer_gc: settings.worker.consumer_gc,
            interval: settings.maintenance.interval,
            budgets: None,
        }
    }

    /// Refresh `summaryd_tenant_budget_used_ratio` for the tenants `budgets` names (a
    /// process with the tokens file and Redis).
    pub fn with_budgets(mut self, budgets: Option<BudgetSource>) -> Self {
        self.budgets = budgets;
        self
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
                in_flight = report.in_flight,
                running = report.running,
                job_texts = report.job_texts,
                summary_parts = report.summary_parts,
                model_calls = report.model_calls,
                "maintenance removed finished work"
            );
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
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
        if let Err(e) = self.retain_postgres(now, report).await {
            first_error.get_or_insert(e);
        }
        // Ending the transaction releases the lock.
        lock.commit().await?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The Redis side, on one connection: a failure there skips what follows it.
    async fn retain_redis(
        &self,
        redis: &crate::infra::redis::RedisPool,
        now: DateTime<Utc>,
        report: &mut Report,
    ) -> Result<(), MaintenanceError> {
        let mut conn = redis.get().await?;
        report.consumers = self.remove_gone_consumers(&mut conn).await?;
        report.dead_letters = self.purge_dead_letters(&mut conn, now).await?;
        report.in_flight = self.sweep_in_flight(&mut conn).await?;
        for keys in self.keys.all() {
            report.running += lanes::sweep_running(&mut conn, keys).await?;
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

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
