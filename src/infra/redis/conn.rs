//! The one Redis connection type the crate uses, [`Conn`], and the pool it comes from,
//! [`RedisPool`], over a single Redis server or a Redis Cluster.
//!
//! Callers write commands once: `Conn` implements [`ConnectionLike`] by handing each command
//! to the connection it wraps, so `query_async`, `Script::invoke_async` and atomic pipelines
//! work unchanged. On a cluster the redis crate routes each command by its key's slot and
//! follows MOVED/ASK; a transaction or script must keep its keys under one hash tag.
//!
//! What differs per mode is kept in [`super::routed`] (commands that must reach the node
//! owning a given key: WAIT, SCAN).

use std::sync::atomic::{AtomicUsize, Ordering};

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

/// A Redis connection: pooled or shared, to one server or to a cluster.
///
/// Cheap to match on; every command costs one branch more than the wrapped connection.
pub enum Conn {
    /// From the single-server pool: a connection of its own, fit for blocking commands.
    Pooled(deadpool_redis::Connection),
    /// The API's multiplexed connection to a single server (one per thread).
    Shared(ConnectionManager),
    /// From the cluster pool: its own connections to every node, so a command blocked on
    /// one pooled connection never delays another's.
    ClusterPooled(managed::Object<ClusterManager>),
    /// The API's multiplexed cluster connection (one per thread).
    ClusterShared(ClusterConnection),
}

impl Conn {
    /// The cluster connection, when this is one.
    pub fn cluster(&mut self) -> Option<&mut ClusterConnection> {
        match self {
            Conn::ClusterPooled(c) => Some(c),
            Conn::ClusterShared(c) => Some(c),
            Conn::Pooled(_) | Conn::Shared(_) => None,
        }
    }

    /// Whether this connection goes to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::ClusterPooled(_) | Conn::ClusterShared(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Pooled(c) => c.req_packed_command(cmd),
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::ClusterPooled(c) => {
                let c: &mut ClusterConnection = c;
                c.req_packed_command(cmd)
            }
            Conn::ClusterShared(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Pooled(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::ClusterPooled(c) => {
                let c: &mut ClusterConnection = c;
                c.req_packed_commands(pipeline, offset, count)
            }
            Conn::ClusterShared(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Pooled(c) => c.get_db(),
            Conn::Shared(c) => c.get_db(),
            Conn::ClusterPooled(c) => c.get_db(),
            Conn::ClusterShared(c) => c.get_db(),
        }
    }
}

/// Dedicated Redis connections (see `connections::redis_pool`), to one server or a cluster.
/// A failed checkout is a [`deadpool_redis::PoolError`] in both modes.
#[derive(Clone)]
pub enum RedisPool {
    Single(deadpool_redis::Pool),
    Cluster(managed::Pool<ClusterManager>),
}

impl RedisPool {
    /// A connection of the caller's own until it is dropped.
    pub async fn get(&self) -> Result<Conn, deadpool_redis::PoolError> {
        match self {
            RedisPool::Single(pool) => pool.get().await.map(Conn::Pooled),
            RedisPool::Cluster(pool) => pool.get().await.map(Conn::ClusterPooled),
        }
    }

    /// Whether the connections go to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisPool::Cluster(_))
    }
}

impl From<deadpool_redis::Pool> for RedisPool {
    fn from(pool: deadpool_redis::Pool) -> Self {
        RedisPool::Single(pool)
    }
}

/// Makes and checks the cluster pool's connections. Each connection is a
/// [`ClusterConnection`] of its own (its own socket to each node), unlike clones of one
/// cluster connection, which share their sockets.
pub struct ClusterManager {
    client: ClusterClient,
    pings: AtomicUsize,
}

impl ClusterManager {
    /// `client` carries the nodes, credentials, TLS material and timeouts.
    pub fn new(client: ClusterClient) -> Self {
        Self {
            client,
            pings: AtomicUsize::new(0),
        }
    }
}

impl std::fmt::Debug for ClusterManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client's Debug would print the nodes' passwords.
        f.debug_struct("ClusterManager").finish_non_exhaustive()
    }
}

impl managed::Manager for ClusterManager {
    type Type = ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut ClusterConnection,
        _: &Metrics,
    ) -> RecycleResult<RedisError> {
        // One node is enough to know the connection's task is alive (the crate reconnects
        // to nodes on its own); PING's default routing would ask every node.
        let token = self.pings.fetch_add(1, Ordering::Relaxed).to_string();
        let mut ping = redis::cmd("PING");
        ping.arg(&token);
        let reply = conn
            .route_command(
                ping,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await?;
        match reply {
            Value::BulkString(b) if b == token.as_bytes() => Ok(()),
            _ => Err(RecycleError::message("unexpected PING reply")),
        }
    }
}
