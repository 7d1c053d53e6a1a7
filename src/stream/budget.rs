//! Tenants' token budgets in Redis (`docs/tenants.md`, Budgets): one hash per tenant and
//! period (`infra::keys::budget`) with `reserved` and `used`.
//!
//! - A job's worst case is reserved by the accepting script (`enqueue_once.lua`, arguments
//!   from [`Admission::pass_to`]) in the step that accepts it, with the reservation noted
//!   in the job state (`job_state::Reservation`): reserving and accepting are one step, so
//!   concurrent requests on any number of API processes can never reserve past the budget.
//! - The step that finishes the job settles it ([`add_settle`] in the ack's MULTI, and
//!   [`SETTLE_LUA`] inside the dead-letter script): the reservation is read and removed
//!   from the job state and replaced by the tokens spent, in the same script, so a second
//!   ack or a later dead letter finds nothing left to settle.
//!
//! The arithmetic is `domain::Budget`/`BudgetUse`; the scripts do the same in Lua.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use redis::{Pipeline, ScriptInvocation};

use super::job_state::{self, Reservation};
use crate::domain::{Budget, BudgetUse, JobId};
use crate::infra::keys::RedisKeys;
use crate::infra::redis::script_call::ScriptArgs;

/// The period hash's fields (the Lua text spells them too: `enqueue_once.lua` and
/// [`SETTLE_LUA`]).
pub(crate) const RESERVED: &str = "reserved";
pub(crate) const USED: &str = "used";

/// How many arguments [`Admission::pass_to`] appends to the enqueue script (the script
/// finds the stream entry's fields before them by this count).
#[cfg(test)]
const ADMISSION_ARGS: usize = 7;

/// What the accepting script needs to reserve a job's worst case: the cost, the budget,
/// the period and when it resets. `None` for a tenant without a budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub(crate) budget: Budget,
    /// The job's worst-case tokens (prompt and completion of every call it may make).
    pub(crate) cost: u64,
    pub(crate) period_id: String,
    /// Until the period resets: the wait a refusal names.
    pub(crate) retry_after_ms: u64,
}

impl Admission {
    /// The reservation of `cost` tokens against `budget` at `now` (the API's clock: the
    /// period is the one `now` falls in, and a refusal waits until it ends).
    pub fn new(budget: Budget, cost: u64, now: DateTime<Utc>) -> Self {
        let resets = budget.period.resets_at(now);
        let retry_after_ms = u64::try_from((resets - now).num_milliseconds()).unwrap_or(0);
        Self {
            budget,
            cost,
            period_id: budget.period.id(now),
            retry_after_ms: retry_after_ms.max(1),
        }
    }

    /// The budget hash this admission reserves in.
    pub(crate) fn key(&self, keys: &RedisKeys, tenant: &str) -> String {
        keys.budget(tenant, &self.period_id)
    }

    /// Append the script's budget arguments ([`ADMISSION_ARGS`] of them): cost (0 = no
    /// budget), budget tokens, retry ms, the hash's TTL in ms, the job-state field of the
    /// period, the period id, the job-state field of the tokens.
    pub(crate) fn pass_to(admission: Option<&Self>, script: &mut impl ScriptArgs) {
        let [period_field, tokens_field] = job_state::reservation_fields();
        match admission {
            Some(a) => script
                .arg(a.cost)
                .arg(a.budget.tokens)
                .arg(a.retry_after_ms)
                .arg(a.budget.period.keep_ms())
                .arg(period_field)
                .arg(&a.period_id)
                .arg(tokens_field),
            None => script
                .arg(0)
                .arg(0)
                .arg(0)
                .arg(0)
                .arg(period_field)
                .arg("")
                .arg(tokens_field),
        };
    }
}

/// How a finished job's reservation is settled: what it spent, by what the job state says
/// it reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settle {
    pub reservation: Reservation,
    /// Tokens the provider reported for the whole job; `None` when unknown (a provider
    /// that reports no usage): then the reservation is charged in full, so a budget is
    /// never exceeded by jobs whose cost was not reported.
    pub spent: Option<u64>,
}

impl Settle {
    /// The settle arguments: the two job-state field names, the period id the
    /// reservation must still name, and the tokens spent (-1: unknown).
    fn args(settle: Option<&Self>) -> [String; 4] {
        let [period_field, tokens_field] = job_state::reservation_fields();
        let (period_id, spent) = match settle {
            Some(s) => (
                s.reservation.period_id.clone(),
                s.spent.map_or_else(|| "-1".to_owned(), |n| n.to_string()),
            ),
            None => (String::new(), "-1".to_owned()),
        };
        [
            period_field.to_owned(),
            tokens_field.to_owned(),
            period_id,
            spent,
        ]
    }

