//! Fair scheduling between tenants: per-tenant lanes in front of the job stream
//! (`docs/tenants.md`, "Fair scheduling").
//!
//! The accept script (`enqueue_once.lua`) puts a job in its tenant's *lane*, a stream with
//! no consumer group, registers the lane in the *active lanes* (a sorted set scored by the
//! virtual time its next job may start at) and rings the *doorbell*. A worker's read of new
//! work is [`dispatch`], one script: an entry already on the job stream first (an older
//! version's accept), else the oldest entry of the eligible lane with the lowest score is
//! moved onto the job stream and read by this consumer with XREADGROUP, in the same step.
//! So a job is always either in a lane or in the group's pending list, and everything the
//! group does for a delivery (counts, XAUTOCLAIM, dead letters, ack) is unchanged.
//!
//! The scores are start-time fair queueing: a lane that becomes active starts at the
//! virtual time `V`; dispatching from a lane with score `s` sets `V = max(V, s)` and moves
//! the lane to `max(s, V) + 1/weight`. Every lane that is not at its `max_concurrent` has
//! a score of at least `V`, so a newly active lane's first job waits for at most one job
//! of each other lane of equal weight ([`max_dispatches_before`] states the bound).
//!
//! `max_concurrent` counts a tenant's job-stream entries dispatched and not yet finished
//! (the tenant's running set, `RedisKeys::running`): dispatch adds, the ack and the
//! dead-letter step remove, and [`sweep_running`] removes what is no longer pending (an
//! older version's ack, an operator's manual XACK).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::streams::{StreamId, StreamRangeReply};
use redis::{Pipeline, Script};

use super::job_entry;
use super::job_state::{self, Reservation, SeenReservation};
use super::tenant_limits::TenantLimits;
use crate::infra::keys::{GROUP, RedisKeys};
use crate::infra::redis::script_call::{ScriptArgs, ScriptCall};

/// Lanes one dispatch looks at, lowest score first, to find one whose tenant is below its
/// `max_concurrent`. Bounded so a dispatch is short whatever the number of tenants; a
/// lane at its cap keeps its low score, so when this many lanes in front are all at their
/// cap (that many of their jobs are running), the others wait for one of those to finish.
pub(crate) const LOOK_AHEAD: usize = 32;

/// How a tenant's jobs are scheduled against other tenants' (the tokens file's `weight`
/// and `max_concurrent`; header mode: weight 1, no cap).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LanePolicy {
    /// Share of dispatches while other lanes have work: a lane of weight 2 gets two jobs
    /// for every one of a lane of weight 1.
    pub weight: f64,
    /// Jobs of the tenant dispatched and not yet finished, fleet-wide; 0: no cap.
    pub max_concurrent: u32,
}

impl LanePolicy {
    pub(crate) fn of(limits: &TenantLimits) -> Self {
        Self {
            weight: limits
                .weight
                .filter(|w| w.is_finite() && *w > 0.0)
                .unwrap_or(1.0),
            max_concurrent: limits.max_concurrent.unwrap_or(0),
        }
    }

    /// The accept script's last three arguments: weight, max_concurrent (0: none), tenant.
    /// `{}` prints a whole weight without a fraction ("1"), which the script compares with
    /// to store nothing for a tenant with the defaults.
    pub(crate) fn pass_to(&self, invocation: &mut impl ScriptArgs, tenant: &str) {
        invocation
            .arg(format!("{}", self.weight))
            .arg(self.max_concurrent)
            .arg(tenant);
    }
}

/// The most jobs a backlogged lane of weight `other` is dispatched before the `n`-th job
/// (from 1) of a lane of weight `weight` that became active after it, when neither is at
/// its `max_concurrent`: the newcomer's `n`-th job has the score `V + (n-1)/weight`; the
/// other lane's jobs go first only while their scores (at least `V`, spaced `1/other`)
/// are not above it, ties included.
pub fn max_dispatches_before(n: u64, other: f64, weight: f64) -> u64 {
    let span = n.saturating_sub(1) as f64 * other / weight;
    // A hair of slack for the float sums the script makes.
    (span + 1e-9).floor() as u64 + 1
}

