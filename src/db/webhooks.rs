//! Webhook endpoints and deliveries: which endpoints a tenant has disabled (a 410 Gone, or
//! every delivery failing for `SUMMARYD_WEBHOOK_DISABLE_AFTER_S`), and the operator's view
//! and replay of webhook rows of the outbox (`summaryd webhook …`).
//!
//! The rows themselves are outbox rows (`db::outbox` leases and marks them); this module
//! owns the `webhook_endpoints` table and the queries that read a webhook row's payload.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::Serialize;

use super::DbError;
use super::outbox::{AS_NEW, NOT_LEASED};
use crate::domain::{JobId, TenantId, WebhookEvent};

/// The longest span compared with `now()`, about 1000 years: `now()` minus more than
/// Postgres's timestamps reach back (4713 BC) is an error, so an absurd
/// `SUMMARYD_WEBHOOK_DISABLE_AFTER_S` or `--failed-since 99999999w` would refuse every
/// statement instead of meaning "longer than anything stored".
const MAX_SECONDS: i64 = 1_000 * 366 * 86_400;

fn seconds(span: Duration) -> i64 {
    i64::try_from(span.as_secs()).map_or(MAX_SECONDS, |s| s.min(MAX_SECONDS))
}

/// Why an endpoint is disabled, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub at: DateTime<Utc>,
    pub reason: String,
}

/// An endpoint's state for its tenant, read before each send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// `Some` while it is disabled.
    pub disabled: Option<Disabled>,
    /// A run of failures is open (`failing_since`): a delivery ends it. Known here so a
    /// delivery to a healthy endpoint, the common case, costs no second statement.
    pub failing: bool,
}

/// The endpoint's state for its tenant; an endpoint without a row is enabled and healthy.
pub async fn endpoint(pool: &Pool, tenant: &TenantId, url: &str) -> Result<Endpoint, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT disabled_at, coalesce(disabled_reason, ''), failing_since IS NOT NULL \
               FROM webhook_endpoints WHERE tenant = $1 AND url = $2",
        )
        .await?;
    let Some(row) = client.query_opt(&stmt, &[&tenant.as_str(), &url]).await? else {
        return Ok(Endpoint::default());
    };
    let at: Option<DateTime<Utc>> = row.try_get(0)?;
    Ok(Endpoint {
        disabled: match at {
            Some(at) => Some(Disabled {
                at,
                reason: row.try_get(1)?,
            }),
            None => None,
        },
        failing: row.try_get(2)?,
    })
}

/// The endpoint's state for its tenant: `Some` while it is disabled.
pub async fn disabled(
    pool: &Pool,
    tenant: &TenantId,
    url: &str,
) -> Result<Option<Disabled>, DbError> {
    Ok(endpoint(pool, tenant, url).await?.disabled)
}

/// Disable the endpoint for its tenant now (a 410 Gone), unless it already is. Returns
/// whether this call disabled it.
pub async fn disable(
    pool: &Pool,
    tenant: &TenantId,
    url: &str,
    reason: &str,
) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "INSERT INTO webhook_endpoints (tenant, url, disabled_at, disabled_reason) \
             VALUES ($1, $2, now(), $3) \
             ON CONFLICT (tenant, url) DO UPDATE \
                SET disabled_at = now(), disabled_reason = $3 \
              WHERE webhook_endpoints.disabled_at IS NULL",
        )
        .await?;
    Ok(client
        .execute(&stmt, &[&tenant.as_str(), &url, &reason])
        .await?
        == 1)
}

/// A delivery to the endpoint failed: start its run of failures if none is running, and
/// disable it when the run has lasted `disable_after`. Returns the reason when this call
/// disabled it.
pub async fn note_failure(
    pool: &Pool,
    tenant: &TenantId,
    url: &str,
    disable_after: Duration,
) -> Result<Option<String>, DbError> {
    let client = pool.get().await?;
    let reason = format!(
        "every delivery failed for {} s (SUMMARYD_WEBHOOK_DISABLE_AFTER_S)",
        disable_after.as_secs()
    );
    // On the right of SET, `failing_since` is the value before this update: the first
    // failure of a run never disables. Failures of one pass are noted concurrently, so
    // "this statement disabled it" is read from the row as it was just before this
    // statement changed it: `before` locks it (a statement that waited for the lock of the
    // one that disabled it sees that version; the INSERT reads it, so it runs first, not
    // when RETURNING asks, by which time the row is this statement's own) and RETURNING
    // compares. Comparing
    // `disabled_at` with this statement's own now() was not enough: two statements can
    // start in the same microsecond.
    let stmt = client
        .prepare_cached(
            "WITH before AS (SELECT disabled_at FROM webhook_endpoints \
                              WHERE tenant = $1 AND url = $2 FOR UPDATE) \
             INSERT INTO webhook_endpoints (tenant, url, failing_since) \
             SELECT $1, $2, now() FROM (SELECT 1) AS one LEFT JOIN before ON true \
             ON CONFLICT (tenant, url) DO UPDATE \
                SET failing_since = coalesce(webhook_endpoints.failing_since, now()), \
                    disabled_at = CASE WHEN webhook_endpoints.disabled_at IS NULL \
                                        AND webhook_endpoints.failing_since \
                                            <= now() - $3::bigint * interval '1 second' \
                                       THEN now() ELSE webhook_endpoints.disabled_at END, \
                    disabled_reason = CASE WHEN webhook_endpoints.disabled_at IS NULL \
                                        AND webhook_endpoints.failing_since \
                                            <= now() - $3::bigint * interval '1 second' \
                                       THEN $4 ELSE webhook_endpoints.disabled_reason END \
             RETURNING coalesce(disabled_at IS NOT NULL \
                                AND (SELECT disabled_at FROM before) IS NULL \
                                AND disabled_reason = $4, false)",
        )
        .await?;
    let row = client
        .query_one(
            &stmt,
            &[&tenant.as_str(), &url, &seconds(disable_after), &reason],
        )
        .await?;
    let disabled_now: bool = row.try_get(0)?;
    Ok(disabled_now.then_some(reason))
}

