//! One api, three worker and two relay processes; a client submits hundreds of
//! jobs, as three tenants of different sizes (so through three lanes), while a random worker or relay is SIGKILLed and restarted every 1–2 s. Every job
//! asks for a webhook as well as its email: each is accepted under its one webhook-id and
//! verifies with the Standard Webhooks reference library.
//!
//! `CHAOS_SOAK_S=<seconds>` lengthens the kill phase (and the job count with it) for a
//! soak run; unset, the phase is 30 s and 500 jobs (see docs/testing.md).
//!
//! 30 of the jobs are long texts (20,000 to 92,500 bytes, those above 64 KiB kept in
//! `job_texts` at intake) on a 4,096-token context, each summarised in several parts that
//! the kills interrupt too.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use summaryd::llm::PromptKind;

use crate::harness::client::ApiClient;
use crate::harness::load::Load;
use crate::harness::mail_sink::MailBehavior;
use crate::harness::model_server::ModelBehavior;
use crate::harness::process::{Proc, stop_all};
use crate::harness::webhook_sink::WebhookBehavior;
use crate::harness::{World, WorldOptions};

const DEFAULT_KILL_PHASE_S: u64 = 30;
const MIN_JOBS: usize = 500;
/// Soak runs keep the default run's rate of about 17 new jobs per second.
const JOBS_PER_S: usize = 17;
const WORKERS: usize = 3;
const RELAYS: usize = 2;
/// The world's 5 s drain grace plus process teardown on a loaded machine.
const STOP_WITHIN: Duration = Duration::from_secs(8);
/// A context on which every long text below takes several parts (the default model's
/// tokenizer puts about 15,000 bytes of them in one).
const CONTEXT_TOKENS: &str = "4096";
const LONG_TEXTS: usize = 30;
/// Every `LONG_EVERY`-th job (from the first) is a long text, until there are `LONG_TEXTS`.
const LONG_EVERY: usize = 17;
/// summaryd's default `SUMMARYD_API_INLINE_TEXT_BYTES`.
const INLINE_TEXT_BYTES: usize = 65_536;

/// Job `i`'s length when it is a long text: 20,000 bytes and 2,500 more for each long
/// text before it, so 11 of the 30 are above `SUMMARYD_API_INLINE_TEXT_BYTES` (65,536).
fn long_text(i: usize) -> Option<usize> {
    let nth = i / LONG_EVERY;
    (i.is_multiple_of(LONG_EVERY) && nth < LONG_TEXTS).then_some(20_000 + 2_500 * nth)
}

/// Three tenants of different sizes (six, three and one jobs in ten), so the kills meet
/// jobs in several lanes and in the job stream at once.
fn tenant_of(i: usize) -> Option<&'static str> {
    Some(match i % 10 {
        0..=5 => "chaos-large",
        6..=8 => "chaos-medium",
        _ => "chaos-small",
    })
}