/// Dispatch: one new entry for `consumer`, or `None` when there is no work it may take.
///
/// KEYS[1] job stream   KEYS[2] active lanes   KEYS[3] virtual time   KEYS[4] policies
/// ARGV[1] group   ARGV[2] consumer   ARGV[3] lane name prefix   ARGV[4], ARGV[5] what
/// comes before and after a tenant in its running set's name   ARGV[6] lanes to look at
/// ARGV[7] the tenant field of an entry   ARGV[8] its job id field   ARGV[9] what comes
/// before a job id in its state's name   ARGV[10], ARGV[11] the state's reservation fields
///
/// Replies `{{{id, fields}}, period, tokens}` (the entry in XRANGE's shape, then the job
/// state's reservation, each nil when absent) or nil. The reservation rides along because
/// every job that ends well needs it for its acknowledgement, which saves each one a
/// round trip. Entries already on the job stream go first (they were accepted by a version
/// without lanes, or staged there): they are read before any lane. A lane found empty (an operator deleted its entries) leaves the
/// schedule. The only command that can fail (XREADGROUP without the group) runs before any
/// write.
static DISPATCH: LazyLock<Script> = LazyLock::new(|| Script::new(DISPATCH_LUA));
const DISPATCH_LUA: &str = r"
local function policy(tenant)
  local p = redis.call('HGET', KEYS[4], tenant)
  if not p then return 1, 0 end
  local w, c = string.match(p, '^(%S+) (%d+)$')
  w = tonumber(w)
  if not w or w <= 0 then w = 1 end
  return w, tonumber(c) or 0
end
local function read()
  return redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
end
local function running(tenant, id)
  local _, cap = policy(tenant)
  if cap > 0 then redis.call('SADD', ARGV[4] .. tenant .. ARGV[5], id) end
end
local function field(entry, name)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
end
local function handed(entry)
  local job = field(entry, ARGV[8])
  if not job then return {{entry}, false, false} end
  local r = redis.call('HMGET', ARGV[9] .. job, ARGV[10], ARGV[11])
  return {{entry}, r[1], r[2]}
end
local got = read()
if got then
  local entry = got[1][2][1]
  local tenant = field(entry, ARGV[7])
  if tenant then running(tenant, entry[1]) end
  return handed(entry)
end
local clock = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
local lanes = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[6]) - 1, 'WITHSCORES')
for i = 1, #lanes, 2 do
  local tenant, score = lanes[i], tonumber(lanes[i + 1])
  local weight, cap = policy(tenant)
  local set = ARGV[4] .. tenant .. ARGV[5]
  if cap == 0 or redis.call('SCARD', set) < cap then
    local lane = ARGV[3] .. tenant
    local head = redis.call('XRANGE', lane, '-', '+', 'COUNT', 1)
    if #head == 0 then
      redis.call('ZREM', KEYS[2], tenant)
      redis.call('DEL', lane)
    else
      local start = math.max(score, clock)
      redis.call('XADD', KEYS[1], '*', unpack(head[1][2]))
      redis.call('XDEL', lane, head[1][1])
      if redis.call('XLEN', lane) == 0 then
        redis.call('ZREM', KEYS[2], tenant)
        redis.call('DEL', lane)
      else
        redis.call('ZADD', KEYS[2], string.format('%.17g', start + 1 / weight), tenant)
      end
      if start > clock then
        redis.call('SET', KEYS[3], string.format('%.17g', start))
      end
      local entry = read()[1][2][1]
      if cap > 0 then redis.call('SADD', set, entry[1]) end
      return handed(entry)
    end
  end
end
return false
";

/// Hand `consumer` one new entry: from the job stream if one waits there, else moved from
/// the lane whose turn it is. `None` when there is nothing it may take now.
pub async fn dispatch<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
) -> redis::RedisResult<Option<Handed>> {
    let reply = dispatch_call(keys, consumer).invoke(conn).await?;
    Ok(dispatched(reply))
}

