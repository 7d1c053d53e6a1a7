//! Postgres: the pool, migrations, and one module per table.

pub mod migrate;
pub mod outbox;
pub mod summaries;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

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
}

/// Connecting must fail fast when Postgres is down so callers can answer 503 or retry.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A request waits this long for a free connection before it counts as unavailable.
const POOL_WAIT: Duration = Duration::from_secs(5);

pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, DbError> {
    let mut config =
        tokio_postgres::Config::from_str(url).map_err(|e| DbError::InvalidUrl(e.to_string()))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("summaryd");
    }
    Ok(config)
}

/// Build the pool; it connects lazily, so this succeeds while Postgres is down.
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    let config = parse_url(url)?;
    // Verified recycling costs a round trip per checkout; a closed connection is detected
    // by `is_closed` and a broken one surfaces as a query error that callers handle anyway.
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| DbError::Build(e.to_string()))
}
