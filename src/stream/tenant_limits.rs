//! Per-tenant limits on accepting jobs, enforced in Redis so they hold for every API replica
//! together (`docs/reference.md`, Tenants): a request rate (`rate_per_s` with `burst`, as
//! GCRA), `max_in_flight`, the jobs accepted and not yet finished, and `notify_per_hour`,
//! the jobs accepted in any rolling hour that email one recipient (a sliding window of job
//! ids by acceptance time: exact, where a GCRA would let twice the figure through in the
//! hour after a burst; at most `notify_per_hour` members per recipient).
//!
//! All are checked inside the enqueue script (`enqueue_once.lua`), after the idempotency
//! record is looked up and before anything is written: a replay is answered before any
//! limit, so it is never charged or refused, and a refused request writes nothing. The
//! in-flight set gains the job id in the same step that enqueues it and loses it in the step
//! that finishes it (ack, dead-letter); `dlq replay` adds it back. This module owns the
//! arguments the script receives and those writes, and the reads and the removal of the
//! maintenance sweep that takes out members those steps left behind (a version that did not
//! remove them, an operator's manual XACK).

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::{Pipeline, Script};

use super::job_entry;
use crate::domain::{Email, JobId};
use crate::infra::keys::RedisKeys;
use crate::infra::redis::routed::{Routable, on_master_of};
use crate::infra::redis::script_call::ScriptArgs;

/// One tenant's limits; `None` is unlimited. From the tokens file (`auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantLimits {
    /// Sustained accepted jobs per second.
    pub(crate) rate_per_s: Option<f64>,
    /// Jobs that may be accepted at once above the sustained rate.
    pub(crate) burst: Option<u32>,
    /// Jobs accepted and not yet done or dead-lettered.
    pub(crate) max_in_flight: Option<u32>,
    /// Jobs accepted in any rolling hour that notify one recipient.
    pub(crate) notify_per_hour: Option<u32>,
    /// The tenant's share of dispatch against other tenants with work queued (`stream::lanes`);
    /// `None` is 1. Not a limit on accepting, but it travels with the accepted job.
    pub(crate) weight: Option<f64>,
    /// Jobs of the tenant dispatched and not yet finished, fleet-wide (`stream::lanes`).
    pub(crate) max_concurrent: Option<u32>,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Rate,
    InFlight,
    /// `notify_per_hour`: the recipient had that many emails from this tenant this hour.
    NotifyRate,
    /// `budget_tokens`: the job's worst case does not fit the period's budget
    /// (`stream/budget.rs`); retry when the period resets.
    Budget,
}

/// A refusal: which limit, and when a request could pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    pub(crate) limit: Limit,
    pub(crate) retry_after: Duration,
}

/// How long a client over `max_in_flight` is asked to wait: a job takes seconds, and the
/// script cannot know when one will finish.
const IN_FLIGHT_RETRY_AFTER_MS: u64 = 1_000;

impl TenantLimits {
    /// Microseconds between two jobs at the sustained rate; 0 = no rate limit.
    fn interval_us(&self) -> f64 {
        match self.rate_per_s {
            Some(rate) if rate > 0.0 => 1e6 / rate,
            _ => 0.0,
        }
    }

    /// Without a burst, one second's worth (at least one job).
    fn burst(&self) -> f64 {
        match (self.burst, self.rate_per_s) {
            (Some(b), _) => f64::from(b),
            (None, Some(rate)) => rate.ceil().max(1.0),
            (None, None) => 1.0,
        }
    }

