//! `summaryd dlq list` and `summaryd dlq replay`.

use std::io::Write;

use super::AdminError;
use super::output::{Row, one_line, print_rows};
use crate::keys::RedisKeys;
use crate::stream::dead_letters::{self as dlq, DeadLetter, ReplayOutcome};

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

/// Replay the given dead entries (or all). Returns how many went back onto the stream;
/// unknown ids are reported and skipped, so running the same replay twice is harmless.
pub async fn replay(
    redis: &deadpool_redis::Pool,
    keys: &RedisKeys,
    ids: &[String],
    all: bool,
    out: &mut impl Write,
) -> Result<usize, AdminError> {
    let mut conn = redis.get().await?;
    let ids = if all {
        dlq::all_ids(&mut conn, keys).await?
    } else {
        ids.to_vec()
    };
    let mut replayed = 0;
    for id in &ids {
        match dlq::replay(&mut conn, keys, id).await? {
            ReplayOutcome::Replayed { job_id, stream_id } => {
                replayed += 1;
                writeln!(out, "replayed {id}: job {job_id} queued as {stream_id}")?;
            }
            ReplayOutcome::NotFound => {
                writeln!(out, "skipped {id}: not in the dead-letter stream")?
            }
        }
    }
    writeln!(out, "{replayed} of {} replayed", ids.len())?;
    Ok(replayed)
}
