//! The `model_calls` table: every model call a job made (each attempt against a provider,
//! failed ones included), for the operator's view of the job.
//!
//! Written once per delivery in one statement: with the summary, inside its transaction
//! (`summaries::commit_with_outbox`), or, for a delivery that did not finish its job, by
//! the consumer before it settles the delivery (`worker/complete.rs`). Retention removes a
//! job's calls with its summary's text, and every call once as old as a dead letter may be
//! (`maintenance/retention.rs`).

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::types::Json;

use super::DbError;
use crate::domain::{JobId, ModelCall, TenantId};

/// Postgres integer is signed; a count past `i32::MAX` is no real call's.
fn int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The one statement that writes a delivery's calls: every column an array, so any number
/// of rows costs one statement, prepared once per connection.
const INSERT: &str = "INSERT INTO model_calls \
        (job_id, tenant, delivery, seq, provider, model, prompt_tokens, completion_tokens, \
         duration_ms, error_class, at) \
     SELECT $1, $2, * FROM unnest($3::integer[], $4::integer[], $5::text[], $6::text[], \
         $7::integer[], $8::integer[], $9::integer[], $10::text[], $11::timestamptz[])";

/// Write `calls` of `job_id` in one statement on `client` (a pooled connection or an open
/// transaction). Nothing is sent for no calls.
pub(crate) async fn insert<C: GenericClient + Sync>(
    client: &C,
    job_id: JobId,
    tenant: &TenantId,
    calls: &[ModelCall],
) -> Result<(), DbError> {
    if calls.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&ModelCall) -> i32| calls.iter().map(f).collect::<Vec<i32>>();
    let delivery = column(|c| int(c.delivery));
    let seq = column(|c| int(c.seq));
    let duration = column(|c| int(c.duration_ms));
    let provider: Vec<&str> = calls.iter().map(|c| c.provider.as_str()).collect();
    let model: Vec<&str> = calls.iter().map(|c| c.model.as_str()).collect();
    let prompt: Vec<Option<i32>> = calls.iter().map(|c| c.prompt_tokens.map(int)).collect();
    let completion: Vec<Option<i32>> = calls.iter().map(|c| c.completion_tokens.map(int)).collect();
    let error: Vec<Option<&str>> = calls.iter().map(|c| c.error_class.as_deref()).collect();
    let at: Vec<DateTime<Utc>> = calls.iter().map(|c| c.at).collect();
    let stmt = client.prepare_cached(INSERT).await?;
    client
        .execute(
            &stmt,
            &[
                &job_id.as_uuid(),
                &tenant.as_str(),
                &delivery,
                &seq,
                &provider,
                &model,
                &prompt,
                &completion,
                &duration,
                &error,
                &at,
            ],
        )
        .await?;
    Ok(())
}

/// Write the calls of a delivery that did not commit its job, in one statement.
pub(crate) async fn record(
    pool: &Pool,
    job_id: JobId,
    tenant: &TenantId,
    calls: &[ModelCall],
) -> Result<(), DbError> {
    if calls.is_empty() {
        return Ok(());
    }
    let client = pool.get().await?;
    insert(&client, job_id, tenant, calls).await
}

/// Every recorded model call of `job_id` (the rows of deliveries that did not commit, and
/// the calls stored on its summary's row), by delivery, then in the order they started
/// (`seq` within a delivery; a delivery number that did not count appears again for the
/// delivery after it, whose calls started later).
pub async fn for_job(pool: &Pool, job_id: &JobId) -> Result<Vec<ModelCall>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT delivery, seq, provider, model, prompt_tokens, completion_tokens, \
                    duration_ms, error_class, at \
               FROM model_calls WHERE job_id = $1",
        )
        .await?;
    let on_summary = client
        .prepare_cached("SELECT model_calls FROM summaries WHERE job_id = $1")
        .await?;
    let id = job_id.as_uuid();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
    let (rows, committed) = tokio::join!(
        client.query(&stmt, &params),
        client.query_opt(&on_summary, &params)
    );
    // Written from u32s; a negative value could only be a hand edit, and reads as 0.
    let count = |n: i32| u32::try_from(n).unwrap_or(0);
    let mut calls = rows?
        .iter()
        .map(|row| {
            Ok(ModelCall {
                delivery: count(row.try_get(0)?),
                seq: count(row.try_get(1)?),
                provider: row.try_get(2)?,
                model: row.try_get(3)?,
                prompt_tokens: row.try_get::<_, Option<i32>>(4)?.map(count),
                completion_tokens: row.try_get::<_, Option<i32>>(5)?.map(count),
                duration_ms: count(row.try_get(6)?),
                error_class: row.try_get(7)?,
                at: row.try_get(8)?,
            })
        })
        .collect::<Result<Vec<_>, DbError>>()?;
    if let Some(row) = committed? {
        let stored: Option<Json<Vec<ModelCall>>> = row.try_get(0)?;
        calls.extend(stored.map(|Json(c)| c).unwrap_or_default());
    }
    calls.sort_by_key(|c| (c.delivery, c.at, c.seq));
    Ok(calls)
}

/// Remove up to `batch` calls made before `cutoff`, oldest first; returns how many.
pub(crate) async fn delete_before(
    pool: &Pool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let client = pool.get().await?;
    // By ctid: the table has no key of its own, and the batch is found by the BRIN index
    // on `at` (unordered: every row before the cutoff goes, in whatever order).
    let stmt = client
        .prepare_cached(
            "DELETE FROM model_calls WHERE ctid = ANY(ARRAY( \
                SELECT ctid FROM model_calls WHERE at < $1 LIMIT $2))",
        )
        .await?;
    Ok(client.execute(&stmt, &[&cutoff, &batch]).await?)
}
