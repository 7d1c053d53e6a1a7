//! A model outage of two minutes against the real binary: every provider call answers 503
//! (probes included), with two deliveries per job and a one-second claim idle. The breaker
//! opens after a few failures, the workers stop taking jobs, and only probes reach the
//! provider until it is back; then every job is done, once, with one email each
//! (`docs/providers.md`, Outage mode).

use std::time::{Duration, Instant};

use crate::harness::load::Load;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions};

const JOBS: usize = 40;
const OUTAGE: Duration = Duration::from_secs(120);
const WORKERS: usize = 2;
const CONSUMERS: usize = 2;
const BREAKER_FAILURES: usize = 5;
const COOLDOWN: Duration = Duration::from_secs(2);
/// The cooldown doubles while probes fail, up to this many times the first.
const COOLDOWN_GROWTH_CAP: u32 = 8;

/// The most probes one process can send in `window`: cooldowns of 2, 4, 8, 16, 16, … s.
fn probe_bound(window: Duration) -> usize {
    let mut at = Duration::ZERO;
    let mut step = COOLDOWN;
    let mut probes = 0;
    loop {
        at += step;
        if at > window {
            return probes;
        }
        probes += 1;
        step = (step * 2).min(COOLDOWN * COOLDOWN_GROWTH_CAP);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_minute_model_outage_dead_letters_nothing_and_only_probes_reach_the_model() {
    let world = World::new(
        "model-outage",
        WorldOptions {
            model: ModelBehavior::down(),
            env: vec![
                // Two deliveries and a short claim idle: an outage that spent deliveries
                // would dead-letter every job within seconds.
                ("SUMMARYD_WORKER_MAX_DELIVERIES", "2".into()),
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "1000".into()),
                (
                    "SUMMARYD_LLM_BREAKER_FAILURES",
                    BREAKER_FAILURES.to_string(),
                ),
                (
                    "SUMMARYD_LLM_BREAKER_COOLDOWN_MS",
                    COOLDOWN.as_millis().to_string(),
                ),
            ],
            ..Default::default()
        },
    )
    .await;
    let deployment = world.spawn_split(WORKERS, CONSUMERS).await;
    let client = &deployment.client;
    let started = Instant::now();
    let load = Load::start(
        client,
        &format!("mo-{}", crate::run_id()),
        JOBS,
        Duration::from_secs(5),
        10,
    );

    // Real time on purpose: the outage is a window in which nothing may be dead-lettered,
    // and the probe bound is a count over the cooldowns that really passed.
    tokio::time::sleep(OUTAGE / 2).await;
    // Mid-outage: the workers are ready (an outage is not the pod's fault) and say why they wait.
    let http = reqwest::Client::new();
    let readyz = http
        .get(format!("{}/readyz", deployment.workers[0].base_url()))
        .send()
        .await
        .expect("readyz");
    assert_eq!(readyz.status(), 200);
    let body: serde_json::Value = readyz.json().await.expect("readyz body");
    let check = body["checks"]["model:openai:gpt-4.1-mini"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(check.contains("breaker open"), "{body}");
    tokio::time::sleep(OUTAGE.saturating_sub(started.elapsed())).await;

    let job_calls = world.model.total_calls();
    let probes = world.model.probes();
    let dead = world.dead_letters().await;
    assert_eq!(dead, 0, "nothing dead-lettered during the outage");
    // Before each process's breaker opened: its threshold, plus calls its other consumers
    // had already started.
    let job_call_bound = WORKERS * (BREAKER_FAILURES + CONSUMERS);
    assert!(
        job_calls <= job_call_bound,
        "job calls during the outage {job_calls} > {job_call_bound}"
    );
    // The cooldown's probes, plus one confirmation per process when the calls of a
    // delivery opened its breaker (`docs/delivery.md`).
    let probe_limit = WORKERS * (probe_bound(started.elapsed()) + 1);
    assert!(
        (1..=probe_limit).contains(&probes),
        "probes {probes}, at most {probe_limit}"
    );
    assert_eq!(
        world.count("SELECT count(*) FROM summaries").await,
        0,
        "no job was summarised while the model was down"
    );

    world.model.set_behavior(ModelBehavior::fast());
    let back = Instant::now();
    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, client).await;
    assert_eq!(report.jobs, JOBS);
    assert_eq!(report.distinct_sends, JOBS);
    println!(
        "model outage: {JOBS} jobs, {:?} of 503s; during it {job_calls} job calls \
         (bound {job_call_bound}) and {probes} probes (bound {probe_limit}), dead letters {dead}; \
         all done {:?} after recovery; {report}",
        OUTAGE,
        back.elapsed()
    );
}

#[test]
fn the_probe_bound_follows_the_cooldown_schedule() {
    assert_eq!(probe_bound(Duration::from_secs(1)), 0);
    assert_eq!(probe_bound(Duration::from_secs(2)), 1);
    // 2, 6, 14, 30, 46, …: one every 16 s after the fourth.
    assert_eq!(probe_bound(Duration::from_secs(30)), 4);
    assert_eq!(probe_bound(Duration::from_secs(46)), 5);
}
