//! The `outbox` table: the relay's lease-based claim and marks, and the operator queries.
//!
//! A relay does not hold row locks across the network call to the mail provider. It claims
//! rows with a lease (`claimed_until`) in one short statement, sends without any transaction
//! open, then records the outcome. A relay that dies leaves its rows leased; they become
//! claimable again when the lease runs out. Each claim writes a fresh `claim_token`, and a
//! failure is only recorded while the row still carries the claimant's token, so a relay
//! whose lease expired mid-send cannot undo a newer claim.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use super::DbError;
use tokio_postgres::types::Json;

use crate::domain::{EventType, JobId, SummaryReady, TraceContext, WebhookEvent};

/// One claimed row, leased to the relay that claimed it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    pub id: i64,
    pub(crate) topic: String,
    pub(crate) dedupe_key: String,
    pub(crate) payload: Value,
    /// Failed attempts so far (this claim not included).
    pub(crate) attempts: i32,
    /// Proof of this claim; the marks that could undo a newer claim require it.
    pub claim_token: Uuid,
    /// The trace of the step that wrote the row, for the send to join.
    pub trace: Option<TraceContext>,
}

/// A row that needs a person (`summaryd outbox stuck`): failed permanently, or failed
/// transiently again past the give-up horizon (`SUMMARYD_RELAY_GIVE_UP_S` since its first
/// failure).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StuckRow {
    pub id: i64,
    /// From the payload; `None` when the payload has no usable job id (often why it is stuck).
    pub job_id: Option<String>,
    pub topic: String,
    pub dedupe_key: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
}

/// Postgres intervals overflow long before `u64` milliseconds do; no lease or backoff we
/// configure comes near a year, so clamping there only guards against absurd settings.
const MAX_INTERVAL_MS: i64 = 365 * 24 * 60 * 60 * 1000;

fn interval_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).map_or(MAX_INTERVAL_MS, |ms| ms.min(MAX_INTERVAL_MS))
}

/// No relay holds the row: never leased, or its lease ran out (its relay died or gave up).
pub(super) const NOT_LEASED: &str = "(claimed_until IS NULL OR claimed_until < now())";

/// A row made due again by a person as if it had never failed: attempts from 0, the backoff
/// from its first step, no give-up horizon until its next failure (`retry_from` records
/// when a person retried it). `outbox retry` and `webhook replay` share it.
pub(super) const AS_NEW: &str = "failed_at = NULL, attempts = 0, next_attempt_at = now(), \
     first_failed_at = NULL, retry_from = now(), claimed_until = NULL, claim_token = NULL";

/// Lease up to `batch` due rows to the caller, oldest first, in one statement.
///
/// `FOR UPDATE SKIP LOCKED` makes concurrent relays skip rows another claim is taking right
/// now, and the lease condition makes them skip rows another relay holds; the row locks last
/// only for this statement. Rows of a relay that crashed come back once `lease` has passed.
/// Parked rows (`failed_at`) are left for a person. A row is parked only by a failure, never
/// by waiting: a row whose horizon ran out while the relay was down or paused (the mail
/// provider misconfigured) is tried once more, and only a failure then parks it.
///
/// Per `topic`: the relay claims emails and webhooks apart, so one provider's trouble (a
/// paused mail provider, a slow receiver) never holds the other's rows back.
pub async fn claim_due(
    pool: &Pool,
    topic: &str,
    batch: i64,
    lease: Duration,
) -> Result<Vec<OutboxRow>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(&format!(
            "UPDATE outbox \
                SET claimed_until = now() + $2::bigint * interval '1 millisecond', \
                    claim_token = gen_random_uuid() \
              WHERE id IN ( \
                    SELECT id FROM outbox \
                     WHERE sent_at IS NULL AND failed_at IS NULL AND skipped_at IS NULL \
                       AND topic = $3 AND next_attempt_at <= now() \
                       AND {NOT_LEASED} \
                     ORDER BY id \
                     LIMIT $1 \
                     FOR UPDATE SKIP LOCKED) \
          RETURNING id, topic, dedupe_key, payload, attempts, claim_token, traceparent, tracestate"
        ))
        .await?;
    let rows = client
        .query(&stmt, &[&batch, &interval_ms(lease), &topic])
        .await?;
    let mut claimed: Vec<OutboxRow> = rows.iter().map(outbox_row).collect::<Result<_, _>>()?;
    // RETURNING follows no particular order; keep "oldest first" for the caller.
    claimed.sort_by_key(|r| r.id);
    Ok(claimed)
}

