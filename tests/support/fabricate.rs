//! State a test writes so that it need not wait for time to pass: each helper leaves the
//! stores exactly as the named stretch of time would, and the code under test then reads it
//! as it reads real state. Where only the clock can set the state (a stream entry's id, a
//! consumer's idle time), a test still waits for real.

use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamPendingCountReply;
use summaryd::infra::keys::{GROUP, RedisKeys};

/// A pending entry looks idle for an hour, as after its holder died: XCLAIM to its current
/// owner with IDLE and JUSTID, which leaves the delivery counter alone.
pub async fn make_idle(redis: &mut MultiplexedConnection, keys: &RedisKeys, msg_id: &str) {
    let pending: StreamPendingCountReply = redis
        .xpending_count(keys.stream(), GROUP, msg_id, msg_id, 1)
        .await
        .unwrap();
    let owner = pending
        .ids
        .into_iter()
        .next()
        .map(|p| p.consumer)
        .expect("entry is pending");
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(keys.stream())
        .arg(GROUP)
        .arg(owner)
        .arg(0)
        .arg(msg_id)
        .arg("IDLE")
        .arg(3_600_000)
        .arg("JUSTID")
        .query_async(redis)
        .await
        .unwrap();
}

/// Every outbox lease in `pg`'s database has run out, as after waiting out `relay.lease_ms`.
pub async fn expire_leases(pg: &tokio_postgres::Client) {
    pg.execute(
        "UPDATE outbox SET claimed_until = now() - interval '1 millisecond' \
              WHERE claimed_until IS NOT NULL",
        &[],
    )
    .await
    .expect("expire leases");
}

/// Every unsent, unparked outbox row in `pg`'s database is due now, as after waiting out
/// its backoff.
pub async fn make_outbox_due(pg: &tokio_postgres::Client) {
    pg.execute(
        "UPDATE outbox SET next_attempt_at = now() \
              WHERE sent_at IS NULL AND failed_at IS NULL",
        &[],
    )
    .await
    .expect("make rows due");
}

/// `tenant`'s rate limit as it is `by` later: the stored theoretical arrival time (µs, on the
/// accepting replica's clock) moved back, which is all the clock moving on does to GCRA.
pub async fn rewind_rate(
    redis: &mut MultiplexedConnection,
    keys: &RedisKeys,
    tenant: &str,
    by: Duration,
) {
    let by_us = i64::try_from(by.as_micros()).unwrap();
    // DECRBY keeps the key's expiry; a key already expired stays harmless, since the script
    // reads a time in the past as "no arrivals pending".
    let _: i64 = redis.decr(keys.rate(tenant), by_us).await.unwrap();
}

/// A dead letter of `job` added under the entry id `id` (`<ms>-<seq>`, when it was
/// dead-lettered; `*` for now), as the worker writes one: the job's fields, the reason, the
/// original entry id and the time; with `class` when given, without one as dead letters
/// written before classes existed. Ids must grow, as the stream's clock does.
pub async fn dead_letter(
    redis: &mut MultiplexedConnection,
    keys: &RedisKeys,
    id: &str,
    job: &summaryd::domain::Job,
    class: Option<&str>,
) -> String {
    let mut fields: Vec<(String, String)> = summaryd::stream::job_entry::to_fields(job)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    fields.push(("reason".into(), "fabricated".into()));
    if let Some(class) = class {
        fields.push(("class".into(), class.into()));
    }
    fields.push(("original_id".into(), "1-0".into()));
    fields.push((
        "failed_at".into(),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    ));
    redis
        .xadd(keys.dead_letters(), id, &fields)
        .await
        .expect("XADD dead letter")
}
