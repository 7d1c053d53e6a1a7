//! Commands whose meaning depends on which server receives them. On a single server they
//! go to that server; on a cluster, to the master that owns a given key's slot (the
//! `route_key`: any key of the data the command is about, e.g. the stream just written).
//!
//! Left to the cluster connection's own routing, WAIT would go to every master and SCAN to a
//! random node, neither of which is what a caller means.

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, RedisResult, Value};

use super::Conn;

/// A connection whose commands can be sent to a chosen node: a cluster connection says so;
/// a connection to a single server sends everything there.
pub trait Routable: redis::aio::ConnectionLike + Send {
    /// The cluster connection, when this is one.
    fn as_cluster(&mut self) -> Option<&mut redis::cluster_async::ClusterConnection> {
        None
    }
}

impl Routable for Conn {
    fn as_cluster(&mut self) -> Option<&mut redis::cluster_async::ClusterConnection> {
        self.cluster()
    }
}

impl Routable for redis::aio::MultiplexedConnection {}

impl Routable for redis::aio::ConnectionManager {}

/// Sends `cmd` to the master owning `route_key`'s slot (cluster) or to the server.
pub async fn on_master_of<T: FromRedisValue, C: Routable>(
    conn: &mut C,
    route_key: &str,
    cmd: Cmd,
) -> RedisResult<T> {
    let Some(cluster) = conn.as_cluster() else {
        return cmd.query_async(conn).await;
    };
    let route = Route::with_key(route_key.as_bytes(), SlotAddr::Master);
    let value: Value = cluster
        .route_command(
            cmd,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )
        .await?;
    Ok(redis::from_redis_value(value.extract_error()?)?)
}

/// `WAIT replicas timeout`: how many replicas have acknowledged the writes this connection
/// made to `route_key`'s master, waiting at most `timeout` for `replicas` of them.
///
/// WAIT counts the writes of the connection it arrives on, so it must be sent on the same
/// `Conn` that wrote (and, on a cluster, for a key of the same slot as those writes). On a
/// multiplexed connection it covers every write sent on that socket so far, which is at least
/// the caller's own. The server holds the connection for up to `timeout`, so on a shared
/// (multiplexed) connection the commands queued behind it wait too: keep `timeout` short.
/// A `timeout` of zero would wait forever and is sent as one millisecond.
pub async fn wait_replicas<C: Routable>(
    conn: &mut C,
    route_key: &str,
    replicas: u32,
    timeout: std::time::Duration,
) -> RedisResult<u32> {
    let millis = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(millis);
    on_master_of(conn, route_key, cmd).await
}

/// Every key matching `pattern` on the server, or on the master owning `route_key`'s slot
/// (which holds every key sharing its hash tag), `count` keys per SCAN step. The same key may
/// come twice if the keyspace is resized meanwhile, as SCAN allows; callers deduplicate when
/// that matters.
pub async fn scan_keys<C: Routable>(
    conn: &mut C,
    route_key: &str,
    pattern: &str,
    count: usize,
) -> RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count.max(1));
        let (next, batch): (u64, Vec<String>) = on_master_of(conn, route_key, cmd).await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Every key matching `pattern` (and of `key_type`, e.g. `"set"`, when given) in the whole
/// keyspace: on a cluster, a full SCAN of every master, each continued on the node that gave
/// the cursor; on a single server, plain SCAN. For keys that are not under one hash tag.
pub async fn scan_every_master(
    conn: &mut Conn,
    pattern: &str,
    key_type: Option<&str>,
    count: usize,
) -> RedisResult<Vec<String>> {
    let scan = |cursor: u64| {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count.max(1));
        if let Some(t) = key_type {
            cmd.arg("TYPE").arg(t);
        }
        cmd
    };
    let mut keys = Vec::new();
    let Some(cluster) = conn.cluster() else {
        let mut cursor = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = scan(cursor).query_async(conn).await?;
            keys.extend(batch);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    };
    use redis::cluster_routing::MultipleNodeRoutingInfo;
    let first = cluster
        .route_command(
            scan(0),
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await?;
    let by_node: Vec<(String, (u64, Vec<String>))> =
        redis::from_redis_value(first.extract_error()?)?;
    for (node, (mut cursor, batch)) in by_node {
        keys.extend(batch);
        let Some((host, port)) = node.rsplit_once(':') else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "cluster node address without a port",
            )));
        };
        let port: u16 = port.parse().map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::Client, "cluster node port not a number"))
        })?;
        while cursor != 0 {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            });
            let value = cluster.route_command(scan(cursor), routing).await?;
            let (next, batch): (u64, Vec<String>) =
                redis::from_redis_value(value.extract_error()?)?;
            keys.extend(batch);
            cursor = next;
        }
    }
    Ok(keys)
}
