//! A Redis primary with one replica of its own, both private to the test, on loopback:
//! for the tests of `SUMMARYD_REDIS_MIN_REPLICAS_ACK`, which read what reached the replica
//! and stall it to see a write go unconfirmed.

use std::path::Path;
use std::time::Duration;

use super::eventually;
use super::servers::{RedisProc, test_dir};

/// Primary and replica, killed when dropped (SIGKILL ends a frozen one too), their files in
/// a temporary directory.
pub struct ReplicaPair {
    pub primary: RedisProc,
    pub replica: RedisProc,
    _dir: tempfile::TempDir,
}

impl ReplicaPair {
    /// A fresh primary and a replica of it, returned once the replica is in sync.
    pub async fn start(name: &str) -> ReplicaPair {
        let dir = test_dir(name);
        let primary = RedisProc::start(&dir.path().join("primary"), &no_persistence());
        let replica = start_replica(&dir.path().join("replica"), primary.port);
        let pair = ReplicaPair {
            primary,
            replica,
            _dir: dir,
        };
        pair.wait_in_sync().await;
        pair
    }

    /// Until the replica's link is up and the primary counts it online.
    pub async fn wait_in_sync(&self) {
        let replica = self.replica.connection().await;
        let primary = self.primary.connection().await;
        // Multiplexed connections clone cheaply: one per look.
        let synced = eventually(Duration::from_secs(20), || {
            let (mut replica, mut primary) = (replica.clone(), primary.clone());
            async move {
                info(&mut replica, "replication")
                    .await
                    .contains("master_link_status:up")
                    && info(&mut primary, "replication")
                        .await
                        .contains("state=online")
            }
        })
        .await;
        assert!(synced, "the replica did not come in sync with the primary");
    }

    /// Stop the replica's process (SIGSTOP): its connection to the primary stays open, so
    /// the primary still counts it as a replica, but it acknowledges nothing.
    pub fn freeze_replica(&self) {
        signal(&self.replica, libc::SIGSTOP);
    }

    /// Let a frozen replica run again; it catches up from where it stopped.
    pub fn thaw_replica(&self) {
        signal(&self.replica, libc::SIGCONT);
    }
}

fn no_persistence() -> Vec<String> {
    ["--appendonly", "no", "--repl-diskless-sync", "no"]
        .map(String::from)
        .to_vec()
}

fn start_replica(dir: &Path, primary_port: u16) -> RedisProc {
    let mut args = no_persistence();
    args.extend([
        "--replicaof".into(),
        "127.0.0.1".into(),
        primary_port.to_string(),
    ]);
    RedisProc::start(dir, &args)
}

fn signal(server: &RedisProc, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(server.pid()).expect("pid");
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    let done = unsafe { libc::kill(pid, signal) };
    assert_eq!(done, 0, "signal {signal} to redis-server {pid}");
}

/// `INFO section` as text.
pub async fn info(conn: &mut redis::aio::MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO")
}

/// How many WAIT commands the server has run since it started (or since CONFIG RESETSTAT).
pub async fn wait_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let stats = info(conn, "commandstats").await;
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}