fn outbox_row(row: &Row) -> Result<OutboxRow, DbError> {
    Ok(OutboxRow {
        id: row.try_get(0)?,
        topic: row.try_get(1)?,
        dedupe_key: row.try_get(2)?,
        payload: row.try_get(3)?,
        attempts: row.try_get(4)?,
        claim_token: row.try_get(5)?,
        trace: super::trace_context(row.try_get(6)?, row.try_get(7)?),
    })
}

/// Record that the provider accepted the email. Returns false if it was already recorded.
///
/// Deliberately not fenced by the claim token: the provider *did* accept the message, and
/// recording that fact can only prevent another send. A stale relay that gets here after
/// its lease expired thus finishes the row even if another relay re-claimed it; that relay's
/// own marks then find `sent_at` set and change nothing.
pub async fn mark_sent(pool: &Pool, id: i64) -> Result<bool, DbError> {
    mark_delivered(pool, id, None).await
}

/// [`mark_sent`] for every row of `ids` in one statement (the relay records a pass's sent
/// rows together): answers the ids this call recorded, leaving out those already recorded.
pub async fn mark_sent_many(pool: &Pool, ids: &[i64]) -> Result<Vec<i64>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE outbox SET sent_at = now(), claimed_until = NULL, claim_token = NULL \
              WHERE id = ANY($1::bigint[]) AND sent_at IS NULL RETURNING id",
        )
        .await?;
    Ok(client
        .query(&stmt, &[&ids])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// [`mark_sent`], with the HTTP status the receiver answered (`webhook deliveries`).
pub async fn mark_delivered(pool: &Pool, id: i64, status: Option<i32>) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE outbox SET sent_at = now(), claimed_until = NULL, claim_token = NULL, \
                    last_status = coalesce($2, last_status) \
              WHERE id = $1 AND sent_at IS NULL",
        )
        .await?;
    Ok(client.execute(&stmt, &[&id, &status]).await? == 1)
}

/// What recording a transient failure left the row as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransientMark {
    /// Failed attempts so far, this one included.
    pub attempts: i32,
    /// The row has now failed past the give-up horizon: it needs a person.
    pub past_give_up: bool,
}

/// A failure a later attempt may fix: count it and make the row due again after `backoff`.
///
/// The row's first failure starts its give-up horizon (`first_failed_at`); a failure
/// recorded once `give_up` has passed since then parks the row for a person instead. The
/// horizon counts from the first failure, not from the row's creation: a row that waited
/// in a backlog longer than the horizon is not parked by its first 429.
///
/// Returns the row's state after this failure, or `None` when the claim is no longer ours
/// (lease expired and the row was re-claimed or finished): then nothing is changed.
pub async fn mark_failed_transient(
    pool: &Pool,
    id: i64,
    claim_token: Uuid,
    error: &str,
    backoff: Duration,
    give_up: Duration,
) -> Result<Option<TransientMark>, DbError> {
    let failure = Failure {
        error,
        status: None,
    };
    mark_attempt_failed(pool, id, claim_token, failure, backoff, give_up).await
}

/// What one failed attempt left to record: our wording of it, and the HTTP status when
/// the other side answered one.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    pub error: &'a str,
    pub status: Option<i32>,
}

/// [`mark_failed_transient`] with the attempt's HTTP status.
pub async fn mark_attempt_failed(
    pool: &Pool,
    id: i64,
    claim_token: Uuid,
    failure: Failure<'_>,
    backoff: Duration,
    give_up: Duration,
) -> Result<Option<TransientMark>, DbError> {
    let client = pool.get().await?;
    // On the right of SET, `first_failed_at` is the value before this update: NULL on the
    // first failure, which therefore never parks the row.
    let stmt = client
        .prepare_cached(
            "UPDATE outbox \
                SET attempts = attempts + 1, last_error = $4, last_status = $6, \
                    last_failed_at = now(), \
                    next_attempt_at = now() + $5::bigint * interval '1 millisecond', \
                    first_failed_at = coalesce(first_failed_at, now()), \
                    failed_at = CASE WHEN first_failed_at \
                                          <= now() - $1::bigint * interval '1 millisecond' \
                                     THEN now() END, \
                    claimed_until = NULL, claim_token = NULL \
              WHERE id = $2 AND claim_token = $3 AND sent_at IS NULL \
          RETURNING attempts, failed_at IS NOT NULL",
        )
        .await?;
    let row = client
        .query_opt(
            &stmt,
            &[
                &interval_ms(give_up),
                &id,
                &claim_token,
                &failure.error,
                &interval_ms(backoff),
                &failure.status,
            ],
        )
        .await?;
    Ok(match row {
        Some(row) => Some(TransientMark {
            attempts: row.try_get(0)?,
            past_give_up: row.try_get(1)?,
        }),
        None => None,
    })
}

