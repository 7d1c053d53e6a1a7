//! The in-flight sweep: a tenant's in-flight set (what `max_in_flight` counts) loses a job in
//! the step that finishes it, but a member can outlive its job: an older version that did not
//! remove it, an operator's manual XACK, a job's state deleted by hand. Such a member counts
//! against the tenant forever and, once enough have piled up, refuses every POST with 429.
//!
//! A member is removed when its job has a summary row (finished) or when it has no job
//! state and no entry on the job stream or the dead-letter stream (gone). A job that is
//! queued, pending or dead-lettered has its state, so its member stays; the removal itself
//! re-checks the state (`tenant_limits::remove_leaked`), so an enqueue or replay of the same
//! job meanwhile keeps it.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use tracing::warn;

use super::{Maintenance, MaintenanceError};
use crate::db;
use crate::domain::JobId;
use crate::infra::keys::RedisKeys;
use crate::stream::tenant_limits::{self, Leaked};

/// SCAN steps over the keyspace one pass makes at most (each looks at about
/// `tenant_limits::SWEEP_BATCH` keys): a large keyspace is covered over several passes, so
/// no pass spends long on it; the cursor carries over. Every set a step finds is swept
/// whole, so no set with many live members is left half done.
const SCAN_STEPS_PER_PASS: usize = 50;

impl Maintenance {
    /// Sweep the in-flight sets the next part of each shard's keyspace holds; returns how
    /// many members were removed.
    pub(super) async fn sweep_in_flight(
        &self,
        conn: &mut crate::infra::redis::Conn,
    ) -> Result<u64, MaintenanceError> {
        let mut removed = 0;
        for keys in self.keys.all() {
            removed += self.sweep_in_flight_of(conn, keys).await?;
        }
        Ok(removed)
    }

    async fn sweep_in_flight_of(
        &self,
        conn: &mut crate::infra::redis::Conn,
        keys: &RedisKeys,
    ) -> Result<u64, MaintenanceError> {
        let saved = &self.sweep_cursors[usize::from(keys.shard())];
        let mut cursor = saved.load(Ordering::Relaxed);
        let mut removed = 0;
        for _ in 0..SCAN_STEPS_PER_PASS {
            let (next, sets) = tenant_limits::scan_sets(conn, keys, cursor).await?;
            for set in sets {
                let n = self.sweep_set(conn, keys, &set).await?;
                if n > 0 {
                    warn!(
                        tenant = keys.in_flight_tenant(&set).unwrap_or(&set),
                        members = n,
                        "removed in-flight members whose job had finished or was gone"
                    );
                }
                removed += n;
            }
            cursor = next;
            // Kept after each step, so a failed pass resumes where it stopped.
            saved.store(cursor, Ordering::Relaxed);
            if cursor == 0 {
                break;
            }
        }
        Ok(removed)
    }

    /// Sweep one set, a batch of members at a time.
    async fn sweep_set(
        &self,
        conn: &mut crate::infra::redis::Conn,
        keys: &RedisKeys,
        set: &str,
    ) -> Result<u64, MaintenanceError> {
        let mut cursor = 0;
        let mut removed = 0;
        loop {
            let (next, members) = tenant_limits::scan_members(conn, set, cursor).await?;
            let leaked = self.leaked_among(conn, keys, &members).await?;
            removed += tenant_limits::remove_leaked(conn, keys, set, &leaked).await?;
            cursor = next;
            if cursor == 0 {
                return Ok(removed);
            }
        }
    }

    /// Which of `members` are left behind: finished (a summary row), not a job id at all,
    /// or gone (no job state, on neither stream).
    async fn leaked_among(
        &self,
        conn: &mut crate::infra::redis::Conn,
        keys: &RedisKeys,
        members: &[String],
    ) -> Result<Vec<Leaked>, MaintenanceError> {
        let mut leaked = Vec::new();
        let mut jobs = Vec::new();
        for member in members {
            match member.parse::<JobId>() {
                Ok(job) => jobs.push((job, member)),
                // Nothing ever adds such a member, and no job can ever match it.
                Err(_) => leaked.push(Leaked::Finished(member.clone())),
            }
        }
        let ids: Vec<JobId> = jobs.iter().map(|(job, _)| *job).collect();
        let finished = db::summaries::existing(&self.pg, &ids).await?;
        let open: Vec<JobId> = ids
            .iter()
            .filter(|job| !finished.contains(job))
            .copied()
            .collect();
        let has_state = tenant_limits::have_state(conn, keys, &open).await?;
        let stateless: HashSet<JobId> = open
            .iter()
            .zip(has_state)
            .filter(|(_, has)| !has)
            .map(|(job, _)| *job)
            .collect();
        let on_streams = if stateless.is_empty() {
            HashSet::new()
        } else {
            tenant_limits::on_streams(conn, keys, &stateless).await?
        };
        for (job, member) in &jobs {
            if finished.contains(job) {
                leaked.push(Leaked::Finished((*member).clone()));
            } else if stateless.contains(job) && !on_streams.contains(job) {
                leaked.push(Leaked::Gone {
                    member: (*member).clone(),
                    job: *job,
                });
            }
        }
        Ok(leaked)
    }
}
