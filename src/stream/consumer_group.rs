//! The stream's consumer group, as a worker uses it: create the group, read new entries,
//! reclaim idle ones, count deliveries, acknowledge finished jobs, and remove consumers
//! that are gone.
//!
//! Thin wrappers over single Redis commands (or one MULTI/EXEC); the decisions about what to
//! do with a delivery live in the worker's consumer loop (`worker/consumer.rs`).

use std::collections::HashMap;

use redis::AsyncCommands;
use redis::aio::ConnectionLike;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamInfoConsumersReply,
    StreamPendingCountReply, StreamReadOptions, StreamReadReply,
};

use super::job_state;
use crate::domain::JobId;
use crate::keys::{GROUP, RedisKeys};

/// The XAUTOCLAIM cursor that starts (and, when returned, ends) a full scan of the PEL.
pub const CURSOR_START: &str = "0-0";

/// One stream entry handed to this consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub id: String,
    pub fields: HashMap<String, redis::Value>,
}

impl From<StreamId> for Delivery {
    fn from(entry: StreamId) -> Self {
        Self {
            id: entry.id,
            fields: entry.map,
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

/// XAUTOCLAIM entries idle for at least `min_idle_ms`, starting at `cursor`.
/// Returns the next cursor (`0-0` when the scan is complete), the claimed entries, and the
/// ids that were pending but no longer exist in the stream (Redis drops them from the PEL).
pub async fn autoclaim<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    min_idle_ms: u64,
    cursor: &str,
    count: usize,
) -> redis::RedisResult<(String, Vec<Delivery>, Vec<String>)> {
    let reply: StreamAutoClaimReply = conn
        .xautoclaim_options(
            keys.stream(),
            GROUP,
            consumer,
            min_idle_ms,
            cursor,
            StreamAutoClaimOptions::default().count(count),
        )
        .await?;
    Ok((
        reply.next_stream_id,
        reply.claimed.into_iter().map(Delivery::from).collect(),
        reply.deleted_ids,
    ))
}

/// XREADGROUP … `>`: entries never delivered to any consumer, waiting up to `block_ms`.
pub async fn read_new<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    consumer: &str,
    count: usize,
    block_ms: u64,
) -> redis::RedisResult<Vec<Delivery>> {
    let options = StreamReadOptions::default()
        .group(GROUP, consumer)
        .count(count)
        .block(usize::try_from(block_ms).unwrap_or(usize::MAX));
    let reply: Option<StreamReadReply> = conn
        .xread_options(&[keys.stream()], &[">"], &options)
        .await?;
    Ok(reply
        .into_iter()
        .flat_map(|r| r.keys)
        .flat_map(|k| k.ids)
        .map(Delivery::from)
        .collect())
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

/// Acknowledge a finished job and drop its Redis job state, in one MULTI/EXEC: once
/// Postgres has the summary, it is the truth, and the state must not outlive the ack.
pub async fn ack_done<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    msg_id: &str,
    job_id: JobId,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    pipe.atomic().xack(keys.stream(), GROUP, &[msg_id]).ignore();
    job_state::add_forget(&mut pipe, &keys.job(job_id));
    pipe.query_async(conn).await
}

/// Delete a consumer only if it still has nothing pending, atomically: XGROUP DELCONSUMER
/// discards the consumer's pending entries, which would lose jobs if it took one meanwhile.
const DELETE_IF_IDLE: &str = r"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
";

/// Remove consumers of the group that have been idle longer than `idle_ms` and hold no
/// pending entries (processes that are gone), never `own`. Returns the removed names.
pub async fn remove_idle_consumers<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    own: &str,
    idle_ms: u64,
) -> redis::RedisResult<Vec<String>> {
    let info: StreamInfoConsumersReply = conn.xinfo_consumers(keys.stream(), GROUP).await?;
    let script = redis::Script::new(DELETE_IF_IDLE);
    let mut removed = Vec::new();
    for consumer in info.consumers {
        let idle = u64::try_from(consumer.idle).unwrap_or(u64::MAX);
        if consumer.name == own || consumer.pending > 0 || idle <= idle_ms {
            continue;
        }
        let result: i64 = script
            .key(keys.stream())
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

/// Entries delivered and not yet acknowledged, for the `summaryd_stream_pending` gauge.
pub async fn pending_count<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<u64> {
    let reply: redis::streams::StreamPendingReply = conn.xpending(keys.stream(), GROUP).await?;
    Ok(u64::try_from(reply.count()).unwrap_or(u64::MAX))
}