/// The mail provider refused the send as misconfigured (its credentials, its URL): nothing
/// about this row was tried. Release the row to be sent again after `backoff`, with the
/// provider's answer as `last_error`, without counting an attempt or touching the give-up
/// horizon: such a row waits for the provider however long it takes, and is never parked.
///
/// Returns false when the claim is no longer ours; then nothing is changed.
pub async fn mark_provider_unavailable(
    pool: &Pool,
    id: i64,
    claim_token: Uuid,
    error: &str,
    backoff: Duration,
) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE outbox \
                SET last_error = $3, \
                    next_attempt_at = now() + $4::bigint * interval '1 millisecond', \
                    claimed_until = NULL, claim_token = NULL \
              WHERE id = $1 AND claim_token = $2 AND sent_at IS NULL",
        )
        .await?;
    let n = client
        .execute(&stmt, &[&id, &claim_token, &error, &interval_ms(backoff)])
        .await?;
    Ok(n == 1)
}

/// A failure no retry can fix: park the row for a person (`summaryd outbox stuck`).
///
/// Returns false when the claim is no longer ours; then nothing is changed.
pub async fn mark_failed_permanent(
    pool: &Pool,
    id: i64,
    claim_token: Uuid,
    error: &str,
) -> Result<bool, DbError> {
    let failure = Failure {
        error,
        status: None,
    };
    mark_attempt_refused(pool, id, claim_token, failure).await
}

/// [`mark_failed_permanent`] with the attempt's HTTP status.
pub async fn mark_attempt_refused(
    pool: &Pool,
    id: i64,
    claim_token: Uuid,
    failure: Failure<'_>,
) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE outbox \
                SET attempts = attempts + 1, last_error = $3, last_status = $4, \
                    failed_at = now(), last_failed_at = now(), \
                    first_failed_at = coalesce(first_failed_at, now()), \
                    claimed_until = NULL, claim_token = NULL \
              WHERE id = $1 AND claim_token = $2 AND sent_at IS NULL",
        )
        .await?;
    let n = client
        .execute(&stmt, &[&id, &claim_token, &failure.error, &failure.status])
        .await?;
    Ok(n == 1)
}

/// Not sent, and not to be sent by itself: the row's webhook endpoint is disabled. The row
/// leaves the relay's work (and `summaryd_outbox_unsent`) like a sent one; `webhook
/// replay` makes it due again. Returns false when the claim is no longer ours.
pub async fn mark_skipped(
    pool: &Pool,
    id: i64,
    claim_token: Uuid,
    failure: Failure<'_>,
) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE outbox \
                SET skipped_at = now(), last_error = $3, \
                    last_status = coalesce($4, last_status), last_failed_at = now(), \
                    claimed_until = NULL, claim_token = NULL \
              WHERE id = $1 AND claim_token = $2 AND sent_at IS NULL",
        )
        .await?;
    let n = client
        .execute(&stmt, &[&id, &claim_token, &failure.error, &failure.status])
        .await?;
    Ok(n == 1)
}

/// Commit one event as an outbox row outside a summary's transaction (the `summary.failed`
/// webhook of a job being dead-lettered). A row with its dedupe key already there is the
/// same event: nothing is written.
pub async fn record_event(pool: &Pool, event: &WebhookEvent) -> Result<(), DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "INSERT INTO outbox (topic, dedupe_key, payload, traceparent, tracestate) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (dedupe_key) DO NOTHING",
        )
        .await?;
    let (traceparent, tracestate) = super::trace_columns();
    client
        .execute(
            &stmt,
            &[
                &WebhookEvent::TOPIC,
                &event.id(),
                &Json(event),
                &traceparent,
                &tracestate,
            ],
        )
        .await?;
    Ok(())
}

