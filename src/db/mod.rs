//! Postgres: the pool, migrations, and one module per table.

pub mod connect;
pub mod migrate;
pub mod outbox;
pub mod summaries;

use std::path::Path;
use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod, Runtime};

pub use connect::PgTarget;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("SUMMARYD_DATABASE_URL is invalid: {0}")]
    InvalidUrl(String),
    #[error("could not get a Postgres connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("Postgres error: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("could not build the Postgres pool: {0}")]
    Build(String),
    #[error("migration failed: {0}")]
    Migration(String),
    /// A CA file that cannot be read or parsed; the message names the setting.
    #[error("{0}")]
    TlsConfig(String),
    #[error("TLS to Postgres at {addr} failed (sslmode={mode}): {reason}")]
    Tls {
        addr: String,
        mode: &'static str,
        reason: String,
    },
}

impl DbError {
    /// The SQLSTATE Postgres answered with, when it refused a statement.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Self::Query(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// Postgres refused the data itself: a data exception (class 22: NUL in text, an invalid
    /// encoding, a value out of range) or a violated constraint (class 23). Only these can
    /// come from a job's own content; the same data is refused on every attempt, so retrying
    /// only costs. The one expected conflict, a summary that already exists, is answered by
    /// `ON CONFLICT` and never arrives here.
    pub fn is_data_error(&self) -> bool {
        self.sqlstate()
            .is_some_and(|code| code.starts_with("22") || code.starts_with("23"))
    }

    /// Whether the database could not serve us at all, as opposed to refusing what one job
    /// brought. Down, unreachable, restarting, out of connections, failed over to a read-only
    /// replica, a table or permission missing: none of that is the job's fault, and a worker
    /// must not spend the job's deliveries on it (`docs/delivery.md`). Every refused statement
    /// that is not a data error ([`Self::is_data_error`]) counts, and so does one with no
    /// SQLSTATE (the connection closed, timed out or failed at the socket).
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Pool(_) | DbError::Tls { .. } => true,
            DbError::Query(_) => !self.is_data_error(),
            DbError::InvalidUrl(_)
            | DbError::Build(_)
            | DbError::Migration(_)
            | DbError::TlsConfig(_) => false,
        }
    }
}

/// Connecting must fail fast when Postgres is down so callers can answer 503 or retry.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A request waits this long for a free connection before it counts as unavailable.
const POOL_WAIT: Duration = Duration::from_secs(5);

/// Build the pool; it connects lazily, so this succeeds while Postgres is down.
pub fn pool(url: &str, ca_file: Option<&Path>, max_size: usize) -> Result<Pool, DbError> {
    let target = PgTarget::parse(url, ca_file)?;
    // Verified recycling costs a round trip per checkout; a closed connection is detected
    // by `is_closed` and a broken one surfaces as a query error that callers handle anyway.
    let manager = target.manager(ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    });
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| DbError::Build(e.to_string()))
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