/// The dispatch script's call for `consumer`, for a caller that sends it along with other
/// commands (`consumer_group::autoclaim_and_dispatch`).
pub(crate) fn dispatch_call(keys: &RedisKeys, consumer: &str) -> ScriptCall {
    let (before, after) = keys.running_affixes();
    let mut call = ScriptCall::new(
        &DISPATCH,
        &[
            &keys.stream(),
            &keys.lanes(),
            &keys.lanes_clock(),
            &keys.lane_policies(),
        ],
    );
    call.arg(GROUP)
        .arg(consumer)
        .arg(keys.lane_prefix())
        .arg(before)
        .arg(after)
        .arg(LOOK_AHEAD)
        .arg(job_entry::TENANT)
        .arg(job_entry::JOB_ID)
        .arg(keys.job_prefix())
        .arg(&job_state::reservation_fields()[..]);
    call
}

/// An entry a dispatch handed out, with its job's reservation as the same step read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Handed {
    pub entry: StreamId,
    pub reservation: SeenReservation,
}

/// The dispatch script's reply, as it comes.
pub(crate) type DispatchReply = Option<(StreamRangeReply, Option<String>, Option<u64>)>;

/// The entry a dispatch reply hands out, if any.
pub(crate) fn dispatched(reply: DispatchReply) -> Option<Handed> {
    let (range, period, tokens) = reply?;
    let entry = range.ids.into_iter().next()?;
    let reservation = match job_entry::job_id_as_spelt(&entry.map) {
        Some(job_id) => SeenReservation::Read {
            job_id,
            reservation: Reservation::of(period, tokens),
        },
        None => SeenReservation::Unread,
    };
    Some(Handed { entry, reservation })
}

/// Wait up to `block` for the doorbell (a job was put in a lane); true when it rang. A
/// zero `block` does not wait (BLPOP 0 would wait forever). The connection is held while
/// it waits, as it was by the blocking XREADGROUP this replaces: the pool's response
/// timeout already allows for `block`.
pub async fn wait_for_work<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    block: Duration,
) -> redis::RedisResult<bool> {
    if block < Duration::from_millis(1) {
        return Ok(false);
    }
    let rang: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(keys.doorbell())
        .arg(format!("{:.3}", block.as_secs_f64()))
        .query_async(conn)
        .await?;
    Ok(rang.is_some())
}

/// Stop counting the job-stream entry `msg_id` as running for `tenant` (the ack's
/// MULTI/EXEC; SREM is idempotent, so a repeated ack is no harm).
pub(crate) fn add_finished(pipe: &mut Pipeline, keys: &RedisKeys, tenant: &str, msg_id: &str) {
    pipe.srem(keys.running(tenant), msg_id).ignore();
}

/// What waits in the lanes, read from the active set (no key scan).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaneBacklog {
    /// Each active tenant's queued jobs, by tenant.
    pub per_tenant: Vec<(String, u64)>,
    /// The id of the oldest lane entry (`<ms>-<seq>`: when it was accepted), if any.
    pub oldest_id: Option<String>,
}

impl LaneBacklog {
    pub fn total(&self) -> u64 {
        self.per_tenant.iter().map(|(_, n)| n).sum()
    }
}