/// Unsent rows the relay will not pick up again by itself: parked by a permanent failure or
/// by a transient failure past the give-up horizon.
const STUCK: &str = "(sent_at IS NULL AND failed_at IS NOT NULL)";

/// Rows of `topic` (any topic when `None`); `$n` is the query's parameter holding it.
fn of_topic(n: u8) -> String {
    format!("(${n}::text IS NULL OR topic = ${n}::text)")
}

/// Rows that need a person, oldest first. An email carries its job id at the top of its
/// payload, a webhook in its body's `data`, as receivers see it.
pub async fn stuck(pool: &Pool) -> Result<Vec<StuckRow>, DbError> {
    select_stuck(pool, None, None, 0).await
}

/// One page of the rows that need a person, oldest first: those of `topic` (every topic
/// when `None`), at most `limit`, after skipping `offset` (a console's paging; a row
/// retried or sent meanwhile shifts later pages, which only means a row may show twice or
/// be seen on the next look).
pub async fn stuck_matching(
    pool: &Pool,
    topic: Option<&str>,
    limit: usize,
    offset: usize,
) -> Result<Vec<StuckRow>, DbError> {
    select_stuck(pool, topic, Some(limit), offset).await
}

/// How many rows of `topic` (every topic when `None`) need a person.
pub async fn count_stuck(pool: &Pool, topic: Option<&str>) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            &format!(
                "SELECT count(*) FROM outbox WHERE {STUCK} AND {}",
                of_topic(1)
            ),
            &[&topic],
        )
        .await?;
    let n: i64 = row.try_get(0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn sql_count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn select_stuck(
    pool: &Pool,
    topic: Option<&str>,
    limit: Option<usize>,
    offset: usize,
) -> Result<Vec<StuckRow>, DbError> {
    let client = pool.get().await?;
    // LIMIT NULL is no limit.
    let rows = client
        .query(
            &format!(
                "SELECT id, coalesce(payload->>($1::text), payload #>> '{{body,data,job_id}}'), \
                        topic, dedupe_key, attempts, last_error, created_at \
                   FROM outbox WHERE {STUCK} AND {} ORDER BY id LIMIT $3 OFFSET $4",
                of_topic(2)
            ),
            &[
                &SummaryReady::JOB_ID_FIELD,
                &topic,
                &limit.map(sql_count),
                &sql_count(offset),
            ],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(StuckRow {
                id: row.try_get(0)?,
                job_id: row.try_get(1)?,
                topic: row.try_get(2)?,
                dedupe_key: row.try_get(3)?,
                attempts: row.try_get(4)?,
                last_error: row.try_get(5)?,
                created_at: row.try_get(6)?,
            })
        })
        .collect()
}

/// One outbox row of a job, email or webhook, as the operator's job page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobOutboxRow {
    pub id: i64,
    /// `email.summary_ready` or `webhook`.
    pub topic: String,
    /// The provider's idempotency key (emails) or the webhook-id (webhooks).
    pub dedupe_key: String,
    /// Failed attempts so far.
    pub attempts: i32,
    pub last_error: Option<String>,
    /// The HTTP status of a webhook's last attempt; `None` without one, and for emails.
    pub last_status: Option<i32>,
    pub created_at: DateTime<Utc>,
    /// When the email was sent or the webhook delivered.
    pub sent_at: Option<DateTime<Utc>>,
    /// When the relay tries it next; `None` once sent, parked or skipped.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Parked: it needs a person (`outbox retry`, `webhook replay`).
    pub failed_at: Option<DateTime<Utc>>,
    /// A webhook not sent because its endpoint is disabled for the tenant.
    pub skipped_at: Option<DateTime<Utc>>,
    pub first_failed_at: Option<DateTime<Utc>>,
    pub last_failed_at: Option<DateTime<Utc>>,
}

