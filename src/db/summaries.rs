//! The `summaries` table, and the one transaction that commits a summary with its effects
//! (the email and the webhook intents).
//!
//! A row is a finished job's identity (job id, tenant, when, which model, what it cost) and,
//! until summaries retention removes it, the summary text. Retention never deletes a row:
//! its primary key is what makes a later delivery of the same job a duplicate.

use chrono::{DateTime, SubsecRound, Utc};
use deadpool_postgres::Pool;
use tokio_postgres::types::Json;
use tracing::Instrument;

use super::{DbError, model_calls};
use crate::domain::{Job, JobId, JobText, ModelSummary, SummaryReady, WebhookEvent};
use crate::infra::telemetry::{self, otel_span};
use crate::resilience::failure::Classify;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SummaryRow {
    pub(crate) job_id: JobId,
    pub(crate) tenant: String,
    /// `None` once summaries retention removed the text; the job is still done.
    pub(crate) summary: Option<String>,
    /// The model that wrote it; `None` for summaries stored before models were recorded.
    pub(crate) model: Option<String>,
    /// Model calls it took when it was summarised in parts; `None` for one call.
    pub(crate) parts: Option<i32>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) completed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// This delivery wrote the summary (and the outbox row, unless one for this job was
    /// already there).
    Inserted,
    /// Another delivery got there first; nothing was written.
    Duplicate,
}

/// Cheap pre-check so a redelivered, already finished job skips the model call. A job whose
/// text retention removed is finished too: its row stays.
pub(crate) async fn exists(pool: &Pool, job_id: JobId) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached("SELECT 1 FROM summaries WHERE job_id = $1")
        .await?;
    Ok(client
        .query_opt(&stmt, &[&job_id.as_uuid()])
        .await?
        .is_some())
}

/// Which of `jobs` have a summary row (finished), in one query: the in-flight sweep asks
/// about a batch of members at a time.
pub(crate) async fn existing(
    pool: &Pool,
    jobs: &[JobId],
) -> Result<std::collections::HashSet<JobId>, DbError> {
    if jobs.is_empty() {
        return Ok(Default::default());
    }
    let ids: Vec<uuid::Uuid> = jobs.iter().map(JobId::as_uuid).collect();
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached("SELECT job_id FROM summaries WHERE job_id = ANY($1)")
        .await?;
    let rows = client.query(&stmt, &[&ids]).await?;
    rows.iter()
        .map(|row| Ok(JobId::from(row.try_get::<_, uuid::Uuid>(0)?)))
        .collect()
}

/// Whether a delivery could commit now: the writes `commit_with_outbox` makes, for a job
/// id no job has, rolled back. A read would pass on a Postgres that refuses writes (a
/// replica after a failover, a full disk, a revoked privilege) and let every delivery fail
/// at the commit and count; the writes meet each of those refusals the way a commit does.
pub(crate) async fn probe(pool: &Pool) -> Result<(), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO summaries (job_id, tenant, summary, created_at) \
         VALUES ($1, '', '', now()) ON CONFLICT (job_id) DO NOTHING",
        &[&JobId::NIL.as_uuid()],
    )
    .await?;
    tx.execute(
        "INSERT INTO outbox (topic, dedupe_key, payload) \
         VALUES ('probe', 'probe', '{}') ON CONFLICT (dedupe_key) DO NOTHING",
        &[],
    )
    .await?;
    tx.rollback().await?;
    Ok(())
}

/// Tokens the provider reported for the whole job whose summary is committed (its parts and
/// combinations included: `ModelSummary::usage`), for settling its budget reservation.
/// `None` without a summary row or when no call of it reported usage.
pub(crate) async fn spent_tokens(pool: &Pool, job_id: JobId) -> Result<Option<u64>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT prompt_tokens::bigint, completion_tokens::bigint FROM summaries WHERE job_id = $1",
        )
        .await?;
    let row = client.query_opt(&stmt, &[&job_id.as_uuid()]).await?;
    Ok(row.and_then(|row| {
        let (prompt, completion): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        let tokens = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        (prompt.is_some() || completion.is_some()).then(|| tokens(prompt) + tokens(completion))
    }))
}

pub(crate) async fn find(pool: &Pool, job_id: JobId) -> Result<Option<SummaryRow>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT tenant, summary, model, created_at, completed_at, parts FROM summaries WHERE job_id = $1",
        )
        .await?;
    Ok(client
        .query_opt(&stmt, &[&job_id.as_uuid()])
        .await?
        .map(|row| SummaryRow {
            job_id,
            tenant: row.get(0),
            summary: row.get(1),
            model: row.get(2),
            created_at: row.get(3),
            completed_at: row.get(4),
            parts: row.get(5),
        }))
}

