//! What every process knows of a provider, kept in Redis (`docs/tenants.md`, "Provider
//! limits"): its requests and tokens per minute (one limiter for the whole fleet), the
//! "cool until" a 429's `Retry-After` set, and its open circuit breaker with the fleet's
//! one probe.
//!
//! Every decision that needs the fleet's view is one Redis step: the limiter takes a
//! request slot and the call's tokens in one script (both or neither), on the server's
//! clock, so the processes' clocks never disagree about a window. The state machine of the
//! breaker stays in `resilience/breaker.rs`; this module only carries it between processes
//! (`chain.rs` decides when).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::infra::keys::RedisKeys;

/// A minute, the window `rpm` and `tpm` are stated over, in ms.
const MINUTE_MS: f64 = 60_000.0;
/// The requests that may go at once after a quiet spell: a tenth of the minute's (at least
/// one), so a fleet that starts together does not spend the minute in its first second,
/// and a burst of jobs still starts without waiting for each slot.
const REQUEST_BURST_DIVISOR: u32 = 10;
/// How long the limiter's state outlives its last use: past it, the state is that of an
/// idle provider anyway (every arrival time is in the past).
const LIMIT_STATE_TTL_MS: u64 = 120_000;

/// One dimension of the limiter: every call adds `per_unit_ms × cost` to the theoretical
/// arrival time, which may run at most `limit_ms` ahead of now (GCRA).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_unit_ms: f64,
    pub limit_ms: f64,
    /// The most one call is charged: a call larger than the whole bucket could never pass.
    pub max_cost: u64,
}

/// A provider's `rpm` and `tpm` as the limiter applies them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    pub requests: Option<Rate>,
    pub tokens: Option<Rate>,
}

impl Limits {
    /// Requests: one slot every minute/`rpm`, a burst of a tenth of `rpm` (at least 1).
    /// Tokens: refilled at `tpm` per minute, a bucket of one minute's tokens, because one
    /// call's cost ranges from a few hundred tokens to the whole context and a smaller
    /// bucket would hold the large ones back forever; a call is charged at most `tpm`.
    pub fn new(rpm: Option<u32>, tpm: Option<u32>) -> Self {
        Self {
            requests: rpm.filter(|r| *r > 0).map(|rpm| {
                let per = MINUTE_MS / f64::from(rpm);
                let burst = (rpm / REQUEST_BURST_DIVISOR).max(1);
                Rate {
                    per_unit_ms: per,
                    limit_ms: per * f64::from(burst),
                    max_cost: 1,
                }
            }),
            tokens: tpm.filter(|t| *t > 0).map(|tpm| Rate {
                per_unit_ms: MINUTE_MS / f64::from(tpm),
                limit_ms: MINUTE_MS,
                max_cost: u64::from(tpm),
            }),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }

    /// The script's arguments for a call of `cost` tokens: per dimension the increment and
    /// the limit in ms (0 = no such limit).
    fn args(&self, cost: u64) -> [f64; 4] {
        let dim = |rate: Option<Rate>, units: u64| match rate {
            Some(r) => [r.per_unit_ms * units.min(r.max_cost) as f64, r.limit_ms],
            None => [0.0, 0.0],
        };
        let [ri, rl] = dim(self.requests, 1);
        let [ti, tl] = dim(self.tokens, cost);
        [ri, rl, ti, tl]
    }
}

/// Why a call waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// No request slot (`rpm`).
    Requests,
    /// Not enough tokens (`tpm`).
    Tokens,
    /// The provider asked every client to wait (a 429's `Retry-After`).
    Cool,
}

impl WaitReason {
    /// The `reason` label of `summaryd_llm_limit_waits_total`.
    pub fn label(self) -> &'static str {
        match self {
            WaitReason::Requests => "requests",
            WaitReason::Tokens => "tokens",
            WaitReason::Cool => "cool",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "tokens" => WaitReason::Tokens,
            "cool" => WaitReason::Cool,
            _ => WaitReason::Requests,
        }
    }
}

