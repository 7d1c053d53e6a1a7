//! The stream's consumer group, as a worker uses it: create the group, read new entries,
//! reclaim idle ones, count deliveries, acknowledge finished jobs, and remove consumers
//! that are gone.
//!
//! Thin wrappers over single Redis commands, one MULTI/EXEC or a short owner-checked script;
//! the decisions about what to do with a delivery live in the worker (`worker/settle.rs`). `docs/delivery.md` explains the delivery accounting.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::ConnectionLike;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamInfoConsumersReply,
    StreamPendingCountReply,
};

use super::budget::{self, Settle};
use super::job_state::SeenReservation;
use super::lanes::Handed;
use super::{job_entry, job_state, lanes, tenant_limits};
use crate::domain::{Job, JobId};
use crate::infra::keys::{GROUP, RedisKeys};
use crate::infra::redis::script_call::is_noscript;

/// The XAUTOCLAIM cursor that starts (and, when returned, ends) a full scan of the PEL.
pub(crate) const CURSOR_START: &str = "0-0";

/// One stream entry handed to this consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub id: String,
    pub fields: HashMap<String, redis::Value>,
    /// The shard whose job stream the entry is on: every later step of the delivery (the
    /// claim's extension, the ack, the dead letter) uses that shard's keys.
    pub shard: u16,
    /// Its job's budget reservation, when the step that handed it out read it.
    pub reservation: SeenReservation,
}

impl Delivery {
    fn of(keys: &RedisKeys) -> impl Fn(StreamId) -> Self {
        let shard = keys.shard();
        move |entry| Self {
            id: entry.id,
            fields: entry.map,
            shard,
            reservation: SeenReservation::Unread,
        }
    }

    fn handed(keys: &RedisKeys) -> impl Fn(Handed) -> Self {
        let of = Self::of(keys);
        move |handed| Self {
            reservation: handed.reservation,
            ..of(handed.entry)
        }
    }
}

/// Create the consumer group (and the stream) if missing. Starts at `0`, not `$`: jobs the
/// API enqueued before the first worker ever started must still be processed.
pub async fn ensure_group<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<()> {
    let created: redis::RedisResult<()> =
        conn.xgroup_create_mkstream(keys.stream(), GROUP, "0").await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// XAUTOCLAIM entries idle for at least `min_idle`, starting at `cursor`.
/// Returns the next cursor (`0-0` when the scan is complete), the claimed entries, and the
/// ids that were pending but no longer exist in the stream (Redis drops them from the PEL).
pub(crate) async fn autoclaim<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    min_idle: Duration,
    cursor: &str,
    count: usize,
) -> redis::RedisResult<(String, Vec<Delivery>, Vec<String>)> {
    let reply: StreamAutoClaimReply = conn
        .xautoclaim_options(
            keys.stream(),
            GROUP,
            consumer,
            millis(min_idle),
            cursor,
            StreamAutoClaimOptions::default().count(count),
        )
        .await?;
    Ok((
        reply.next_stream_id,
        reply.claimed.into_iter().map(Delivery::of(keys)).collect(),
        reply.deleted_ids,
    ))
}

/// What [`autoclaim_and_dispatch`] found.
pub(crate) struct ClaimedAndDispatched {
    /// XAUTOCLAIM's next cursor (`0-0` when its scan is complete).
    pub(crate) next_cursor: String,
    /// Entries idle past `min_idle`, now this consumer's.
    pub(crate) claimed: Vec<Delivery>,
    /// Ids that were pending but no longer exist in the stream.
    pub(crate) deleted: Vec<String>,
    /// The new entry dispatch handed this consumer, if there was one.
    pub(crate) new: Option<Delivery>,
}