/// Every outbox row of `job_id` (its email, its `summary.completed` and `summary.failed`
/// webhooks), oldest first; found by their dedupe keys, so the unique index finds them.
pub async fn for_job(pool: &Pool, job_id: &JobId) -> Result<Vec<JobOutboxRow>, DbError> {
    let keys = [
        SummaryReady::dedupe_key(*job_id),
        WebhookEvent::webhook_id(*job_id, EventType::Completed),
        WebhookEvent::webhook_id(*job_id, EventType::Failed),
    ];
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT id, topic, dedupe_key, attempts, last_error, last_status, created_at, \
                    sent_at, \
                    CASE WHEN sent_at IS NULL AND failed_at IS NULL AND skipped_at IS NULL \
                         THEN next_attempt_at END, \
                    failed_at, skipped_at, first_failed_at, last_failed_at \
               FROM outbox WHERE dedupe_key = ANY($1) ORDER BY id",
        )
        .await?;
    let rows = client.query(&stmt, &[&keys.as_slice()]).await?;
    rows.iter()
        .map(|row| {
            Ok(JobOutboxRow {
                id: row.try_get(0)?,
                topic: row.try_get(1)?,
                dedupe_key: row.try_get(2)?,
                attempts: row.try_get(3)?,
                last_error: row.try_get(4)?,
                last_status: row.try_get(5)?,
                created_at: row.try_get(6)?,
                sent_at: row.try_get(7)?,
                next_attempt_at: row.try_get(8)?,
                failed_at: row.try_get(9)?,
                skipped_at: row.try_get(10)?,
                first_failed_at: row.try_get(11)?,
                last_failed_at: row.try_get(12)?,
            })
        })
        .collect()
}

/// Make stuck rows eligible for the relay again, as if they had never failed: attempts from
/// 0, the backoff from its first step, and no give-up horizon until the row's next failure
/// starts a new one (`first_failed_at` cleared; `retry_from` records when a person retried).
/// `None` = all stuck rows.
///
/// Only stuck rows no relay holds are touched (ids of sent, still-retrying or leased rows
/// are ignored), so a retry can never resend a delivered email, nor clear the lease of a
/// row a relay is sending right now: that would let another relay claim and send it at
/// the same time. `last_error` is kept for the record until the next attempt overwrites it.
/// Returns how many rows were made eligible.
pub async fn retry(pool: &Pool, ids: Option<&[i64]>) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let update = format!("UPDATE outbox SET {AS_NEW} WHERE {STUCK} AND {NOT_LEASED}");
    let n = match ids {
        None => client.execute(&update, &[]).await?,
        Some(ids) => {
            client
                .execute(&format!("{update} AND id = ANY($1)"), &[&ids])
                .await?
        }
    };
    Ok(n)
}

/// [`retry`] every stuck row of `topic` (every topic when `None`): the same rows
/// [`stuck_matching`] lists, less those a relay holds. Returns how many were made eligible.
pub async fn retry_matching(pool: &Pool, topic: Option<&str>) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let update = format!(
        "UPDATE outbox SET {AS_NEW} WHERE {STUCK} AND {NOT_LEASED} AND {}",
        of_topic(1)
    );
    Ok(client.execute(&update, &[&topic]).await?)
}

/// Delete up to `batch` rows sent before `cutoff`, oldest first; returns how many.
pub async fn delete_sent_before(
    pool: &Pool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let delete = "DELETE FROM outbox WHERE id IN ( \
                    SELECT id FROM outbox WHERE sent_at < $1 \
                     ORDER BY sent_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
    super::delete_batch_before(pool, delete, cutoff, batch).await
}

/// Delete up to `batch` rows skipped (their webhook endpoint disabled) before `cutoff`,
/// oldest first; the sent rows' horizon applies to them.
pub async fn delete_skipped_before(
    pool: &Pool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let delete = "DELETE FROM outbox WHERE id IN ( \
                    SELECT id FROM outbox WHERE skipped_at < $1 \
                     ORDER BY skipped_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
    super::delete_batch_before(pool, delete, cutoff, batch).await
}

/// The gauge's query; public so a test can check that its plan reads the index.
pub const UNSENT_BY_TOPIC: &str = "SELECT topic, count(*) FROM outbox \
     WHERE sent_at IS NULL AND skipped_at IS NULL GROUP BY topic";

/// Rows not yet sent per topic, stuck ones included, skipped ones not (the
/// `summaryd_outbox_unsent{topic}` gauge); reads the `outbox_unsent` partial index, not
/// the table. Only topics with such rows are listed.
pub(crate) async fn count_unsent(pool: &Pool) -> Result<Vec<(String, i64)>, DbError> {
    let client = pool.get().await?;
    let stmt = client.prepare_cached(UNSENT_BY_TOPIC).await?;
    client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}
