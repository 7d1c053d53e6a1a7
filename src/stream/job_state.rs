//! Per-job state in Redis for jobs that have no summary yet: who owns it, when it was
//! accepted, and whether it was dead-lettered. Postgres is the truth once a summary exists.
//!
//! This module owns the hash's field names, its status values and every write to it. The
//! writes are added to the atomic step that changes the stream (enqueue, dead-letter,
//! replay, ack), so GET never disagrees with the queue; the Lua scripts among those steps
//! receive the names and values as arguments ([`Queued::pass_to`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use redis::{AsyncCommands, Pipeline, ScriptInvocation};

use super::job_entry;
use crate::domain::{Job, JobId};
use crate::infra::keys::RedisKeys;
use crate::infra::redis::script_call::ScriptArgs;

const TENANT: &str = "tenant";
const STATUS: &str = "status";
const CREATED_AT: &str = "created_at";
/// Why the job was dead-lettered; only while it is `failed`.
const ERROR: &str = "error";
/// How many of the job's deliveries were refunded (not counted: an outage or a shutdown cut
/// them short). Bounded, so no path refunds one job without end; a replay starts it over.
pub const REFUNDS: &str = "refunds";
/// Why the job's last counted delivery failed, for the dead letter's reason should its
/// deliveries run out (empty: none failed yet).
const LAST_FAILURE: &str = "last_failure";
/// Model calls a job summarised in parts has finished, and how many its plan needs (an
/// estimate while it runs: combinations are counted as if every summary were as long as
/// it may be). Absent for a job summarised in one call.
const PARTS_DONE: &str = "parts_done";
const PARTS_TOTAL: &str = "parts_total";

/// The job's reservation against its tenant's budget (`stream/budget.rs`): the period id it
/// was made in and the tokens held. Written in the accepting step, removed by the one step
/// that settles it (ack or dead letter), so a reservation is settled at most once.
const BUDGET_PERIOD: &str = "budget_period";
const BUDGET_RESERVED: &str = "budget_reserved";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// On the stream, waiting or being processed.
    Queued,
    /// Dead-lettered; `error` says why.
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Failed => "failed",
        }
    }

    /// Anything but `failed` reads as queued: a job whose state exists is on a stream.
    fn parse(raw: Option<&str>) -> Self {
        if raw == Some(Status::Failed.as_str()) {
            Status::Failed
        } else {
            Status::Queued
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    pub(crate) tenant: String,
    pub status: Status,
    pub error: Option<String>,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) last_failure: Option<String>,
    /// `(parts_done, parts_total)` of a job being summarised in parts.
    pub(crate) progress: Option<(u32, u32)>,
}

pub async fn get<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    job_id: JobId,
) -> redis::RedisResult<Option<JobState>> {
    let map: HashMap<String, String> = conn.hgetall(keys.job(job_id)).await?;
    let Some(tenant) = map.get(TENANT).cloned() else {
        return Ok(None);
    };
    Ok(Some(JobState {
        tenant,
        status: Status::parse(map.get(STATUS).map(String::as_str)),
        error: map.get(ERROR).cloned(),
        created_at: map
            .get(CREATED_AT)
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|d| d.with_timezone(&Utc)),
        last_failure: map.get(LAST_FAILURE).filter(|s| !s.is_empty()).cloned(),
        progress: map
            .get(PARTS_DONE)
            .and_then(|d| d.parse().ok())
            .zip(map.get(PARTS_TOTAL).and_then(|t| t.parse().ok())),
    }))
}

/// Note how far a job summarised in parts has come, if the job still has its state (as
/// [`note_failure`]: a finished job's state must not come back).
pub(crate) async fn note_progress<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    job_id: JobId,
    done: u32,
    total: u32,
) -> redis::RedisResult<()> {
    static NOTE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            "if redis.call('EXISTS', KEYS[1]) == 1 then \
               redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) end return 1",
        )
    });
    let _: i64 = NOTE
        .key(keys.job(job_id))
        .arg(PARTS_DONE)
        .arg(done)
        .arg(PARTS_TOTAL)
        .arg(total.max(done))
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Note why a counted delivery of the job failed, if the job still has its state (a
/// finished job's state is gone and must not come back as a hash with no tenant).
pub(crate) async fn note_failure<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    job_id: JobId,
    reason: &str,
) -> redis::RedisResult<()> {
    static NOTE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            "if redis.call('EXISTS', KEYS[1]) == 1 then \
               redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end return 1",
        )
    });
    let _: i64 = NOTE
        .key(keys.job(job_id))
        .arg(LAST_FAILURE)
        .arg(reason)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// The state of a job that is (again) on the stream: tenant, `queued`, when it was
/// accepted, and no error left from an earlier failure.
pub(crate) struct Queued {
    tenant: String,
    created_at: String,
}

impl Queued {
    pub fn of(job: &Job) -> Self {
        Self {
            tenant: job.tenant.to_string(),
            created_at: job_entry::timestamp(job.created_at),
        }
    }

    /// From the raw fields of a dead entry being replayed (which may lack them).
    pub(crate) fn restored(tenant: String, created_at: String) -> Self {
        Self { tenant, created_at }
    }

