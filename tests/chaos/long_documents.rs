//! kill -9 of the worker in the middle of a long text summarised in parts: the parts it
//! finished are stored, and the next worker pays only for the rest.

use std::time::{Duration, Instant};

use summaryd::llm::{Fit, PromptKind, TokenCounter, split};

use crate::harness::client::ApiClient;
use crate::harness::model_server::{ModelBehavior, long_marked_text};
use crate::harness::{World, WorldOptions, eventually};

/// Not one of OpenAI's models, so summaryd counts tokens by its estimate (2.5 bytes per
/// token) and the test can plan the parts exactly as the service does.
const MODEL: &str = "llama-chaos";
const CONTEXT_TOKENS: u32 = 4_096;
/// summaryd's default `SUMMARYD_LLM_MAX_TOKENS`.
const MAX_TOKENS: u32 = 512;
const PARALLEL_PARTS: usize = 4;
const PARTS: usize = 40;
/// Slow enough that the kill lands mid-job (40 parts, 4 at a time: 3 s of calls).
const MODEL_MS: u64 = 300;
/// Part calls the model has seen when worker A is killed: some answered, most not.
const KILL_AFTER_PART_CALLS: usize = 12;
const CLAIM_IDLE_MS: &str = "3000";

/// The parts the service cuts `text` into (what the intake plans with, `llm::Fit`).
fn parts_of(fit: &Fit, text: &str) -> usize {
    split::split_text(text, fit.room(PromptKind::Part), fit.counter()).len()
}