/// The limiter's answer for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Sent now: its request slot and tokens are taken.
    Go,
    /// Nothing taken; ask again after `after`.
    Wait { after: Duration, reason: WaitReason },
}

/// KEYS[1] limiter hash (`req`, `tok`: theoretical arrival times, Unix ms)
/// KEYS[2] cool-until (Unix ms)
/// ARGV[1] request increment ms  ARGV[2] request limit ms (0 = no rpm)
/// ARGV[3] token increment ms    ARGV[4] token limit ms   (0 = no tpm)
/// ARGV[5] TTL of the hash, ms
/// Returns {wait ms, reason}: 0 when admitted (both taken), else neither is.
static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(ADMIT_LUA));
const ADMIT_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cool = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if cool > now then return {cool - now, 'cool'} end
local wait, why = 0, 'requests'
local function check(field, inc, limit, name)
  if limit <= 0 then return nil end
  local tat = tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
  if tat < now then tat = now end
  local over = tat + inc - now - limit
  if over > 0 then
    if over > wait then wait = over; why = name end
    return nil
  end
  return tat + inc
end
local req = check('req', tonumber(ARGV[1]), tonumber(ARGV[2]), 'requests')
local tok = check('tok', tonumber(ARGV[3]), tonumber(ARGV[4]), 'tokens')
if wait > 0 then return {math.ceil(wait), why} end
if req then redis.call('HSET', KEYS[1], 'req', math.ceil(req)) end
if tok then redis.call('HSET', KEYS[1], 'tok', math.ceil(tok)) end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {0, ''}
";

/// KEYS[1] cool-until (Unix ms)   ARGV[1] the wait the provider asked for, ms
/// Moves the cool-until to now + the wait, never earlier than it was; returns it.
static COOL: LazyLock<Script> = LazyLock::new(|| Script::new(COOL_LUA));
const COOL_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = tonumber(ARGV[1])
local want = now + wait
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if want > cur then
  redis.call('SET', KEYS[1], want, 'PX', wait + 1000)
  return want
end
return cur
";

/// An open breaker as published for the fleet: absolute times, so any process can turn
/// them into its own instants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenRecord {
    pub since_ms: u64,
    pub probe_at_ms: u64,
    pub probes_failed: u32,
    pub reason: String,
}

impl OpenRecord {
    /// The record of a breaker open since `since` with its next probe at `probe_at`, as of
    /// `now` (the same moment on both clocks).
    pub fn at(
        now: (Instant, SystemTime),
        since: Instant,
        probe_at: Instant,
        probes_failed: u32,
        reason: &str,
    ) -> Self {
        let unix = unix_ms(now.1);
        let ago = now.0.saturating_duration_since(since).as_millis() as u64;
        let ahead = probe_at.saturating_duration_since(now.0).as_millis() as u64;
        Self {
            since_ms: unix.saturating_sub(ago),
            probe_at_ms: unix.saturating_add(ahead),
            probes_failed,
            reason: reason.to_owned(),
        }
    }

    /// `(since, probe_at)` as this process's instants, as of `now`.
    pub fn instants(&self, now: (Instant, SystemTime)) -> (Instant, Instant) {
        let unix = unix_ms(now.1);
        let since = now
            .0
            .checked_sub(Duration::from_millis(unix.saturating_sub(self.since_ms)))
            .unwrap_or(now.0);
        let probe_at = now.0 + Duration::from_millis(self.probe_at_ms.saturating_sub(unix));
        (since, probe_at)
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The fleet's probe of an open breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeLease {
    /// This process probes now.
    Won,
    /// Another process probes, or probed and failed: ask again after this.
    Held(Duration),
}

/// The Redis side of every provider of one process's chain.
#[derive(Clone)]
pub struct SharedLimits {
    redis: crate::infra::redis::RedisPool,
    keys: RedisKeys,
}

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits").finish_non_exhaustive()
    }
}

