//! The `job_texts` table: texts longer than `SUMMARYD_API_INLINE_TEXT_BYTES`, stored at
//! intake so the stream entry carries only a reference (`domain::JobText::Stored`).
//!
//! Written before the job is enqueued, so a job on the stream always finds its text; a
//! retry of the same request writes nothing new (the job id is the key). Deleted with the
//! commit of the job's summary (`summaries::commit_with_outbox`), and by retention when
//! the job never finished.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use super::DbError;
use crate::domain::{JobId, TenantId};

/// Store `text` for `job_id`. `true` when this call wrote it, `false` when it was there
/// already (a retry of the same request).
pub(crate) async fn store(
    pool: &Pool,
    job_id: JobId,
    tenant: &TenantId,
    text: &str,
) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "INSERT INTO job_texts (job_id, tenant, text) VALUES ($1, $2, $3) \
             ON CONFLICT (job_id) DO NOTHING",
        )
        .await?;
    let written = client
        .execute(&stmt, &[&job_id.as_uuid(), &tenant.as_str(), &text])
        .await?;
    Ok(written == 1)
}

/// Remove the text of a job that was not enqueued after all (the request was a replay, a
/// mismatch or refused by a limit), when this request was the one that stored it.
pub(crate) async fn forget(pool: &Pool, job_id: JobId) -> Result<(), DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached("DELETE FROM job_texts WHERE job_id = $1")
        .await?;
    client.execute(&stmt, &[&job_id.as_uuid()]).await?;
    Ok(())
}

/// The stored text of `job_id`, if it is there.
pub(crate) async fn load(pool: &Pool, job_id: JobId) -> Result<Option<String>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached("SELECT text FROM job_texts WHERE job_id = $1")
        .await?;
    Ok(client
        .query_opt(&stmt, &[&job_id.as_uuid()])
        .await?
        .map(|row| row.get(0)))
}

/// Remove up to `batch` texts stored before `cutoff` (jobs that never finished: a
/// finished job's text goes with its commit); returns how many.
pub(crate) async fn delete_stored_before(
    pool: &Pool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "DELETE FROM job_texts WHERE job_id IN ( \
                SELECT job_id FROM job_texts WHERE created_at < $1 \
                 ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .await?;
    Ok(client.execute(&stmt, &[&cutoff, &batch]).await?)
}
