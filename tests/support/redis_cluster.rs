//! A private Redis Cluster for one test: three masters with one replica each on loopback,
//! started by `scripts/redis-cluster.sh` in a temporary directory and stopped when dropped.
//!
//! Beside the URL the application is given ([`RedisCluster::url`]), it offers what a
//! failover test needs: which node is the master of a key or slot
//! ([`RedisCluster::master_of_key`]), its replicas, a direct connection to any node, killing a
//! node with SIGKILL and promoting its replica ([`RedisCluster::fail_over`]), and
//! restarting a killed node so it rejoins ([`RedisCluster::restart_node`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// Nodes per cluster: three masters, three replicas.
pub const NODES: u16 = 6;
/// How long a cluster may take to start or to settle after a failover.
const SETTLE: Duration = Duration::from_secs(30);

/// One line of `CLUSTER NODES`, as far as the helpers need it.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The node is marked failed (or possibly failed) by the node asked.
    pub failed: bool,
    /// For a replica, its master's id.
    pub master_id: Option<String>,
    /// Slot ranges, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl Node {
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
    }
}

pub struct RedisCluster {
    dir: tempfile::TempDir,
    /// The first node's port; the others follow it.
    pub base_port: u16,
    /// With TLS: the CA file the nodes' certificates chain to.
    tls_ca: Option<PathBuf>,
    /// What the script was given beyond the directory and port, for restarting a node.
    server_args: Vec<String>,
    script_env: Vec<(String, String)>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/redis-cluster.sh")
}

/// A base port whose six ports and six cluster-bus ports (port + 10000) are free. Drawn from
/// 10000..22000 so both ranges stay below the kernel's ephemeral ports (32768 and up), where
/// `free_port` and outgoing connections take theirs; a counter spreads tests of one process.
fn candidate_base() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let spread = (std::process::id() as u64).wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    let slot = (spread + NEXT.fetch_add(1, Ordering::Relaxed) as u64 * 7) % 2000;
    10_000 + (slot as u16) * NODES
}

