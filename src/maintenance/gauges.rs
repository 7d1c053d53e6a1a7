//! The cluster-wide gauges `/metrics` serves: the stream's backlog and dead letters (from
//! Redis) and the unsent outbox rows (from Postgres). Every replica refreshes them itself, so
//! every replica exports the same values (aggregate them with `max`, never `sum`); a scrape
//! only renders what the last refresh cached, so no number of scrapes can load Redis or
//! Postgres.

use std::time::Duration;

use chrono::Utc;

use super::{Maintenance, MaintenanceError, Report, clamp};
use crate::db;
use crate::stream::dead_letters;

impl Maintenance {
    /// Read the cluster-wide values into the gauges. Each source is read separately, so
    /// Redis being down does not stop the outbox gauge and vice versa; a gauge whose
    /// source fails keeps its last value (and the refresh timestamp says how old it is).
    pub(super) async fn refresh_gauges(&self, report: &mut Report) -> Result<(), MaintenanceError> {
        let m = &self.metrics;
        let mut result = Ok(());
        if let Some(redis) = &self.redis {
            let redis_part = async {
                let mut conn = redis.get().await?;
                let backlog = self.trim_finished(&mut conn).await?;
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
                    Self::record_trimmed(report, backlog.trimmed);
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
}
