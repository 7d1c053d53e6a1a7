//! The dead-letter stream: jobs that will never succeed wait here for a person
//! (`summaryd dlq list` / `dlq replay`). This module owns the stream's field names and
//! every write to it: moving a job here, and replaying it into its tenant's lane (ahead of
//! the job stream, `stream/lanes.rs`) with the SAME job id (so a replay can never make a second summary or email). Operators find
//! dead letters by [`DeadLetterFilter`] (`list_matching`, `count_matching`); bulk actions
//! over them are `stream/bulk.rs`.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::Utc;
use redis::aio::ConnectionLike;
use redis::streams::{StreamId, StreamRangeReply};
use redis::{AsyncCommands, Script, Value};

use super::budget::{self, Settle};
use super::consumer_group::entry_millis;
use super::job_entry::{self, field_bytes};
use super::job_state::{self, Queued};
use crate::domain::{JobId, ReasonClass};
use crate::infra::keys::{GROUP, RedisKeys};

/// Fields a dead entry has besides the job's own (`job_entry::FIELDS`).
const REASON: &str = "reason";
/// `ReasonClass::as_str`; absent from dead letters written before it existed.
const CLASS: &str = "class";
const ORIGINAL_ID: &str = "original_id";
const FAILED_AT: &str = "failed_at";
/// The budget reservation the job held when it was dead-lettered (its period id and
/// tokens); absent for a job without one.
const BUDGET_PERIOD: &str = "budget_period";
const BUDGET_TOKENS: &str = "budget_tokens";

/// One dead-lettered job as operators see it (`summaryd dlq list`).
///
/// Serialises to exactly the fields `summaryd dlq list --json` prints (the external
/// contract fixes them), so `class` is left out there; a console shows it from the field.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetter {
    /// The dead-letter entry id (`<ms>-<seq>`, Redis's clock when it was dead-lettered).
    pub id: String,
    pub job_id: String,
    pub tenant: String,
    /// The operator's full reason.
    pub reason: String,
    #[serde(skip)]
    pub class: ReasonClass,
    /// RFC 3339.
    pub failed_at: String,
}

impl DeadLetter {
    /// The dead letter a raw entry (from [`entries_after`]) holds.
    pub(crate) fn from_entry(entry: &StreamId) -> Self {
        let class =
            field_bytes(&entry.map, CLASS).map(|b| String::from_utf8_lossy(&b).into_owned());
        DeadLetter {
            id: entry.id.clone(),
            job_id: text(&entry.map, job_entry::JOB_ID),
            tenant: text(&entry.map, job_entry::TENANT),
            reason: text(&entry.map, REASON),
            class: ReasonClass::from_stored(class.as_deref()),
            failed_at: text(&entry.map, FAILED_AT),
        }
    }
}

/// Which dead letters an operator means. Every field that is set must match; the default
/// matches everything. Ages are measured from the entry id (Redis's clock when the job was
/// dead-lettered), as `dlq purge --older-than` measures them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeadLetterFilter {
    /// Exactly this tenant.
    pub tenant: Option<String>,
    /// Exactly this class (`ReasonClass::Unknown` matches dead letters without one).
    pub class: Option<ReasonClass>,
    /// Dead-lettered longer ago than this.
    pub older_than: Option<Duration>,
    /// Dead-lettered at most this long ago.
    pub newer_than: Option<Duration>,
}

