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
use crate::infra::keys::{GROUP, RedisKeys};

/// Fields a dead entry has besides the job's own (`job_entry::FIELDS`).
const REASON: &str = "reason";
const ORIGINAL_ID: &str = "original_id";
const FAILED_AT: &str = "failed_at";

/// One dead-lettered job as operators see it (`summaryd dlq list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    pub(crate) id: String,
    pub(crate) job_id: String,
    pub(crate) tenant: String,
    pub(crate) reason: String,
    pub(crate) failed_at: String,
}

/// Move the entry `msg_id`, pending for `consumer`, to the dead-letter stream (its original
/// fields plus the operator's `reason`, original id and time), mark the job failed with
/// `tenant_error` (what GET shows) and stop counting it in flight for its tenant, in one
/// script; see [`DEAD_LETTER_LUA`]. The entry leaves the job stream in the same step, so its
/// text is kept once (in the dead letter), not twice. Returns false when the entry was no
/// longer pending for `consumer` (acknowledged by a delivery that finished, or reclaimed by another consumer):
/// then nothing was written, and whoever holds the entry decides its fate.
pub async fn add<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    msg_id: &str,
    fields: &HashMap<String, Value>,
    reason: &str,
    tenant_error: &str,
) -> redis::RedisResult<bool> {
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

    let mut invocation = DEAD_LETTER.prepare_invoke();
    invocation.key(keys.stream()).key(keys.dead_letters());
    // A malformed entry may have no usable job id; then there is no job state to update and
    // nothing counted in flight (the keys, never touched, are the dead-letter stream again).
    match job_entry::job_id(fields) {
        Some(job_id) => {
            let tenant = text(fields, job_entry::TENANT);
            invocation
                .key(keys.job(job_id))
                .key(keys.in_flight(&tenant));
            invocation
                .arg(GROUP)
                .arg(consumer)
                .arg(msg_id)
                .arg(job_id.to_string());
            job_state::pass_failed(&mut invocation, tenant_error);
        }
        None => {
            invocation.key(keys.dead_letters()).key(keys.dead_letters());
            invocation
                .arg(GROUP)
                .arg(consumer)
                .arg(msg_id)
                .arg("")
                .arg(0);
        }
    }
    for (name, value) in &entry {
        invocation.arg(name).arg(value);
    }
    let dead_id: Option<String> = invocation.invoke_async(conn).await?;
    Ok(dead_id.is_some())
}

/// The dead-letter step.
///
/// Only if the entry is still pending for this consumer: a delivery that was reclaimed from
/// us, or that finished elsewhere, is not ours to bury (a dead letter for a job that then
/// completes, or a `failed` state with no tenant recreated for a finished job, was the
/// result). The dead entry is written first: the only command that can fail (XADD on a key
/// of the wrong type) then fails before any write, so the job is never acknowledged without
/// its dead letter. Then XACK, then the job state, and only while the state still exists:
/// a finished job's state is gone and must stay gone. The job stops counting against its
/// tenant's `max_in_flight` in the same step (SREM is idempotent, so a job the set never
/// held is no harm). The entry is deleted from the job stream right after the XACK, in this
/// same step: never gone while still pending, never left behind once dead.
///
/// KEYS[1] job stream   KEYS[2] dead-letter stream   KEYS[3] job state hash
/// KEYS[4] the tenant's in-flight set
/// ARGV[1] group   ARGV[2] consumer   ARGV[3] entry id   ARGV[4] job id ('' when none)
/// ARGV[5] n, ARGV[6 .. 5+n] job-state fields and values (`job_state::pass_failed`)
/// ARGV[6+n ..] the dead entry's fields and values
static DEAD_LETTER: LazyLock<Script> = LazyLock::new(|| Script::new(DEAD_LETTER_LUA));
const DEAD_LETTER_LUA: &str = r"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #pending == 0 then return false end
local n = tonumber(ARGV[5])
local dead_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 6 + n))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
if n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], unpack(ARGV, 6, 5 + n))
end
if ARGV[4] ~= '' then
  redis.call('SREM', KEYS[4], ARGV[4])
end
return dead_id
";