    /// The script's limit arguments: emission interval (µs), burst, max in flight (0 = none),
    /// the time the rate is measured at (µs since the epoch; 0 without a rate), emails per
    /// recipient per hour (0 = none) and the time the hour ends at (ms since the epoch; 0
    /// without that limit).
    ///
    /// The time is this process's clock, not Redis' `TIME`: `TIME` made the script about a
    /// quarter slower (measured with Redis' own per-call timing: ~35 µs instead of ~28 µs
    /// per accepted job). Replicas' clocks agree within milliseconds under NTP; one that runs
    /// `d` ahead can admit at most `d × rate_per_s` jobs beyond the tenant's burst.
    pub(crate) fn pass_to(&self, script: &mut impl ScriptArgs, now: SystemTime) {
        let interval = self.interval_us();
        let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let now_us = if interval > 0.0 {
            u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let per_hour = self.notify_per_hour.unwrap_or(0);
        let now_ms = if per_hour > 0 {
            u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        script
            .arg(interval)
            .arg(self.burst())
            .arg(self.max_in_flight.unwrap_or(0))
            .arg(now_us)
            .arg(per_hour)
            .arg(now_ms);
    }
}

impl TenantLimits {
    /// The key of the recipient's window for the enqueue script. Without a
    /// `notify_per_hour` the script never touches it, so the recipient is not hashed (an
    /// IDNA pass and a SHA-256 less per POST) and a fixed name stands in.
    pub(crate) fn notify_window(&self, keys: &RedisKeys, tenant: &str, to: &Email) -> String {
        match self.notify_per_hour {
            Some(_) => keys.notify_window(tenant, &to.recipient_id()),
            None => keys.notify_window(tenant, "unlimited"),
        }
    }

    /// The limits of a job with the recipient `to`: a job that emails no one (a webhook
    /// only) is under no recipient's rate.
    pub(crate) fn for_recipient(&self, to: Option<&Email>) -> TenantLimits {
        let mut limits = *self;
        if to.is_none() {
            limits.notify_per_hour = None;
        }
        limits
    }
}

impl OverLimit {
    /// Which limit refused.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// When the request could pass.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// From the script's refusal: the limit's name and, for the rate, when the next job fits.
    pub(crate) fn from_script(limit: &str, retry_after_ms: i64) -> Self {
        let retry_after = Duration::from_millis(u64::try_from(retry_after_ms).unwrap_or(0));
        match limit {
            "in_flight" => Self {
                limit: Limit::InFlight,
                retry_after: Duration::from_millis(IN_FLIGHT_RETRY_AFTER_MS),
            },
            "notify" => Self {
                limit: Limit::NotifyRate,
                retry_after,
            },
            "budget" => Self {
                limit: Limit::Budget,
                retry_after,
            },
            _ => Self {
                limit: Limit::Rate,
                retry_after,
            },
        }
    }
}

/// The job counts as in flight for its tenant (plain enqueue; the script does its own).
pub(crate) fn add_accepted(pipe: &mut Pipeline, keys: &RedisKeys, tenant: &str, job_id: JobId) {
    pipe.sadd(keys.in_flight(tenant), job_id.to_string())
        .ignore();
}

/// The job is finished (done or dead-lettered): it no longer counts. Idempotent.
pub(crate) fn add_finished(pipe: &mut Pipeline, keys: &RedisKeys, tenant: &str, job_id: JobId) {
    pipe.srem(keys.in_flight(tenant), job_id.to_string())
        .ignore();
}

/// Keys per SCAN call, members per SSCAN call and per removal script, stream entries per
/// page of the stream scan: small, so no single command of the sweep holds Redis for long.
pub(crate) const SWEEP_BATCH: usize = 200;

/// One step of a SCAN over the keyspace for tenants' in-flight sets: the next cursor (0 when
/// the scan is complete) and the set keys of this step. On a cluster the SCAN goes to the
/// node holding `keys`' shard (its stream's slot), whose keyspace holds the shard's sets.
pub(crate) async fn scan_sets<C: Routable + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    cursor: u64,
) -> redis::RedisResult<(u64, Vec<String>)> {
    let mut scan = redis::cmd("SCAN");
    scan.arg(cursor)
        .arg("MATCH")
        .arg(keys.in_flight_pattern())
        .arg("COUNT")
        .arg(SWEEP_BATCH)
        .arg("TYPE")
        .arg("set");
    on_master_of(conn, &keys.stream(), scan).await
}

/// Every tenant with jobs in flight and how many (the console's tenants page).
pub(crate) async fn in_flight_by_tenant<C: Routable + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<std::collections::BTreeMap<String, u64>> {
    let mut counts = std::collections::BTreeMap::new();
    let mut cursor = 0;
    loop {
        let (next, sets) = scan_sets(conn, keys, cursor).await?;
        for set in sets {
            if let Some(tenant) = keys.in_flight_tenant(&set) {
                let n: u64 = redis::cmd("SCARD").arg(&set).query_async(conn).await?;
                counts.insert(tenant.to_owned(), n);
            }
        }
        if next == 0 {
            return Ok(counts);
        }
        cursor = next;
    }
}

/// One step of an SSCAN over one in-flight set: the next cursor (0 at the end) and members.
pub(crate) async fn scan_members<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    set: &str,
    cursor: u64,
) -> redis::RedisResult<(u64, Vec<String>)> {
    redis::cmd("SSCAN")
        .arg(set)
        .arg(cursor)
        .arg("COUNT")
        .arg(SWEEP_BATCH)
        .query_async(conn)
        .await
}

/// Which of `jobs` still have their job state (in the order given), in one round trip.
/// Only whether the hash exists: any state at all means the job may be on a stream.
pub(crate) async fn have_state<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    jobs: &[JobId],
) -> redis::RedisResult<Vec<bool>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for job in jobs {
        pipe.exists(keys.job(*job));
    }
    pipe.query_async(conn).await
}