fn kill_phase() -> Duration {
    let secs = std::env::var("CHAOS_SOAK_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_KILL_PHASE_S);
    Duration::from_secs(secs)
}

async fn spawn_role(world: &World, role: &str, index: usize) -> Proc {
    let name = format!("{role}-{index}");
    match role {
        "worker" => world.spawn(&name, "worker", &["--consumers", "3"]).await,
        _ => world.spawn(&name, "relay", &["--relays", "2"]).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_of_workers_and_relays_lose_nothing_and_duplicate_nothing() {
    let started = Instant::now();
    let world = World::new(
        "chaos",
        WorldOptions {
            // A realistic, flaky model and mail provider: some 500s and 429s, some 503s.
            model: ModelBehavior {
                latency_ms: 10..80,
                error_rate: 0.03,
                throttle_rate: 0.02,
                hang: false,
                down: false,
            },
            mail: MailBehavior {
                latency_ms: 0..20,
                error_rate: 0.03,
            },
            webhook: WebhookBehavior {
                latency_ms: 0..20,
                error_rate: 0.03,
            },
            env: vec![
                // Long enough that a delivery's claim outlives the CPU-bound stretches of
                // splitting a 90 KB text in the debug build (on a loaded 2-core machine
                // 1.5 s let other consumers take the entry from a live delivery again and
                // again until it ran out of deliveries); still short next to the kill phase.
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "5000".into()),
                ("SUMMARYD_LLM_CONTEXT_TOKENS", CONTEXT_TOKENS.into()),
            ],
            ..Default::default()
        },
    )
    .await;
    let mut api = world.spawn("api", "api", &[]).await;
    let mut workers = Vec::new();
    for i in 0..WORKERS {
        workers.push(spawn_role(&world, "worker", i).await);
    }
    let mut relays = Vec::new();
    for i in 0..RELAYS {
        relays.push(spawn_role(&world, "relay", i).await);
    }
    let client = ApiClient::new(api.base_url()).with_webhook(world.webhooks.url());

    let phase = kill_phase();
    let jobs = MIN_JOBS.max(JOBS_PER_S * phase.as_secs() as usize);
    // Submissions end a little before the kills do, so the last jobs meet kills too.
    let prefix = format!("chaos-{}", crate::run_id());
    let long_keys: BTreeSet<String> = (0..jobs)
        .filter(|&i| long_text(i).is_some())
        .map(|i| format!("{prefix}-{i:05}"))
        .collect();
    assert_eq!(long_keys.len(), LONG_TEXTS);
    let load = Load::start_shaped(
        &client,
        &prefix,
        jobs,
        phase.mul_f64(0.9),
        10,
        Arc::new(long_text),
        Arc::new(tenant_of),
    );

    let phase_end = Instant::now() + phase;
    let (mut worker_kills, mut relay_kills) = (0, 0);
    while Instant::now() < phase_end {
        // Real time on purpose: kills at random instants of the processes' own work.
        tokio::time::sleep(Duration::from_millis(rand::random_range(1_000..2_000))).await;
        let victim = rand::random_range(0..WORKERS + RELAYS);
        if victim < WORKERS {
            workers[victim].kill9();
            worker_kills += 1;
            workers[victim] = spawn_role(&world, "worker", victim).await;
        } else {
            let i = victim - WORKERS;
            relays[i].kill9();
            relay_kills += 1;
            relays[i] = spawn_role(&world, "relay", i).await;
        }
    }
    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    assert_eq!(report.jobs, jobs);
    assert!(report.model_calls >= jobs && report.sends >= report.distinct_sends);
    assert_eq!(report.webhooks.distinct, jobs);
    // The long texts were summarised in parts (the exactly-once check above covers them
    // like every other job: one summary, two outbox rows, one email and one webhook-id
    // each).
    assert_eq!(
        (0..jobs)
            .filter_map(long_text)
            .filter(|&b| b > INLINE_TEXT_BYTES)
            .count(),
        11
    );
    assert_eq!(
        world.count("SELECT count(*) FROM job_texts").await,
        0,
        "a text kept in job_texts goes with its job's summary"
    );
    let mut long_parts = Vec::new();
    for a in accepted.iter().filter(|a| long_keys.contains(&a.key)) {
        let (status, body) = client.get(&a.job_id).await;
        assert_eq!(status, 200, "GET {}: {body}", a.job_id);
        let parts = body["parts"].as_u64().unwrap_or(0);
        assert!(parts >= 3, "{} is parts and a combination: {body}", a.key);
        long_parts.push(parts);
    }
    long_parts.sort_unstable();
    long_parts.dedup();
    // Restarted processes drain and exit cleanly too (the API with the client's idle
    // keep-alive connections still open).
    let mut all: Vec<&mut Proc> = workers.iter_mut().chain(relays.iter_mut()).collect();
    all.push(&mut api);
    stop_all(&mut all, STOP_WITHIN).await;
    println!(
        "chaos: {worker_kills} worker + {relay_kills} relay SIGKILLs over {phase:?}; {report}; \
         resends {}, webhook resends {}; model calls: documents {}, parts {}, combinations {}; parts per long \
         text {long_parts:?}; wall {:?}",
        report.sends - report.distinct_sends,
        report.webhooks.accepted - report.webhooks.distinct,
        world.model.calls_of(PromptKind::Document),
        world.model.calls_of(PromptKind::Part),
        world.model.calls_of(PromptKind::Combine),
        started.elapsed()
    );
}