impl DeadLetterFilter {
    /// Whether `dead` is one of the dead letters meant, ages measured at `now_ms` (Unix
    /// milliseconds). An entry id without a time matches no age bound.
    pub fn matches(&self, dead: &DeadLetter, now_ms: u64) -> bool {
        let cutoff = |age: Duration| now_ms.saturating_sub(millis(age));
        let at = entry_millis(&dead.id);
        self.tenant.as_ref().is_none_or(|t| *t == dead.tenant)
            && self.class.is_none_or(|c| c == dead.class)
            && self
                .older_than
                .is_none_or(|age| at.is_some_and(|ms| ms < cutoff(age)))
            && self
                .newer_than
                .is_none_or(|age| at.is_some_and(|ms| ms >= cutoff(age)))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Now, in Unix milliseconds, for measuring ages.
pub(crate) fn now_millis() -> u64 {
    u64::try_from(Utc::now().timestamp_millis()).unwrap_or(0)
}

/// Why a job is dead-lettered, as [`add`] stores it.
#[derive(Debug, Clone, Copy)]
pub struct Why<'a> {
    /// The operator's full reason.
    pub reason: &'a str,
    pub class: ReasonClass,
    /// What GET shows the tenant.
    pub tenant_error: &'a str,
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
    why: Why<'_>,
) -> redis::RedisResult<bool> {
    add_settling(conn, keys, consumer, msg_id, fields, why, None).await
}

/// [`add`], releasing the job's budget reservation (`settle`: what the job's reported calls
/// spent is charged, the rest of the reservation given back) inside the same
/// owner-checked script, so a dead letter that does not happen releases nothing and a job
/// acknowledged meanwhile is not settled twice (`stream/budget.rs`).
pub async fn add_settling<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    msg_id: &str,
    fields: &HashMap<String, Value>,
    why: Why<'_>,
    settle: Option<&Settle>,
) -> redis::RedisResult<bool> {
    let Why {
        reason,
        class,
        tenant_error,
    } = why;
    let failed_at = job_entry::timestamp(Utc::now());
    // Keep every original field a replay needs; ours go last and win on a name clash.
    let mut entry: Vec<(String, Vec<u8>)> = fields
        .keys()
        .filter(|name| {
            ![
                REASON,
                CLASS,
                ORIGINAL_ID,
                FAILED_AT,
                BUDGET_PERIOD,
                BUDGET_TOKENS,
            ]
            .contains(&name.as_str())
        })
        .filter_map(|name| field_bytes(fields, name).map(|v| (name.clone(), v)))
        .collect();
    // HashMap order is random; a stable order makes entries easy to compare by eye.
    entry.sort();
    entry.push((REASON.into(), reason.as_bytes().to_vec()));
    entry.push((CLASS.into(), class.as_str().as_bytes().to_vec()));
    entry.push((ORIGINAL_ID.into(), msg_id.as_bytes().to_vec()));
    entry.push((FAILED_AT.into(), failed_at.into_bytes()));
    // The reservation the job held, so `dlq replay` can reserve as much again.
    if let Some(s) = settle {
        entry.push((
            BUDGET_PERIOD.into(),
            s.reservation.period_id.as_bytes().to_vec(),
        ));
        entry.push((
            BUDGET_TOKENS.into(),
            s.reservation.tokens.to_string().into_bytes(),
        ));
    }

    let mut invocation = DEAD_LETTER.prepare_invoke();
    invocation.key(keys.stream()).key(keys.dead_letters());
    // A malformed entry may have no usable job id; then there is no job state to update and
    // nothing counted in flight (the keys, never touched, are the dead-letter stream again).
    match job_entry::job_id(fields) {
        Some(job_id) => {
            let tenant = text(fields, job_entry::TENANT);
            invocation
                .key(keys.job(job_id))
                .key(keys.in_flight(&tenant))
                .key(keys.running(&tenant));
            invocation
                .arg(GROUP)
                .arg(consumer)
                .arg(msg_id)
                .arg(job_id.to_string());
            job_state::pass_failed(&mut invocation, tenant_error);
        }
        None => {
            invocation.key(keys.dead_letters()).key(keys.dead_letters());
            // The running set is a set whatever the entry holds: SREM on another type
            // would fail after the writes before it.
            invocation.key(keys.running(&text(fields, job_entry::TENANT)));
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
    // Last, after the entry's fields (the script finds those before these by their count).
    let tenant = text(fields, job_entry::TENANT);
    let settle = settle.filter(|_| job_entry::job_id(fields).is_some());
    Settle::pass_to(settle, keys, &tenant, &mut invocation);
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
/// KEYS[4] the tenant's in-flight set   KEYS[5] the tenant's running set (`stream::lanes`)
/// KEYS[6] the budget hash of the job's reservation
/// ARGV[1] group   ARGV[2] consumer   ARGV[3] entry id   ARGV[4] job id ('' when none)
/// ARGV[5] n, ARGV[6 .. 5+n] job-state fields and values (`job_state::pass_failed`)
/// ARGV[6+n .. #ARGV-4] the dead entry's fields and values
/// ARGV[#ARGV-3 ..] the budget settle's arguments (`budget::Settle::pass_to`; its period id
/// is '' when there is nothing to settle)
static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{}{DEAD_LETTER_LUA}", budget::SETTLE_LUA)));
const DEAD_LETTER_LUA: &str = r"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #pending == 0 then return false end
local n = tonumber(ARGV[5])
local s = #ARGV - 4
local dead_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 6 + n, s))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
if n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], unpack(ARGV, 6, 5 + n))
end
if ARGV[4] ~= '' then
  redis.call('SREM', KEYS[4], ARGV[4])
  settle_budget(KEYS[3], KEYS[6], ARGV[s + 1], ARGV[s + 2], ARGV[s + 3], ARGV[s + 4])
