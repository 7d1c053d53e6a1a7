//! `summaryd dlq list`, `summaryd dlq replay` and `summaryd dlq purge`.

use clap::Subcommand;
use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::parse_duration;
use super::output::{Row, one_line, print_rows};
use crate::infra::keys::Shards;
use crate::stream::dead_letters::{self as dlq, DeadLetter, ReplayError, ReplayOutcome};

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead-lettered jobs, oldest first: id, job_id, tenant, reason, failed_at.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Re-enqueue with the SAME job_id and remove from the dead-letter stream.
    Replay {
        /// Dead-letter entry ids (from `dlq list`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<String>,
        #[arg(long)]
        all: bool,
    },
    /// Remove dead letters and their job state (GET then answers 404 for those jobs).
    Purge {
        /// Only dead letters that failed longer ago than this: a number and a unit, s, m,
        /// h, d or w (e.g. 30d). Without ids: every dead letter that old.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration,
              required_unless_present = "ids")]
        older_than: Option<Duration>,
        /// Dead-letter entry ids (from `dlq list`).
        ids: Vec<String>,
    },
}

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
    keys: &Shards,
    limit: usize,
    json: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let mut conn = redis.get().await?;
    let mut rows = Vec::new();
    for shard in keys.all() {
        let left = limit.saturating_sub(rows.len());
        if left == 0 {
            break;
        }
        rows.extend(dlq::list(&mut conn, shard, left).await?);
    }
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
/// An id is looked for in each shard in turn (ids are per shard; the first shard holding
/// it replays it).
pub async fn replay(
    redis: &deadpool_redis::Pool,
    keys: &Shards,
    ids: &[String],
    all: bool,
    out: &mut impl Write,
) -> Result<ReplayReport, AdminError> {
    let mut conn = redis.get().await?;
    let mut targets = Vec::new();
    if all {
        for shard in keys.all() {
            let ids = dlq::all_ids(&mut conn, shard).await?;
            targets.extend(ids.into_iter().map(|id| (id, Some(shard))));
        }
    } else {
        targets.extend(ids.iter().map(|id| (id.clone(), None)));
    }
    let mut report = ReplayReport::default();
    for (id, shard) in &targets {
        let shards = match shard {
            Some(shard) => std::slice::from_ref(*shard),
            None => keys.all(),
        };
        let mut outcome = Ok(ReplayOutcome::NotFound);
        for shard in shards {
            outcome = dlq::replay(&mut conn, shard, id).await;
            if !matches!(outcome, Ok(ReplayOutcome::NotFound)) {
                break;
            }
        }
        match outcome {
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
    writeln!(out, "{} of {} replayed", report.replayed, targets.len())?;
    if report.malformed > 0 {
        writeln!(
            out,
            "{} malformed entries skipped (not jobs; see `summaryd dlq list`)",
            report.malformed
        )?;
    }
    Ok(report)
}

/// Remove dead letters (and their job state): the given ids, or all of them, that failed
/// longer than `older_than` ago. Returns how many were removed.
pub async fn purge(
    redis: &deadpool_redis::Pool,
    keys: &Shards,
    ids: &[String],
    older_than: Option<Duration>,
    out: &mut impl Write,
) -> Result<u64, AdminError> {
    let mut conn = redis.get().await?;
    let cutoff_ms = older_than.map(|age| {
        let now_ms = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
        now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
    });
    let mut removed = 0;
    for shard in keys.all() {
        removed += match (ids.is_empty(), cutoff_ms) {
            (true, Some(cutoff_ms)) => dlq::purge_before(&mut conn, shard, cutoff_ms).await?,
            _ => dlq::purge_ids(&mut conn, shard, ids, cutoff_ms).await?,
        };
    }
    writeln!(out, "{removed} dead letters purged")?;
    Ok(removed)
}
