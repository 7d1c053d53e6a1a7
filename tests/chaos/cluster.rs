//! The pipeline on a private Redis Cluster (three primaries with a replica each) with three
//! shards (`SUMMARYD_STREAM_SHARDS=3`), the tenants of the load spread over all of them:
//! a worker SIGKILLed mid-run; a shard's primary SIGKILLed and its replica promoted while
//! jobs are being accepted with `SUMMARYD_REDIS_MIN_REPLICAS_ACK=1`; and the window that
//! setting closes, measured: accepts a primary never sent to its replica are lost in a
//! failover with `MIN_REPLICAS_ACK=0`, and answered 503 (then accepted again after the
//! failover, and done once) with `MIN_REPLICAS_ACK=1`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::client::{Accepted, ApiClient};
use crate::harness::load::Load;
use crate::harness::process::Proc;
use crate::harness::{World, WorldOptions, eventually, eventually_every};
use crate::shared::redis_cluster::RedisCluster;

const SHARDS: u16 = 3;
/// One tenant of each shard of three (`Shards::of_tenant`; pinned in `tenants_cover_shards`).
const TENANTS: [(&str, u16); 3] = [("acme", 0), ("globex", 1), ("umbrella", 2)];
/// The tenant whose shard, 0, the failovers are about.
const SHARD0_TENANT: &str = "acme";
/// How long a failover may take to be agreed on by every node.
const SETTLE: Duration = Duration::from_secs(30);

fn tenant_of(i: usize) -> Option<&'static str> {
    Some(TENANTS[i % TENANTS.len()].0)
}