end
redis.call('SREM', KEYS[5], ARGV[3])
return dead_id
";

/// Re-enqueue one dead entry and delete it, atomically: the entry is either still in the
/// dead-letter stream or back in its tenant's lane (`stream::lanes`, scheduled like a new
/// job of the tenant) with its state `queued`, never both or neither. Re-checks that the entry still exists, so a concurrent or repeated replay is a
/// no-op. The job's fields come from the caller, who read the entry: an entry never
/// changes, so they are what it holds if it still exists.
///
/// KEYS[1] dead-letter stream   KEYS[2] the tenant's lane   KEYS[3] job state hash
/// KEYS[4] the tenant's in-flight set (the job counts again, never refused by the limit)
/// KEYS[5] active lanes   KEYS[6] the scheduler's virtual time   KEYS[7] the doorbell
/// ARGV[1] dead entry id      ARGV[2] job id
/// ARGV[3] n, ARGV[4 .. 3+n] job-state fields and values, ARGV[4+n] the job-state field
///         to clear (`job_state::Queued::pass_to`)
/// ARGV[5+n .. #ARGV-6] the job's stream fields and values   ARGV[#ARGV-5] the tenant
/// KEYS[8] the tenant's budget hash of this period   ARGV[#ARGV-4 ..] the reservation the
/// job makes again (`budget::Rereserve::pass_to`: tokens, 0 for none, TTL ms, the job-state
/// field of the period, the period id, the job-state field of the tokens); never refused
static REPLAY: LazyLock<Script> = LazyLock::new(|| Script::new(REPLAY_LUA));
const REPLAY_LUA: &str = r"
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return false end
local n = tonumber(ARGV[3])
local b = #ARGV - 5
local new_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5 + n, b - 1))
redis.call('HSET', KEYS[3], unpack(ARGV, 4, 3 + n))
redis.call('HDEL', KEYS[3], ARGV[4 + n])
if tonumber(ARGV[b + 1]) > 0 then
  redis.call('HINCRBY', KEYS[8], 'reserved', ARGV[b + 1])
  redis.call('PEXPIRE', KEYS[8], ARGV[b + 2])
  redis.call('HSET', KEYS[3], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 1])
end
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[5], 'NX', redis.call('GET', KEYS[6]) or 0, ARGV[b])
redis.call('RPUSH', KEYS[7], 1)
redis.call('LTRIM', KEYS[7], -64, -1)
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
    Ok(reply.ids.iter().map(DeadLetter::from_entry).collect())
}

/// Entries read per XRANGE while filtering: a page small enough that Redis is never busy
/// with one read for long.
pub(crate) const SCAN_PAGE: usize = 200;

/// The most entries one [`list_matching`] call reads, so a filter that matches little in a
/// large dead-letter stream answers in bounded time (and hands back a cursor to go on).
pub const MAX_SCAN: usize = 10_000;

/// The XRANGE start just after `after` (exclusive), or the stream's start.
fn start_after(after: Option<&str>) -> String {
    after.map_or_else(|| "-".to_owned(), |id| format!("({id}"))
}

/// Up to `count` raw dead entries after `after` (exclusive) and up to `upto` (inclusive,
/// `+` for the newest), oldest first.
pub(crate) async fn entries_after<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    after: Option<&str>,
    upto: &str,
    count: usize,
) -> redis::RedisResult<Vec<StreamId>> {
    let reply: StreamRangeReply = conn
        .xrange_count(keys.dead_letters(), start_after(after), upto, count)
        .await?;
    Ok(reply.ids)
}

