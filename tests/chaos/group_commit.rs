//! kill -9 of a worker whose finished jobs are committed together (group commit): once
//! with a batch's transaction in flight, once after its commit with the acknowledgements
//! stalled. Either way every job is done once: no job lost, none summarised twice, no
//! second email.

use std::time::Duration;

use crate::harness::client::ApiClient;
use crate::harness::model_server::ModelBehavior;
use crate::harness::process::Proc;
use crate::harness::{World, WorldOptions, eventually};

const JOBS: usize = 8;
const CONSUMERS: &str = "8";
/// Long enough that the batch gathers every consumer's summary into one transaction.
const COMMIT_WAIT_MS: &str = "1000";
const CLAIM_IDLE_MS: &str = "3000";
const MODEL_MS: u64 = 1_500;

async fn world(name: &str, private_redis: bool) -> World {
    World::new(
        name,
        WorldOptions {
            // Every consumer in a model call at once, so their summaries are ready within
            // the commit wait of each other and meet in one batch.
            model: ModelBehavior::slow(MODEL_MS),
            private_redis,
            env: vec![
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", CLAIM_IDLE_MS.into()),
                ("SUMMARYD_WORKER_COMMIT_WAIT_MS", COMMIT_WAIT_MS.into()),
            ],
            ..Default::default()
        },
    )
    .await
}

/// A batch's INSERT is held by a lock the test takes on `summaries`, so the worker is
/// killed with the batch's transaction open: Postgres rolls it back with the connection,
/// and the next worker redelivers and commits every one of its jobs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_with_a_batch_in_flight_loses_none_of_its_jobs() {
    let world = world("group-commit-in-flight", false).await;
    let (client, accepted, _procs) = accept(&world, "group").await;
    let mut held = BatchHeld::start(&world).await;
    held.worker.kill9();
    held.release().await;
    assert_eq!(world.count("SELECT count(*) FROM summaries").await, 0);

    let _worker_b = world
        .spawn("worker-b", "worker", &["--consumers", CONSUMERS])
        .await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    assert_eq!(report.distinct_sends, JOBS);
    println!(
        "kill -9 with a batch in flight ({} jobs): {report}",
        held.jobs
    );
}

/// The batch commits while Redis stands still (SIGSTOP), so the acknowledgements that
/// follow cannot reach it; the worker is killed then. The next worker reclaims the
/// entries, finds each summary and acknowledges it as a duplicate without calling the
/// model again: one email each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_with_its_acknowledgements_stalled_sends_each_email_once() {
    let world = world("group-commit-acks", true).await;
    let (client, accepted, _procs) = accept(&world, "group-acks").await;
    let mut held = BatchHeld::start(&world).await;
    let redis = world.redis.as_ref().expect("private redis");
    redis.pause(true);
    held.release().await;
    let committed = eventually(Duration::from_secs(20), || async {
        world.count("SELECT count(*) FROM summaries").await == JOBS as i64
    })
    .await;
    assert!(committed, "the batch was not committed");
    held.worker.kill9();
    redis.pause(false);
    assert_eq!(
        world.stream_pending().await,
        JOBS as u64,
        "no acknowledgement reached Redis"
    );

    let _worker_b = world
        .spawn("worker-b", "worker", &["--consumers", CONSUMERS])
        .await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    assert_eq!(report.distinct_sends, JOBS);
    // Each job was paid for once: the reclaiming delivery found the summary first.
    assert!(world.model.calls().values().all(|n| *n == 1));
    println!(
        "kill -9 with the acknowledgements of a {}-job batch stalled: {report}",
        held.jobs
    );
}

/// An api and a relay, and `JOBS` jobs accepted (no worker yet).
async fn accept(
    world: &World,
    prefix: &str,
) -> (ApiClient, Vec<crate::harness::client::Accepted>, Vec<Proc>) {
    let api = world.spawn("api", "api", &[]).await;
    let relay = world.spawn("relay", "relay", &[]).await;
    let client = ApiClient::new(api.base_url());
    let run = crate::run_id();
    let mut accepted = Vec::new();
    for i in 0..JOBS {
        let key = format!("{prefix}-{run}-{i:03}");
        accepted.push(client.submit(&key, &key).await);
    }
    (client, accepted, vec![api, relay])
}

/// Worker A with its first batch's INSERT waiting on a lock the test holds on
/// `summaries` (inserts wait for it; reads do not).
struct BatchHeld {
    /// A session inside the transaction that holds the lock.
    lock: tokio_postgres::Client,
    worker: Proc,
    /// Jobs in the transaction held.
    jobs: f64,
}

impl BatchHeld {
    async fn start(world: &World) -> BatchHeld {
        let lock = world.pg().await;
        lock.batch_execute("BEGIN; LOCK TABLE summaries IN SHARE MODE")
            .await
            .expect("lock summaries");
        let worker = world
            .spawn("worker-a", "worker", &["--consumers", CONSUMERS])
            .await;
        let all_held = eventually(Duration::from_secs(20), || async {
            world.model.in_flight() == JOBS
        })
        .await;
        assert!(all_held, "in flight: {}", world.model.in_flight());
        let waiting = eventually(Duration::from_secs(20), || async {
            world
                .count(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND query LIKE 'INSERT INTO summaries%' AND wait_event_type = 'Lock'",
                )
                .await
                == 1
        })
        .await;
        assert!(waiting, "the batch's insert never waited on the lock");
        let jobs = metric(&worker.base_url(), "summaryd_worker_commit_batch_jobs_sum").await;
        assert!(jobs >= 2.0, "the transaction held carries one job only");
        BatchHeld { lock, worker, jobs }
    }

    /// End the transaction holding the lock: the batch's insert goes on.
    async fn release(&self) {
        self.lock
            .batch_execute("ROLLBACK")
            .await
            .expect("release the lock");
    }
}

/// A sample's value on the process's `/metrics`.
async fn metric(base_url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base_url}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}