/// A delivery to the endpoint succeeded: its run of failures is over.
pub async fn note_success(pool: &Pool, tenant: &TenantId, url: &str) -> Result<(), DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE webhook_endpoints SET failing_since = NULL \
              WHERE tenant = $1 AND url = $2 AND failing_since IS NOT NULL",
        )
        .await?;
    client.execute(&stmt, &[&tenant.as_str(), &url]).await?;
    Ok(())
}

/// Enable the endpoint again (`summaryd webhook enable`), its run of failures forgotten.
/// Returns whether it was disabled.
pub async fn enable(pool: &Pool, tenant: &TenantId, url: &str) -> Result<bool, DbError> {
    let client = pool.get().await?;
    let n = client
        .execute(
            "UPDATE webhook_endpoints \
                SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL \
              WHERE tenant = $1 AND url = $2 AND disabled_at IS NOT NULL",
            &[&tenant.as_str(), &url],
        )
        .await?;
    Ok(n == 1)
}

/// One webhook row as `summaryd webhook deliveries` prints it (the contract's fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeliveryRow {
    pub id: i64,
    pub job_id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub url: Option<String>,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    /// When the relay sends it next; empty once delivered, parked or skipped.
    pub next_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// Which webhook rows an operator means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    Ids(Vec<i64>),
    Job(JobId),
    /// Not delivered, with a failed attempt (or a skip) within this long.
    FailedSince(Duration),
}

/// The webhook rows, oldest first: of one job (`job`), and/or only those not delivered whose
/// last attempt failed (`failed`: still retrying, parked or skipped).
pub async fn deliveries(
    pool: &Pool,
    job: Option<JobId>,
    failed: bool,
) -> Result<Vec<DeliveryRow>, DbError> {
    let client = pool.get().await?;
    let mut conditions = vec!["topic = $1".to_owned()];
    let mut ids = Vec::new();
    if let Some(job) = job {
        // By dedupe key, so the unique index finds them.
        ids = job_ids(job);
        conditions.push("dedupe_key = ANY($2)".into());
    }
    if failed {
        conditions.push("sent_at IS NULL AND last_failed_at IS NOT NULL".into());
    }
    let query = format!(
        "SELECT id, payload #>> '{{body,data,job_id}}', payload #>> '{{body,type}}', \
                payload ->> 'url', attempts, last_status, last_error, \
                CASE WHEN sent_at IS NULL AND failed_at IS NULL AND skipped_at IS NULL \
                     THEN next_attempt_at END, \
                sent_at \
           FROM outbox WHERE {} ORDER BY id",
        conditions.join(" AND ")
    );
    let rows = if job.is_some() {
        client.query(&query, &[&WebhookEvent::TOPIC, &ids]).await?
    } else {
        client.query(&query, &[&WebhookEvent::TOPIC]).await?
    };
    rows.iter()
        .map(|row| {
            Ok(DeliveryRow {
                id: row.try_get(0)?,
                job_id: row.try_get(1)?,
                kind: row.try_get(2)?,
                url: row.try_get(3)?,
                attempts: row.try_get(4)?,
                last_status: row.try_get(5)?,
                last_error: row.try_get(6)?,
                next_at: row.try_get(7)?,
                delivered_at: row.try_get(8)?,
            })
        })
        .collect()
}

/// Send the selected webhook rows again, with the same webhook-id, as if new: due now,
/// attempts from 0, no give-up horizon until their next failure, a skip or a delivery
/// forgotten. Rows a relay holds right now are left alone (another relay could otherwise
/// send them at the same time). An endpoint disabled for the tenant stays disabled: its
/// rows are skipped again until `webhook enable`. Returns how many rows were made due.
pub async fn replay(pool: &Pool, selection: &Selection) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let update = format!(
        "UPDATE outbox SET sent_at = NULL, skipped_at = NULL, {AS_NEW} \
          WHERE topic = $1 AND {NOT_LEASED}"
    );
    let n = match selection {
        Selection::Ids(ids) => {
            client
                .execute(
                    &format!("{update} AND id = ANY($2)"),
                    &[&WebhookEvent::TOPIC, ids],
                )
                .await?
        }
        Selection::Job(job) => {
            client
                .execute(
                    &format!("{update} AND dedupe_key = ANY($2)"),
                    &[&WebhookEvent::TOPIC, &job_ids(*job)],
                )
                .await?
        }
        Selection::FailedSince(within) => {
            client
                .execute(
                    &format!(
                        "{update} AND sent_at IS NULL \
                         AND last_failed_at >= now() - $2::bigint * interval '1 second'"
                    ),
                    &[&WebhookEvent::TOPIC, &seconds(*within)],
                )
                .await?
        }
    };
    Ok(n)
}

/// Every webhook-id a job's events can have.
fn job_ids(job: JobId) -> Vec<String> {
    [
        crate::domain::EventType::Completed,
        crate::domain::EventType::Failed,
    ]
    .into_iter()
    .map(|kind| WebhookEvent::webhook_id(job, kind))
    .collect()
}