impl SharedLimits {
    pub fn new(redis: crate::infra::redis::RedisPool, keys: RedisKeys) -> Self {
        Self { redis, keys }
    }

    /// The shared state of the provider called `label` (`openai:<model>`, `builtin`).
    pub fn provider(&self, label: &str, limits: Limits) -> ProviderShare {
        ProviderShare {
            redis: self.redis.clone(),
            limits,
            limit_key: self.keys.llm_limit(label),
            cool_key: self.keys.llm_cool_until(label),
            breaker_key: self.keys.llm_breaker(label),
            probe_key: self.keys.llm_probe(label),
            seen_open: AtomicBool::new(false),
        }
    }
}

/// One provider's shared state.
pub struct ProviderShare {
    redis: crate::infra::redis::RedisPool,
    limits: Limits,
    limit_key: String,
    cool_key: String,
    breaker_key: String,
    probe_key: String,
    /// Whether this process last saw the breaker open in Redis: then its record's absence
    /// means a probe passed somewhere (and not that this process's own publish failed).
    seen_open: AtomicBool,
}

/// Anything Redis can answer wrong: a connection, a command, a record that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
}

impl ProviderShare {
    async fn conn(&self) -> Result<crate::infra::redis::Conn, ShareError> {
        Ok(self.redis.get().await?)
    }

    /// Take a slot for one call of `cost` tokens, or learn how long to wait for one. The
    /// cool-until is honoured even without limits.
    pub async fn admit(&self, cost: u64) -> Result<Admission, ShareError> {
        let mut conn = self.conn().await?;
        let [ri, rl, ti, tl] = self.limits.args(cost);
        let (wait, reason): (u64, String) = ADMIT
            .key(&self.limit_key)
            .key(&self.cool_key)
            .arg(ri)
            .arg(rl)
            .arg(ti)
            .arg(tl)
            .arg(LIMIT_STATE_TTL_MS)
            .invoke_async(&mut conn)
            .await?;
        Ok(if wait == 0 {
            Admission::Go
        } else {
            Admission::Wait {
                after: Duration::from_millis(wait),
                reason: WaitReason::parse(&reason),
            }
        })
    }

