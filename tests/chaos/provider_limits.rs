//! Provider limits shared by every process (`docs/tenants.md`, "Provider limits"), against
//! real worker processes and a fake model that records when each request arrived:
//! - two workers of four consumers keep one `rpm` together, so the fake, metering as a
//!   provider would, never has a request to refuse;
//! - one 429 with `Retry-After: 5` keeps every process away from the model for 5 s;
//! - with the model down, the fleet makes one probe per cooldown, and a worker started
//!   during the outage makes no job call.

use std::time::{Duration, Instant};

use crate::harness::load::Load;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions, eventually};

const MODEL: &str = "openai:gpt-4.1-mini";

/// Two workers, four consumers each: eight calls could go at once.
const WORKERS: usize = 2;
const CONSUMERS: usize = 4;

async fn metrics(base_url: &str) -> String {
    reqwest::get(format!("{base_url}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_keep_one_rpm_together_and_the_model_never_has_to_refuse() {
    const RPM: u32 = 60;
    const JOBS: usize = 24;
    let world = World::new(
        "rpm",
        WorldOptions {
            model: ModelBehavior::fast(),
            env: vec![("SUMMARYD_LLM_RPM", RPM.to_string())],
            ..Default::default()
        },
    )
    .await;
    // The limiter's burst is a tenth of the minute (6); one more for requests whose trip
    // to the fake took longer than the one admitted after them.
    world.model.enforce_rpm(RPM, RPM / 10 + 1);
    let deployment = world.spawn_split(WORKERS, CONSUMERS).await;
    let client = &deployment.client;
    // Submitted at once: eight consumers against a 5–30 ms model would send them all
    // within a second without the limiter.
    let load = Load::start(
        client,
        &format!("rpm-{}", crate::run_id()),
        JOBS,
        Duration::from_millis(500),
        10,
    );
    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, client).await;
    assert_eq!(report.jobs, JOBS);
    assert_eq!(
        world.model.over_limit(),
        0,
        "the model saw more than {RPM}/min (burst {}) from the fleet",
        RPM / 10
    );
    // The limit, not chance, spread them: calls waited, in both processes' counters.
    let waited =
        format!(r#"summaryd_llm_limit_waits_total{{provider="{MODEL}",reason="requests"}}"#);
    let mut processes_that_waited = 0;
    for worker in &deployment.workers {
        if metrics(&worker.base_url()).await.contains(&waited) {
            processes_that_waited += 1;
        }
    }
    assert!(processes_that_waited >= 1, "no call waited for its slot");
    println!(
        "rpm {RPM}: {JOBS} jobs, {} model calls, {processes_that_waited} processes waited; {report}",
        world.model.total_calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_retry_after_keeps_every_process_away_for_as_long_as_it_says() {
    const JOBS: usize = 30;
    const RETRY_AFTER: Duration = Duration::from_secs(5);
    /// Calls already on their way when the 429 was answered (admitted before it was
    /// shared) may still arrive this soon after it.
    const IN_FLIGHT: Duration = Duration::from_secs(1);
    let world = World::new(
        "retry-after",
        WorldOptions {
            model: ModelBehavior::fast(),
            ..Default::default()
        },
    )
    .await;
    let deployment = world.spawn_split(WORKERS, CONSUMERS).await;
    let client = &deployment.client;
    world.model.throttle_once(5, RETRY_AFTER.as_secs());
    // Spread over 3 s, so jobs keep arriving while the provider asked everyone to wait.
    let load = Load::start(
        client,
        &format!("ra-{}", crate::run_id()),
        JOBS,
        Duration::from_secs(3),
        10,
    );
    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, client).await;
    assert_eq!(report.jobs, JOBS);
    let throttled = world.model.throttled_at().expect("the 429 was answered");
    let calls = world.model.job_call_times();
    let too_soon: Vec<Duration> = calls
        .iter()
        .filter(|at| **at > throttled + IN_FLIGHT)
        .map(|at| at.duration_since(throttled))
        .filter(|after| *after + Duration::from_millis(50) < RETRY_AFTER)
        .collect();
    assert!(
        too_soon.is_empty(),
        "calls {too_soon:?} after the 429 asked for {RETRY_AFTER:?}"
    );
    let after = calls.iter().filter(|at| **at > throttled).count();
    assert!(after > 0, "the jobs after the 429 were summarised after it");
    println!(
        "retry-after: {JOBS} jobs, {} calls, {after} after the 429; {report}",
        calls.len()
    );
}

/// The most probes one schedule makes in `window`: cooldowns of 1, 2, 4, 8, 8, … s.
fn probe_bound(window: Duration, cooldown: Duration) -> usize {
    let (mut at, mut step, mut probes) = (Duration::ZERO, cooldown, 0);
    loop {
        at += step;
        if at > window {
            return probes;
        }
        probes += 1;
        step = (step * 2).min(cooldown * 8);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_an_outage_the_fleet_probes_once_per_cooldown_and_a_new_worker_takes_no_job() {
    const COOLDOWN: Duration = Duration::from_secs(1);
    const WATCH: Duration = Duration::from_secs(8);
    let world = World::new(
        "shared-breaker",
        WorldOptions {
            model: ModelBehavior::down(),
            env: vec![
                ("SUMMARYD_LLM_BREAKER_FAILURES", "2".into()),
                (
                    "SUMMARYD_LLM_BREAKER_COOLDOWN_MS",
                    COOLDOWN.as_millis().to_string(),
                ),
            ],
            ..Default::default()
        },
    )
    .await;
    let deployment = world.spawn_split(WORKERS, 2).await;
    let client = &deployment.client;
    let run = crate::run_id();
    let first = Load::start(client, &format!("sb1-{run}"), 4, Duration::ZERO, 0)
        .finish()
        .await;
    assert_eq!(first.len(), 4);
    let started = Instant::now();
    // The first breaker to open publishes it.
    let breaker = format!("{}llm:{{{MODEL}}}:breaker", world.key_prefix);
    let mut redis = world.redis_conn().await;
    let published = eventually(Duration::from_secs(30), || {
        let key = breaker.clone();
        let mut redis = redis.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(&key)
                .query_async::<bool>(&mut redis)
                .await
                .unwrap_or(false)
        }
    })
    .await;
    assert!(published, "no process published its open breaker");
    // Every running worker holds it open (its own failures, or the record read within a
    // second): the fleet is in outage mode before the late worker starts.
    let open_line = format!(r#"summaryd_llm_breaker_open{{provider="{MODEL}"}} 1"#);
    for worker in &deployment.workers {
        let url = worker.base_url();
        let open = eventually(Duration::from_secs(10), || {
            let (url, line) = (url.clone(), open_line.clone());
            async move { metrics(&url).await.contains(&line) }
        })
        .await;
        assert!(open, "{url}: breaker not open");
    }
    // A worker started now reads the fleet's breaker before it takes anything.
    let _late = world
        .spawn("worker-late", "worker", &["--consumers", "2"])
        .await;
    let calls_before = world.model.total_calls();
    let more = Load::start(client, &format!("sb2-{run}"), 3, Duration::ZERO, 0)
        .finish()
        .await;
    assert_eq!(more.len(), 3);
    tokio::time::sleep(WATCH).await;
    assert_eq!(
        world.model.total_calls(),
        calls_before,
        "a job call was made after the breaker was open fleet-wide (the late worker's?)"
    );
    let record: Option<String> = redis::cmd("GET")
        .arg(&breaker)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(record.is_some(), "still open while the model is down");
    let probes = world.model.probe_times().len();
    // One schedule for the fleet, plus one confirmation by each first worker whose own
    // calls opened its breaker (`docs/providers.md`); the late one opened nothing itself.
    let bound = probe_bound(started.elapsed(), COOLDOWN) + WORKERS;
    assert!(
        (1..=bound).contains(&probes),
        "{probes} probes in {:?}, at most {bound}",
        started.elapsed()
    );
    assert_eq!(world.dead_letters().await, 0);
    println!(
        "shared breaker: {calls_before} job calls before the breaker opened, none after; \
         {probes} probes in {:?} (bound {bound})",
        started.elapsed()
    );
}

#[test]
fn the_probe_bound_follows_the_cooldown_schedule() {
    let s = Duration::from_secs(1);
    assert_eq!(probe_bound(Duration::from_millis(900), s), 0);
    assert_eq!(probe_bound(Duration::from_secs(3), s), 2);
    assert_eq!(probe_bound(Duration::from_secs(10), s), 3);
    assert_eq!(probe_bound(Duration::from_secs(15), s), 4);
}
