//! The `summaries` table, and the one transaction that commits a summary with its email intent.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio_postgres::types::Json;

use super::DbError;
use crate::domain::{Job, JobId, SummaryReady};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRow {
    pub job_id: JobId,
    pub tenant: String,
    pub summary: String,
    pub created_at: DateTime<Utc>,
    pub completed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// This delivery wrote the summary and the outbox row.
    Inserted,
    /// Another delivery got there first; nothing was written.
    Duplicate,
}

/// Cheap pre-check so a redelivered, already finished job skips the model call.
pub async fn exists(pool: &Pool, job_id: JobId) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached("SELECT 1 FROM summaries WHERE job_id = $1")
        .await?;
    Ok(client
        .query_opt(&stmt, &[&job_id.as_uuid()])
        .await?
        .is_some())
}

/// The worker's readiness probe: the statement its pre-check runs, for a job id no job has,
/// so it proves the connection, the table and the permission a delivery needs.
pub async fn probe(pool: &Pool) -> Result<(), DbError> {
    exists(pool, JobId::from(uuid::Uuid::nil()))
        .await
        .map(|_| ())
}

pub async fn find(pool: &Pool, job_id: JobId) -> Result<Option<SummaryRow>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT tenant, summary, created_at, completed_at FROM summaries WHERE job_id = $1",
        )
        .await?;
    Ok(client
        .query_opt(&stmt, &[&job_id.as_uuid()])
        .await?
        .map(|row| SummaryRow {
            job_id,
            tenant: row.get(0),
            summary: row.get(1),
            created_at: row.get(2),
            completed_at: row.get(3),
        }))
}

/// Insert the summary and its outbox row (the [`SummaryReady`] event) in one transaction,
/// or nothing at all.
///
/// The primary key plus `ON CONFLICT DO NOTHING RETURNING` is the guarantee: when two
/// deliveries race, both may have paid for the model, but only the one whose insert
/// returned a row writes the outbox row, so exactly one email is ever intended.
pub async fn commit_with_outbox(
    pool: &Pool,
    job: &Job,
    summary: &str,
) -> Result<CommitOutcome, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let inserted = tx
        .query_opt(
            "INSERT INTO summaries (job_id, tenant, summary, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
            &[
                &job.job_id.as_uuid(),
                &job.tenant.as_str(),
                &summary,
                &job.created_at,
            ],
        )
        .await?;
    if inserted.is_none() {
        tx.rollback().await?;
        return Ok(CommitOutcome::Duplicate);
    }
    let event = SummaryReady::new(job, summary);
    // `Json` serialises the event as the statement is sent; the payload's shape is the
    // event type's alone.
    tx.execute(
        "INSERT INTO outbox (topic, dedupe_key, payload) VALUES ($1, $2, $3)",
        &[
            &SummaryReady::TOPIC,
            &SummaryReady::dedupe_key(job.job_id),
            &Json(&event),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(CommitOutcome::Inserted)
}

/// Delete up to `batch` summaries completed before `cutoff`, oldest first; returns how
/// many. `SKIP LOCKED` as in `outbox::delete_sent_before`.
pub async fn delete_completed_before(
    pool: &Pool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "DELETE FROM summaries WHERE job_id IN ( \
                SELECT job_id FROM summaries WHERE completed_at < $1 \
                 ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .await?;
    Ok(client.execute(&stmt, &[&cutoff, &batch]).await?)
}
