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
    /// Whether the database could not serve us at all, as opposed to refusing what one job
    /// brought. Down, unreachable, restarting, out of connections, failed over to a read-only
    /// replica, a table or permission missing: none of that is the job's fault, and a worker
    /// must not spend the job's deliveries on it (`docs/delivery.md`). Only data exceptions
    /// (SQLSTATE class 22) and integrity violations (23) can come from a job's own content.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Pool(_) | DbError::Tls { .. } => true,
            // No SQLSTATE: the connection closed, timed out or failed at the socket.
            DbError::Query(e) => e
                .code()
                .is_none_or(|code| !matches!(code.code().get(..2), Some("22" | "23"))),
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
