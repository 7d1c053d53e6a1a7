use redis::aio::ConnectionLike;

use super::job_state;
use super::message::JobMessage;
use crate::keys::RedisKeys;

/// XADD the job and record it as queued, in one MULTI/EXEC: a job is never on the stream
/// without its state, nor the other way round. Returns the stream entry id.
pub async fn enqueue<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &RedisKeys,
    msg: &JobMessage,
) -> redis::RedisResult<String> {
    let fields = msg.to_fields();
    let job_key = keys.job(msg.job_id);
    let (id,): (String,) = redis::pipe()
        .atomic()
        .xadd(keys.stream(), "*", &fields)
        .hset_multiple(
            &job_key,
            &[
                ("tenant", msg.tenant.as_str()),
                ("status", job_state::QUEUED),
                ("created_at", fields[3].1.as_str()),
            ],
        )
        .ignore()
        .hdel(&job_key, "error")
        .ignore()
        .query_async(conn)
        .await?;
    Ok(id)
}
