//! The connections a process opens: the Redis pool, the API's shared Redis connection and the
//! Postgres pool. Each is built once per process, connects lazily, and goes only to the roles
//! and commands that use it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::redis::AsyncConnectionConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use secrecy::ExposeSecret;

use crate::config::Settings;
use crate::infra::redis::{ClusterManager, ClusterSeed};
pub use crate::infra::redis::{Conn, RedisClient, RedisPool};

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Redis(#[from] crate::infra::redis::RedisSetupError),
    #[error("could not build the Redis pool: {0}")]
    RedisManager(#[source] redis::RedisError),
    #[error("could not build the Redis pool: {0}")]
    RedisPool(#[source] deadpool_redis::BuildError),
    #[error(transparent)]
    Postgres(#[from] crate::infra::postgres::PostgresError),
}

/// Fail fast when Redis is down, so the API answers 503 promptly instead of hanging.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Must exceed the longest XREADGROUP BLOCK; other commands answer in microseconds.
const REDIS_RESPONSE_MARGIN: Duration = Duration::from_secs(5);
/// A cluster connection connects to every node and reads the slot map before it is ready.
const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(3);
/// A request waits at most this long for a pooled connection.
const REDIS_POOL_WAIT: Duration = Duration::from_secs(2);
/// Every Postgres use is one or two short statements on a connection taken and returned at
/// once (no connection is held across a model call or a send), so a few dozen connections
/// carry thousands of jobs/s. More would only queue inside Postgres and eat into its
/// `max_connections` (100 by default), which every process of a deployment shares; past the
/// cap, a consumer waits for a free connection (the pool's wait timeout bounds it).
const PG_POOL_MAX: usize = 32;
/// The shared connection carries only commands that answer in well under a millisecond
/// (GET, EVALSHA of short scripts, HGETALL); a reply slower than this means Redis is hung,
/// and the request should become a 503 rather than wait for the client to give up.
const SHARED_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The Redis connection API requests use: one multiplexed connection per thread, shared by
/// every request that thread serves.
///
/// Why not the pool: deadpool-redis pings on every checkout to verify the connection, so a
/// request that takes a pooled connection pays an extra round trip per checkout. A
/// multiplexed connection needs no checkout: concurrent requests are pipelined on one
/// socket, which also lets Redis answer many of them per read. Blocking commands must never
/// go through it (they would stall every request behind them); they use [`redis_pool`].
///
/// Why per thread: each actix worker thread runs its own runtime, and a connection's I/O is
/// driven by a task on the runtime that created it. One process-wide connection made every
/// other worker thread hand each command to that one thread and wait to be woken (the
/// profile showed the switching); a connection per thread keeps a request on its thread.
///
/// Built on first use on each thread (so `SharedRedis::new` needs no runtime and never
/// connects), then kept. [`ConnectionManager`] replaces the connection when it drops (e.g.
/// Redis restarts). With zero connection retries, a request while Redis is down fails after
/// one connect attempt (refused at once, or `REDIS_CONNECT_TIMEOUT`), and the next request
/// tries again.
///
/// On a cluster it is one multiplexed cluster connection per thread instead (a socket to
/// each node), made on the thread's first request; a failed connect is that request's
/// error and the next request tries again.
#[derive(Clone)]
pub struct SharedRedis {
    target: SharedTarget,
    /// Distinguishes instances in the per-thread map (tests build many in one process).
    id: u64,
}

// One per process and cloned only when roles are wired: its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum SharedTarget {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

#[derive(Clone)]
enum ThreadConnection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl From<ThreadConnection> for Conn {
    fn from(c: ThreadConnection) -> Self {
        match c {
            ThreadConnection::Single(c) => Conn::Shared(c),
            ThreadConnection::Cluster(c) => Conn::ClusterShared(c),
        }
    }
}

thread_local! {
    /// This thread's connection for each `SharedRedis` instance.
    static THREAD_CONNECTIONS: RefCell<HashMap<u64, ThreadConnection>> = RefCell::new(HashMap::new());
}

static NEXT_SHARED_REDIS_ID: AtomicU64 = AtomicU64::new(0);

impl SharedRedis {
    /// `client` carries the TLS material for `rediss://` (see `infra::redis::client`).
    pub fn new(client: RedisClient) -> Result<Self, ConnectError> {
        let target = match client {
            RedisClient::Single(client) => SharedTarget::Single(client),
            RedisClient::Cluster(seed) => SharedTarget::Cluster(
                seed.client(REDIS_CONNECT_TIMEOUT, SHARED_RESPONSE_TIMEOUT)
                    .map_err(ConnectError::RedisManager)?,
            ),
        };
        Ok(Self {
            target,
            id: NEXT_SHARED_REDIS_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// A handle on this thread's connection; clone-cheap, use it for one request.
    pub async fn get(&self) -> redis::RedisResult<Conn> {
        if let Some(conn) = THREAD_CONNECTIONS.with(|m| m.borrow().get(&self.id).cloned()) {
            return Ok(conn.into());
        }
        let conn = match &self.target {
            SharedTarget::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_number_of_retries(0)
                    .set_connection_timeout(Some(REDIS_CONNECT_TIMEOUT))
                    .set_response_timeout(Some(SHARED_RESPONSE_TIMEOUT));
                // Lazy: connects on the first command, so a Redis that is down at that
                // moment is one failed request, not a failed initialisation.
                ThreadConnection::Single(ConnectionManager::new_lazy_with_config(
                    client.clone(),
                    config,
                )?)
            }
            SharedTarget::Cluster(client) => {
                ThreadConnection::Cluster(client.get_async_connection().await?)
            }
        };
        // Two requests on this thread may both have got here; keep whichever came first.
        Ok(THREAD_CONNECTIONS
            .with(|m| {
                m.borrow_mut()
                    .entry(self.id)
                    .or_insert_with(|| conn.clone())
                    .clone()
            })
            .into())
    }
}

/// The Redis client every Redis handle of a process is built from, plain or with the TLS
/// material for `rediss://`: one client, so the pool speaks TLS exactly when the API does.
pub(crate) fn redis_client(settings: &Settings) -> Result<RedisClient, ConnectError> {
    Ok(crate::infra::redis::client(settings)?)
}

/// Dedicated Redis connections, for commands that block (XREADGROUP BLOCK) or hold a
/// connection across several steps: the worker, readiness checks, the gauges read at scrape
/// time, the admin commands.
///
/// On a cluster each pooled connection has its own socket to every node, so a consumer
/// blocked in XREADGROUP or BLPOP holds up no other.
pub(crate) fn redis_pool(
    settings: &Settings,
    client: &RedisClient,
) -> Result<RedisPool, ConnectError> {
    // Each consumer holds a connection while blocked in XREADGROUP; the rest serve
    // readiness checks, the gauges and the admin commands.
    let size = settings.worker.consumers + 32;
    let response_timeout = settings.worker.block + REDIS_RESPONSE_MARGIN;
    let client = match client {
        RedisClient::Single(client) => client,
        RedisClient::Cluster(seed) => {
            return cluster_pool(seed, size, response_timeout).map(RedisPool::Cluster);
        }
    };
    let conn_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REDIS_CONNECT_TIMEOUT))
        .set_response_timeout(Some(response_timeout));
    let manager =
        deadpool_redis::Manager::new_with_config(client.get_connection_info().clone(), conn_config)
            .map_err(ConnectError::RedisManager)?;
    deadpool_redis::Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .wait_timeout(Some(REDIS_POOL_WAIT))
        .create_timeout(Some(REDIS_CONNECT_TIMEOUT))
        .build()
        .map(RedisPool::Single)
        .map_err(ConnectError::RedisPool)
}

fn cluster_pool(
    seed: &ClusterSeed,
    size: usize,
    response_timeout: Duration,
) -> Result<deadpool::managed::Pool<ClusterManager>, ConnectError> {
    let client = seed
        .client(REDIS_CONNECT_TIMEOUT, response_timeout)
        .map_err(ConnectError::RedisManager)?;
    deadpool::managed::Pool::builder(ClusterManager::new(client))
        .max_size(size)
        .runtime(deadpool::Runtime::Tokio1)
        .wait_timeout(Some(REDIS_POOL_WAIT))
        .create_timeout(Some(CLUSTER_CREATE_TIMEOUT))
        .build()
        .map_err(ConnectError::RedisPool)
}

/// The Postgres pool, sized for the consumers and relay tasks the settings ask for.
pub fn pg_pool(settings: &Settings) -> Result<deadpool_postgres::Pool, ConnectError> {
    let size = (settings.worker.consumers + settings.relay.tasks + 16).min(PG_POOL_MAX);
    let ca_file = settings.database.ca_file.as_deref();
    Ok(crate::infra::postgres::pool(
        settings.database_url.expose_secret(),
        ca_file,
        size,
    )?)
}