    fn fields(&self) -> [(&'static str, &str); 5] {
        [
            (TENANT, self.tenant.as_str()),
            (STATUS, Status::Queued.as_str()),
            (CREATED_AT, self.created_at.as_str()),
            (REFUNDS, "0"),
            (LAST_FAILURE, ""),
        ]
    }

    /// Add the writes to an atomic pipeline.
    pub(crate) fn add_to(&self, pipe: &mut Pipeline, key: &str) {
        pipe.hset_multiple(key, &self.fields())
            .ignore()
            .hdel(key, ERROR)
            .ignore();
    }

    /// Hand the writes to a script as arguments: `n`, then `n` field and value arguments
    /// for HSET, then the field to HDEL. The script runs
    /// `HSET key unpack(ARGV, i + 1, i + n)` and `HDEL key ARGV[i + n + 1]`.
    pub(crate) fn pass_to(&self, script: &mut impl ScriptArgs) {
        let fields = self.fields();
        script.arg(fields.len() * 2);
        for (name, value) in fields {
            script.arg(name).arg(value);
        }
        script.arg(ERROR);
    }
}

/// Mark the job dead-lettered, with the reason GET reports: handed to the dead-letter
/// script as `n`, then `n` field and value arguments for `HSET key unpack(ARGV, i + 1, i + n)`.
pub(crate) fn pass_failed(script: &mut ScriptInvocation, reason: &str) {
    script
        .arg(4)
        .arg(STATUS)
        .arg(Status::Failed.as_str())
        .arg(ERROR)
        .arg(reason);
}

/// Hand a script the field and value that mark a job dead-lettered, as two arguments, so
/// it can drop the state of a dead letter it removes only while the job is still `failed`.
pub(crate) fn pass_failed_marker(script: &mut ScriptInvocation) {
    script.arg(STATUS).arg(Status::Failed.as_str());
}

/// Drop the state: once Postgres has the summary, it is the truth.
pub(crate) fn add_forget(pipe: &mut Pipeline, key: &str) {
    pipe.del(key).ignore();
}

/// A job's reservation against its tenant's budget, as the job state holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// `domain::BudgetPeriod::id` of the period it was made in.
    pub period_id: String,
    pub tokens: u64,
}

impl Reservation {
    /// The reservation HMGET (or a script's HMGET) found: both fields or nothing.
    pub(crate) fn of(period: Option<String>, tokens: Option<u64>) -> Option<Self> {
        period
            .zip(tokens)
            .map(|(period_id, tokens)| Self { period_id, tokens })
    }
}

/// A job's reservation as the step that handed out its entry saw it. Only the holder of a
/// pending entry settles its job's reservation, and settling ends the entry (ack or dead
/// letter), so what the dispatch read stays true while the entry is pending; a replay
/// makes a new entry, read again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SeenReservation {
    /// Read in the dispatch script that handed the entry out, for the job id the entry
    /// names (`job_id`, as the entry spells it).
    Read {
        job_id: String,
        reservation: Option<Reservation>,
    },
    /// Not read: an entry claimed or re-claimed, which asks the job state.
    #[default]
    Unread,
}

impl SeenReservation {
    /// What was read for `job_id`; `None` when nothing was, or when the entry spelt the id
    /// in another form than its state's key (an older writer's entry), whose state the
    /// script could not have found.
    pub fn of(&self, job_id: JobId) -> Option<Option<Reservation>> {
        match self {
            Self::Read {
                job_id: spelt,
                reservation,
            } if *spelt == job_id.to_string() => Some(reservation.clone()),
            _ => None,
        }
    }
}

/// The two field names of the reservation (period, then tokens), which the budget scripts
/// receive as arguments rather than spelling them.
pub(crate) fn reservation_fields() -> [&'static str; 2] {
    [BUDGET_PERIOD, BUDGET_RESERVED]
}

/// The job's reservation, while it holds one (`None`: no budget, or already settled).
pub async fn reservation<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    job_id: JobId,
) -> redis::RedisResult<Option<Reservation>> {
    let (period, tokens): (Option<String>, Option<u64>) = redis::cmd("HMGET")
        .arg(keys.job(job_id))
        .arg(BUDGET_PERIOD)
        .arg(BUDGET_RESERVED)
        .query_async(conn)
        .await?;
    Ok(Reservation::of(period, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_seen_with_the_entry_counts_only_for_the_job_it_was_read_for() {
        let job = JobId::from_scoped_key("t:k");
        let reservation = Reservation {
            period_id: "m2026-12".into(),
            tokens: 7,
        };
        let read = |spelt: String, reservation| SeenReservation::Read {
            job_id: spelt,
            reservation,
        };
        assert_eq!(
            read(job.to_string(), Some(reservation.clone())).of(job),
            Some(Some(reservation.clone()))
        );
        assert_eq!(read(job.to_string(), None).of(job), Some(None));
        // Spelt otherwise than the state's key: the script looked under another name.
        assert_eq!(read(job.to_string().to_uppercase(), None).of(job), None);
        let other = JobId::from_scoped_key("t:other");
        assert_eq!(read(other.to_string(), Some(reservation)).of(job), None);
        assert_eq!(SeenReservation::Unread.of(job), None);
    }

    #[test]
    fn a_reservation_needs_both_its_fields() {
        assert_eq!(
            Reservation::of(Some("d2026-12-03".into()), Some(3)),
            Some(Reservation {
                period_id: "d2026-12-03".into(),
                tokens: 3
            })
        );
        assert_eq!(Reservation::of(Some("d2026-12-03".into()), None), None);
        assert_eq!(Reservation::of(None, Some(3)), None);
    }
}
