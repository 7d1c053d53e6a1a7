//! `summaryd dlq list`, `summaryd dlq replay` and `summaryd dlq purge`.

use clap::Subcommand;
use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::parse_duration;
use super::output::{Row, one_line, print_rows};
use crate::infra::keys::{RedisKeys, Shards};
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
        /// Dead-letter entry ids as `dlq list` shows them (`<shard>/<id>` with several shards).
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
        /// Dead-letter entry ids as `dlq list` shows them (`<shard>/<id>` with several shards).
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
    redis: &crate::infra::redis::RedisPool,
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
        let mut listed = dlq::list(&mut conn, shard, left).await?;
        if keys.count() > 1 {
            for d in &mut listed {
                d.id = format!("{}/{}", shard.shard(), d.id);
            }
        }
        rows.extend(listed);
    }
    print_rows(out, &rows, json)?;
    Ok(())
}

/// Which shard's dead letter an id from `dlq list` is, and its entry id there: with one
/// shard, the id as listed; with more, `<shard>/<id>`, since each shard's stream numbers
/// its entries by its own clock and two shards may hold the same id.
fn locate<'k>(keys: &'k Shards, listed: &str) -> Result<(&'k RedisKeys, String), AdminError> {
    if keys.count() == 1 {
        return Ok((keys.get(0), listed.to_owned()));
    }
    listed
        .split_once('/')
        .and_then(|(shard, id)| {
            let shard = shard.parse::<u16>().ok()?;
            (usize::from(shard) < keys.count()).then(|| (keys.get(shard), id.to_owned()))
        })
        .ok_or_else(|| AdminError::ShardedId {
            id: listed.to_owned(),
            shards: keys.count(),
        })
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
    redis: &crate::infra::redis::RedisPool,
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
            let shown = |id: &String| match keys.count() {
                1 => id.clone(),
                _ => format!("{}/{id}", shard.shard()),
            };
            targets.extend(ids.into_iter().map(|id| (shard, shown(&id), id)));
        }
    } else {
        for listed in ids {
            let (shard, id) = locate(keys, listed)?;
            targets.push((shard, listed.clone(), id));
        }
    }
    let mut report = ReplayReport::default();
    for (shard, shown, id) in &targets {
        match dlq::replay(&mut conn, shard, id).await {
            Ok(ReplayOutcome::Replayed { job_id, stream_id }) => {
                report.replayed += 1;
                writeln!(out, "replayed {shown}: job {job_id} queued as {stream_id}")?;
            }
            Ok(ReplayOutcome::NotFound) => {
                writeln!(out, "skipped {shown}: not in the dead-letter stream")?
            }
            Err(e @ ReplayError::NotAJob(_)) => {
                report.malformed += 1;
                writeln!(out, "skipped {shown}: {e}; it stays dead-lettered")?
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
    redis: &crate::infra::redis::RedisPool,
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
    match (ids.is_empty(), cutoff_ms) {
        (true, Some(cutoff_ms)) => {
            for shard in keys.all() {
                removed += dlq::purge_before(&mut conn, shard, cutoff_ms).await?;
            }
        }
        _ => {
            for listed in ids {
                let (shard, id) = locate(keys, listed)?;
                removed += dlq::purge_ids(&mut conn, shard, &[id], cutoff_ms).await?;
            }
        }
    }
    writeln!(out, "{removed} dead letters purged")?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_shard_when_there_are_several() {
        let one = Shards::single("p:");
        let (keys, id) = locate(&one, "1733190000000-0").unwrap();
        assert_eq!((keys.shard(), id.as_str()), (0, "1733190000000-0"));

        let three = Shards::new("p:", 3, false);
        let (keys, id) = locate(&three, "2/1733190000000-0").unwrap();
        assert_eq!((keys.shard(), id.as_str()), (2, "1733190000000-0"));
        let (keys, _) = locate(&three, "0/1-0").unwrap();
        assert_eq!(keys.shard(), 0);
        for bad in ["1733190000000-0", "3/1-0", "x/1-0", "-1/1-0", "/1-0"] {
            match locate(&three, bad) {
                Err(AdminError::ShardedId { id, shards }) => {
                    assert_eq!((id.as_str(), shards), (bad, 3));
                }
                other => panic!("{bad}: {:?}", other.map(|(k, id)| (k.shard(), id))),
            }
        }
    }
}
