//! Retention: dead letters, sent outbox rows and summary texts older than their horizon
//! (`SUMMARYD_RETENTION_*`; 0 keeps them) are deleted, in short batches. A summary's row
//! stays when its text goes: it is the job's identity, which keeps a resent request a
//! duplicate and GET's answer `done`. The stored parts of a long text go with its
//! summary's text; the parts and the stored text of a job that never finished go when a
//! dead letter of that age would (`SUMMARYD_RETENTION_DEAD_LETTERS_S`). A job's model calls
//! (`model_calls`) go with its summary's text too, and every call, finished job or not,
//! once as old as a dead letter may be: the history is kept for as long as an operator
//! may still be asked about the job, and its storage stays bounded even while summaries
//! are kept for good.

use chrono::{DateTime, Utc};

use super::{Maintenance, MaintenanceError, Report, clamp};
use crate::db::{self, DbError};
use crate::stream::dead_letters;

/// Rows deleted per statement: each batch is a short transaction that holds few row locks
/// and little WAL, so retention never competes with the relay and the workers for long.
const DELETE_BATCH: i64 = 500;
/// Rows one pass deletes at most per table; the rest waits for the next pass, so a first
/// run on a large backlog is spread out instead of one long burst of deletes.
const MAX_DELETES_PER_PASS: u64 = 50_000;

impl Maintenance {
    /// Purge dead letters older than their horizon; returns how many.
    pub(super) async fn purge_dead_letters(
        &self,
        conn: &mut crate::infra::redis::Conn,
        now: DateTime<Utc>,
    ) -> Result<u64, MaintenanceError> {
        if self.retention.dead_letters_s == 0 {
            return Ok(0);
        }
        let cutoff = now - chrono::Duration::seconds(clamp(self.retention.dead_letters_s));
        let cutoff_ms = u64::try_from(cutoff.timestamp_millis()).unwrap_or(0);
        let mut purged = 0;
        for keys in self.keys.all() {
            purged += dead_letters::purge_before(conn, keys, cutoff_ms).await?;
        }
        Ok(purged)
    }

    /// Delete sent outbox rows, the texts of summaries, the stored texts and parts of long
    /// jobs, and model calls past their horizons. A failing table does not stop the others; the first
    /// error is returned after all ran.
    pub(super) async fn retain_postgres(
        &self,
        now: DateTime<Utc>,
        report: &mut Report,
    ) -> Result<(), MaintenanceError> {
        let mut first_error: Option<MaintenanceError> = None;
        let mut keep = |result: Result<u64, DbError>, removed: &mut u64| match result {
            Ok(n) => *removed += n,
            Err(e) => {
                first_error.get_or_insert(e.into());
            }
        };
        let horizon = |s: u64| (s > 0).then(|| now - chrono::Duration::seconds(clamp(s)));
        if let Some(cutoff) = horizon(self.retention.outbox_sent_s) {
            let deleted = delete_in_batches(DELETE_BATCH as u64, || {
                db::outbox::delete_sent_before(&self.pg, cutoff, DELETE_BATCH)
            });
            keep(deleted.await, &mut report.outbox_sent);
            // Webhooks to a disabled endpoint were skipped, not sent: as finished, and gone
            // on the same horizon.
            let skipped = delete_in_batches(DELETE_BATCH as u64, || {
                db::outbox::delete_skipped_before(&self.pg, cutoff, DELETE_BATCH)
            });
            keep(skipped.await, &mut report.outbox_sent);
        }
        if let Some(cutoff) = horizon(self.retention.summaries_s) {
            let expired = delete_in_batches(DELETE_BATCH as u64, || {
                db::summaries::expire_texts_completed_before(&self.pg, cutoff, DELETE_BATCH)
            });
            keep(expired.await, &mut report.summaries);
        }
        let unfinished = horizon(self.retention.dead_letters_s);
        if let Some(cutoff) = unfinished {
            let deleted = delete_in_batches(DELETE_BATCH as u64, || {
                db::job_texts::delete_stored_before(&self.pg, cutoff, DELETE_BATCH)
            });
            keep(deleted.await, &mut report.job_texts);
            let deleted = delete_in_batches(DELETE_BATCH as u64, || {
                db::model_calls::delete_before(&self.pg, cutoff, DELETE_BATCH)
            });
            keep(deleted.await, &mut report.model_calls);
        }
        // Kept for good, unfinished jobs' parts stay too: nothing older than the epoch.
        let cutoff = unfinished.unwrap_or(DateTime::<Utc>::MIN_UTC);
        // A batch of jobs removes any number of parts: only an empty one says none is left.
        let deleted = delete_in_batches(1, || {
            db::parts::delete_expired(&self.pg, cutoff, PARTS_JOBS_BATCH)
        });
        keep(deleted.await, &mut report.summary_parts);
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Jobs whose parts one statement deletes: a job has up to `SUMMARYD_LLM_MAX_PARTS` parts.
const PARTS_JOBS_BATCH: i64 = 20;

/// Delete batch after batch until one removes fewer than `full` rows (nothing is left) or
/// the pass's cap is reached.
async fn delete_in_batches<F, Fut>(full: u64, mut batch: F) -> Result<u64, DbError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, DbError>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?;
        total += n;
        if n < full || total >= MAX_DELETES_PER_PASS {
            return Ok(total);
        }
    }
}