/// [`autoclaim`] (one entry) and one [`lanes::dispatch`] in one round trip, pipelined.
///
/// Nearly every take finds nothing idle and needs a new entry, so asking for both at once
/// saves each job a round trip. When both find one (idle entries follow a worker's crash,
/// so that is rare), the caller decides what waits: the worker holds the new one and
/// re-claims it before running it (`worker/take.rs`). A NOSCRIPT (Redis lost its script
/// cache) fails only the dispatch: the claim stands, and the dispatch is sent again alone,
/// which loads the script.
pub(crate) async fn autoclaim_and_dispatch<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    min_idle: Duration,
    cursor: &str,
) -> redis::RedisResult<ClaimedAndDispatched> {
    let dispatch = lanes::dispatch_call(keys, consumer);
    let mut pipe = redis::pipe();
    pipe.ignore_errors()
        .cmd("XAUTOCLAIM")
        .arg(keys.stream())
        .arg(GROUP)
        .arg(consumer)
        .arg(millis(min_idle))
        .arg(cursor)
        .arg("COUNT")
        .arg(1)
        .add_command(dispatch.into_cmd());
    let replies: Vec<redis::RedisResult<redis::Value>> = pipe.query_async(conn).await?;
    let mut replies = replies.into_iter();
    let (Some(claim), Some(read)) = (replies.next(), replies.next()) else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a pipeline of two commands answered fewer replies",
        )));
    };
    let claim: StreamAutoClaimReply = redis::from_redis_value(claim?)?;
    let new = match read {
        Err(e) if is_noscript(&e) => lanes::dispatch(conn, keys, consumer).await?,
        read => lanes::dispatched(redis::from_redis_value(read?)?),
    };
    Ok(ClaimedAndDispatched {
        next_cursor: claim.next_stream_id,
        claimed: claim.claimed.into_iter().map(Delivery::of(keys)).collect(),
        deleted: claim.deleted_ids,
        new: new.map(Delivery::handed(keys)),
    })
}

/// New work for `consumer`, at most `count` entries: dispatched by [`lanes::dispatch`] (an
/// entry already on the job stream, else the next one of the lane whose turn it is, read
/// with XREADGROUP `>` in the same step). When there is none, waits up to `block` for the
/// doorbell a new job rings, then tries once more.
pub async fn read_new<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    count: usize,
    block: Duration,
) -> redis::RedisResult<Vec<Delivery>> {
    let mut taken = read_now(conn, keys, consumer, count).await?;
    if taken.is_empty() && wait_for_work(conn, keys, block).await? {
        taken = read_now(conn, keys, consumer, 1).await?;
    }
    Ok(taken)
}

/// [`read_new`] without the wait: what dispatch hands out now, at most `count` entries.
pub async fn read_now<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    count: usize,
) -> redis::RedisResult<Vec<Delivery>> {
    let mut taken = Vec::new();
    while taken.len() < count.max(1) {
        match lanes::dispatch(conn, keys, consumer).await? {
            Some(handed) => taken.push(Delivery::handed(keys)(handed)),
            None => break,
        }
    }
    Ok(taken)
}

/// Wait up to `block` for the doorbell of `keys`' shard: whether a job was put in a lane.
pub async fn wait_for_work<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    block: Duration,
) -> redis::RedisResult<bool> {
    lanes::wait_for_work(conn, keys, block).await
}

/// How often `msg_id` has been delivered (XREADGROUP sets 1, each claim adds one), from the
/// PEL, so the count survives the crashes an in-memory counter would forget.
/// `None` when the entry is no longer pending (another consumer finished it meanwhile).
pub async fn delivery_count<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    msg_id: &str,
) -> redis::RedisResult<Option<u64>> {
    let reply: StreamPendingCountReply = conn
        .xpending_count(keys.stream(), GROUP, msg_id, msg_id, 1)
        .await?;
    Ok(reply
        .ids
        .first()
        .map(|p| u64::try_from(p.times_delivered).unwrap_or(u64::MAX)))
}

/// How [`claim_own`] sets the delivery count of the entry it re-claims. Counts are set, not
/// moved: a call whose reply was lost can be sent again and lands on the same count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimCount {
    /// Leave the count: a running delivery extending its claim.
    Keep,
    /// Set it: the retry of a held entry, as the delivery it stands for. Only from the
    /// count one below or as a repeat; a count that moved otherwise (the entry was claimed
    /// meanwhile) answers `None`, as an entry that is not ours.
    Set(u64),
    /// Refund a delivery that did not get to finish the job: set the count to `to`, unless
    /// the job has had `limit` refunds already (counted in its job state, which a refund
    /// needs: without one nothing bounds the refunds, so none is given).
    Refund { to: u64, limit: u64 },
}