    /// The provider asked for `wait` (a 429's `Retry-After`): no process calls it before
    /// then. Only ever moves the cool-until later.
    pub async fn cool_for(&self, wait: Duration) -> Result<(), ShareError> {
        let mut conn = self.conn().await?;
        let ms = wait.as_millis().max(1) as u64;
        let _: u64 = COOL
            .key(&self.cool_key)
            .arg(ms)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Publish an open breaker. `first`: it just opened here, and a record another process
    /// published first (with its schedule) is kept; otherwise (a failed probe) this is the
    /// new schedule. The fleet's probe is held until `record.probe_at_ms` either way, and
    /// the record lives `ttl`, so a fleet that is gone leaves nothing open for ever.
    pub async fn publish_open(
        &self,
        record: &OpenRecord,
        first: bool,
        ttl: Duration,
    ) -> Result<(), ShareError> {
        let mut conn = self.conn().await?;
        let json = serde_json::to_string(record).unwrap_or_default();
        let hold = record
            .probe_at_ms
            .saturating_sub(unix_ms(SystemTime::now()))
            .max(1);
        let mut set_record = redis::cmd("SET");
        set_record
            .arg(&self.breaker_key)
            .arg(json)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        let mut set_hold = redis::cmd("SET");
        set_hold
            .arg(&self.probe_key)
            .arg("cooldown")
            .arg("PX")
            .arg(hold);
        if first {
            set_record.arg("NX");
            set_hold.arg("NX");
        }
        let _: () = redis::pipe()
            .add_command(set_record)
            .ignore()
            .add_command(set_hold)
            .ignore()
            .query_async(&mut conn)
            .await?;
        self.seen_open.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// A probe passed: the breaker is closed for everyone.
    pub async fn clear_open(&self) -> Result<(), ShareError> {
        let mut conn = self.conn().await?;
        let _: () = conn.del(&[&self.breaker_key, &self.probe_key]).await?;
        self.seen_open.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// The open breaker the fleet sees, if any. A record that does not parse counts as
    /// none (a closed breaker costs at most the failures that open it again).
    pub async fn read_open(&self) -> Result<Option<OpenRecord>, ShareError> {
        let mut conn = self.conn().await?;
        let raw: Option<String> = conn.get(&self.breaker_key).await?;
        Ok(raw.and_then(|json| serde_json::from_str(&json).ok()))
    }

    /// Whether the record's absence now means someone closed it (this process saw it
    /// open since); resets what it saw.
    pub(crate) fn closed_elsewhere(&self) -> bool {
        self.seen_open.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn saw_open(&self) {
        self.seen_open.store(true, Ordering::Relaxed);
    }

    /// Take the fleet's probe of the open breaker for `ttl` (the probe's longest run), or
    /// learn how long it stays taken.
    pub async fn take_probe(&self, ttl: Duration) -> Result<ProbeLease, ShareError> {
        let mut conn = self.conn().await?;
        let won: Option<String> = redis::cmd("SET")
            .arg(&self.probe_key)
            .arg("probing")
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await?;
        if won.is_some() {
            return Ok(ProbeLease::Won);
        }
        let left: i64 = conn.pttl(&self.probe_key).await?;
        // -2: gone meanwhile (ask again soon); -1: no expiry, which this module never sets.
        let left = u64::try_from(left).unwrap_or(100).max(100);
        Ok(ProbeLease::Held(Duration::from_millis(left)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rpm, tpm, a call's cost, and the script's arguments.
    type Case = (Option<u32>, Option<u32>, u64, [f64; 4]);

    #[test]
    fn limits_follow_rpm_and_tpm() {
        let cases: [Case; 5] = [
            (None, None, 500, [0.0, 0.0, 0.0, 0.0]),
            // 60 a minute: one a second, a burst of 6.
            (Some(60), None, 500, [1_000.0, 6_000.0, 0.0, 0.0]),
            // Below 10 a minute the burst is one request.
            (Some(5), None, 500, [12_000.0, 12_000.0, 0.0, 0.0]),
            // 60,000 tokens a minute: a ms per token, a minute's bucket.
            (None, Some(60_000), 1_500, [0.0, 0.0, 1_500.0, 60_000.0]),
            // A call larger than tpm is charged tpm: it fits an empty bucket.
            (
                Some(600),
                Some(1_000),
                5_000,
                [100.0, 6_000.0, 60_000.0, 60_000.0],
            ),
        ];
        for (rpm, tpm, cost, args) in cases {
            let limits = Limits::new(rpm, tpm);
            assert_eq!(limits.args(cost), args, "{rpm:?} {tpm:?} {cost}");
            assert_eq!(limits.is_unlimited(), rpm.is_none() && tpm.is_none());
        }
        assert!(
            Limits::new(Some(0), Some(0)).is_unlimited(),
            "0 is no limit"
        );
    }

    #[test]
    fn an_open_record_round_trips_between_clocks() {
        let now = (
            Instant::now(),
            UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        );
        let since = now.0.checked_sub(Duration::from_secs(3)).unwrap_or(now.0);
        let probe_at = now.0 + Duration::from_secs(5);
        let record = OpenRecord::at(now, since, probe_at, 2, "503");
        assert_eq!(record.since_ms, 1_700_000_000_000 - 3_000);
        assert_eq!(record.probe_at_ms, 1_700_000_000_000 + 5_000);
        // Another process, a second later on both clocks.
        let later = (
            now.0 + Duration::from_secs(1),
            now.1 + Duration::from_secs(1),
        );
        let (s, p) = record.instants(later);
        assert_eq!(p, probe_at);
        assert_eq!(s, since);
        // A probe time already past is now.
        let much_later = (
            now.0 + Duration::from_secs(60),
            now.1 + Duration::from_secs(60),
        );
        assert_eq!(record.instants(much_later).1, much_later.0);
    }
}
