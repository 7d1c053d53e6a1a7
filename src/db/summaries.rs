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
use crate::domain::{Job, JobId, JobText, ModelSummary, SummaryReady, TraceContext, WebhookEvent};
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
    let span = commit_span(job);
    let trace = span.in_scope(telemetry::current);
    let finished = Finished {
        job,
        summary,
        trace: trace.as_ref(),
    };
    let committed = commit_alone(pool, finished).instrument(span.clone()).await;
    if let Err(e) = &committed {
        telemetry::fail(&span, e.disposition().class());
    }
    committed
}

/// [`commit_batch`] of one job, in a transaction of its own (no span: the caller's).
pub(crate) async fn commit_alone(
    pool: &Pool,
    finished: Finished<'_>,
) -> Result<CommitOutcome, DbError> {
    let outcomes = commit_batch(pool, &[finished]).await?;
    // One job in, one outcome out; an empty answer cannot happen, and would mean nothing
    // of this job was inserted.
    Ok(outcomes
        .first()
        .copied()
        .unwrap_or(CommitOutcome::Duplicate))
}

/// The `commit` span of `job`: its outbox rows carry this span's context, so the relay's
/// send joins the job's trace (`worker/committer.rs` makes it for a group commit).
pub(crate) fn commit_span(job: &Job) -> tracing::Span {
    otel_span!(
        "commit",
        "client",
        job.job_id,
        job.tenant,
        "db.system.name" = "postgresql"
    )
}

/// A finished job to commit: the job, the summary the model wrote for it, and the trace
/// its outbox rows join (its `commit` span's; `None` with export off).
#[derive(Debug, Clone, Copy)]
pub struct Finished<'a> {
    pub job: &'a Job,
    pub summary: &'a ModelSummary,
    pub trace: Option<&'a TraceContext>,
}

