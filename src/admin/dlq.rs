//! `summaryd dlq list` and `summaryd dlq replay`.

use std::io::Write;

use super::AdminError;
use super::output::{Row, one_line, print_rows};
use crate::keys::RedisKeys;
use crate::stream::dead_letters::{self as dlq, DeadLetter, ReplayError, ReplayOutcome};

impl Row for DeadLetter {
    const COLUMNS: &'static [&'static str] = &["id", "job_id", "tenant", "reason", "failed_at"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.clone(),
            self.job_id.clone(),
            self.tenant.clone(),
            one_line(&self.reason, 80),
            self.failed_at.clone(),
        ]
    }
}

pub async fn list(
    redis: &deadpool_redis::Pool,
    keys: &RedisKeys,
    limit: usize,
    json: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let mut conn = redis.get().await?;
    let rows = dlq::list(&mut conn, keys, limit).await?;
    print_rows(out, &rows, json)?;
    Ok(())
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Entries put back onto the job stream.
    pub replayed: usize,
    /// Entries that are not a job (no valid job id or payload) and stay dead-lettered.
    /// Malformed messages are exactly what gets dead-lettered, so one of them must not stop
    /// the others from being replayed; a nonzero count makes the command exit 1.
    pub malformed: usize,
}

/// Replay the given dead entries (or all). Unknown ids are reported and skipped, so running
/// the same replay twice is harmless; malformed entries are reported, skipped and counted.
pub async fn replay(
    redis: &deadpool_redis::Pool,
    keys: &RedisKeys,
    ids: &[String],
    all: bool,
    out: &mut impl Write,
) -> Result<ReplayReport, AdminError> {
    let mut conn = redis.get().await?;
    let ids = if all {
        dlq::all_ids(&mut conn, keys).await?
    } else {
        ids.to_vec()
    };
    let mut report = ReplayReport::default();
    for id in &ids {
        match dlq::replay(&mut conn, keys, id).await {
            Ok(ReplayOutcome::Replayed { job_id, stream_id }) => {
                report.replayed += 1;
                writeln!(out, "replayed {id}: job {job_id} queued as {stream_id}")?;
            }
            Ok(ReplayOutcome::NotFound) => {
                writeln!(out, "skipped {id}: not in the dead-letter stream")?
            }
            Err(e @ ReplayError::NotAJob(_)) => {
                report.malformed += 1;
                writeln!(out, "skipped {id}: {e}; it stays dead-lettered")?
            }
            Err(e @ ReplayError::Redis(_)) => return Err(e.into()),
        }
    }
    writeln!(out, "{} of {} replayed", report.replayed, ids.len())?;
    if report.malformed > 0 {
        writeln!(
            out,
            "{} malformed entries skipped (not jobs; see `summaryd dlq list`)",
            report.malformed
        )?;
    }
    Ok(report)
}
