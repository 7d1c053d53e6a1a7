//! The `summary_parts` table: every finished part of a job summarised in parts, stored
//! before the next step needs it, so no later delivery pays for it again.
//!
//! A part is found by the SHA-256 of its input (`llm::Prompt::input_sha256`), not by its
//! place in a plan: a delivery on a provider with another context cuts the text
//! differently, and still finds every part whose input it shares.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use super::DbError;
use crate::domain::{JobId, TokenUsage};

/// One stored part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPart {
    pub summary: String,
    pub model: String,
    pub usage: Option<TokenUsage>,
}

/// Where a part sat in the plan that wrote it: its level (0: a piece of the text, 1 and
/// up: a combination) and its place among its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartPlace {
    pub level: u32,
    pub part: u32,
}

fn count(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Every stored part of `job_id`, by input hash.
pub(crate) async fn load(
    pool: &Pool,
    job_id: JobId,
) -> Result<HashMap<[u8; 32], StoredPart>, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT input_sha256, summary, model, prompt_tokens, completion_tokens \
               FROM summary_parts WHERE job_id = $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&job_id.as_uuid()]).await?;
    let mut parts = HashMap::with_capacity(rows.len());
    for row in rows {
        let hash: Vec<u8> = row.try_get(0)?;
        let Ok(hash) = <[u8; 32]>::try_from(hash.as_slice()) else {
            continue;
        };
        let tokens = |i: usize| -> Result<Option<u32>, DbError> {
            Ok(row
                .try_get::<_, Option<i32>>(i)?
                .and_then(|n| u32::try_from(n).ok()))
        };
        let usage = match (tokens(3)?, tokens(4)?) {
            (Some(prompt), Some(completion)) => Some(TokenUsage { prompt, completion }),
            _ => None,
        };
        parts.insert(
            hash,
            StoredPart {
                summary: row.try_get(1)?,
                model: row.try_get(2)?,
                usage,
            },
        );
    }
    Ok(parts)
}

/// Store one finished part. A part another delivery stored meanwhile is kept as it was.
pub(crate) async fn store(
    pool: &Pool,
    job_id: JobId,
    input_sha256: &[u8; 32],
    place: PartPlace,
    part: &StoredPart,
) -> Result<(), DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "INSERT INTO summary_parts \
                (job_id, input_sha256, level, part, model, summary, prompt_tokens, completion_tokens) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (job_id, input_sha256) DO NOTHING",
        )
        .await?;
    client
        .execute(
            &stmt,
            &[
                &job_id.as_uuid(),
                &input_sha256.as_slice(),
                &count(place.level),
                &count(place.part),
                &part.model,
                &part.summary,
                &part.usage.map(|u| count(u.prompt)),
                &part.usage.map(|u| count(u.completion)),
            ],
        )
        .await?;
    Ok(())
}

/// Remove the parts of up to `batch` jobs: those whose summary text retention removed,
/// and those of jobs that never finished, stored before `unfinished_before`. Returns how
/// many parts were removed.
pub(crate) async fn delete_expired(
    pool: &Pool,
    unfinished_before: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "DELETE FROM summary_parts WHERE job_id IN ( \
                SELECT DISTINCT p.job_id FROM summary_parts p \
                  LEFT JOIN summaries s ON s.job_id = p.job_id \
                 WHERE (s.job_id IS NOT NULL AND s.summary IS NULL) \
                    OR (s.job_id IS NULL AND p.created_at < $1) \
                 LIMIT $2)",
        )
        .await?;
    Ok(client.execute(&stmt, &[&unfinished_before, &batch]).await?)
}