/// Insert the summary and its outbox rows (the [`SummaryReady`] email when the job has a
/// `notify`, the `summary.completed` [`WebhookEvent`] when it has a webhook) in one
/// transaction, or nothing at all; the job's stored text (`job_texts`), needed no more,
/// goes with it. The model calls the summary carries (`ModelSummary::calls`) are stored on
/// its row, or as `model_calls` rows when another delivery committed the job first.
///
/// The primary key plus `ON CONFLICT DO NOTHING RETURNING` is the guarantee: when two
/// deliveries race, both may have paid for the model, but only the one whose insert
/// returned a row writes the outbox rows, so exactly one email and one webhook are ever
/// intended.
pub async fn commit_with_outbox(
    pool: &Pool,
    job: &Job,
    summary: &ModelSummary,
) -> Result<CommitOutcome, DbError> {
    // The outbox rows store this span's context: the relay's sends become its children.
    let span = otel_span!(
        "commit",
        "client",
        job.job_id,
        job.tenant,
        "db.system.name" = "postgresql"
    );
    let committed = commit_in_one_transaction(pool, job, summary)
        .instrument(span.clone())
        .await;
    if let Err(e) = &committed {
        telemetry::fail(&span, e.disposition().class());
    }
    committed
}

async fn commit_in_one_transaction(
    pool: &Pool,
    job: &Job,
    summary: &ModelSummary,
) -> Result<CommitOutcome, DbError> {
    // Postgres integer is signed; a count past i32::MAX is no real completion.
    let tokens = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let prompt_tokens = summary.usage.map(|u| tokens(u.prompt));
    let completion_tokens = summary.usage.map(|u| tokens(u.completion));
    let parts = summary.parts.map(tokens);
    // One instant for the row and the webhook's `completed_at`, so both say the same: to
    // the microsecond, what Postgres stores, or GET's `completed_at` (read from the row)
    // and the webhook's would differ in their last digits.
    let completed_at = Utc::now().trunc_subsecs(6);
    let (job_id, tenant) = (job.job_id.as_uuid(), job.tenant.as_str());
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    // The calls ride on the summary's row (`model_calls` jsonb): one more value in the
    // insert the job makes anyway, so keeping the history costs no statement of its own.
    let calls = (!summary.calls.is_empty()).then_some(Json(&summary.calls));
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
        &job_id,
        &tenant,
        &summary.text,
        &job.created_at,
        &summary.model,
        &prompt_tokens,
        &completion_tokens,
        &parts,
        &completed_at,
        &calls,
    ];
    let inserted = tx
        .query_opt(
            "INSERT INTO summaries \
                (job_id, tenant, summary, created_at, model, prompt_tokens, completion_tokens, parts, \
                 completed_at, model_calls) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
            &params,
        )
        .await?;
    if inserted.is_none() {
        // Another delivery committed the job first; this one paid for its calls too, and
        // they are kept as rows of their own.
        if summary.calls.is_empty() {
            tx.rollback().await?;
        } else {
            model_calls::insert(&tx, job.job_id, &job.tenant, &summary.calls).await?;
            tx.commit().await?;
        }
        return Ok(CommitOutcome::Duplicate);
    }
    // `Json` serialises each event as the statement is sent; the payload's shape is the
    // event type's alone. An outbox row with this job's dedupe key can only exist if its
    // summary row was removed by hand or by an older version's retention: that effect was
    // intended already, so the job is stored and no second one is (a conflict here would be
    // a data error, and a finished job would be dead-lettered for it).
    if let Some(to) = &job.notify {
        let event = SummaryReady::new(job, to.clone(), &summary.text);
        insert_event(
            &tx,
            SummaryReady::TOPIC,
            &SummaryReady::dedupe_key(job.job_id),
            &Json(&event),
        )
        .await?;
    }
    if let Some(url) = &job.webhook {
        let event = WebhookEvent::completed(
            job,
            url.clone(),
            &summary.text,
            &summary.model,
            completed_at,
        );
        insert_event(&tx, WebhookEvent::TOPIC, &event.id(), &Json(&event)).await?;
    }
    if matches!(job.text, JobText::Stored) {
        tx.execute(
            "DELETE FROM job_texts WHERE job_id = $1",
            &[&job.job_id.as_uuid()],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(CommitOutcome::Inserted)
}

/// One outbox row, unless one with its dedupe key exists (see `commit_with_outbox`).
async fn insert_event(
    tx: &deadpool_postgres::Transaction<'_>,
    topic: &str,
    dedupe_key: &str,
    payload: &(dyn tokio_postgres::types::ToSql + Sync),
) -> Result<(), DbError> {
    let (traceparent, tracestate) = super::trace_columns();
    tx.execute(
        "INSERT INTO outbox (topic, dedupe_key, payload, traceparent, tracestate) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (dedupe_key) DO NOTHING",
        &[&topic, &dedupe_key, payload, &traceparent, &tracestate],
    )
    .await?;
    Ok(())
}

/// Jobs and tokens of one tenant and model (`summaryd usage`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UsageRow {
    pub(crate) tenant: String,
    /// `unknown` for summaries stored before models were recorded.
    pub(crate) model: String,
    pub(crate) jobs: i64,
    /// Sums of what the providers reported; jobs whose provider reported nothing add 0.
    pub(crate) prompt_tokens: i64,
    pub(crate) completion_tokens: i64,
}