/// Up to `limit` dead letters that match `filter`, oldest first, after the entry id
/// `after` (exclusive; `None` = from the oldest). Reads the stream in pages and filters
/// here, at most [`MAX_SCAN`] entries per call.
///
/// The second value is the cursor for the next page (pass it as `after`): `None` when the
/// stream was read to its end. A page may hold fewer than `limit` dead letters and still
/// have a cursor (the scan stopped at [`MAX_SCAN`]); only `None` means there are no more.
pub async fn list_matching<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    filter: &DeadLetterFilter,
    after: Option<&str>,
    limit: usize,
) -> redis::RedisResult<(Vec<DeadLetter>, Option<String>)> {
    let now_ms = now_millis();
    let mut found = Vec::new();
    let mut cursor = after.map(str::to_owned);
    if limit == 0 {
        return Ok((found, cursor));
    }
    let mut scanned = 0;
    loop {
        let page = entries_after(conn, keys, cursor.as_deref(), "+", SCAN_PAGE).await?;
        let read = page.len();
        for entry in &page {
            scanned += 1;
            cursor = Some(entry.id.clone());
            let dead = DeadLetter::from_entry(entry);
            if filter.matches(&dead, now_ms) {
                found.push(dead);
                if found.len() == limit {
                    return Ok((found, cursor));
                }
            }
        }
        if read < SCAN_PAGE {
            return Ok((found, None));
        }
        if scanned >= MAX_SCAN {
            return Ok((found, cursor));
        }
    }
}

/// How many dead letters up to the entry id `upto` (inclusive: the newest when the
/// operator looked, from [`newest_id`]) match `filter`. Reads every such entry, in pages.
pub async fn count_matching<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    filter: &DeadLetterFilter,
    upto: &str,
) -> redis::RedisResult<usize> {
    count_matching_at(conn, keys, filter, upto, now_millis()).await
}

/// [`count_matching`], ages measured at `now_ms`.
pub(crate) async fn count_matching_at<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    filter: &DeadLetterFilter,
    upto: &str,
    now_ms: u64,
) -> redis::RedisResult<usize> {
    let mut count = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = entries_after(conn, keys, cursor.as_deref(), upto, SCAN_PAGE).await?;
        count += page
            .iter()
            .filter(|entry| filter.matches(&DeadLetter::from_entry(entry), now_ms))
            .count();
        match page.last() {
            Some(last) if page.len() == SCAN_PAGE => cursor = Some(last.id.clone()),
            _ => return Ok(count),
        }
    }
}