/// KEYS[1] active lanes   ARGV[1] lane name prefix
/// Replies {oldest entry id or '', tenant, length, tenant, length, …}.
static BACKLOG: LazyLock<Script> = LazyLock::new(|| Script::new(BACKLOG_LUA));
const BACKLOG_LUA: &str = r"
local out = {''}
local oldest_ms, oldest_seq
for _, tenant in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local lane = ARGV[1] .. tenant
  local head = redis.call('XRANGE', lane, '-', '+', 'COUNT', 1)
  if #head > 0 then
    local ms, seq = string.match(head[1][1], '^(%d+)-(%d+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if not oldest_ms or ms < oldest_ms or (ms == oldest_ms and seq < oldest_seq) then
      oldest_ms, oldest_seq, out[1] = ms, seq, head[1][1]
    end
  end
  out[#out + 1] = tenant
  out[#out + 1] = redis.call('XLEN', lane)
end
return out
";

/// The lanes' backlog: one read of each active lane (as many as tenants with work queued).
pub async fn backlog<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<LaneBacklog> {
    let reply: Vec<redis::Value> = BACKLOG
        .key(keys.lanes())
        .arg(keys.lane_prefix())
        .invoke_async(conn)
        .await?;
    let mut items = reply.into_iter();
    let oldest: String = match items.next() {
        Some(v) => redis::from_redis_value(v)?,
        None => String::new(),
    };
    let mut per_tenant = Vec::new();
    while let (Some(tenant), Some(n)) = (items.next(), items.next()) {
        per_tenant.push((
            redis::from_redis_value(tenant)?,
            redis::from_redis_value(n)?,
        ));
    }
    Ok(LaneBacklog {
        per_tenant,
        oldest_id: Some(oldest).filter(|id| !id.is_empty()),
    })
}

/// Remove members of the running sets whose entry is no longer pending in the group (an
/// older version's ack, a manual XACK), for the tenants with a `max_concurrent` (those in
/// the policies hash: no key scan). Atomic per tenant: dispatch adds a member in the same
/// step as the XREADGROUP that makes it pending, so a member that is not pending is done.
/// Returns how many were removed.
///
/// KEYS[1] job stream   KEYS[2] policies   ARGV[1] group   ARGV[2], ARGV[3] the running
/// set's name around the tenant
static SWEEP: LazyLock<Script> = LazyLock::new(|| Script::new(SWEEP_LUA));
const SWEEP_LUA: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local removed = 0
local policies = redis.call('HKEYS', KEYS[2])
for _, tenant in ipairs(policies) do
  local set = ARGV[2] .. tenant .. ARGV[3]
  for _, id in ipairs(redis.call('SMEMBERS', set)) do
    if #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) == 0 then
      removed = removed + redis.call('SREM', set, id)
    end
  end
end
return removed
";

pub(crate) async fn sweep_running<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<u64> {
    let (before, after) = keys.running_affixes();
    let result: redis::RedisResult<u64> = SWEEP
        .key(keys.stream())
        .key(keys.lane_policies())
        .arg(GROUP)
        .arg(before)
        .arg(after)
        .invoke_async(conn)
        .await;
    match result {
        // No group yet: nothing was ever dispatched.
        Err(e) if e.code() == Some("NOGROUP") => Ok(0),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_on_another_lanes_jobs() {
        // (n-th job of the newcomer, other lane's weight, newcomer's weight, bound)
        for (n, other, weight, bound) in [
            (1, 1.0, 1.0, 1),
            (2, 1.0, 1.0, 2),
            (10, 1.0, 1.0, 10),
            (1, 4.0, 1.0, 1),
            (2, 4.0, 1.0, 5),
            (3, 1.0, 2.0, 2),
            (10, 1.0, 2.0, 5),
            (10, 3.0, 1.0, 28),
            (5, 0.5, 1.0, 3),
        ] {
            assert_eq!(
                max_dispatches_before(n, other, weight),
                bound,
                "n={n} other={other} weight={weight}"
            );
        }
    }

    #[test]
    fn a_policy_from_the_limits_defaults_to_weight_one_and_no_cap() {
        assert_eq!(
            LanePolicy::of(&TenantLimits::default()),
            LanePolicy {
                weight: 1.0,
                max_concurrent: 0
            }
        );
        let limits = TenantLimits {
            weight: Some(2.5),
            max_concurrent: Some(3),
            ..Default::default()
        };
        assert_eq!(
            LanePolicy::of(&limits),
            LanePolicy {
                weight: 2.5,
                max_concurrent: 3
            }
        );
        // The script stores nothing for the defaults only when the weight prints as "1".
        assert_eq!(format!("{}", 1.0_f64), "1");
    }
}