    /// The budget hash the reservation was made in (a job settles against the period it
    /// reserved in, even after that period ended).
    fn key(settle: Option<&Self>, keys: &RedisKeys, tenant: &str) -> String {
        match settle {
            Some(s) => keys.budget(tenant, &s.reservation.period_id),
            // Never touched: the settle stops at the empty period id.
            None => keys.budget(tenant, "none"),
        }
    }

    /// The key and the [`SETTLE_ARGS`] arguments for a script that calls
    /// `settle_budget` ([`SETTLE_LUA`]) with them.
    pub(crate) fn pass_to(
        settle: Option<&Self>,
        keys: &RedisKeys,
        tenant: &str,
        script: &mut ScriptInvocation,
    ) {
        script.key(Self::key(settle, keys, tenant));
        for arg in Self::args(settle) {
            script.arg(arg);
        }
    }
}

/// Arguments [`Settle::pass_to`] appends (the dead-letter script finds the dead entry's
/// fields before them by this count).
#[cfg(test)]
const SETTLE_ARGS: usize = 4;

/// `settle_budget(job state key, budget key, period field, tokens field, period id, spent)`:
/// if the job state still holds a reservation made in `period id`, remove it and move it
/// from `reserved` to `used` as `spent` tokens (-1: the reservation itself), in the
/// period's hash if that still exists. Returns 1 when it settled. Removing the fields is
/// what makes it once only: whichever step runs second (a repeated ack, a dead letter of a
/// job acknowledged meanwhile) finds nothing. `reserved` never goes below zero.
pub(crate) const SETTLE_LUA: &str = r"
local function settle_budget(job_key, budget_key, period_field, tokens_field, period_id, spent)
  if period_id == '' then return 0 end
  local held = redis.call('HMGET', job_key, period_field, tokens_field)
  if held[1] ~= period_id or not held[2] then return 0 end
  redis.call('HDEL', job_key, period_field, tokens_field)
  if redis.call('EXISTS', budget_key) == 0 then return 0 end
  local reserved = tonumber(redis.call('HGET', budget_key, 'reserved') or '0') - tonumber(held[2])
  if reserved < 0 then reserved = 0 end
  local charged = spent
  if tonumber(spent) < 0 then charged = held[2] end
  redis.call('HSET', budget_key, 'reserved', string.format('%.0f', reserved))
  redis.call('HINCRBY', budget_key, 'used', charged)
  return 1
end
";

/// The settle alone, for the ack's MULTI/EXEC (EVAL is queued like any command, so it
/// runs in the same atomic step as the XACK and the removal of the job state).
/// KEYS[1] job state   KEYS[2] budget hash   ARGV = [`Settle::args`]
static SETTLE_ALONE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{SETTLE_LUA}\nreturn settle_budget(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])"
    )
});

/// Queue the settle of `job_id`'s reservation in an atomic pipeline, before the job
/// state is removed.
pub(crate) fn add_settle(
    pipe: &mut Pipeline,
    keys: &RedisKeys,
    tenant: &str,
    job_id: JobId,
    settle: &Settle,
) {
    let cmd = pipe.cmd("EVAL").arg(SETTLE_ALONE.as_str()).arg(2);
    cmd.arg(keys.job(job_id))
        .arg(Settle::key(Some(settle), keys, tenant));
    for arg in Settle::args(Some(settle)) {
        cmd.arg(arg);
    }
    pipe.ignore();
}

/// What a replayed job reserves: the reservation it held when it was dead-lettered (the
/// dead entry keeps it), in the period of the same kind that `now` falls in. A replay is an
/// operator's decision and is never refused (as with `max_in_flight`), so the job is
/// reserved even past the budget; it is settled like any other job when it finishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rereserve {
    pub tokens: u64,
    pub period_id: String,
}

impl Rereserve {
    /// From the dead entry's reservation (period id and tokens), at `now`.
    pub fn at(period_id: &str, tokens: u64, now: DateTime<Utc>) -> Option<Self> {
        let period = crate::domain::BudgetPeriod::of_id(period_id)?;
        (tokens > 0).then(|| Self {
            tokens,
            period_id: period.id(now),
        })
    }