/// What [`claim_own`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    /// The delivery count now.
    pub count: u64,
    /// Whether a [`ClaimCount::Refund`] was given (false: the count was left as it was).
    pub refunded: bool,
}

/// Re-claim an entry this consumer holds, only if it still holds it: reset its idle time
/// (so no XAUTOCLAIM takes it from a live delivery) and set its delivery count as `count`
/// says. Owner-checked in one script, because a plain XCLAIM would take the entry from
/// whoever reclaimed it meanwhile. `None` when the entry is no longer pending for
/// `consumer` (acknowledged, dead-lettered or reclaimed by another consumer): then nothing
/// was changed.
///
/// KEYS[1] job stream   KEYS[2] job state
/// ARGV[1] group   ARGV[2] consumer   ARGV[3] entry id   ARGV[4] keep | set | refund
/// ARGV[5] the count to set   ARGV[6] the refunds field (`job_state`)   ARGV[7] refund limit
static CLAIM_OWN: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CLAIM_OWN_LUA));
const CLAIM_OWN_LUA: &str = r"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #pending == 0 then return false end
local count = tonumber(pending[1][4])
local refunded = 0
if ARGV[4] == 'set' then
  local to = tonumber(ARGV[5])
  -- Set lands once: from the count before (to - 1 after a counted delivery, or the refunded
  -- one's) or as a repeat. Any other count moved without us: our view of it is stale.
  if count ~= to and count + 1 ~= to then return false end
  count = to
elseif ARGV[4] == 'refund' and redis.call('EXISTS', KEYS[2]) == 1 then
  local used = tonumber(redis.call('HGET', KEYS[2], ARGV[6]) or '0') or 0
  if used < tonumber(ARGV[7]) then
    redis.call('HSET', KEYS[2], ARGV[6], used + 1)
    count = tonumber(ARGV[5])
    refunded = 1
  end
end
if count < 0 then count = 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', count, 'JUSTID')
return {count, refunded}
";

pub async fn claim_own<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    delivery: &Delivery,
    count: ClaimCount,
) -> redis::RedisResult<Option<Reclaimed>> {
    let (mode, to, limit) = match count {
        ClaimCount::Keep => ("keep", 0, 0),
        ClaimCount::Set(to) => ("set", to, 0),
        ClaimCount::Refund { to, limit } => ("refund", to, limit),
    };
    // An entry without a job id has no state: the nil id's key, which no job has, makes a
    // refund refused.
    let job_id = job_entry::job_id(&delivery.fields).unwrap_or(JobId::NIL);
    let reply: Option<(u64, u8)> = CLAIM_OWN
        .key(keys.stream())
        .key(keys.job(job_id))
        .arg(GROUP)
        .arg(consumer)
        .arg(&delivery.id)
        .arg(mode)
        .arg(to)
        .arg(job_state::REFUNDS)
        .arg(limit)
        .invoke_async(conn)
        .await?;
    Ok(reply.map(|(count, refunded)| Reclaimed {
        count,
        refunded: refunded == 1,
    }))
}

/// Mark `consumer` alive for `ttl`. The process running the consumer refreshes the mark
/// well before it expires; a process that is gone (kill -9 included) stops refreshing it.
///
/// Why not the consumer's idle time: on Redis 7.0 an XREADGROUP or XAUTOCLAIM that returns
/// nothing does not reset it, so on a quiet system a live consumer looks as idle as a dead one.
pub(crate) async fn mark_alive<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    ttl: Duration,
) -> redis::RedisResult<()> {
    let ttl_ms = millis(ttl).max(1);
    redis::cmd("SET")
        .arg(keys.consumer_alive(consumer))
        .arg(1)
        .arg("PX")
        .arg(ttl_ms)
        .query_async(conn)
        .await
}

/// Drop `consumer`'s mark (a consumer that stops cleanly).
pub(crate) async fn clear_alive<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
) -> redis::RedisResult<()> {
    conn.del(keys.consumer_alive(consumer)).await
}