fn ports_free(base: u16) -> bool {
    (0..NODES).all(|i| {
        [base + i, base + i + 10_000]
            .iter()
            .all(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
    })
}

impl RedisCluster {
    /// Starts a cluster and returns once every node reports `cluster_state:ok` and every
    /// replica is in sync (a few seconds). Retries on other ports if another test took the
    /// chosen ones meanwhile.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// [`RedisCluster::start`] with TLS only on every port (clients, cluster bus,
    /// replication): the nodes' certificate is issued by `ca` for 127.0.0.1, and clients
    /// need not present one. The URL is then `rediss+cluster://`.
    pub fn start_tls(ca: &super::certs::TestCa) -> Self {
        Self::start_with(Some(ca))
    }

    fn start_with(ca: Option<&super::certs::TestCa>) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let base = candidate_base();
            if !ports_free(base) {
                continue;
            }
            let dir = tempfile::Builder::new()
                .prefix("redis-cluster-")
                .tempdir()
                .expect("tempdir");
            let mut server_args = Vec::new();
            let mut script_env = Vec::new();
            if let Some(ca) = ca {
                let server = ca.server("redis-cluster", &["127.0.0.1", "localhost"]);
                // Nodes connecting to each other's bus must show a client certificate.
                let node_client = ca.client("redis-cluster-node");
                server_args = vec![
                    "--tls-client-cert-file".into(),
                    node_client.cert_file.display().to_string(),
                    "--tls-client-key-file".into(),
                    node_client.key_file.display().to_string(),
                    "--tls-cert-file".into(),
                    server.cert_file.display().to_string(),
                    "--tls-key-file".into(),
                    server.key_file.display().to_string(),
                    "--tls-ca-cert-file".into(),
                    ca.ca_file.display().to_string(),
                    "--tls-auth-clients".into(),
                    "no".into(),
                ];
                script_env = vec![
                    ("REDIS_CLUSTER_TLS".into(), "1".into()),
                    (
                        "REDIS_CLUSTER_CLI_ARGS".into(),
                        format!("--cacert {}", ca.ca_file.display()),
                    ),
                ];
            }
            let out = Command::new(script())
                .arg("start")
                .arg(dir.path())
                .arg(base.to_string())
                .args(&server_args)
                .envs(script_env.iter().cloned())
                .output()
                .expect("run scripts/redis-cluster.sh");
            if out.status.success() {
                return RedisCluster {
                    dir,
                    base_port: base,
                    tls_ca: ca.map(|ca| ca.ca_file.clone()),
                    server_args,
                    script_env,
                };
            }
            last_error = String::from_utf8_lossy(&out.stderr).into_owned();
        }
        panic!("could not start a Redis Cluster: {last_error}");
    }

    /// `redis+cluster://127.0.0.1:P1,...,127.0.0.1:P6`: every node as a seed, so the
    /// application can connect while any one of them is down.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls_ca.is_some() {
            "rediss+cluster"
        } else {
            "redis+cluster"
        };
        format!("{scheme}://{}", nodes.join(","))
    }

    /// The six node ports.
    pub fn ports(&self) -> Vec<u16> {
        (0..NODES).map(|i| self.base_port + i).collect()
    }

    /// Where the nodes' logs, pidfiles and nodes files are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` with TLS): one node, not the cluster.
    pub fn node_url(&self, port: u16) -> String {
        let scheme = if self.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{port}")
    }

    fn node_client(&self, port: u16) -> redis::RedisResult<redis::Client> {
        let url = self.node_url(port);
        match &self.tls_ca {
            None => redis::Client::open(url),
            Some(ca) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).expect("read CA")),
                },
            ),
        }
    }

    /// A connection to one node (commands for other slots answer MOVED).
    pub async fn node(&self, port: u16) -> MultiplexedConnection {
        self.node_client(port)
            .expect("node url")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to node {port}: {e}"))
    }

    async fn try_node(&self, port: u16) -> Option<MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        self.node_client(port)
            .ok()?
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()
    }

    /// Whether a node answers PING.
    pub async fn answers(&self, port: u16) -> bool {
        match self.try_node(port).await {
            Some(mut c) => redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok(),
            None => false,
        }
    }

    /// The slot of `key` (hash tags honoured), as the cluster computes it.
    pub async fn slot_of(&self, key: &str) -> u16 {
        let mut conn = self.any_node().await;
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("CLUSTER KEYSLOT")
    }

    /// A connection to the first node that answers.
    async fn any_node(&self) -> MultiplexedConnection {
        for port in self.ports() {
            if let Some(conn) = self.try_node(port).await {
                return conn;
            }
        }
        panic!(
            "no node of the cluster answers (logs in {})",
            self.dir().display()
        );
    }

    /// The cluster's nodes as the first answering node sees them.
    pub async fn nodes(&self) -> Vec<Node> {
        let mut conn = self.any_node().await;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .expect("CLUSTER NODES");
        text.lines().filter_map(parse_node).collect()
    }

    /// The port of the live master owning `slot`.
    pub async fn master_of_slot(&self, slot: u16) -> u16 {
        self.nodes()
            .await
            .into_iter()
            .find(|n| n.master && !n.failed && n.owns(slot))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no live master owns slot {slot}"))
    }

    /// The port of the live master owning `key`'s slot.
    pub async fn master_of_key(&self, key: &str) -> u16 {
        let slot = self.slot_of(key).await;
        self.master_of_slot(slot).await
    }

    /// The ports of the live replicas of the master on `master_port`.
    pub async fn replicas_of(&self, master_port: u16) -> Vec<u16> {
        let nodes = self.nodes().await;
        let Some(master) = nodes.iter().find(|n| n.port == master_port) else {
            panic!("no node on port {master_port}");
        };
        nodes
            .iter()
            .filter(|n| !n.failed && n.master_id.as_deref() == Some(master.id.as_str()))
            .map(|n| n.port)
            .collect()
    }

    /// SIGKILL the node on `port` (its pidfile names it); nothing else is signalled.
    pub fn kill_node(&self, port: u16) {
        let pidfile = self.dir().join(format!("redis-{port}.pid"));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("{}: {e}", pidfile.display()))
            .trim()
            .parse()
            .expect("pid");
        // SAFETY: kill(2) on a pid this cluster started; no memory is involved.
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(rc, 0, "kill -9 {pid} (node {port})");
        let _ = std::fs::remove_file(&pidfile);
        // The port is free once the process is gone.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(
                std::time::Instant::now() < until,
                "node {port} survived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the master on `master_port` with SIGKILL and promotes one of its replicas with
    /// `CLUSTER FAILOVER TAKEOVER` (no vote needed, so it is immediate even while the failure
    /// is not yet agreed on). Returns once the replica is a master owning the old master's
    /// slots in every live node's view and every live node says `cluster_state:ok`; returns
    /// the new master's port. Writes the old master had not yet sent to its replica are lost,
    /// as in a real failover: that is what the caller's test is about.
    pub async fn fail_over(&self, master_port: u16) -> u16 {
        let replica = *self
            .replicas_of(master_port)
            .await
            .first()
            .unwrap_or_else(|| panic!("master {master_port} has no live replica"));
        let slots = self
            .nodes()
            .await
            .into_iter()
            .find(|n| n.port == master_port)
            .map(|n| n.slots)
            .unwrap_or_default();
        self.kill_node(master_port);
        let mut conn = self.node(replica).await;
        let reply: redis::RedisResult<String> = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .arg("TAKEOVER")
            .query_async(&mut conn)
            .await;
        if let Err(e) = reply {
            // The cluster may have promoted it on its own already (node timeout 1 s).
            let role: Vec<redis::Value> = redis::cmd("ROLE")
                .query_async(&mut conn)
                .await
                .expect("ROLE");
            let is_master =
                matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
            assert!(is_master, "CLUSTER FAILOVER TAKEOVER on {replica}: {e}");
        }
        let first_slot = slots.first().map(|&(lo, _)| lo);
        let settled = super::eventually_every(SETTLE, Duration::from_millis(100), || async {
            self.agree_on_master(replica, first_slot).await && self.ok_everywhere().await
        })
        .await;
        assert!(
            settled,
            "after killing {master_port}, {replica} did not become master everywhere (logs in {})",
            self.dir().display()
        );
        replica
    }

    /// Starts a killed node again; it rejoins as a replica of whichever node took its slots.
    /// Returns once it answers and the cluster is ok.
    pub async fn restart_node(&self, port: u16) {
        let out = Command::new(script())
            .arg("restart-node")
            .arg(self.dir())
            .arg(port.to_string())
            .args(&self.server_args)
            .envs(self.script_env.iter().cloned())
            .output()
            .expect("run scripts/redis-cluster.sh");
        assert!(
            out.status.success(),
            "restart node {port}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_ok().await;
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub async fn wait_ok(&self) {
        let ok =
            super::eventually_every(SETTLE, Duration::from_millis(100), || self.ok_everywhere())
                .await;
        assert!(ok, "cluster not ok (logs in {})", self.dir().display());
    }

    async fn ok_everywhere(&self) -> bool {
        for port in self.ports() {
            let Some(mut conn) = self.try_node(port).await else {
                continue; // killed
            };
            let info: String = match redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await
            {
                Ok(info) => info,
                Err(_) => return false,
            };
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return false;
            }
        }
        true
    }

    /// Every live node sees `port` as a live master (owning `slot`, when given).
    async fn agree_on_master(&self, port: u16, slot: Option<u16>) -> bool {
        for asked in self.ports() {
            let Some(mut conn) = self.try_node(asked).await else {
                continue;
            };
            let Ok(text) = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut conn)
                .await
            else {
                return false;
            };
            let promoted = text
                .lines()
                .filter_map(parse_node)
                .any(|n| n.port == port && n.master && !n.failed && slot.is_none_or(|s| n.owns(s)));
            if !promoted {
                return false;
            }
        }
        true
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// `<id> <ip:port@bus[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`
fn parse_node(line: &str) -> Option<Node> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?.to_owned();
    let addr = fields.next()?;
    let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
    let flags = fields.next()?;
    let master_id = fields.next()?;
    let rest: Vec<&str> = fields.skip(4).collect();
    let slots = rest
        .iter()
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => s.parse().ok().map(|one| (one, one)),
        })
        .collect();
    Some(Node {
        id,
        port,
        master: flags.split(',').any(|f| f == "master"),
        failed: flags.split(',').any(|f| f == "fail" || f == "fail?"),
        master_id: (master_id != "-").then(|| master_id.to_owned()),
        slots,
    })
}
