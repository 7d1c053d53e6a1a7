//! Moving a job that can never succeed to the dead-letter stream, where it waits for a person
//! (`summaryd dlq list` / `dlq replay`).

use std::collections::HashMap;

use chrono::{SecondsFormat, Utc};
use redis::aio::ConnectionLike;

use super::job_state;
use crate::domain::JobId;
use crate::keys::{GROUP, RedisKeys};

/// Fields this module adds to the original entry's fields.
pub const REASON: &str = "reason";
pub const ORIGINAL_ID: &str = "original_id";
pub const FAILED_AT: &str = "failed_at";

/// XADD the entry (its original fields plus reason, original id and time) to the
/// dead-letter stream, XACK it, and mark the job failed, all in one MULTI/EXEC: a job is
/// never both pending and dead, nor dead without GET saying so.
pub async fn dead_letter<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    msg_id: &str,
    fields: &HashMap<String, redis::Value>,
    reason: &str,
) -> redis::RedisResult<()> {
    let failed_at = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    // Keep every original field a replay needs; ours go last and win on a name clash.
    let mut entry: Vec<(String, Vec<u8>)> = fields
        .iter()
        .filter(|(name, _)| ![REASON, ORIGINAL_ID, FAILED_AT].contains(&name.as_str()))
        .filter_map(|(name, value)| value_bytes(value).map(|v| (name.clone(), v)))
        .collect();
    // HashMap order is random; a stable order makes entries easy to compare by eye.
    entry.sort();
    entry.push((REASON.into(), reason.as_bytes().to_vec()));
    entry.push((ORIGINAL_ID.into(), msg_id.as_bytes().to_vec()));
    entry.push((FAILED_AT.into(), failed_at.as_bytes().to_vec()));

    let mut pipe = redis::pipe();
    pipe.atomic()
        .xadd(keys.dead_letters(), "*", &entry)
        .ignore()
        .xack(keys.stream(), GROUP, &[msg_id])
        .ignore();
    // A malformed entry may have no usable job id; then there is no job state to update.
    if let Some(job_id) = job_id_of(fields) {
        pipe.hset_multiple(
            keys.job(job_id),
            &[("status", job_state::FAILED), ("error", reason)],
        )
        .ignore();
    }
    pipe.query_async(conn).await
}

fn value_bytes(value: &redis::Value) -> Option<Vec<u8>> {
    match value {
        redis::Value::BulkString(bytes) => Some(bytes.clone()),
        redis::Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        redis::Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn job_id_of(fields: &HashMap<String, redis::Value>) -> Option<JobId> {
    let bytes = value_bytes(fields.get("job_id")?)?;
    std::str::from_utf8(&bytes).ok()?.parse().ok()
}