/// Re-enqueue one dead entry and delete it, atomically: the entry is either still in the
/// dead-letter stream or back on the job stream with its state `queued`, never both or
/// neither. Re-checks that the entry still exists, so a concurrent or repeated replay is a
/// no-op. The job's fields come from the caller, who read the entry: an entry never
/// changes, so they are what it holds if it still exists.
///
/// KEYS[1] dead-letter stream   KEYS[2] job stream   KEYS[3] job state hash
/// KEYS[4] the tenant's in-flight set (the job counts again, never refused by the limit)
/// ARGV[1] dead entry id      ARGV[2] job id
/// ARGV[3] n, ARGV[4 .. 3+n] job-state fields and values, ARGV[4+n] the job-state field
///         to clear (`job_state::Queued::pass_to`)
/// ARGV[5+n ..] the job's stream fields and values
static REPLAY: LazyLock<Script> = LazyLock::new(|| Script::new(REPLAY_LUA));
const REPLAY_LUA: &str = r"
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return false end
local n = tonumber(ARGV[3])
local new_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5 + n))
redis.call('HSET', KEYS[3], unpack(ARGV, 4, 3 + n))
redis.call('HDEL', KEYS[3], ARGV[4 + n])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[2])
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

/// Remove dead letters and the job state of each, atomically per batch: KEYS[1] is the
/// dead-letter stream, KEYS[2..] the job-state hashes; ARGV[1], ARGV[2] the job-state field
/// and value of a failed job (`job_state::pass_failed_marker`); then per dead letter its id
/// and the index into KEYS of its job state (0 when the entry has no usable job id).
/// Only a dead letter this call actually deletes counts, and its job state is dropped only
/// while the job is still failed (not replayed meanwhile), so concurrent purges never
/// remove or count anything twice.
static PURGE: LazyLock<Script> = LazyLock::new(|| Script::new(PURGE_LUA));
const PURGE_LUA: &str = r"
local removed = 0
for i = 3, #ARGV, 2 do
  if redis.call('XDEL', KEYS[1], ARGV[i]) == 1 then
    removed = removed + 1
    local k = tonumber(ARGV[i + 1])
    if k > 0 and redis.call('HGET', KEYS[k], ARGV[1]) == ARGV[2] then
      redis.call('DEL', KEYS[k])
    end
  end
end
return removed
";

/// Dead letters taken per read and removed per script call: small, so a purge of a
/// large dead-letter stream never blocks Redis for long.
pub(crate) const PURGE_BATCH: usize = 200;

/// Remove every dead letter added before `cutoff_ms` (Unix milliseconds, Redis's clock: a
/// dead letter's id is the time it was added), with its job state, in batches.
/// A dead letter added at `cutoff_ms` or later stays. Returns how many this call removed.
pub async fn purge_before<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    cutoff_ms: u64,
) -> redis::RedisResult<u64> {
    if cutoff_ms == 0 {
        return Ok(0);
    }
    let end = format!("({cutoff_ms}-0");
    let mut removed = 0;
    loop {
        let reply: StreamRangeReply = conn
            .xrange_count(keys.dead_letters(), "-", &end, PURGE_BATCH)
            .await?;
        let batch = reply.ids.len();
        if batch == 0 {
            return Ok(removed);
        }
        removed += purge_entries(conn, keys, &reply.ids).await?;
        if batch < PURGE_BATCH {
            return Ok(removed);
        }
    }
}

/// Remove the given dead letters (those still there) with their job state; with
/// `cutoff_ms`, only those added before it. Returns how many were removed.
pub(crate) async fn purge_ids<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    ids: &[String],
    cutoff_ms: Option<u64>,
) -> redis::RedisResult<u64> {
    let mut removed = 0;
    for chunk in ids.chunks(PURGE_BATCH) {
        let mut entries = Vec::new();
        for id in chunk {
            let reply: StreamRangeReply = conn.xrange(keys.dead_letters(), id, id).await?;
            entries.extend(reply.ids.into_iter().filter(|e| {
                cutoff_ms.is_none_or(|cut| {
                    super::consumer_group::entry_millis(&e.id).is_some_and(|ms| ms < cut)
                })
            }));
        }
        removed += purge_entries(conn, keys, &entries).await?;
    }
    Ok(removed)
}

async fn purge_entries<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    entries: &[redis::streams::StreamId],
) -> redis::RedisResult<u64> {
    if entries.is_empty() {
        return Ok(0);
    }
    let mut invocation = PURGE.prepare_invoke();
    invocation.key(keys.dead_letters());
    job_state::pass_failed_marker(&mut invocation);
    let mut next_key = 2;
    for entry in entries {
        invocation.arg(&entry.id);
        match job_entry::job_id(&entry.map) {
            Some(job_id) => {
                invocation.key(keys.job(job_id)).arg(next_key);
                next_key += 1;
            }
            None => {
                invocation.arg(0);
            }
        }
    }
    invocation.invoke_async(conn).await
}

/// Entries in the dead-letter stream (the `summaryd_dead_letters` gauge).
pub(crate) async fn count<C: ConnectionLike + Send + Sync>(
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
        .key(keys.in_flight(&text(&entry.map, job_entry::TENANT)))
        .arg(dead_id)
        .arg(job_id.to_string());
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