    /// The budget key, then (as arguments, [`REPLAY_ARGS`] of them, last) the tokens (0:
    /// none), the hash's TTL in ms, the job-state field of the period, the period id, the
    /// job-state field of the tokens.
    pub(crate) fn pass_to(
        rereserve: Option<&Self>,
        keys: &RedisKeys,
        tenant: &str,
        script: &mut ScriptInvocation,
    ) {
        let [period_field, tokens_field] = job_state::reservation_fields();
        match rereserve {
            Some(r) => {
                let keep = crate::domain::BudgetPeriod::of_id(&r.period_id)
                    .map_or(0, crate::domain::BudgetPeriod::keep_ms);
                script
                    .key(keys.budget(tenant, &r.period_id))
                    .arg(r.tokens)
                    .arg(keep)
                    .arg(period_field)
                    .arg(&r.period_id)
                    .arg(tokens_field)
            }
            None => script
                .key(keys.budget(tenant, "none"))
                .arg(0)
                .arg(0)
                .arg(period_field)
                .arg("")
                .arg(tokens_field),
        };
    }
}

/// Arguments [`Rereserve::pass_to`] appends (the replay script finds the job's fields
/// before them by this count).
#[cfg(test)]
const REPLAY_ARGS: usize = 5;

/// A tenant's counters in one period (zero for a period nothing was reserved in).
pub async fn read<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    tenant: &str,
    period_id: &str,
) -> redis::RedisResult<BudgetUse> {
    let (reserved, used): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
        .arg(keys.budget(tenant, period_id))
        .arg(RESERVED)
        .arg(USED)
        .query_async(conn)
        .await?;
    let positive = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
    Ok(BudgetUse {
        reserved: positive(reserved),
        used: positive(used),
    })
}

/// A tenant's counters now, in the period `now` falls in.
pub async fn current<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    tenant: &str,
    budget: &Budget,
    now: DateTime<Utc>,
) -> redis::RedisResult<BudgetUse> {
    read(conn, keys, tenant, &budget.period.id(now)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_find_the_budget_arguments_by_their_count() {
        assert!(include_str!("enqueue_once.lua").contains(&format!("#ARGV - {ADMISSION_ARGS}")));
        let script = redis::Script::new("return 1");
        let mut invocation = script.prepare_invoke();
        Admission::pass_to(None, &mut invocation);
        let admission = Admission::new(
            Budget {
                tokens: 10,
                period: crate::domain::BudgetPeriod::Day,
                soft_ratio: 0.8,
            },
            3,
            Utc::now(),
        );
        Admission::pass_to(Some(&admission), &mut invocation);
        assert_eq!(Settle::args(None).len(), SETTLE_ARGS);
        let settle = Settle {
            reservation: Reservation {
                period_id: "2026-12-02".into(),
                tokens: 300,
            },
            spent: None,
        };
        // Unknown spend charges the reservation (-1 tells the script so).
        assert_eq!(Settle::args(Some(&settle))[2..], ["2026-12-02", "-1"]);
        let spent = Settle {
            spent: Some(120),
            ..settle
        };
        assert_eq!(Settle::args(Some(&spent))[2..], ["2026-12-02", "120"]);
        assert_eq!(Settle::args(None)[2], "", "nothing to settle");
        let mut replay = script.prepare_invoke();
        Rereserve::pass_to(None, &RedisKeys::new(""), "acme", &mut replay);
        let dead_letters = include_str!("dead_letters.rs");
        assert!(dead_letters.contains(&format!("local s = #ARGV - {SETTLE_ARGS}")));
        assert!(dead_letters.contains(&format!("local b = #ARGV - {REPLAY_ARGS}")));
    }

    #[test]
    fn a_replay_reserves_as_much_again_in_the_period_of_its_kind_now() {
        let now = chrono::DateTime::parse_from_rfc3339("2027-01-05T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let rows = [
            // (dead entry's period, tokens, reserves)
            ("2026-12-31", 300, Some(("2027-01-05", 300))),
            ("2026-12", 300, Some(("2027-01", 300))),
            ("2026-12", 0, None),
            ("", 300, None),
        ];
        for (period, tokens, want) in rows {
            let got = Rereserve::at(period, tokens, now);
            assert_eq!(
                got.map(|r| (r.period_id, r.tokens)),
                want.map(|(p, t)| (p.to_owned(), t)),
                "{period}"
            );
        }
    }

    #[test]
    fn a_refusal_waits_until_the_period_resets() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-02T23:59:30Z")
            .unwrap()
            .with_timezone(&Utc);
        let budget = Budget {
            tokens: 10,
            period: crate::domain::BudgetPeriod::Day,
            soft_ratio: 0.8,
        };
        let admission = Admission::new(budget, 3, now);
        assert_eq!(admission.retry_after_ms, 30_000);
        assert_eq!(admission.period_id, "2026-12-02");
    }
}