/// The shortest long text of `marker` that is cut into exactly `parts` parts.
fn text_of_parts(fit: &Fit, marker: &str, parts: usize) -> String {
    // A part holds at most room × 2.5 bytes, less its overlap with the one before; start
    // well short and grow a paragraph at a time.
    let per_part = fit.room(PromptKind::Part) * 5 / 2;
    let mut bytes = per_part * parts / 2;
    loop {
        let text = long_marked_text(marker, bytes);
        let n = parts_of(fit, &text);
        if n >= parts {
            assert_eq!(
                n, parts,
                "no text of {bytes} bytes is exactly {parts} parts"
            );
            return text;
        }
        bytes = text.len() + 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_mid_long_text_stored_parts_are_reused_and_the_job_done_once() {
    let started = Instant::now();
    let world = World::new(
        "long-documents",
        WorldOptions {
            model: ModelBehavior::slow(MODEL_MS),
            env: vec![
                ("SUMMARYD_LLM_MODEL", MODEL.into()),
                ("SUMMARYD_LLM_CONTEXT_TOKENS", CONTEXT_TOKENS.to_string()),
                ("SUMMARYD_LLM_MAX_TOKENS", MAX_TOKENS.to_string()),
                ("SUMMARYD_LLM_PARALLEL_PARTS", PARALLEL_PARTS.to_string()),
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", CLAIM_IDLE_MS.into()),
            ],
            ..Default::default()
        },
    )
    .await;
    let fit = Fit::new(TokenCounter::Estimate, CONTEXT_TOKENS, MAX_TOKENS);
    let key = format!("long-{}", crate::run_id());
    let text = text_of_parts(&fit, &key, PARTS);
    // Above SUMMARYD_API_INLINE_TEXT_BYTES: the text is kept in job_texts at intake.
    assert!(text.len() > 65_536, "{} bytes", text.len());

    let api = world.spawn("api", "api", &[]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let mut worker_a = world
        .spawn("worker-a", "worker", &["--consumers", "1"])
        .await;
    let client = ApiClient::new(api.base_url());
    let body = serde_json::json!({"text": text, "notify": format!("{key}@example.com")});
    let accepted = client.submit_body(&key, &body).await;
    assert_eq!(
        world.count("SELECT count(*) FROM job_texts").await,
        1,
        "the long text is stored at intake"
    );

    assert!(
        eventually(Duration::from_secs(30), || async {
            world.model.calls_of(PromptKind::Part) >= KILL_AFTER_PART_CALLS
        })
        .await,
        "worker A never got {KILL_AFTER_PART_CALLS} part calls out; part calls {}",
        world.model.calls_of(PromptKind::Part)
    );
    // Half a call later: the calls in flight are mid-answer, and the parts answered
    // before them have had time to be stored (a part answered but not yet stored when the
    // worker dies is lost like a call in flight).
    tokio::time::sleep(Duration::from_millis(MODEL_MS / 2)).await;
    // GET shows how far the job has come while it runs.
    let (status, running) = client.get(&accepted.job_id).await;
    assert_eq!(status, 200, "{running}");
    assert_ne!(running["status"], "done", "{running}");
    assert!(
        running["progress"]["parts_done"].as_u64().unwrap_or(0) >= 1,
        "progress while running: {running}"
    );
    worker_a.kill9();
    // A request already on the wire when A died still reaches the model.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let calls_by_a = world.model.calls_of(PromptKind::Part);
    let stored_by_a = world
        .count("SELECT count(*) FROM summary_parts WHERE level = 0")
        .await as usize;
    assert_eq!(world.count("SELECT count(*) FROM summaries").await, 0);
    assert_eq!(
        world.model.calls_of(PromptKind::Combine),
        0,
        "A never combined"
    );
    assert_eq!(
        world.model.calls_of(PromptKind::Document),
        0,
        "never sent whole"
    );
    assert!(
        stored_by_a >= KILL_AFTER_PART_CALLS - PARALLEL_PARTS,
        "A's answered parts are stored before the kill: {stored_by_a} of {calls_by_a} calls"
    );
    assert!(
        calls_by_a - stored_by_a <= PARALLEL_PARTS,
        "at most {PARALLEL_PARTS} part calls in flight at the kill: {calls_by_a} calls, {stored_by_a} stored"
    );
    assert!(
        calls_by_a < PARTS,
        "A was killed mid-job: {calls_by_a} part calls"
    );

    let kill_at = Instant::now();
    let _worker_b = world
        .spawn("worker-b", "worker", &["--consumers", "1"])
        .await;
    let report = world
        .assert_exactly_once(std::slice::from_ref(&accepted), &client)
        .await;
    let b_took = kill_at.elapsed();

    // Each part is paid for once, but for the calls lost with A; a part that does not fit
    // a part prompt would be split again (more calls than the intake planned).
    let part_calls = world.model.calls_of(PromptKind::Part);
    let calls_by_b = part_calls - calls_by_a;
    assert!(
        part_calls <= PARTS + PARALLEL_PARTS,
        "{part_calls} part calls for {PARTS} parts (A {calls_by_a}, B {calls_by_b})"
    );
    assert!(part_calls < 2 * PARTS, "{part_calls} part calls");
    assert_eq!(
        calls_by_b,
        PARTS - stored_by_a,
        "B called the model for exactly the parts A had not stored"
    );
    assert_eq!(
        world
            .count("SELECT count(*) FROM summary_parts WHERE level = 0")
            .await,
        PARTS as i64,
        "every part stored once"
    );
    // 40 short summaries fit one combination.
    assert_eq!(world.model.calls_of(PromptKind::Combine), 1);
    assert_eq!(world.model.calls_of(PromptKind::Document), 0);
    let (status, done) = client.get(&accepted.job_id).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(
        done["parts"],
        PARTS + 1,
        "parts and the combination: {done}"
    );
    assert_eq!(
        world.count("SELECT count(*) FROM job_texts").await,
        0,
        "the stored text goes with the summary"
    );
    println!(
        "long documents: {PARTS} parts, {} bytes; part calls by A {calls_by_a} ({stored_by_a} \
         stored at the kill), by B {calls_by_b}, total {part_calls}; B finished in {b_took:?}; \
         {report}; running GET {running}; wall {:?}",
        text.len(),
        started.elapsed()
    );
}
