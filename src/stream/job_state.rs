//! Per-job state in Redis for jobs that have no summary yet: who owns it, when it was
//! accepted, and whether it was dead-lettered. Postgres is the truth once a summary exists.
//!
//! Written atomically with the stream operation that changes it (enqueue, dead-letter,
//! replay), so GET never disagrees with the queue.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;

use crate::domain::JobId;
use crate::keys::RedisKeys;

pub const QUEUED: &str = "queued";
pub const FAILED: &str = "failed";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    pub tenant: String,
    /// `queued` or `failed`.
    pub status: String,
    pub error: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
}

pub async fn get<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    job_id: JobId,
) -> redis::RedisResult<Option<JobState>> {
    let map: HashMap<String, String> = conn.hgetall(keys.job(job_id)).await?;
    let Some(tenant) = map.get("tenant").cloned() else {
        return Ok(None);
    };
    Ok(Some(JobState {
        tenant,
        status: map.get("status").cloned().unwrap_or_else(|| QUEUED.into()),
        error: map.get("error").cloned(),
        created_at: map
            .get("created_at")
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|d| d.with_timezone(&Utc)),
    }))
}