/// Acknowledge a finished job, delete its stream entry, drop its Redis job state and stop
/// counting it in flight for its tenant, in one MULTI/EXEC: once Postgres has the summary it
/// is the truth, and neither the entry (the job's full text), the state nor the tenant's
/// in-flight and running counts may outlive the ack. Deleting in the same step as the ack means an entry
/// is never gone while still pending, and never left behind finished (the dead-letter step,
/// `dead_letters::add`, deletes the same way).
pub async fn ack_done<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    msg_id: &str,
    job: &Job,
) -> redis::RedisResult<()> {
    ack_settling(conn, keys, msg_id, job, None).await
}

/// [`ack_done`], settling the job's budget reservation (`settle`, from the reservation
/// the job state held when read) in the same MULTI/EXEC, before the state goes: the
/// settle removes the reservation from the state as it settles, so a repeated ack, or a
/// dead letter after it, settles nothing again (`stream/budget.rs`).
pub async fn ack_settling<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    msg_id: &str,
    job: &Job,
    settle: Option<&Settle>,
) -> redis::RedisResult<()> {
    ack_many(
        conn,
        keys,
        &[Ack {
            msg_id,
            job,
            settle,
        }],
    )
    .await
}

/// One finished job to acknowledge: its entry, the job, and its budget's settlement.
#[derive(Debug, Clone, Copy)]
pub struct Ack<'a> {
    pub msg_id: &'a str,
    pub job: &'a Job,
    pub settle: Option<&'a Settle>,
}

/// [`ack_settling`] for many finished jobs of one shard, in one MULTI/EXEC and one round
/// trip: each job's entry acknowledged and deleted, its budget settled, its state dropped
/// and its in-flight and running counts released, exactly as one by one. All or nothing:
/// after an error none is acknowledged and each entry is still pending.
pub async fn ack_many<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    acks: &[Ack<'_>],
) -> redis::RedisResult<()> {
    if acks.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    let ids: Vec<&str> = acks.iter().map(|a| a.msg_id).collect();
    pipe.xack(keys.stream(), GROUP, &ids).ignore();
    pipe.xdel(keys.stream(), &ids).ignore();
    for Ack {
        msg_id,
        job,
        settle,
    } in acks
    {
        if let Some(settle) = settle {
            budget::add_settle(&mut pipe, keys, job.tenant.as_str(), job.job_id, settle);
        }
        job_state::add_forget(&mut pipe, &keys.job(job.job_id));
        tenant_limits::add_finished(&mut pipe, keys, job.tenant.as_str(), job.job_id);
        lanes::add_finished(&mut pipe, keys, job.tenant.as_str(), msg_id);
    }
    pipe.query_async(conn).await
}

/// Delete a consumer only if its liveness mark is gone and it still has nothing pending,
/// atomically: XGROUP DELCONSUMER discards the consumer's pending entries, which would lose
/// jobs if it took one meanwhile, and a consumer whose process lives keeps its mark.
///
/// KEYS[1] job stream   KEYS[2] the consumer's liveness mark   ARGV[1] group   ARGV[2] consumer
static DELETE_IF_GONE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(DELETE_IF_GONE_LUA));
const DELETE_IF_GONE_LUA: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
";

/// Remove consumers of the group whose process is gone: no liveness mark, nothing pending,
/// and idle longer than `idle` (the idle test keeps consumers of a version that writes
/// no mark, during a rolling upgrade, from being removed while they work). Never `own`.
/// Returns the removed names.
pub async fn remove_idle_consumers<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    own: &str,
    idle: Duration,
) -> redis::RedisResult<Vec<String>> {
    let info: StreamInfoConsumersReply = conn.xinfo_consumers(keys.stream(), GROUP).await?;
    let mut removed = Vec::new();
    for consumer in info.consumers {
        let idle_ms = u64::try_from(consumer.idle).unwrap_or(u64::MAX);
        if consumer.name == own || consumer.pending > 0 || idle_ms <= millis(idle) {
            continue;
        }
        let result: i64 = DELETE_IF_GONE
            .key(keys.stream())
            .key(keys.consumer_alive(&consumer.name))
            .arg(GROUP)
            .arg(&consumer.name)
            .invoke_async(conn)
            .await?;
        if result >= 0 {
            removed.push(consumer.name);
        }
    }
    Ok(removed)
}