/// One page of a stream's job ids: entries after `after` (from the start when `None`), at
/// most [`SWEEP_BATCH`]; returns the last entry id of the page ('' when empty), how many
/// entries it had, and the job ids of those entries. The ids are picked out in Redis, so a page of entries carrying
/// long texts does not cross the network.
///
/// KEYS[1] stream   ARGV[1] exclusive start ('-' for the first page)   ARGV[2] count
/// ARGV[3] the job id field
static JOB_IDS_PAGE: LazyLock<Script> = LazyLock::new(|| Script::new(JOB_IDS_PAGE_LUA));
const JOB_IDS_PAGE_LUA: &str = r"
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
local out = {'', tostring(#entries)}
for _, e in ipairs(entries) do
  out[1] = e[1]
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == ARGV[3] then out[#out + 1] = f[i + 1] end
  end
end
return out
";

/// Of `candidates`, those whose job has an entry on the job stream or the dead-letter stream,
/// read page by page and stopping once every candidate is found. Reads every unfinished
/// entry in the worst case, so the sweep calls it only for members that already look gone.
pub(crate) async fn on_streams<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    candidates: &HashSet<JobId>,
) -> redis::RedisResult<HashSet<JobId>> {
    let mut found = HashSet::new();
    for stream in [keys.stream(), keys.dead_letters()] {
        let mut start = "-".to_owned();
        while found.len() < candidates.len() {
            let page: Vec<String> = JOB_IDS_PAGE
                .key(&stream)
                .arg(&start)
                .arg(SWEEP_BATCH)
                .arg(job_entry::JOB_ID)
                .invoke_async(conn)
                .await?;
            let [last, entries, ids @ ..] = page.as_slice() else {
                break;
            };
            found.extend(
                ids.iter()
                    .filter_map(|id| id.parse::<JobId>().ok())
                    .filter(|id| candidates.contains(id)),
            );
            if last.is_empty() || entries.parse::<usize>().unwrap_or(0) < SWEEP_BATCH {
                break;
            }
            start = format!("({last}");
        }
    }
    Ok(found)
}

/// A member the sweep found left behind, and how sure it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Leaked {
    /// The job has its summary (finished for good), or the member is not a job id at all:
    /// removed as it is.
    Finished(String),
    /// The job had no state and no stream entry when the sweep looked: removed only if it
    /// still has no state, checked in the removing script itself.
    Gone { member: String, job: JobId },
}

/// Remove leaked members of one in-flight set; returns how many this call removed.
///
/// Race-free against an enqueue or a `dlq replay` of the same job running meanwhile: both
/// write the job's state in the same atomic step as they add the member, and the script
/// re-checks that state before each SREM of a gone member, so a job put back on a stream
/// after the sweep looked keeps its member. A finished member needs no re-check: a job
/// with a summary is finished for good, and a later acceptance under the same id is a
/// duplicate the worker answers without a model call.
///
/// KEYS[1] the in-flight set   KEYS[2 ..] job-state hashes
/// ARGV pairs: member, index into KEYS of its job state (0: remove without a check)
static REMOVE_LEAKED: LazyLock<Script> = LazyLock::new(|| Script::new(REMOVE_LEAKED_LUA));
const REMOVE_LEAKED_LUA: &str = r"
local removed = 0
for i = 1, #ARGV, 2 do
  local k = tonumber(ARGV[i + 1])
  if k == 0 or redis.call('EXISTS', KEYS[k]) == 0 then
    removed = removed + redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return removed
";

pub(crate) async fn remove_leaked<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    set: &str,
    leaked: &[Leaked],
) -> redis::RedisResult<u64> {
    if leaked.is_empty() {
        return Ok(0);
    }
    let mut invocation = REMOVE_LEAKED.prepare_invoke();
    invocation.key(set);
    let mut next_key = 2;
    for member in leaked {
        match member {
            Leaked::Finished(member) => {
                invocation.arg(member).arg(0);
            }
            Leaked::Gone { member, job } => {
                invocation.key(keys.job(*job)).arg(member).arg(next_key);
                next_key += 1;
            }
        }
    }
    invocation.invoke_async(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_defaults_to_one_seconds_worth() {
        let l = TenantLimits {
            rate_per_s: Some(2.5),
            ..Default::default()
        };
        assert_eq!(l.burst(), 3.0);
        assert_eq!(l.interval_us(), 400_000.0);
        assert_eq!(TenantLimits::default().interval_us(), 0.0);
    }

    #[test]
    fn only_a_limited_tenant_has_a_window_per_recipient() {
        let keys = RedisKeys::new("p:");
        let to = Email::parse_recipient("Ann@Example.com").unwrap();
        let limited = TenantLimits {
            notify_per_hour: Some(3),
            ..Default::default()
        };
        assert_eq!(
            limited.notify_window(&keys, "acme", &to),
            format!("p:tenant:acme:notify:{}", to.recipient_id())
        );
        assert_eq!(
            TenantLimits::default().notify_window(&keys, "acme", &to),
            "p:tenant:acme:notify:unlimited"
        );
    }

    #[test]
    fn the_sweep_pattern_matches_in_flight_sets_of_this_prefix_only() {
        let keys = RedisKeys::new("t*[1]:");
        assert_eq!(keys.in_flight_pattern(), r"t\*\[1\]:tenant:*:in_flight");
        let set = keys.in_flight("acme");
        assert_eq!(keys.in_flight_tenant(&set), Some("acme"));
        assert_eq!(keys.in_flight_tenant(&keys.rate("acme")), None);
        assert_eq!(keys.in_flight_tenant("other:tenant:acme:in_flight"), None);
    }
}
