//! Postgres: the pool, migrations, and one module per table.

pub mod job_texts;
pub mod migrate;
pub mod model_calls;
pub mod outbox;
pub mod parts;
pub mod summaries;
pub mod webhooks;

use deadpool_postgres::Pool;

use crate::domain::TraceContext;
use crate::infra::postgres::PostgresError;
use crate::resilience::failure::{Classify, Disposition};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Connect(#[from] PostgresError),
    #[error("could not get a Postgres connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("Postgres error: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[source] refinery::Error),
    /// A value could not be turned into the JSON a column stores: the same value fails
    /// on every attempt.
    #[error("could not encode a JSON column: {0}")]
    Encode(#[source] serde_json::Error),
}

impl DbError {
    /// The SQLSTATE Postgres answered with, when it refused a statement.
    pub(crate) fn sqlstate(&self) -> Option<&str> {
        match self {
            Self::Query(e) | Self::Connect(PostgresError::Connect(e)) => e.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// Postgres refused the data itself: a data exception (class 22: NUL in text, an invalid
    /// encoding, a value out of range) or a violated constraint (class 23). Only these can
    /// come from a job's own content; the same data is refused on every attempt, so retrying
    /// only costs. The one expected conflict, a summary that already exists, is answered by
    /// `ON CONFLICT` and never arrives here.
    fn refuses_the_data(&self) -> bool {
        self.sqlstate()
            .is_some_and(|code| code.starts_with("22") || code.starts_with("23"))
    }
}

impl Classify for DbError {
    /// Decided once for every caller (`docs/delivery.md`): data the database refuses is
    /// permanent (the job's own). A database that could not serve us at all is unavailable,
    /// never the job's fault, and a worker must not spend the job's deliveries on it: down,
    /// unreachable, restarting, out of connections, failed over to a read-only replica, a
    /// table or permission missing, that is every refused statement outside classes 22 and
    /// 23, and every one with no SQLSTATE (the connection closed, timed out or failed at the
    /// socket). What is neither (settings that cannot work, a failed migration) is worth
    /// another attempt.
    fn disposition(&self) -> Disposition {
        if self.refuses_the_data() || matches!(self, DbError::Encode(_)) {
            return Disposition::Permanent;
        }
        let unavailable = match self {
            DbError::Pool(_) | DbError::Query(_) => true,
            DbError::Connect(e) => e.is_unavailable(),
            DbError::Migration(_) | DbError::Encode(_) => false,
        };
        if unavailable {
            Disposition::Unavailable
        } else {
            Disposition::TRANSIENT
        }
    }
}

/// Run one retention batch: `delete` is a `DELETE … WHERE key IN (SELECT … WHERE t < $1
/// ORDER BY t LIMIT $2 FOR UPDATE SKIP LOCKED)` of one table (each table's module owns its
/// SQL). `SKIP LOCKED`: rows another deleter holds are left to it, so concurrent retention
/// passes never wait on each other or delete a row twice. Returns how many rows went.
async fn delete_batch_before(
    pool: &Pool,
    delete: &str,
    cutoff: chrono::DateTime<chrono::Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let client = pool.get().await?;
    let stmt = client.prepare_cached(delete).await?;
    Ok(client.execute(&stmt, &[&cutoff, &batch]).await?)
}

/// A stored context that no longer parses (written by hand) only loses the row its trace.
pub(crate) fn trace_context(
    traceparent: Option<String>,
    tracestate: Option<String>,
) -> Option<TraceContext> {
    TraceContext::parse(&traceparent?, tracestate.as_deref()).ok()
}

/// The columns an outbox row's trace context is written to, from the innermost exported
/// span (`None`s with export off).
pub(crate) fn trace_columns() -> (Option<String>, Option<String>) {
    match crate::infra::telemetry::current() {
        Some(trace) => (
            Some(trace.traceparent().to_owned()),
            trace.tracestate().map(str::to_owned),
        ),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusals that need a live server (SQLSTATEs, closed sockets) are covered against
    /// Postgres in tests/it; these are the ones that can be made here.
    #[test]
    fn a_pool_without_connections_is_unavailable_and_a_bad_url_is_worth_retrying() {
        let pool = DbError::Pool(deadpool_postgres::PoolError::Closed);
        assert_eq!(pool.disposition(), Disposition::Unavailable);
        assert_eq!(pool.sqlstate(), None);
        let url = DbError::Connect(PostgresError::InvalidUrl("no host".into()));
        assert_eq!(url.disposition(), Disposition::TRANSIENT);
    }
}
