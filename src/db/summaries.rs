//! The `summaries` table, and the one transaction that commits a summary with its email intent.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde_json::json;

use super::DbError;
use crate::domain::JobId;
use crate::stream::JobMessage;

/// Outbox topic of the "your summary is ready" email.
pub const SUMMARY_READY_TOPIC: &str = "email.summary_ready";

/// The outbox dedupe key for a job; also the mail provider's idempotency key.
pub fn summary_ready_dedupe_key(job_id: JobId) -> String {
    format!("summary_ready:{job_id}")
}

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

/// Insert the summary and its outbox row in one transaction, or nothing at all.
///
/// The primary key plus `ON CONFLICT DO NOTHING RETURNING` is the guarantee: when two
/// deliveries race, both may have paid for the model, but only the one whose insert
/// returned a row writes the outbox row, so exactly one email is ever intended.
pub async fn commit_with_outbox(
    pool: &Pool,
    msg: &JobMessage,
    summary: &str,
) -> Result<CommitOutcome, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let inserted = tx
        .query_opt(
            "INSERT INTO summaries (job_id, tenant, summary, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
            &[
                &msg.job_id.as_uuid(),
                &msg.tenant,
                &summary,
                &msg.created_at,
            ],
        )
        .await?;
    if inserted.is_none() {
        tx.rollback().await?;
        return Ok(CommitOutcome::Duplicate);
    }
    let payload = json!({
        "job_id": msg.job_id,
        "tenant": msg.tenant,
        "to": msg.payload.notify,
        "summary": summary,
    });
    tx.execute(
        "INSERT INTO outbox (topic, dedupe_key, payload) VALUES ($1, $2, $3)",
        &[
            &SUMMARY_READY_TOPIC,
            &summary_ready_dedupe_key(msg.job_id),
            &payload,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(CommitOutcome::Inserted)
}