/// Entries delivered and not yet acknowledged (the gauge reads it with the rest of the
/// backlog, in [`backlog_and_trim`]).
pub async fn pending_count<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<u64> {
    let reply: redis::streams::StreamPendingReply = conn.xpending(keys.stream(), GROUP).await?;
    Ok(u64::try_from(reply.count()).unwrap_or(u64::MAX))
}

/// The group's backlog, as the cluster-wide gauges report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Entries not yet delivered to any consumer (`None` when Redis cannot tell).
    pub lag: Option<u64>,
    /// Entries delivered and not yet acknowledged.
    pub pending: u64,
    /// Age of the oldest entry that is pending or not yet delivered; 0 when there is none.
    pub oldest_age_ms: u64,
    /// Finished entries this call removed (see [`backlog_and_trim`]).
    pub trimmed: u64,
}

/// KEYS[1] job stream   ARGV[1] group
/// Returns {lag or -1, pending, oldest unfinished entry id or '', trimmed, now in ms}.
///
/// The oldest unfinished entry is the older of the oldest pending entry (XPENDING) and the
/// first entry after the group's last-delivered id (the oldest undelivered one). Every entry
/// before it was delivered and is no longer pending, i.e. finished; they are trimmed
/// (XTRIM MINID), which removes nothing that is pending or undelivered. One script, so no
/// delivery can slip between the reads and the trim.
static BACKLOG: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(BACKLOG_LUA));
const BACKLOG_LUA: &str = r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, '', 0, now_ms} end
local group = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if f['name'] == ARGV[1] then group = f end
end
if not group then
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  local oldest = ''
  if #first > 0 then oldest = first[1][1] end
  return {redis.call('XLEN', KEYS[1]), 0, oldest, 0, now_ms}
end
local lag = group['lag']
if not lag then
  -- Redis reports no lag when a deleted entry sits at the group's last-delivered id; the
  -- read counter stays exact (undelivered entries are never deleted), so derive it.
  lag = -1
  if group['entries-read'] then
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    for i = 1, #info, 2 do
      if info[i] == 'entries-added' then lag = info[i + 1] - group['entries-read'] end
    end
  end
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function before(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local oldest = redis.call('XPENDING', KEYS[1], ARGV[1])[2]
local undelivered = redis.call('XRANGE', KEYS[1], '(' .. group['last-delivered-id'], '+', 'COUNT', 1)
if #undelivered > 0 and (not oldest or before(undelivered[1][1], oldest)) then
  oldest = undelivered[1][1]
end
local trimmed
if oldest then
  trimmed = redis.call('XTRIM', KEYS[1], 'MINID', oldest)
else
  trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
  oldest = ''
end
return {lag, group['pending'], oldest, trimmed, now_ms}
";

/// Measure the group's backlog and remove finished entries the ack did not delete (left by
/// an older version, or by a step that acknowledged without deleting).
pub async fn backlog_and_trim<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<Backlog> {
    let (lag, pending, oldest, trimmed, now_ms): (i64, i64, String, i64, i64) = BACKLOG
        .key(keys.stream())
        .arg(GROUP)
        .invoke_async(conn)
        .await?;
    let as_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    let oldest_age_ms = entry_millis(&oldest)
        .map(|ms| as_u64(now_ms).saturating_sub(ms))
        .unwrap_or(0);
    Ok(Backlog {
        lag: u64::try_from(lag).ok(),
        pending: as_u64(pending),
        oldest_age_ms,
        trimmed: as_u64(trimmed),
    })
}

/// The millisecond timestamp of an entry id (`<ms>-<seq>`): Redis's clock when it was added.
pub fn entry_millis(id: &str) -> Option<u64> {
    id.split_once('-').and_then(|(ms, _)| ms.parse().ok())
}

/// Redis takes its times in whole milliseconds.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
