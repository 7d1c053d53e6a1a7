//! Operator access to the dead-letter stream: list entries, and replay them onto the job
//! stream with the SAME job id (so a replay can never make a second summary or email).

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::streams::StreamRangeReply;
use redis::{AsyncCommands, Script, Value};

use crate::domain::JobId;
use crate::keys::RedisKeys;

/// One dead-lettered job as operators see it (`summaryd dlq list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    pub id: String,
    pub job_id: String,
    pub tenant: String,
    pub reason: String,
    pub failed_at: String,
}

/// Fields of a job message that travel back onto the stream; everything else on a dead
/// entry (reason, failed_at, original_id) is bookkeeping of the failure.
const JOB_FIELDS: [&str; 4] = ["job_id", "tenant", "payload", "created_at"];

/// Re-enqueue one dead entry and delete it, atomically: the entry is either still in the
/// dead-letter stream or back on the job stream with its state `queued`, never both or neither.
/// Re-checks that the entry still exists, so a concurrent or repeated replay is a no-op.
const REPLAY: &str = r#"
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entries == 0 then return false end
local fields = entries[1][2]
local job = {}
for i = 1, #fields, 2 do job[fields[i]] = fields[i + 1] end
if not job['job_id'] or not job['payload'] then return redis.error_reply('dead entry ' .. ARGV[1] .. ' is not a job') end
local out = {}
for i = 2, #ARGV do
  local name = ARGV[i]
  if job[name] then table.insert(out, name); table.insert(out, job[name]) end
end
local new_id = redis.call('XADD', KEYS[2], '*', unpack(out))
redis.call('HSET', KEYS[3], 'tenant', job['tenant'] or '', 'status', 'queued', 'created_at', job['created_at'] or '')
redis.call('HDEL', KEYS[3], 'error')
redis.call('XDEL', KEYS[1], ARGV[1])
return new_id
"#;

fn text(map: &HashMap<String, Value>, name: &str) -> String {
    match map.get(name) {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        _ => String::new(),
    }
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
            job_id: text(&entry.map, "job_id"),
            tenant: text(&entry.map, "tenant"),
            reason: text(&entry.map, "reason"),
            failed_at: text(&entry.map, "failed_at"),
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
    // Read first only to learn the job id, so the job-state key can be declared in KEYS.
    let reply: StreamRangeReply = conn.xrange(keys.dead_letters(), dead_id, dead_id).await?;
    let Some(entry) = reply.ids.into_iter().next() else {
        return Ok(ReplayOutcome::NotFound);
    };
    let job_id: JobId = text(&entry.map, "job_id")
        .parse()
        .map_err(|_| ReplayError::NotAJob(dead_id.to_owned()))?;
    let new_id: Option<String> = Script::new(REPLAY)
        .key(keys.dead_letters())
        .key(keys.stream())
        .key(keys.job(job_id))
        .arg(dead_id)
        .arg(&JOB_FIELDS[..])
        .invoke_async(conn)
        .await?;
    Ok(match new_id {
        Some(stream_id) => ReplayOutcome::Replayed {
            job_id: job_id.to_string(),
            stream_id,
        },
        None => ReplayOutcome::NotFound,
    })
}
