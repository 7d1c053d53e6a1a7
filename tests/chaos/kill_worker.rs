//! kill -9 a worker process while it holds messages, with three tenants of different sizes
//! queued in their lanes (fair scheduling moves each job onto the stream when dispatched).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::harness::client::ApiClient;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions, eventually};

/// Slow enough that the worker is surely mid-call when killed, well under the claim idle
/// time so the second worker never reclaims its own live work.
const MODEL_MS: u64 = 1_000;
const CLAIM_IDLE_MS: &str = "3000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_jobs_are_reclaimed_by_another_process_and_done_once() {
    let world = World::new(
        "kill-worker",
        WorldOptions {
            model: ModelBehavior::slow(MODEL_MS),
            env: vec![("SUMMARYD_WORKER_CLAIM_IDLE_MS", CLAIM_IDLE_MS.into())],
            ..Default::default()
        },
    )
    .await;
    let api = world.spawn("api", "api", &[]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let mut worker_a = world
        .spawn("worker-a", "worker", &["--consumers", "3"])
        .await;
    let client = ApiClient::new(api.base_url());

    let run = crate::run_id();
    let mut accepted = Vec::new();
    // Three tenants of different sizes: 6, 3 and 1 jobs.
    for (tenant, jobs) in [("chaos", 6), ("chaos-mid", 3), ("chaos-small", 1)] {
        let as_tenant = client.as_tenant(tenant);
        for i in 0..jobs {
            let key = format!("kill-{run}-{tenant}-{i:03}");
            accepted.push(as_tenant.submit(&key, &key).await);
        }
    }
    // Worker A's three consumers each hold one job in a model call; seven wait in lanes.
    assert!(
        eventually(Duration::from_secs(15), || async {
            world.model.in_flight() == 3
        })
        .await,
        "worker A never held three jobs; in flight: {}",
        world.model.in_flight()
    );
    let held: BTreeSet<String> = world.model.calls().keys().cloned().collect();
    assert_eq!(held.len(), 3, "three distinct jobs in worker A's hands");

    worker_a.kill9();
    assert_eq!(world.count("SELECT count(*) FROM summaries").await, 0);
    assert_eq!(
        world.stream_pending().await,
        3,
        "the dead worker's deliveries stay pending"
    );

    let _worker_b = world
        .spawn("worker-b", "worker", &["--consumers", "3"])
        .await;
    let report = world.assert_exactly_once(&accepted, &client).await;

    // The held jobs were paid for twice (A's lost call, then B's after XAUTOCLAIM); the
    // others once. Nothing else called the model.
    let calls = world.model.calls();
    assert_eq!(calls.len(), 10);
    for (marker, n) in &calls {
        let expected = if held.contains(marker) { 2 } else { 1 };
        assert_eq!(*n, expected, "model calls for {marker}");
    }
    assert_eq!(report.distinct_sends, 10);
    println!("kill -9 worker: {report}");
}
