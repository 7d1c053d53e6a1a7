//! The shared handles every role works with. Cheap to clone.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::AsyncConnectionConfig;

use crate::config::Settings;
use crate::keys::RedisKeys;
use crate::llm::Llm;
use crate::mail::Mailer;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct Services {
    pub settings: Arc<Settings>,
    pub keys: RedisKeys,
    pub redis: deadpool_redis::Pool,
    pub pg: deadpool_postgres::Pool,
    pub llm: Arc<dyn Llm>,
    pub mailer: Arc<dyn Mailer>,
    pub metrics: Arc<Metrics>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error("SUMMARYD_REDIS_URL is invalid: {0}")]
    Redis(String),
    #[error(transparent)]
    Postgres(#[from] crate::db::DbError),
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Fail fast when Redis is down, so the API answers 503 promptly instead of hanging.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Must exceed the longest XREADGROUP BLOCK; other commands answer in microseconds.
const REDIS_RESPONSE_MARGIN: Duration = Duration::from_secs(5);
/// A request waits at most this long for a pooled connection.
const REDIS_POOL_WAIT: Duration = Duration::from_secs(2);

impl Services {
    /// Build pools (lazily connecting) and wire the given providers.
    pub fn new(
        settings: Settings,
        llm: Arc<dyn Llm>,
        mailer: Arc<dyn Mailer>,
    ) -> Result<Self, ServicesError> {
        let blocking_consumers = settings.worker.consumers;
        // Each consumer holds a connection while blocked in XREADGROUP; the rest serve
        // the API and the relay's metrics.
        let redis_pool_size = blocking_consumers + 32;
        let pg_pool_size = blocking_consumers + settings.relay.tasks + 16;
        let response_timeout =
            Duration::from_millis(settings.worker.block_ms) + REDIS_RESPONSE_MARGIN;
        let conn_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(REDIS_CONNECT_TIMEOUT))
            .set_response_timeout(Some(response_timeout));
        let manager =
            deadpool_redis::Manager::new_with_config(settings.redis_url.as_str(), conn_config)
                .map_err(|e| ServicesError::Redis(e.to_string()))?;
        let redis = deadpool_redis::Pool::builder(manager)
            .max_size(redis_pool_size)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .wait_timeout(Some(REDIS_POOL_WAIT))
            .create_timeout(Some(REDIS_CONNECT_TIMEOUT))
            .build()
            .map_err(|e| ServicesError::Redis(e.to_string()))?;
        let pg = crate::db::pool(&settings.database_url, pg_pool_size)?;
        Ok(Self {
            keys: RedisKeys::new(settings.key_prefix.clone()),
            settings: Arc::new(settings),
            redis,
            pg,
            llm,
            mailer,
            metrics: Arc::new(Metrics::new()?),
        })
    }
}
