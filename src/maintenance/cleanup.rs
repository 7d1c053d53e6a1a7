//! Cleanup of what finished work leaves in Redis: stream entries an acknowledgement left
//! behind, and consumers whose process is gone.

use redis::AsyncCommands;
use tracing::{info, warn};

use super::{Maintenance, MaintenanceError, Report};
use crate::infra::keys::RedisKeys;
use crate::stream::consumer_group::{self, Backlog};

impl Maintenance {
    /// Remove finished entries an acknowledgement left behind in `keys`' shard. The script
    /// that does it needs the oldest entry still in use to know where to cut, so it
    /// measures the backlog too: the gauges take their stream values from this one call,
    /// on every replica.
    pub(super) async fn trim_finished(
        &self,
        conn: &mut crate::infra::redis::Conn,
        keys: &RedisKeys,
    ) -> Result<Backlog, MaintenanceError> {
        Ok(consumer_group::backlog_and_trim(conn, keys).await?)
    }

    /// Report what [`Self::trim_finished`] removed, once the pass's Redis reads all answered.
    pub(super) fn record_trimmed(report: &mut Report, trimmed: u64) {
        report.stream_entries = trimmed;
        if trimmed > 0 {
            warn!(
                entries = trimmed,
                "trimmed finished stream entries an acknowledgement left behind"
            );
        }
    }

    /// Remove the consumers whose process is gone from every shard's group; returns how
    /// many.
    pub(super) async fn remove_gone_consumers(
        &self,
        conn: &mut crate::infra::redis::Conn,
    ) -> Result<u64, MaintenanceError> {
        let mut removed = 0;
        for keys in self.keys.all() {
            removed += self.remove_gone_consumers_of(conn, keys).await?;
        }
        Ok(removed)
    }

    async fn remove_gone_consumers_of(
        &self,
        conn: &mut crate::infra::redis::Conn,
        keys: &RedisKeys,
    ) -> Result<u64, MaintenanceError> {
        // Before the first worker started there is no group (and maybe no stream) yet, and
        // so no consumer to remove: an api replica running alone is not failing.
        let stream_exists: bool = conn.exists(keys.stream()).await?;
        if !stream_exists {
            return Ok(0);
        }
        // No consumer of this process is exempt by name: each live consumer keeps its own
        // liveness mark fresh, and the cleanup never removes a consumer that has one.
        let removed =
            match consumer_group::remove_idle_consumers(conn, keys, "", self.consumer_gc).await {
                Err(e) if e.code() == Some("NOGROUP") => return Ok(0),
                other => other?,
            };
        if !removed.is_empty() {
            info!(consumers = ?removed, "removed gone consumers with nothing pending");
        }
        Ok(removed.len() as u64)
    }
}