/// [`commit_with_outbox`] for many jobs in one transaction (the worker's group commit):
/// one statement per table whatever the number of jobs, and one commit. Each job keeps
/// its own decision: its summary row is inserted unless one exists (then it is a
/// `Duplicate`, its calls kept as `model_calls` rows, and it adds no outbox row), exactly
/// as if it had been committed alone. The same job twice in `batch` (two deliveries of
/// one process) is inserted once, for its first entry; the later entries are duplicates.
/// Answers one outcome per entry of `batch`, in order. Each job's outbox rows carry its
/// own trace context.
///
/// All or nothing: an error means no job of the batch was written. A job whose data
/// Postgres refuses fails the whole batch; the caller commits the jobs one by one then,
/// so that job fails alone (`worker/committer.rs`). Batches may commit concurrently: the
/// summary rows are inserted in job id order, so batches sharing a job never deadlock.
pub async fn commit_batch(
    pool: &Pool,
    batch: &[Finished<'_>],
) -> Result<Vec<CommitOutcome>, DbError> {
    // Postgres integer is signed; a count past i32::MAX is no real completion.
    let tokens = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    // One instant for the rows and the webhooks' `completed_at`, so both say the same: to
    // the microsecond, what Postgres stores, or GET's `completed_at` (read from the row)
    // and the webhook's would differ in their last digits.
    let completed_at = Utc::now().trunc_subsecs(6);
    let mut seen = std::collections::HashSet::with_capacity(batch.len());
    // The entries whose job appears first in the batch: the only ones that may insert.
    let first: Vec<bool> = batch.iter().map(|f| seen.insert(f.job.job_id)).collect();
    // Inserted in job id order: a process commits several batches at once, and two that
    // hold the same jobs (deliveries of one job in two batches) then take those rows'
    // index entries in the same order, so one waits for the other (and finds a duplicate)
    // instead of both deadlocking.
    let mut order: Vec<usize> = (0..batch.len()).filter(|&i| first[i]).collect();
    order.sort_unstable_by_key(|&i| batch[i].job.job_id.as_uuid());
    let candidates = || order.iter().map(|&i| &batch[i]);

    let job_ids: Vec<uuid::Uuid> = candidates().map(|f| f.job.job_id.as_uuid()).collect();
    let tenants: Vec<&str> = candidates().map(|f| f.job.tenant.as_str()).collect();
    let texts: Vec<&str> = candidates().map(|f| f.summary.text.as_str()).collect();
    let created: Vec<DateTime<Utc>> = candidates().map(|f| f.job.created_at).collect();
    let models: Vec<&str> = candidates().map(|f| f.summary.model.as_str()).collect();
    let prompt: Vec<Option<i32>> = candidates()
        .map(|f| f.summary.usage.map(|u| tokens(u.prompt)))
        .collect();
    let completion: Vec<Option<i32>> = candidates()
        .map(|f| f.summary.usage.map(|u| tokens(u.completion)))
        .collect();
    let parts: Vec<Option<i32>> = candidates().map(|f| f.summary.parts.map(tokens)).collect();
    // The calls ride on the summary's row (`model_calls` jsonb): one more column in the
    // insert the job makes anyway, so keeping the history costs no statement of its own.
    let calls: Vec<Option<Json<&[crate::domain::ModelCall]>>> = candidates()
        .map(|f| (!f.summary.calls.is_empty()).then_some(Json(f.summary.calls.as_slice())))
        .collect();

    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let insert = tx.prepare_cached(INSERT_SUMMARIES).await?;
    let inserted: std::collections::HashSet<uuid::Uuid> = tx
        .query(
            &insert,
            &[
                &job_ids,
                &tenants,
                &texts,
                &created,
                &models,
                &prompt,
                &completion,
                &parts,
                &completed_at,
                &calls,
            ],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let outcomes: Vec<CommitOutcome> = batch
        .iter()
        .zip(&first)
        .map(|(f, first)| {
            if *first && inserted.contains(&f.job.job_id.as_uuid()) {
                CommitOutcome::Inserted
            } else {
                CommitOutcome::Duplicate
            }
        })
        .collect();

    let mut outbox = OutboxRows::default();
    let mut stored_texts = Vec::new();
    for (f, outcome) in batch.iter().zip(&outcomes) {
        let Finished {
            job,
            summary,
            trace,
        } = *f;
        if *outcome == CommitOutcome::Duplicate {
            // Another delivery committed the job first; this one paid for its calls too,
            // and they are kept as rows of their own.
            model_calls::insert(&tx, job.job_id, &job.tenant, &summary.calls).await?;
            continue;
        }
        if let Some(to) = &job.notify {
            let event = SummaryReady::new(job, to.clone(), &summary.text);
            outbox.push(
                SummaryReady::TOPIC,
                SummaryReady::dedupe_key(job.job_id),
                serde_json::to_string(&event),
                trace,
            )?;
        }
        if let Some(url) = &job.webhook {
            let event = WebhookEvent::completed(
                job,
                url.clone(),
                &summary.text,
                &summary.model,
                completed_at,
            );
            outbox.push(
                WebhookEvent::TOPIC,
                event.id(),
                serde_json::to_string(&event),
                trace,
            )?;
        }
        if matches!(job.text, JobText::Stored) {
            stored_texts.push(job.job_id.as_uuid());
        }
    }
    if !outbox.topics.is_empty() {
        let stmt = tx.prepare_cached(INSERT_OUTBOX).await?;
        tx.execute(
            &stmt,
            &[
                &outbox.topics,
                &outbox.dedupe_keys,
                &outbox.payloads,
                &outbox.traceparents,
                &outbox.tracestates,
            ],
        )
        .await?;
    }
    if !stored_texts.is_empty() {
        let stmt = tx
            .prepare_cached("DELETE FROM job_texts WHERE job_id = ANY($1::uuid[])")
            .await?;
        tx.execute(&stmt, &[&stored_texts]).await?;
    }
    if outcomes.contains(&CommitOutcome::Inserted)
        || batch.iter().any(|f| !f.summary.calls.is_empty())
    {
        tx.commit().await?;
    } else {
        // Nothing was written: every job was a duplicate without calls to keep.
        tx.rollback().await?;
    }
    Ok(outcomes)
}

/// Every summary row of a batch in one statement, each column an array.
const INSERT_SUMMARIES: &str = "INSERT INTO summaries \
        (job_id, tenant, summary, created_at, model, prompt_tokens, completion_tokens, parts, \
         completed_at, model_calls) \
     SELECT j, t, s, c, m, p, o, n, $9, k \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[], $5::text[], \
         $6::integer[], $7::integer[], $8::integer[], $10::jsonb[]) AS u(j, t, s, c, m, p, o, n, k) \
     ON CONFLICT (job_id) DO NOTHING RETURNING job_id";

/// Every outbox row of a batch in one statement, unless one with its dedupe key exists.
/// Such a row can only exist if its summary row was removed by hand or by an older
/// version's retention: that effect was intended already, so the job is stored and no
/// second one is (a conflict here would be a data error, and a finished job would be
/// dead-lettered for it).
const INSERT_OUTBOX: &str = "INSERT INTO outbox (topic, dedupe_key, payload, traceparent, tracestate) \
     SELECT t, d, p::jsonb, tp, ts \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(t, d, p, tp, ts) \
     ON CONFLICT (dedupe_key) DO NOTHING";

/// The outbox rows of a batch, column by column. The payload's shape is the event type's
/// alone (its `Serialize`).
#[derive(Default)]
struct OutboxRows {
    topics: Vec<&'static str>,
    dedupe_keys: Vec<String>,
    /// JSON text, cast to jsonb by the statement: the events are of different types.
    payloads: Vec<String>,
    /// The W3C context of the commit each row belongs to, for the relay's send to join.
    traceparents: Vec<Option<String>>,
    tracestates: Vec<Option<String>>,
}

impl OutboxRows {
    fn push(
        &mut self,
        topic: &'static str,
        dedupe_key: String,
        payload: serde_json::Result<String>,
        trace: Option<&TraceContext>,
    ) -> Result<(), DbError> {
        self.topics.push(topic);
        self.dedupe_keys.push(dedupe_key);
        self.traceparents
            .push(trace.map(|t| t.traceparent().to_owned()));
        self.tracestates
            .push(trace.and_then(|t| t.tracestate()).map(str::to_owned));
        self.payloads.push(payload.map_err(DbError::Encode)?);
        Ok(())
    }
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
