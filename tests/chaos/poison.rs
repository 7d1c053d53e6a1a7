//! A poisonous job among 300: the model (behind a guardrail) answers 403 for its text and
//! nothing else, across processes, with a worker SIGKILLed once mid-run. The 300 finish
//! exactly once while the breaker's cooldown (30 s by default) could not even pass once,
//! and the poisonous one is dead-lettered after its deliveries, its `summary.failed`
//! webhook accepted once.

use std::time::{Duration, Instant};

use crate::harness::client::ApiClient;
use crate::harness::load::Load;
use crate::harness::process::stop_all;
use crate::harness::{World, WorldOptions};

const JOBS: usize = 300;
const STOP_WITHIN: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisonous_job_among_300_is_dead_lettered_and_the_rest_are_done_once() {
    let started = Instant::now();
    let world = World::new(
        "poison",
        WorldOptions {
            env: vec![
                ("SUMMARYD_WORKER_MAX_DELIVERIES", "3".into()),
                // A counted retry waits at most half of this.
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "2000".into()),
            ],
            ..Default::default()
        },
    )
    .await;
    let mut api = world.spawn("api", "api", &[]).await;
    let mut worker_a = world
        .spawn("worker-a", "worker", &["--consumers", "3"])
        .await;
    let mut worker_b = world
        .spawn("worker-b", "worker", &["--consumers", "3"])
        .await;
    let mut relay = world.spawn("relay", "relay", &[]).await;
    let client = ApiClient::new(api.base_url());

    let run = crate::run_id();
    let poison_key = format!("poison-{run}-guarded");
    world.model.refuse(&poison_key, 403);
    let poison = client
        .clone()
        .with_webhook(world.webhooks.url())
        .submit(&poison_key, &poison_key)
        .await;
    let load = Load::start(
        &client,
        &format!("poison-{run}"),
        JOBS,
        Duration::from_secs(15),
        0,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    worker_a.kill9();
    worker_a = world
        .spawn("worker-a", "worker", &["--consumers", "3"])
        .await;
    let accepted = load.finish().await;
    let report = world
        .assert_exactly_once_but(&accepted, std::slice::from_ref(&poison), &client)
        .await;
    let poison_calls = world.model.calls().get(&poison_key).copied().unwrap_or(0);
    stop_all(
        &mut [&mut api, &mut worker_a, &mut worker_b, &mut relay],
        STOP_WITHIN,
    )
    .await;
    assert_eq!(report.jobs, JOBS);
    assert_eq!(
        report.webhooks.distinct, 1,
        "the poisonous job's summary.failed"
    );
    // Three counted deliveries (one call each: a 403 ends a delivery), and one more for a
    // delivery the SIGKILL cut short.
    assert!(
        (3..=4).contains(&poison_calls),
        "{poison_calls} calls for the poisonous job"
    );
    println!(
        "poison: {report}; poisonous job's calls {poison_calls}; wall {:?}",
        started.elapsed()
    );
}
