//! The dead-letter stream: jobs that will never succeed wait here for a person
//! (`summaryd dlq list` / `dlq replay`). This module owns the stream's field names and
//! every write to it: moving a job here, and replaying it onto the job stream with the
//! SAME job id (so a replay can never make a second summary or email).

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::Utc;
use redis::aio::ConnectionLike;
use redis::streams::StreamRangeReply;
use redis::{AsyncCommands, Script, Value};

use super::job_entry::{self, field_bytes};
use super::job_state::{self, Queued};
use crate::domain::JobId;
use crate::keys::{GROUP, RedisKeys};

/// Fields a dead entry has besides the job's own (`job_entry::FIELDS`).
const REASON: &str = "reason";
const ORIGINAL_ID: &str = "original_id";
const FAILED_AT: &str = "failed_at";

/// One dead-lettered job as operators see it (`summaryd dlq list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    pub id: String,
    pub job_id: String,
    pub tenant: String,
    pub reason: String,
    pub failed_at: String,
}

/// XADD the entry (its original fields plus reason, original id and time) to the
/// dead-letter stream, XACK it, and mark the job failed, all in one MULTI/EXEC: a job is
/// never both pending and dead, nor dead without GET saying so.
pub async fn add<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    msg_id: &str,
    fields: &HashMap<String, Value>,
    reason: &str,
) -> redis::RedisResult<()> {
    let failed_at = job_entry::timestamp(Utc::now());
    // Keep every original field a replay needs; ours go last and win on a name clash.
    let mut entry: Vec<(String, Vec<u8>)> = fields
        .keys()
        .filter(|name| ![REASON, ORIGINAL_ID, FAILED_AT].contains(&name.as_str()))
        .filter_map(|name| field_bytes(fields, name).map(|v| (name.clone(), v)))
        .collect();
    // HashMap order is random; a stable order makes entries easy to compare by eye.
    entry.sort();
    entry.push((REASON.into(), reason.as_bytes().to_vec()));
    entry.push((ORIGINAL_ID.into(), msg_id.as_bytes().to_vec()));
    entry.push((FAILED_AT.into(), failed_at.into_bytes()));

    let mut pipe = redis::pipe();
    pipe.atomic()
        .xadd(keys.dead_letters(), "*", &entry)
        .ignore()
        .xack(keys.stream(), GROUP, &[msg_id])
        .ignore();
    // A malformed entry may have no usable job id; then there is no job state to update.
    if let Some(job_id) = job_entry::job_id(fields) {
        job_state::add_failed(&mut pipe, &keys.job(job_id), reason);
    }
    pipe.query_async(conn).await
}

/// Re-enqueue one dead entry and delete it, atomically: the entry is either still in the
/// dead-letter stream or back on the job stream with its state `queued`, never both or
/// neither. Re-checks that the entry still exists, so a concurrent or repeated replay is a
/// no-op. The job's fields come from the caller, who read the entry: an entry never
/// changes, so they are what it holds if it still exists.
///
/// KEYS[1] dead-letter stream   KEYS[2] job stream   KEYS[3] job state hash
/// ARGV[1] dead entry id
/// ARGV[2] n, ARGV[3 .. 2+n] job-state fields and values, ARGV[3+n] the job-state field
///         to clear (`job_state::Queued::pass_to`)
/// ARGV[4+n ..] the job's stream fields and values
static REPLAY: LazyLock<Script> = LazyLock::new(|| Script::new(REPLAY_LUA));
const REPLAY_LUA: &str = r"
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return false end
local n = tonumber(ARGV[2])
local new_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4 + n))
redis.call('HSET', KEYS[3], unpack(ARGV, 3, 2 + n))
redis.call('HDEL', KEYS[3], ARGV[3 + n])
redis.call('XDEL', KEYS[1], ARGV[1])
return new_id
";

fn text(map: &HashMap<String, Value>, name: &str) -> String {
    field_bytes(map, name)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The oldest `limit` dead letters.
pub async fn list<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    limit: usize,
) -> redis::RedisResult<Vec<DeadLetter>> {
    let reply: StreamRangeReply = conn
        .xrange_count(keys.dead_letters(), "-", "+", limit)
        .await?;
    Ok(reply
        .ids
        .into_iter()
        .map(|entry| DeadLetter {
            job_id: text(&entry.map, job_entry::JOB_ID),
            tenant: text(&entry.map, job_entry::TENANT),
            reason: text(&entry.map, REASON),
            failed_at: text(&entry.map, FAILED_AT),
            id: entry.id,
        })
        .collect())
}

/// Ids of every dead letter (for `dlq replay --all`).
pub async fn all_ids<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<Vec<String>> {
    let reply: StreamRangeReply = conn.xrange_all(keys.dead_letters()).await?;
    Ok(reply.ids.into_iter().map(|e| e.id).collect())
}

/// Entries in the dead-letter stream (the `summaryd_dead_letters` gauge).
pub async fn count<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<u64> {
    conn.xlen(keys.dead_letters()).await
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Back on the job stream under this new entry id.
    Replayed { job_id: String, stream_id: String },
    /// No such dead entry (already replayed, or a wrong id).
    NotFound,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error("dead entry {0} has no valid job_id")]
    NotAJob(String),
}

pub async fn replay<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    dead_id: &str,
) -> Result<ReplayOutcome, ReplayError> {
    let reply: StreamRangeReply = conn.xrange(keys.dead_letters(), dead_id, dead_id).await?;
    let Some(entry) = reply.ids.into_iter().next() else {
        return Ok(ReplayOutcome::NotFound);
    };
    let not_a_job = || ReplayError::NotAJob(dead_id.to_owned());
    let job_id: JobId = job_entry::job_id(&entry.map).ok_or_else(not_a_job)?;
    if !entry.map.contains_key(job_entry::PAYLOAD) {
        return Err(not_a_job());
    }
    let mut invocation = REPLAY.prepare_invoke();
    invocation
        .key(keys.dead_letters())
        .key(keys.stream())
        .key(keys.job(job_id))
        .arg(dead_id);
    Queued::restored(
        text(&entry.map, job_entry::TENANT),
        text(&entry.map, job_entry::CREATED_AT),
    )
    .pass_to(&mut invocation);
    // The job's own fields, byte for byte; the failure's bookkeeping stays behind.
    for name in job_entry::FIELDS {
        if let Some(value) = field_bytes(&entry.map, name) {
            invocation.arg(name).arg(value);
        }
    }
    let new_id: Option<String> = invocation.invoke_async(conn).await?;
    Ok(match new_id {
        Some(stream_id) => ReplayOutcome::Replayed {
            job_id: job_id.to_string(),
            stream_id,
        },
        None => ReplayOutcome::NotFound,
    })
}