async fn cluster_world(name: &str, env: Vec<(&'static str, String)>) -> World {
    let mut all = vec![("SUMMARYD_STREAM_SHARDS", SHARDS.to_string())];
    all.extend(env);
    let world = World::new(
        name,
        WorldOptions {
            cluster: true,
            env: all,
            ..Default::default()
        },
    )
    .await;
    for (tenant, shard) in TENANTS {
        assert_eq!(world.shards().of_tenant(tenant).shard(), shard, "{tenant}");
    }
    world
}

fn cluster(world: &World) -> &RedisCluster {
    world.cluster.as_ref().expect("a cluster world")
}

/// An api, a relay and two workers (three consumers each) on `world`, and `jobs` posted
/// over `over` across every shard's tenant; returned once 30 are done, so whatever the
/// scenario does next happens mid-run, with work of every shard in hand.
struct Fleet {
    _api: Proc,
    _relay: Proc,
    workers: Vec<Proc>,
    client: ApiClient,
    load: Load,
}

async fn fleet_under_load(world: &World, prefix: &str, jobs: usize, over: Duration) -> Fleet {
    let api = world.spawn("api", "api", &[]).await;
    let relay = world.spawn("relay", "relay", &[]).await;
    let mut workers = Vec::new();
    for n in 0..2 {
        let name = format!("worker-{n}");
        workers.push(world.spawn(&name, "worker", &["--consumers", "3"]).await);
    }
    let client = ApiClient::new(api.base_url());
    let prefix = format!("{prefix}-{}", crate::run_id());
    let load = Load::start_shaped(
        &client,
        &prefix,
        jobs,
        over,
        10,
        Arc::new(|_| None),
        Arc::new(tenant_of),
    );
    assert!(
        eventually(Duration::from_secs(30), || async {
            world.count("SELECT count(*) FROM summaries").await >= 30
        })
        .await,
        "no progress under load"
    );
    Fleet {
        _api: api,
        _relay: relay,
        workers,
        client,
        load,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sigkilled_worker_loses_nothing_and_duplicates_nothing() {
    const JOBS: usize = 300;
    let started = Instant::now();
    let world = cluster_world("cluster-kill-worker", Vec::new()).await;
    let mut fleet = fleet_under_load(&world, "ckill", JOBS, Duration::from_secs(6)).await;
    fleet.workers[0].kill9();
    let _replacement = world
        .spawn("worker-2", "worker", &["--consumers", "3"])
        .await;
    let accepted = fleet.load.finish().await;
    let report = world.assert_exactly_once(&accepted, &fleet.client).await;
    assert_eq!(report.jobs, JOBS);
    println!(
        "cluster kill -9 worker: {report}; wall {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_of_a_shards_primary_under_load_with_replica_acks_loses_nothing() {
    const JOBS: usize = 500;
    let started = Instant::now();
    let world = cluster_world(
        "cluster-failover",
        vec![
            ("SUMMARYD_REDIS_MIN_REPLICAS_ACK", "1".into()),
            ("SUMMARYD_REDIS_ACK_TIMEOUT_MS", "300".into()),
        ],
    )
    .await;
    let cluster = cluster(&world);
    let primary = cluster.master_of_key("{s0}").await;
    let fleet_started = Instant::now();
    let fleet = fleet_under_load(&world, "cfail", JOBS, Duration::from_secs(8)).await;
    let promoted = cluster.fail_over(primary).await;
    let failed_over_at = fleet_started.elapsed();
    // The promoted primary has no replica to confirm shard 0's accepts until the old one
    // rejoins as its replica: until then they are answered 503 and retried.
    cluster.restart_node(primary).await;
    let accepted = fleet.load.finish().await;
    let report = world.assert_exactly_once(&accepted, &fleet.client).await;
    assert_eq!(report.jobs, JOBS);
    println!(
        "cluster failover (ACK=1): primary {primary} of {{s0}} killed and {promoted} promoted \
         {failed_over_at:?} after the fleet started (8 s of load); {report}; wall {:?}",
        started.elapsed()
    );
}

/// What one run of the replication window gave.
struct Window {
    /// Shard-0 jobs posted while the primary could not reach its replica.
    posted: usize,
    /// Of those, answered 202 and never summarised.
    lost: usize,
    /// 503s the client saw while the replica was cut off.
    refused: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_accepts_lost_in_a_failover_with_ack_0_are_refused_and_kept_with_ack_1() {
    let started = Instant::now();
    let without = replication_window(0, false).await;
    let with = replication_window(1, false).await;
    println!(
        "cluster replication window: MIN_REPLICAS_ACK=0 lost {} of {} accepted jobs; \
         MIN_REPLICAS_ACK=1 lost {} of {} (503s while the replica was cut off: {}); wall {:?}",
        without.lost,
        without.posted,
        with.lost,
        with.posted,
        with.refused,
        started.elapsed()
    );
    assert_eq!(with.lost, 0);
    assert!(with.refused >= with.posted, "every cut-off accept refused");
    assert!(without.lost > 0);
    // The ACK=0 accepts never left the primary, so every one of them is gone.
    assert_eq!(without.lost, without.posted);
}

/// The client retrying through the failover rather than after it: 20 concurrent POSTs of
/// shard 0 while its replica is cut off (each first answered 503, their WAITs queued one
/// behind another on the api's connection to the primary), retried every second while the
/// primary is killed, its replica promoted and the old primary restarted as its replica.
/// Every 202 must still end in a summary. This is the path where a WAIT sent on its own
/// was answered for writes it never covered: the primary died with the WAIT in flight,
/// the cluster client sent it again on a new connection to the promoted replica, where
/// the accept's writes never arrived, and the rejoined replica answered it at once (1, 6
/// and 4 of 20 lost in three runs). The accept's script and its WAIT now travel as one
/// pipeline, resent whole (`stream::replicas::invoke_confirmed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_retries_through_a_failover_with_ack_1_lose_nothing() {
    let with = replication_window(1, true).await;
    println!(
        "cluster retries through a failover: MIN_REPLICAS_ACK=1 lost {} of {} accepted jobs",
        with.lost, with.posted
    );
    assert_eq!(with.lost, 0);
}

fn signal_node(cluster: &RedisCluster, port: u16, signal: i32) {
    let pidfile = cluster.dir().join(format!("redis-{port}.pid"));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("{}: {e}", pidfile.display()))
        .trim()
        .parse()
        .expect("pid");
    // SAFETY: kill(2) on a node this test's cluster started; no memory is involved.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "signal {signal} to {pid} (node {port})");
}

/// Cut shard 0's primary off from its replica (SIGSTOP the replica, then drop its link on
/// the primary, so nothing written from then on is on its way to it), post jobs of shard 0,
/// SIGKILL the primary, resume the replica and promote it; then run workers and a relay
/// and count the accepted jobs never summarised.
///
/// With `through`, the client keeps retrying shard 0's refused jobs during the failover
/// and the old primary's restart instead of after them.
async fn replication_window(ack: u32, through: bool) -> Window {
    const POSTED: usize = 20;
    const CONTROL: usize = 12;
    let world = cluster_world(
        &format!("cluster-window-ack{ack}"),
        vec![
            ("SUMMARYD_REDIS_MIN_REPLICAS_ACK", ack.to_string()),
            ("SUMMARYD_REDIS_ACK_TIMEOUT_MS", "100".into()),
        ],
    )
    .await;
    let api = world.spawn("api", "api", &[]).await;
    let client = ApiClient::new(api.base_url());
    let run = crate::run_id();
    let cluster = cluster(&world);
    let slot = cluster.slot_of("{s0}").await;
    let primary = cluster.master_of_slot(slot).await;
    let replica = cluster.replicas_of(primary).await[0];

    // Jobs of every shard accepted before the cut: they are on the replicas.
    let mut control = Vec::new();
    for i in 0..CONTROL {
        let key = format!("before-{run}-{i:03}");
        let tenant = tenant_of(i).expect("tenant");
        control.push(client.as_tenant(tenant).submit(&key, &key).await);
    }
    let synced = eventually(Duration::from_secs(10), || async {
        replication_offsets(cluster, primary, replica).await
    })
    .await;
    assert!(synced, "replica {replica} never caught up with {primary}");

    signal_node(cluster, replica, libc::SIGSTOP);
    let mut conn = cluster.node(primary).await;
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL TYPE replica");
    assert_eq!(killed, 1, "the primary's one replica link dropped");

    // One POST each while the replica is cut off: with ACK=0 each is answered 202 at once
    // (on the primary alone); with ACK=1 each is answered 503, and so is a retry.
    let shard0 = client.as_tenant(SHARD0_TENANT);
    let keys: Vec<String> = (0..POSTED)
        .map(|i| format!("window-{run}-{i:03}"))
        .collect();
    let mut accepted_in_window = Vec::new();
    let mut refused = 0;
    for key in keys.iter().filter(|_| !through) {
        let body = shard0.body_for(key);
        let tries = if ack == 0 { 1 } else { 2 };
        for _ in 0..tries {
            let (status, retry_after, answer) = shard0.post_once(key, &body).await.expect("POST");
            if ack == 0 {
                assert_eq!(status, 202, "{key}: {answer}");
                accepted_in_window.push(Accepted {
                    key: key.clone(),
                    job_id: answer["job_id"].as_str().expect("job_id").to_owned(),
                    attempts: 1,
                    webhook: false,
                });
            } else {
                assert_eq!(
                    status, 503,
                    "{key} answered with no replica to confirm: {answer}"
                );
                assert!(retry_after.is_some(), "503 without Retry-After");
                refused += 1;
            }
        }
    }

    // Or the client's own retries, every POST's first answer a 503, running on through the
    // failover.
    let retrying: Vec<_> = keys
        .iter()
        .filter(|_| through)
        .map(|key| {
            let (client, key) = (shard0.clone(), key.clone());
            tokio::spawn(async move { client.submit(&key, &key).await })
        })
        .collect();
    if through {
        let cut_off = eventually(Duration::from_secs(20), || async {
            client.outcomes().get("503").copied().unwrap_or(0) >= POSTED
        })
        .await;
        assert!(
            cut_off,
            "shard 0's accepts were not refused: {:?}",
            client.outcomes()
        );
        assert!(
            retrying.iter().all(|t| !t.is_finished()),
            "an accept was answered 202 with no replica to confirm it"
        );
        refused = POSTED;
    }
    cluster.kill_node(primary);
    signal_node(cluster, replica, libc::SIGCONT);
    promote(cluster, replica, slot).await;
    // The old primary rejoins as the promoted one's replica, so shard 0 can confirm again.
    cluster.restart_node(primary).await;
    let rejoined = eventually(SETTLE, || replica_in_sync(cluster, primary)).await;
    assert!(rejoined, "{primary} did not rejoin as a replica");

    let _w0 = world
        .spawn("worker-0", "worker", &["--consumers", "3"])
        .await;
    let _w1 = world
        .spawn("worker-1", "worker", &["--consumers", "3"])
        .await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let mut done = control;
    for task in retrying {
        done.push(task.await.expect("submit"));
    }
    if through {
        // Whatever the retries got, each 202 must end in a summary; one that does not
        // within a minute was lost with the node that took it.
        let all = done.len() as i64;
        eventually(Duration::from_secs(60), || async {
            world.count("SELECT count(*) FROM summaries").await >= all
        })
        .await;
        let summarised = world.count("SELECT count(*) FROM summaries").await;
        if summarised < all {
            return Window {
                posted: POSTED,
                lost: (all - summarised) as usize,
                refused,
            };
        }
    } else if ack > 0 {
        // The client's retries, now that shard 0 has a primary and a replica again.
        for key in &keys {
            done.push(shard0.submit(key, key).await);
        }
    }
    // The ACK=0 window's jobs are not in this list: the check that every listed job is done
    // once is also the check that none of them left any effect (no summary, no email).
    world.assert_exactly_once(&done, &client).await;
    assert!(world.queued_entries().await.is_empty());
    let summarised: BTreeSet<String> = world
        .pg()
        .await
        .query("SELECT job_id::text FROM summaries", &[])
        .await
        .expect("summaries")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let window_jobs: Vec<&Accepted> = if ack == 0 {
        accepted_in_window.iter().collect()
    } else {
        done[CONTROL..].iter().collect()
    };
    let mut lost = 0;
    for job in &window_jobs {
        if !summarised.contains(&job.job_id) {
            lost += 1;
            let (status, body) = client.get(&job.job_id).await;
            assert_eq!(status, 404, "a lost job is unknown: {body}");
        }
    }
    Window {
        posted: window_jobs.len(),
        lost,
        refused,
    }
}

/// The replica has received everything the primary wrote so far.
async fn replication_offsets(cluster: &RedisCluster, primary: u16, replica: u16) -> bool {
    let offset = |port| async move {
        let mut conn = cluster.node(port).await;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("INFO replication");
        info.lines()
            .find_map(|l| {
                l.strip_prefix("master_repl_offset:")
                    .or_else(|| l.strip_prefix("slave_repl_offset:"))
            })
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let (p, r) = (offset(primary).await, offset(replica).await);
    p.is_some() && p == r
}

/// `CLUSTER FAILOVER TAKEOVER` on `replica` (its primary dead), until every live node
/// agrees it owns `slot` and the cluster is ok.
async fn promote(cluster: &RedisCluster, replica: u16, slot: u16) {
    let promoted = eventually_every(SETTLE, Duration::from_millis(200), || async {
        if agreed_master(cluster, replica, slot).await {
            return true;
        }
        let mut conn = cluster.node(replica).await;
        // Refused while the resumed replica still catches up with the cluster's view; the
        // next round asks again.
        let _: redis::RedisResult<String> = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .arg("TAKEOVER")
            .query_async(&mut conn)
            .await;
        false
    })
    .await;
    assert!(
        promoted,
        "{replica} not promoted (logs in {})",
        cluster.dir().display()
    );
    cluster.wait_ok().await;
}

/// Every live node, `port` itself included, sees `port` as a live master owning `slot`.
async fn agreed_master(cluster: &RedisCluster, port: u16, slot: u16) -> bool {
    for asked in cluster.ports() {
        if !cluster.answers(asked).await {
            continue;
        }
        let mut conn = cluster.node(asked).await;
        let Ok(text) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async::<String>(&mut conn)
            .await
        else {
            return false;
        };
        let seen = text.lines().any(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 8
                && f[1]
                    .split('@')
                    .next()
                    .is_some_and(|a| a.ends_with(&format!(":{port}")))
                && f[2].split(',').any(|x| x == "master")
                && !f[2].split(',').any(|x| x == "fail" || x == "fail?")
                && f[8..].iter().any(|r| match r.split_once('-') {
                    Some((lo, hi)) => {
                        lo.parse::<u16>().is_ok_and(|lo| lo <= slot)
                            && hi.parse::<u16>().is_ok_and(|hi| slot <= hi)
                    }
                    None => r.parse::<u16>() == Ok(slot),
                })
        });
        if !seen {
            return false;
        }
    }
    true
}

/// The node on `port` is a replica whose link to its primary is up (its full sync done).
async fn replica_in_sync(cluster: &RedisCluster, port: u16) -> bool {
    let mut conn = cluster.node(port).await;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    info.lines().any(|l| l.trim() == "role:slave")
        && info.lines().any(|l| l.trim() == "master_link_status:up")
}