/// What the model cost per tenant and model, for summaries completed within `since` (all
/// of them without) and of `tenant` (every tenant without), ordered by tenant and model.
pub async fn usage(
    pool: &Pool,
    since: Option<std::time::Duration>,
    tenant: Option<&str>,
) -> Result<Vec<UsageRow>, DbError> {
    let client = pool.get().await?;
    // A window reaching past what chrono can hold is "everything".
    let cutoff: Option<DateTime<Utc>> = since
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .and_then(|d| Utc::now().checked_sub_signed(d));
    let stmt = client
        .prepare_cached(
            "SELECT tenant, coalesce(model, 'unknown') AS model, count(*), \
                    coalesce(sum(prompt_tokens), 0)::bigint, \
                    coalesce(sum(completion_tokens), 0)::bigint \
               FROM summaries \
              WHERE ($1::timestamptz IS NULL OR completed_at >= $1) \
                AND ($2::text IS NULL OR tenant = $2) \
              GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .await?;
    let rows = client.query(&stmt, &[&cutoff, &tenant]).await?;
    Ok(rows
        .into_iter()
        .map(|row| UsageRow {
            tenant: row.get(0),
            model: row.get(1),
            jobs: row.get(2),
            prompt_tokens: row.get(3),
            completion_tokens: row.get(4),
        })
        .collect())
}

/// Summaries completed in each of the last `minutes` minutes that had any (the console's
/// throughput chart), oldest first. Reads the `completed_at` index.
pub(crate) async fn finished_per_minute(
    pool: &Pool,
    minutes: i32,
) -> Result<Vec<(DateTime<Utc>, i64)>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT date_trunc('minute', completed_at) AS minute, count(*) \
               FROM summaries \
              WHERE completed_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1) \
              GROUP BY 1 ORDER BY 1",
        )
        .await?;
    let rows = client.query(&stmt, &[&minutes]).await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// Remove the text of up to `batch` summaries completed before `cutoff`, oldest first, and
/// keep their rows; the job's model calls (on the row and in `model_calls`) go in the same
/// statement. Returns
/// how many texts were removed.
///
/// The email needs nothing from here: its outbox row carries its own copy of the text, and
/// retention never deletes an unsent outbox row, so a row still to send keeps its text
/// whatever happens to the summary.
pub(crate) async fn expire_texts_completed_before(
    pool: &Pool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let client = pool.get().await?;
    // The outer `summary IS NOT NULL` keeps a row that two passes both picked from
    // counting twice. The calls are found by their job index from the rows just expired,
    // so this never scans `model_calls`.
    let stmt = client
        .prepare_cached(
            "WITH expired AS ( \
                UPDATE summaries SET summary = NULL, model_calls = NULL, summary_expired_at = now() \
                 WHERE job_id IN ( \
                       SELECT job_id FROM summaries \
                        WHERE summary IS NOT NULL AND completed_at < $1 \
                        ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                   AND summary IS NOT NULL \
             RETURNING job_id), \
             calls AS (DELETE FROM model_calls WHERE job_id IN (SELECT job_id FROM expired)) \
             SELECT count(*) FROM expired",
        )
        .await?;
    let expired: i64 = client
        .query_one(&stmt, &[&cutoff, &batch])
        .await?
        .try_get(0)?;
    Ok(u64::try_from(expired).unwrap_or(0))
}