/// The id of the newest dead letter, `None` when there is none: the snapshot a count and a
/// bulk action agree on, so dead letters added after it are left alone.
pub async fn newest_id<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<Option<String>> {
    let reply: StreamRangeReply = conn
        .xrevrange_count(keys.dead_letters(), "+", "-", 1)
        .await?;
    Ok(reply.ids.into_iter().next().map(|e| e.id))
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

/// Remove these dead entries (those still there) with their job state; returns how many
/// this call removed.
pub(crate) async fn purge_entries<C: ConnectionLike + Send + Sync>(
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
    /// Back in its tenant's lane under this new entry id.
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
    let tenant = text(&entry.map, job_entry::TENANT);
    let mut invocation = REPLAY.prepare_invoke();
    invocation
        .key(keys.dead_letters())
        .key(keys.lane(&tenant))
        .key(keys.job(job_id))
        .key(keys.in_flight(&tenant))
        .key(keys.lanes())
        .key(keys.lanes_clock())
        .key(keys.doorbell())
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
    invocation.arg(&tenant);
    // It will spend again: it reserves again what it held, in today's period.
    let rereserve = text(&entry.map, BUDGET_TOKENS)
        .parse::<u64>()
        .ok()
        .and_then(|tokens| {
            budget::Rereserve::at(&text(&entry.map, BUDGET_PERIOD), tokens, Utc::now())
        });
    budget::Rereserve::pass_to(rereserve.as_ref(), keys, &tenant, &mut invocation);
    let new_id: Option<String> = invocation.invoke_async(conn).await?;
    Ok(match new_id {
        Some(stream_id) => ReplayOutcome::Replayed {
            job_id: job_id.to_string(),
            stream_id,
        },
        None => ReplayOutcome::NotFound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000;
    const MINUTE: Duration = Duration::from_secs(60);

    fn dead(tenant: &str, class: ReasonClass, minutes_ago: u64) -> DeadLetter {
        DeadLetter {
            id: format!("{}-0", NOW - minutes_ago * 60_000),
            job_id: "j".into(),
            tenant: tenant.into(),
            reason: "r".into(),
            class,
            failed_at: String::new(),
        }
    }

    #[test]
    fn the_empty_filter_matches_everything() {
        let all = DeadLetterFilter::default();
        assert!(all.matches(&dead("acme", ReasonClass::Unknown, 0), NOW));
        let mut no_time = dead("acme", ReasonClass::Unknown, 0);
        no_time.id = "garbage".into();
        assert!(all.matches(&no_time, NOW));
        let aged = DeadLetterFilter {
            older_than: Some(Duration::ZERO),
            ..DeadLetterFilter::default()
        };
        assert!(!aged.matches(&no_time, NOW), "no time, no age");
        let young = DeadLetterFilter {
            newer_than: Some(MINUTE),
            ..DeadLetterFilter::default()
        };
        assert!(!young.matches(&no_time, NOW), "no time, no age");
    }

    #[test]
    fn tenant_and_class_match_exactly_and_together() {
        let filter = DeadLetterFilter {
            tenant: Some("acme".into()),
            class: Some(ReasonClass::TooLong),
            ..DeadLetterFilter::default()
        };
        assert!(filter.matches(&dead("acme", ReasonClass::TooLong, 5), NOW));
        assert!(!filter.matches(&dead("acme2", ReasonClass::TooLong, 5), NOW));
        assert!(!filter.matches(&dead("acm", ReasonClass::TooLong, 5), NOW));
        assert!(!filter.matches(&dead("acme", ReasonClass::MaxDeliveries, 5), NOW));
        assert!(!filter.matches(&dead("other", ReasonClass::Unknown, 5), NOW));
        let unknown = DeadLetterFilter {
            class: Some(ReasonClass::Unknown),
            ..DeadLetterFilter::default()
        };
        assert!(unknown.matches(&dead("x", ReasonClass::Unknown, 5), NOW));
        assert!(!unknown.matches(&dead("x", ReasonClass::TooLong, 5), NOW));
    }

    #[test]
    fn ages_split_at_the_cutoff_older_strictly() {
        let older = DeadLetterFilter {
            older_than: Some(10 * MINUTE),
            ..DeadLetterFilter::default()
        };
        let newer = DeadLetterFilter {
            newer_than: Some(10 * MINUTE),
            ..DeadLetterFilter::default()
        };
        for (minutes, is_older) in [(11, true), (10, false), (9, false), (0, false)] {
            let d = dead("acme", ReasonClass::Unknown, minutes);
            assert_eq!(older.matches(&d, NOW), is_older, "{minutes} min");
            assert_eq!(newer.matches(&d, NOW), !is_older, "{minutes} min");
        }
        let mut just_before = dead("acme", ReasonClass::Unknown, 10);
        just_before.id = format!("{}-5", NOW - 10 * 60_000 - 1);
        assert!(older.matches(&just_before, NOW));
        assert!(!newer.matches(&just_before, NOW));
        // Both bounds: a window between 5 and 10 minutes ago.
        let window = DeadLetterFilter {
            older_than: Some(5 * MINUTE),
            newer_than: Some(10 * MINUTE),
            ..DeadLetterFilter::default()
        };
        let hits: Vec<u64> = (0..15)
            .filter(|m| window.matches(&dead("acme", ReasonClass::Unknown, *m), NOW))
            .collect();
        assert_eq!(hits, vec![6, 7, 8, 9, 10]);
        // An age longer than the clock has run reaches back to the start of time.
        let ancient = DeadLetterFilter {
            older_than: Some(Duration::from_secs(u64::MAX)),
            ..DeadLetterFilter::default()
        };
        assert!(!ancient.matches(&dead("acme", ReasonClass::Unknown, 60), NOW));
    }

    #[test]
    fn a_cursor_starts_just_after_its_entry() {
        assert_eq!(start_after(None), "-");
        assert_eq!(start_after(Some("5-1")), "(5-1");
    }
}
