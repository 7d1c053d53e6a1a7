//! The cluster-wide gauges `/metrics` serves: the stream's backlog (the tenants' lanes
//! included), dead letters and
//! whether consumption is paused (from Redis) and the unsent outbox rows (from Postgres).
//! Every process that can read a source refreshes its gauges itself (the api and worker
//! have Redis and Postgres, a relay-only process only Postgres), so every process exports
//! the same values (aggregate them with `max`, never `sum`); a scrape only renders what the
//! last refresh cached, so no number of scrapes can load Redis or Postgres.
//!
//! A gauge is exported only while this process holds a measurement of it: one it cannot
//! read at all (the stream gauges on a relay-only process) is never exported, and one whose
//! read fails is removed until a read succeeds again. Never a 0 nobody measured, and never
//! a value from before an outage that looks current: either would keep the queue alerts
//! quiet while jobs wait.

use std::time::Duration;

use chrono::Utc;

use super::{Maintenance, MaintenanceError, Report, clamp};
use crate::db;
use crate::domain::{SummaryReady, WebhookEvent};
use crate::stream::consumer_group::{Backlog, entry_millis};
use crate::stream::lanes::{self, LaneBacklog};
use crate::stream::{budget, dead_letters, pause};

impl Maintenance {
    /// The budget gauge: for each tenant with a budget in the tokens file as loaded now,
    /// reserved and used over its budget in the current period (`domain::Budget::used_ratio`).
    /// Only with the tokens file and Redis; tenants that lost their budget lose their series.
    async fn refresh_budgets(&self) -> Result<(), MaintenanceError> {
        let (Some(budgets), Some(redis)) = (&self.budgets, &self.redis) else {
            return Ok(());
        };
        let now = Utc::now();
        let mut conn = redis.get().await?;
        let mut ratios = Vec::new();
        for (tenant, b) in budgets() {
            let keys = self.keys.of_tenant(&tenant);
            let taken = budget::current(&mut conn, keys, &tenant, &b, now).await?;
            ratios.push((tenant, b.used_ratio(taken), b.soft_ratio));
        }
        let (used, soft) = (
            &self.metrics.tenant_budget_used_ratio,
            &self.metrics.tenant_budget_soft_ratio,
        );
        used.clear_all();
        soft.clear_all();
        for (tenant, ratio, soft_ratio) in ratios {
            used.set_for(&[&tenant], ratio);
            soft.set_for(&[&tenant], soft_ratio);
        }
        Ok(())
    }

    /// Read the cluster-wide values into the gauges. Each source is read separately, so
    /// Redis being down does not stop the outbox gauge and vice versa; the gauges of a
    /// source that fails are removed (and the refresh timestamp says when all were last
    /// read).
    pub(super) async fn refresh_gauges(&self, report: &mut Report) -> Result<(), MaintenanceError> {
        let m = &self.metrics;
        let mut result = Ok(());
        if let Some(redis) = &self.redis {
            let redis_part = async {
                let mut conn = redis.get().await?;
                let mut shards = Vec::with_capacity(self.keys.count());
                for keys in self.keys.all() {
                    let backlog = self.trim_finished(&mut conn, keys).await?;
                    let queued = lanes::backlog(&mut conn, keys).await?;
                    let dead = dead_letters::count(&mut conn, keys).await?;
                    shards.push((with_lanes(backlog, &queued), dead));
                }
                let paused = pause::current(&mut conn, self.keys.global()).await?;
                Ok::<_, MaintenanceError>((shards, paused.is_some()))
            };
            match redis_part.await {
                Ok((shards, paused)) => {
                    let (backlog, dead) = totals(&shards);
                    m.stream_shard_entries.clear_all();
                    for (shard, (b, dead)) in shards.iter().enumerate() {
                        let shard = shard.to_string();
                        if let Some(lag) = b.lag {
                            m.stream_shard_entries
                                .set_for(&[&shard, "queued"], clamp(lag));
                        }
                        m.stream_shard_entries
                            .set_for(&[&shard, "pending"], clamp(b.pending));
                        m.stream_shard_entries
                            .set_for(&[&shard, "dead"], clamp(*dead));
                    }
                    match backlog.lag {
                        Some(lag) => m.stream_lag.set(clamp(lag)),
                        // Redis could not tell this time: no number is better than a guess.
                        None => m.stream_lag.clear(),
                    }
                    m.stream_pending.set(clamp(backlog.pending));
                    m.oldest_queued_age
                        .set(Duration::from_millis(backlog.oldest_age_ms).as_secs_f64());
                    m.dead_letters.set(clamp(dead));
                    m.consumption_paused.set(i64::from(paused));
                    Self::record_trimmed(report, backlog.trimmed);
                }
                Err(e) => {
                    m.stream_shard_entries.clear_all();
                    m.stream_lag.clear();
                    m.stream_pending.clear();
                    m.oldest_queued_age.clear();
                    m.dead_letters.clear();
                    m.consumption_paused.clear();
                    result = Err(e);
                }
            }
        }
        if let Err(e) = self.refresh_budgets().await {
            m.tenant_budget_used_ratio.clear_all();
            m.tenant_budget_soft_ratio.clear_all();
            result = result.and(Err(e));
        }
        match db::outbox::count_unsent(&self.pg).await {
            Ok(by_topic) => {
                m.outbox_unsent.set(by_topic.iter().map(|(_, n)| n).sum());
                for topic in [SummaryReady::TOPIC, WebhookEvent::TOPIC] {
                    let n = by_topic
                        .iter()
                        .find(|(t, _)| t == topic)
                        .map_or(0, |(_, n)| *n);
                    m.outbox_unsent_by_topic.set_for(&[topic], n);
                }
            }
            Err(e) => {
                m.outbox_unsent.clear();
                m.outbox_unsent_by_topic.clear_all();
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
}

/// Every shard's backlog and dead letters added up: lag and pending summed (a lag Redis
/// could not tell for one shard leaves the total unknown), the oldest age the oldest of all,
/// what was trimmed summed.
fn totals(shards: &[(Backlog, u64)]) -> (Backlog, u64) {
    let mut total = Backlog {
        lag: Some(0),
        ..Backlog::default()
    };
    let mut dead = 0;
    for (b, d) in shards {
        total.lag = total.lag.zip(b.lag).map(|(a, b)| a + b);
        total.pending += b.pending;
        total.oldest_age_ms = total.oldest_age_ms.max(b.oldest_age_ms);
        total.trimmed += b.trimmed;
        dead += d;
    }
    (total, dead)
}

/// The stream's backlog with the jobs waiting in the tenants' lanes: they are not yet
/// delivered either, and the oldest of them may be older than anything on the stream.
fn with_lanes(stream: Backlog, lanes: &LaneBacklog) -> Backlog {
    let lane_age = lanes
        .oldest_id
        .as_deref()
        .and_then(entry_millis)
        .map_or(0, |ms| dead_letters::now_millis().saturating_sub(ms));
    Backlog {
        lag: stream.lag.map(|lag| lag + lanes.total()),
        oldest_age_ms: stream.oldest_age_ms.max(lane_age),
        ..stream
    }
}
