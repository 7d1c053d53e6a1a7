use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;
use tracing::Instrument;

use super::budget::Admission;
use super::job_entry;
use super::job_state::Queued;
use super::lanes::LanePolicy;
use super::replicas::{self, ReplicaAcks};
use super::tenant_limits::{self, OverLimit, TenantLimits};
use crate::domain::Job;
use crate::infra::keys::RedisKeys;
use crate::infra::redis::script_call::{ScriptArgs, ScriptCall};
use crate::infra::telemetry::{self, otel_span};
use crate::resilience::failure::Disposition;

/// XADD the job and record it as queued, in one MULTI/EXEC: a job is never on the stream
/// without its state, nor the other way round. Returns the stream entry id.
///
/// This is the plain enqueue, without an idempotency record: for producers that already
/// hold a job id (the end-to-end benchmark, tests that stage redeliveries). The API uses
/// `enqueue_once`, which does the same and stores the response in the same atomic step.
pub async fn enqueue<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &RedisKeys,
    job: &Job,
) -> redis::RedisResult<String> {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .xadd(keys.stream(), "*", &job_entry::to_fields(job));
    Queued::of(job).add_to(&mut pipe, &keys.job(job.job_id));
    tenant_limits::add_accepted(&mut pipe, keys, job.tenant.as_str(), job.job_id);
    let (id,): (String,) = pipe.query_async(conn).await?;
    Ok(id)
}

/// The Lua text lives in its own file so `bench/run.sh` can load the very same script into
/// `redis-benchmark` as the round-trip ceiling of a POST.
pub const ENQUEUE_ONCE_LUA: &str = include_str!("enqueue_once.lua");

/// `Script` sends EVALSHA and falls back to EVAL (loading it) on NOSCRIPT, e.g. after a
/// Redis restart emptied the script cache.
static ENQUEUE_ONCE: LazyLock<Script> = LazyLock::new(|| Script::new(ENQUEUE_ONCE_LUA));

/// What [`enqueue_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnqueueOnce {
    /// The key was new: the job is in its tenant's lane (this entry id), its state is `queued`,
    /// and `record` is stored under the key.
    Enqueued { entry_id: String },
    /// The key already had a record (returned as stored); nothing was written.
    Existing { record: String },
    /// The key was new but the tenant is over a limit; nothing was written.
    Refused(OverLimit),
}

/// What a new job is admitted under: its tenant's limits and, for a tenant with a budget,
/// the job's worst case to reserve.
#[derive(Debug, Clone, Copy)]
pub struct Admit<'a> {
    pub limits: &'a TenantLimits,
    pub budget: Option<&'a Admission>,
}

/// The idempotency record an accept stores: under `key`, `value`, for `ttl_s` seconds.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyRecord<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub ttl_s: u64,
}

/// Unless `record.key` exists: put `job` in its tenant's lane (`stream::lanes`; the
/// workers' dispatch moves it onto the stream) with its state, and store `record`, all in
/// one atomic script, if the tenant is within `admit.limits` and its budget holds the job's
/// worst case (`admit.budget`: reserved in the same step). If it exists, return its content
/// and write nothing (never charged).
pub async fn enqueue_once<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &RedisKeys,
    job: &Job,
    record: IdempotencyRecord<'_>,
    admit: Admit<'_>,
) -> redis::RedisResult<EnqueueOnce> {
    let span = enqueue_span(job);
    let reply = async { invocation(keys, job, record, admit).invoke(conn).await }
        .instrument(span.clone())
        .await;
    traced(&span, reply.map(EnqueueOnce::from_reply))
}

/// The `enqueue` span: the accept's one round trip to Redis, whose context the entry stores.
fn enqueue_span(job: &Job) -> tracing::Span {
    otel_span!(
        "enqueue",
        "client",
        job.job_id,
        job.tenant,
        "db.system.name" = "redis"
    )
}

/// `result`, with a failure (Redis's, always transient to the client) marked on `span`.
fn traced<T>(span: &tracing::Span, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
    if result.is_err() {
        telemetry::fail(span, Disposition::TRANSIENT.class());
    }
    result
}

/// [`enqueue_once`] with a WAIT for `acks` behind it in the same pipeline
/// ([`replicas::invoke_confirmed`] says why they must travel together): also answers how
/// many replicas confirmed this connection's writes up to the script's. Only an
/// `Enqueued` outcome wrote anything for that count to cover.
pub async fn enqueue_once_confirmed<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &RedisKeys,
    job: &Job,
    record: IdempotencyRecord<'_>,
    admit: Admit<'_>,
    acks: ReplicaAcks,
) -> redis::RedisResult<(EnqueueOnce, u32)> {
    let span = enqueue_span(job);
    let confirmed = async {
        let call = invocation(keys, job, record, admit);
        replicas::invoke_confirmed(conn, &call, acks).await
    }
    .instrument(span.clone())
    .await;
    let (reply, acked) = traced(&span, confirmed)?;
    Ok((EnqueueOnce::from_reply(reply), acked))
}

/// The script's reply: outcome (1 enqueued, 2 refused, else existing), the entry id, the
/// refusal or the record, and a refusal's retry hint.
type Reply = (i64, String, i64);

impl EnqueueOnce {
    fn from_reply((outcome, text, retry_ms): Reply) -> Self {
        match outcome {
            1 => EnqueueOnce::Enqueued { entry_id: text },
            2 => EnqueueOnce::Refused(OverLimit::from_script(&text, retry_ms)),
            _ => EnqueueOnce::Existing { record: text },
        }
    }
}

fn invocation(
    keys: &RedisKeys,
    job: &Job,
    record: IdempotencyRecord<'_>,
    admit: Admit<'_>,
) -> ScriptCall {
    let Admit { limits, budget } = admit;
    let tenant = job.tenant.as_str();
    let limits = &limits.for_recipient(job.notify.as_ref());
    // Without a recipient the window is never read (no notify_per_hour); any address names it.
    let window = match &job.notify {
        Some(to) => limits.notify_window(keys, tenant, to),
        None => keys.notify_window(tenant, "unlimited"),
    };
    let budget_key = match budget {
        Some(b) => b.key(keys, tenant),
        // Never read without a cost; any name of the tenant's stands in.
        None => keys.budget(tenant, "none"),
    };
    let mut call = ScriptCall::new(
        &ENQUEUE_ONCE,
        &[
            record.key,
            &keys.lane(tenant),
            &keys.job(job.job_id),
            &keys.in_flight(tenant),
            &keys.rate(tenant),
            &window,
            &budget_key,
            &keys.lanes(),
            &keys.lanes_clock(),
            &keys.doorbell(),
            &keys.lane_policies(),
        ],
    );
    call.arg(record.value)
        .arg(record.ttl_s)
        .arg(job.job_id.to_string());
    limits.pass_to(&mut call, std::time::SystemTime::now());
    Queued::of(job).pass_to(&mut call);
    for (name, value) in job_entry::to_fields(job) {
        call.arg(name).arg(value);
    }
    // The `enqueue` span around this: the worker's delivery continues from it.
    for (name, value) in job_entry::trace_fields(telemetry::current().as_ref()) {
        call.arg(name).arg(value);
    }
    LanePolicy::of(limits).pass_to(&mut call, tenant);
    Admission::pass_to(budget, &mut call);
    call
}
