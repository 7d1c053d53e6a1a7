//! Long documents: a text whose prompt does not fit the model's context is summarised in
//! parts (map-reduce), every part stored as it comes back, and a text too long to keep in
//! Redis is stored in Postgres at intake.
//!
//! The model is a fake OpenAI-compatible server that enforces a context size the way a
//! real one does: it counts each prompt (system and user message) as summaryd's estimate
//! counts a model it has no tokenizer for (2.5 bytes a token, rounded up), and a prompt
//! whose tokens plus `max_tokens` exceed its context gets OpenAI's own 400
//! `context_length_exceeded` answer. Redis and Postgres are real.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use actix_web::test as web;
use chrono::Utc;
use redis::AsyncCommands;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use summaryd::app::Application;
use summaryd::config::roles::{Role, Roles};
use summaryd::config::{FallbackSettings, LlmProvider, Settings};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::llm::prompts::{COMBINE_PROMPT, PART_PROMPT, SYSTEM_PROMPT};
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::pending_count;
use summaryd::stream::enqueue;
use summaryd::worker::Consumer;

use crate::shared::api_requests::{self, assert_problem, record_key, stream_len};
use crate::shared::http_stub::{Connections, HttpStub, Reply, Request, Server, handler};
use crate::shared::running::Running;
use crate::shared::test_env::Services;
use crate::shared::{TestEnv, eventually};

/// A model name tiktoken does not know, so summaryd counts it with its estimate.
const LOCAL: &str = "local-4k";

// ---------------------------------------------------------------------------------------
// The fake model that enforces its context.

/// Which prompt a request carried, by its system message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Document,
    Part,
    Combine,
    /// Anything else (a breaker probe carries the document prompt with one token).
    Other,
}

/// One request as the fake model saw it, and what it answered.
#[derive(Debug, Clone)]
struct Seen {
    kind: Kind,
    /// The data between the tags of a document or part; the user message of a combine.
    data: String,
    /// Prompt tokens as the fake counted them (system and user message).
    tokens: usize,
    max_tokens: u64,
    status: u16,
    /// `(prompt_tokens, completion_tokens)` it reported with a 200.
    usage: Option<(u32, u32)>,
    content: Option<String>,
}

impl Seen {
    fn is_probe(&self) -> bool {
        self.max_tokens == 1
    }
}

struct ModelState {
    context: usize,
    delay: Duration,
    /// Every `n`-th job request (probes aside) answers 500; `0`: never.
    fail_every: AtomicUsize,
    job_requests: AtomicUsize,
    seen: Mutex<Vec<Seen>>,
}

/// An OpenAI-compatible model server with a context of `context` tokens.
struct ContextModel {
    server: Server,
    state: Arc<ModelState>,
}

/// summaryd's estimate for a model it has no tokenizer for: 2.5 bytes a token, rounded up.
fn estimate(bytes: usize) -> usize {
    (bytes * 2).div_ceil(5)
}

impl ContextModel {
    async fn start(context: usize, delay: Duration) -> ContextModel {
        let state = Arc::new(ModelState {
            context,
            delay,
            fail_every: AtomicUsize::new(0),
            job_requests: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let handler = handler(state.clone(), |state, request| async move {
            state.answer(request).await
        });
        let server = Server::start(handler, Connections::KeepAlive).await;
        ContextModel { server, state }
    }

    fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Answer every `n`-th job request with a 500 from now on (`0`: never).
    fn fail_every(&self, n: usize) {
        self.state.fail_every.store(n, Ordering::SeqCst);
    }

    /// Every request but the breaker probes.
    fn jobs(&self) -> Vec<Seen> {
        self.state
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|s| !s.is_probe())
            .cloned()
            .collect()
    }

    /// Job requests it answered with a summary.
    fn answered(&self) -> Vec<Seen> {
        self.jobs()
            .into_iter()
            .filter(|s| s.status == 200)
            .collect()
    }

    fn refusals(&self) -> usize {
        self.jobs().iter().filter(|s| s.status == 400).count()
    }
}

impl ModelState {
    async fn answer(&self, request: Request) -> Reply {
        if request.method != "POST" || !request.path.ends_with("/chat/completions") {
            return Reply::json(404, json!({"error": {"message": "not found"}}));
        }
        let body = request.json();
        let content = |i: usize| {
            body["messages"][i]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let (system, user) = (content(0), content(1));
        let max_tokens = body["max_tokens"].as_u64().unwrap_or(0);
        let tokens = estimate(system.len() + user.len());
        let kind = match system.as_str() {
            s if s == PART_PROMPT => Kind::Part,
            s if s == COMBINE_PROMPT => Kind::Combine,
            s if s == SYSTEM_PROMPT && max_tokens > 1 => Kind::Document,
            _ => Kind::Other,
        };
        let data = user
            .strip_prefix("<document>\n")
            .and_then(|u| u.strip_suffix("\n</document>"))
            .unwrap_or(&user)
            .to_owned();
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let mut seen = Seen {
            kind,
            data,
            tokens,
            max_tokens,
            status: 200,
            usage: None,
            content: None,
        };
        let every = self.fail_every.load(Ordering::SeqCst);
        let reply = if max_tokens != 1
            && every > 0
            && (self.job_requests.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(every)
        {
            seen.status = 500;
            Reply::json(
                500,
                json!({"error": {"message": "The server had an error while processing your request.",
                                 "type": "server_error"}}),
            )
        } else if tokens + max_tokens as usize > self.context {
            seen.status = 400;
            Reply::json(
                400,
                json!({"error": {
                    "message": format!(
                        "This model's maximum context length is {} tokens. However, your messages resulted in {} tokens.",
                        self.context,
                        tokens + max_tokens as usize
                    ),
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded"
                }}),
            )
        } else {
            let head: String = seen
                .data
                .chars()
                .take(60)
                .map(|c| if c.is_whitespace() { ' ' } else { c })
                .collect();
            let hash = hex::encode(&Sha256::digest(user.as_bytes())[..8]);
            let answer = format!("Summary: {head} [{hash}]");
            let completion = estimate(answer.len()) as u32;
            seen.usage = Some((tokens as u32, completion));
            seen.content = Some(answer.clone());
            Reply::json(
                200,
                json!({
                    "id": "chatcmpl-context",
                    "object": "chat.completion",
                    "model": LOCAL,
                    "choices": [{"index": 0,
                                 "message": {"role": "assistant", "content": answer},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": tokens, "completion_tokens": completion,
                              "total_tokens": tokens as u32 + completion}
                }),
            )
        };
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(seen);
        reply
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

/// A text of about `chars` characters (ASCII) in paragraphs of distinct sentences, each
/// sentence beginning `Item {n} of` so a test can find it again.
fn long_text(chars: usize, topic: &str) -> String {
    let mut text = String::with_capacity(chars + 200);
    let mut n = 0;
    while text.len() < chars {
        n += 1;
        text.push_str(&format!(
            "Item {n} of the {topic} review: renewal {n} moved by {} percent after call {}, and the account team logged decision {}. ",
            n * 7 % 100,
            n * 13,
            n * 31 % 997
        ));
        if n % 6 == 0 {
            text.push_str("\n\n");
        }
    }
    text.truncate(chars);
    text
}

/// The `Item {n} of` sentence heads of `text` that are whole (the last may be cut).
fn sentence_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut n = 1;
    loop {
        let head = format!("Item {n} of ");
        let next = format!("Item {} of ", n + 1);
        if !text.contains(&next) {
            return heads;
        }
        heads.push(head);
        n += 1;
    }
}

/// The env's settings with `[llm]` the OpenAI-compatible server at `base` named `LOCAL`,
/// a context of `context` tokens, and waits short enough for a test.
fn model_settings(env: &TestEnv, base: String, context: u32) -> Settings {
    let mut s = env.settings.clone();
    s.llm.provider = LlmProvider::Openai;
    s.llm.base_url = base.into();
    s.llm.model = LOCAL.into();
    s.llm.api_key = Some("sk-local-0000".into());
    s.llm.context_tokens = context;
    s.llm.max_attempts = 2;
    s.llm.backoff = Duration::from_millis(1);
    s.llm.max_backoff = Duration::from_millis(5);
    s.llm.call_timeout = Duration::from_secs(10);
    s
}

fn job(n: usize, text: String) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:long-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: text.into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// The configured providers, a consumer, and `jobs` on the stream.
async fn world(settings: Settings, env: &TestEnv, jobs: Vec<Job>) -> (Services, Consumer) {
    let services = env
        .services()
        .settings(settings)
        .build_with_configured_models();
    let consumer = Consumer::new(services.worker(), "w-long");
    consumer.ensure_group().await.unwrap();
    let mut redis = services.redis.get().await.unwrap();
    for job in &jobs {
        enqueue(&mut redis, services.keys.get(0), job)
            .await
            .unwrap();
    }
    (services, consumer)
}

/// `(model, prompt_tokens, completion_tokens, parts)` of the one summaries row.
async fn summary_row(env: &TestEnv) -> (Option<String>, Option<i32>, Option<i32>, Option<i32>) {
    let rows = env
        .pg()
        .await
        .query(
            "SELECT model, prompt_tokens, completion_tokens, parts FROM summaries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "exactly one summary");
    let r = &rows[0];
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// Sums of the usage the fake reported with its answers.
fn usage_sums(answered: &[Seen]) -> (i32, i32) {
    answered
        .iter()
        .filter_map(|s| s.usage)
        .fold((0, 0), |(p, c), (pp, cc)| (p + pp as i32, c + cc as i32))
}

fn of_kind(seen: &[Seen], kind: Kind) -> usize {
    seen.iter().filter(|s| s.kind == kind).count()
}

async fn post_text(client: &reqwest::Client, base: &str, key: &str, text: &str) -> (u16, Value) {
    let res = client
        .post(format!("{base}/v1/summaries"))
        .header("Idempotency-Key", key)
        .header("X-Tenant-Id", "acme")
        .json(&json!({"text": text, "notify": "team@example.com"}))
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn get_job(client: &reqwest::Client, base: &str, job_id: &str) -> Value {
    client
        .get(format!("{base}/v1/summaries/{job_id}"))
        .header("X-Tenant-Id", "acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// Tests.

/// 60,000 characters on a 4,096-token model: cut into parts that each fit, their summaries
/// combined; GET shows the progress while it runs and the number of calls once done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sixty_thousand_character_text_is_summarised_in_parts_that_each_fit() {
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::from_millis(150)).await;
    let mut settings = model_settings(&env, model.url("/v1"), 4_096);
    settings.llm.parallel_parts = 2;
    settings.worker.consumers = 1;
    let app = Application::from_settings(
        settings.clone(),
        Roles::of(&[Role::Api, Role::Worker]),
        false,
    )
    .await
    .expect("build app");
    let app = Running::start(app);
    let client = reqwest::Client::new();
    let text = long_text(60_000, "quarterly");
    assert_eq!(text.chars().count(), 60_000);

    let (status, accepted) = post_text(&client, &app.base, "long-doc-key-000001", &text).await;
    assert_eq!(status, 202, "{accepted}");
    let job_id = accepted["job_id"].as_str().unwrap().to_owned();

    // Watch it run: every GET, until it is done.
    let mut progress = Vec::new();
    let mut done = None;
    for _ in 0..3_000 {
        let view = get_job(&client, &app.base, &job_id).await;
        match view["status"].as_str() {
            Some("done") => {
                done = Some(view);
                break;
            }
            Some("queued") => {
                if let Some(p) = view.get("progress") {
                    progress.push((
                        p["parts_done"].as_u64().unwrap(),
                        p["parts_total"].as_u64().unwrap(),
                    ));
                }
            }
            _ => panic!("unexpected state: {view}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let view = done.expect("the job is done within 30 s");
    app.stop().await;

    let seen = model.jobs();
    let answered = model.answered();
    assert_eq!(model.refusals(), 0, "no prompt over the context was sent");
    assert_eq!(answered.len(), seen.len(), "every request was answered");
    for s in &seen {
        assert!(
            s.tokens + s.max_tokens as usize <= 4_096,
            "a {:?} prompt of {} tokens (+{}) over the context",
            s.kind,
            s.tokens,
            s.max_tokens
        );
        assert_eq!(s.max_tokens, 512, "the default completion cap");
    }
    let parts = of_kind(&seen, Kind::Part);
    let combines = of_kind(&seen, Kind::Combine);
    assert_eq!(
        of_kind(&seen, Kind::Document),
        0,
        "the whole text was never sent"
    );
    assert!(parts >= 7, "60,000 characters need several parts: {parts}");
    assert!(combines >= 1);
    assert_eq!(
        parts + combines,
        seen.len(),
        "every call a part or a combine"
    );
    // Every whole sentence of the text was in some part.
    for head in sentence_heads(&text) {
        assert!(
            seen.iter()
                .any(|s| s.kind == Kind::Part && s.data.contains(&head)),
            "{head:?} was in no part"
        );
    }

    // GET: done, the number of calls, the last combination as the summary.
    assert_eq!(view["parts"].as_u64(), Some(seen.len() as u64), "{view}");
    assert_eq!(view["model"], LOCAL);
    assert!(view.get("progress").is_none(), "{view}");
    let root = seen
        .iter()
        .rfind(|s| s.kind == Kind::Combine)
        .and_then(|s| s.content.clone())
        .unwrap();
    assert_eq!(view["summary"].as_str(), Some(root.as_str()));

    // One summary, one email intent, every part but the last combination stored.
    assert_eq!(env.count("outbox").await, 1);
    let (model_name, prompt_tokens, completion_tokens, stored_parts) = summary_row(&env).await;
    assert_eq!(model_name.as_deref(), Some(LOCAL));
    assert_eq!(stored_parts, Some(seen.len() as i32));
    let (prompt_sum, completion_sum) = usage_sums(&answered);
    assert_eq!(prompt_tokens, Some(prompt_sum), "the usage of every call");
    assert_eq!(completion_tokens, Some(completion_sum));
    let pg = env.pg().await;
    let level0: i64 = pg
        .query_one("SELECT count(*) FROM summary_parts WHERE level = 0", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(level0, parts as i64, "every part stored");
    assert_eq!(
        env.count("summary_parts").await,
        (seen.len() - 1) as i64,
        "every call but the job's own summary stored as a part"
    );
    let stored_combinations: i64 = env
        .pg()
        .await
        .query_one("SELECT count(*) FROM summary_parts WHERE level > 0", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored_combinations,
        combines as i64 - 1,
        "combinations are stored a level above the parts they combine"
    );
    assert_eq!(env.count("job_texts").await, 0, "60,000 bytes stay inline");
    assert_eq!(env.dead_letters().await, 0);

    // Progress was visible while it ran, and never went backwards past its total.
    assert!(
        progress
            .iter()
            .any(|(done, total)| 0 < *done && done < total),
        "a GET showed the job part way, with parts done: {progress:?}"
    );
    assert!(
        progress.iter().all(|(done, total)| done <= total),
        "{progress:?}"
    );
    // The plan GET showed is the one the intake counted against max_parts (every summary
    // as long as it may be), and the calls made stayed within it.
    let planned = summaryd::llm::most_calls(&summaryd::llm::fits(&settings.llm), &text) as u64;
    assert_eq!(
        progress.iter().map(|(_, total)| *total).max(),
        Some(planned),
        "{progress:?}"
    );
    assert!(seen.len() as u64 <= planned);
}

/// The primary (a large context) answers 503 to everything; the fallback has 4,096 tokens
/// and finishes the long text in parts, every request fitting its context.
#[tokio::test]
async fn with_the_primary_down_a_4096_token_fallback_finishes_a_long_text() {
    let env = TestEnv::new().await;
    let primary = HttpStub::start(Reply::json(
        503,
        json!({"error": {"message": "overloaded"}}),
    ))
    .await;
    let fallback = ContextModel::start(4_096, Duration::ZERO).await;
    let mut settings = model_settings(&env, primary.url("/v1"), 32_768);
    settings.llm.model = "primary-32k".into();
    settings.llm.breaker_failures = 3;
    settings.llm.breaker_cooldown = Duration::from_secs(60);
    settings.llm.fallback = vec![FallbackSettings {
        provider: LlmProvider::Openai,
        base_url: fallback.url("/v1").into(),
        model: LOCAL.into(),
        api_key_env: None,
        call_timeout: None,
        context_tokens: Some(4_096),
        rpm: None,
        tpm: None,
        price_per_mtok_input: None,
        price_per_mtok_output: None,
    }];
    let text = long_text(60_000, "fallback");
    let (services, mut consumer) = world(settings, &env, vec![job(0, text.clone())]).await;

    assert_eq!(consumer.run_once().await.unwrap(), 1);

    assert_eq!(env.dead_letters().await, 0);
    let seen = fallback.jobs();
    assert_eq!(fallback.refusals(), 0);
    assert!(!seen.is_empty());
    for s in &seen {
        assert_eq!(s.status, 200, "{:?}", s.kind);
        assert!(
            s.tokens + s.max_tokens as usize <= 4_096,
            "a {:?} prompt of {} tokens over the fallback's context",
            s.kind,
            s.tokens
        );
    }
    assert_eq!(
        of_kind(&seen, Kind::Document),
        0,
        "the whole text never went to the fallback"
    );
    let parts = of_kind(&seen, Kind::Part);
    assert!(parts >= 7, "{parts}");
    assert_eq!(parts + of_kind(&seen, Kind::Combine), seen.len());
    // The primary was tried (the whole text fits it) until its breaker opened.
    let primary_jobs = primary
        .requests()
        .iter()
        .filter(|r| r.json()["max_tokens"].as_u64() != Some(1))
        .count();
    assert!(primary_jobs >= 2, "{primary_jobs}");

    let (model, prompt_tokens, _, stored_parts) = summary_row(&env).await;
    assert_eq!(model.as_deref(), Some(LOCAL));
    assert_eq!(stored_parts, Some(seen.len() as i32));
    assert_eq!(prompt_tokens, Some(usage_sums(&seen).0));
    assert_eq!(env.count("outbox").await, 1);
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        0
    );
}

/// summaryd believes the model takes 8,192 tokens; it takes 4,096. The model refuses the
/// parts planned for 8,192 with OpenAI's `context_length_exceeded`; they are split smaller
/// and the job finishes in its first delivery, never dead-lettered.
#[tokio::test]
async fn a_context_refusal_splits_smaller_and_is_never_a_dead_letter() {
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::ZERO).await;
    let mut settings = model_settings(&env, model.url("/v1"), 8_192);
    settings.worker.max_deliveries = 1;
    let text = long_text(60_000, "refusal");
    let (services, mut consumer) = world(settings, &env, vec![job(0, text)]).await;

    assert_eq!(consumer.run_once().await.unwrap(), 1);

    let seen = model.jobs();
    assert!(
        model.refusals() >= 1,
        "the model refused at least one prompt for its length"
    );
    assert_eq!(
        env.dead_letters().await,
        0,
        "a refusal is never the job's end"
    );
    let (_, prompt_tokens, _, stored_parts) = summary_row(&env).await;
    let answered = model.answered();
    for s in &answered {
        assert!(s.tokens + s.max_tokens as usize <= 4_096);
    }
    assert!(
        seen.iter()
            .filter(|s| s.status != 200)
            .all(|s| s.status == 400),
        "only context refusals"
    );
    assert_eq!(
        stored_parts,
        Some(answered.len() as i32),
        "parts counts the calls that answered"
    );
    assert_eq!(prompt_tokens, Some(usage_sums(&answered).0));
    assert_eq!(env.count("outbox").await, 1);
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        0
    );

    // Every request is in the job's history, refusals included, all of its one delivery.
    let calls = summaryd::db::model_calls::for_job(&services.pg, &job(0, String::new()).job_id)
        .await
        .unwrap();
    assert_eq!(calls.len(), seen.len(), "one row per request the model saw");
    assert!(
        calls
            .iter()
            .all(|c| c.delivery == 1 && c.provider == format!("openai:{LOCAL}"))
    );
    let refused = calls
        .iter()
        .filter(|c| c.error_class.as_deref() == Some("context_exceeded"))
        .count();
    assert_eq!(refused, model.refusals());
    assert_eq!(refused + answered.len(), calls.len());
    let prompt: i32 = calls
        .iter()
        .filter_map(|c| c.prompt_tokens)
        .map(|n| n as i32)
        .sum();
    assert_eq!(prompt, usage_sums(&answered).0);
    let seqs: Vec<u32> = calls.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (0..calls.len() as u32).collect::<Vec<_>>());
}

/// A text that would need more model calls than `SUMMARYD_LLM_MAX_PARTS`, and one over
/// `SUMMARYD_API_MAX_TEXT_CHARS`, are 413 and leave nothing behind: no stream entry, no
/// stored text, no idempotency record. A text within both is accepted (and, being over the
/// inline limit, stored).
#[actix_web::test]
async fn a_text_needing_more_than_max_parts_is_413_and_nothing_is_stored() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.llm.context_tokens = 4_096;
    settings.llm.max_parts = 5;
    settings.api.max_text_chars = 70_000;
    settings.api.inline_text_bytes = 1_024;
    let services = env.services().settings(settings).build();
    let app = web::init_service(summaryd::api::app(
        services.api(),
        Roles::all(),
        Shutdown::new(),
    ))
    .await;
    let body = |text: &str| json!({"text": text, "notify": "ops@example.com"}).to_string();
    let mut redis = env.redis().await;

    let key = "too-many-parts-key-01";
    let res = web::call_service(
        &app,
        api_requests::post("acme", key, &body(&long_text(60_000, "parts"))).to_request(),
    )
    .await;
    let p = assert_problem(res, 413).await;
    assert!(
        p["type"].as_str().unwrap().ends_with("text-too-many-parts"),
        "{p}"
    );
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("SUMMARYD_LLM_MAX_PARTS"),
        "{p}"
    );
    assert_eq!(p["field"], "text", "{p}");
    let exists: bool = redis
        .exists(record_key(&services, "acme", key))
        .await
        .unwrap();
    assert!(!exists, "no idempotency record");

    let key = "too-long-text-key-001";
    let res = web::call_service(
        &app,
        api_requests::post("acme", key, &body(&"a".repeat(70_001))).to_request(),
    )
    .await;
    let p = assert_problem(res, 413).await;
    assert!(
        p["type"].as_str().unwrap().ends_with("text-too-long"),
        "{p}"
    );
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("SUMMARYD_API_MAX_TEXT_CHARS"),
        "{p}"
    );
    let exists: bool = redis
        .exists(record_key(&services, "acme", key))
        .await
        .unwrap();
    assert!(!exists, "no idempotency record");

    assert_eq!(stream_len(&env).await, 0, "nothing enqueued");
    assert_eq!(env.count("job_texts").await, 0, "no text stored");
    assert_eq!(env.count("summaries").await, 0);

    // Within both limits: accepted, the text stored in Postgres.
    let key = "few-parts-text-key-01";
    let res = web::call_service(
        &app,
        api_requests::post("acme", key, &body(&long_text(10_000, "few"))).to_request(),
    )
    .await;
    assert_eq!(res.status(), 202);
    assert_eq!(stream_len(&env).await, 1);
    assert_eq!(env.count("job_texts").await, 1);
}

/// Jobs queued behind an api-only process: a 200 KB text is stored in Postgres and its
/// stream entry holds a reference, so it costs Redis less than a 2 KB inline text does.
/// Prints what each costs; then a worker finishes them all and the stored texts go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_text_is_stored_in_postgres_and_redis_holds_only_a_reference() {
    const N: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    // A private Redis: other tests' keys would move the shared one's memory.
    let redis_server = crate::shared::servers::RedisProc::start(dir.path(), &[]);
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.redis_url = redis_server.url().into();
    settings.worker.consumers = 2;
    let mut redis = redis_server.connection().await;
    let start = |roles: Roles| {
        env.services()
            .settings(settings.clone())
            .llm(Arc::new(summaryd::llm::BuiltinSummariser))
            .application(roles)
    };
    // Inline texts long enough that what they hold dwarfs the noise of Redis's own
    // accounting (a few hundred bytes a job), yet under the inline limit.
    let short = long_text(40_000, "short");
    let long = long_text(200_000, "long");
    assert!(long.len() > settings.api.inline_text_bytes);
    assert!(short.len() <= settings.api.inline_text_bytes);

    let api = Running::start(start(Roles::of(&[Role::Api])).await);
    let client = reqwest::Client::new();
    let post_all = |tag: &'static str, text: &str, n: usize| {
        let (client, base, text) = (&client, api.base.clone(), text.to_owned());
        async move {
            for i in 0..n {
                let key = format!("{tag}-stored-key-{i:06}");
                let (status, body) = post_text(client, &base, &key, &text).await;
                assert_eq!(status, 202, "{body}");
            }
        }
    };
    // Warm up: the stream, the scripts, the connections and the allocator's first pages.
    post_all("warm-short", &short, 2).await;
    post_all("warm-long", &long, 2).await;

    let before = crate::shared::servers::redis_memory(&mut redis).await;
    post_all("short", &short, N).await;
    let middle = crate::shared::servers::redis_memory(&mut redis).await;
    post_all("long", &long, N).await;
    let after = crate::shared::servers::redis_memory(&mut redis).await;
    let per_job = |from: i64, to: i64| (to - from) / N as i64;
    let inline_used = per_job(before.used_less_clients, middle.used_less_clients);
    let stored_used = per_job(middle.used_less_clients, after.used_less_clients);
    let inline_data = per_job(before.dataset, middle.dataset);
    let stored_data = per_job(middle.dataset, after.dataset);
    println!(
        "figures: redis bytes per queued job ({N} of each): used_memory - mem_clients_normal: \
         inline {} B text = {inline_used}, stored {} B text = {stored_used}; \
         used_memory_dataset: inline = {inline_data}, stored = {stored_data}",
        short.len(),
        long.len()
    );
    // Asserted on the dataset: the used_memory figure moves with the server's accounting
    // of client buffers by more than a job's bytes over a few requests.
    assert!(
        stored_data < 2_048,
        "a stored text costs Redis {stored_data} B a job"
    );
    assert!(
        inline_data > short.len() as i64,
        "stored {stored_data} B, inline {inline_data} B: the inline text is in Redis, the stored one is not"
    );

    // The entries (in their tenants' lanes): the long ones carry a reference, the short
    // ones their text.
    let keys = summaryd::infra::keys::RedisKeys::new(settings.key_prefix.clone());
    let mut entries: Vec<redis::streams::StreamId> = Vec::new();
    let tenants: Vec<String> = redis.zrange(keys.lanes(), 0, -1).await.unwrap();
    for tenant in tenants {
        let lane: redis::streams::StreamRangeReply =
            redis.xrange_all(keys.lane(&tenant)).await.unwrap();
        entries.extend(lane.ids);
    }
    let on_stream: redis::streams::StreamRangeReply =
        redis.xrange_all(keys.stream()).await.unwrap();
    entries.extend(on_stream.ids);
    assert_eq!(entries.len(), 2 * N + 4);
    let (mut stored, mut inline) = (0, 0);
    for entry in &entries {
        let payload: String = entry.get("payload").expect("payload field");
        let payload: Value = serde_json::from_str(&payload).unwrap();
        if payload["text_stored"] == true {
            assert!(payload.get("text").is_none(), "{payload}");
            stored += 1;
        } else {
            assert_eq!(payload["text"].as_str().map(str::len), Some(short.len()));
            inline += 1;
        }
    }
    assert_eq!((stored, inline), (N + 2, N + 2));
    assert_eq!(env.count("job_texts").await, (N + 2) as i64);
    let texts: i64 = env
        .pg()
        .await
        .query_one(
            "SELECT count(*) FROM job_texts WHERE length(text) = $1",
            &[&(long.len() as i32)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(texts, (N + 2) as i64, "the whole text is stored");
    api.stop().await;

    // A worker finishes every job, and the stored texts go with their commits.
    let worker = Running::start(start(Roles::of(&[Role::Worker])).await);
    let total = (2 * N + 4) as i64;
    assert!(
        eventually(Duration::from_secs(120), || async {
            env.count("summaries").await == total
        })
        .await,
        "every job done: {} of {total}",
        env.count("summaries").await
    );
    worker.stop().await;
    assert_eq!(env.count("job_texts").await, 0, "no stored text left");
    assert_eq!(env.count("outbox").await, total);
    let in_parts: i64 = env
        .pg()
        .await
        .query_one("SELECT count(*) FROM summaries WHERE parts > 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        in_parts,
        (N + 2) as i64,
        "the long texts were done in parts"
    );
    let len: i64 = redis.xlen(keys.stream()).await.unwrap();
    assert_eq!(len, 0, "every entry acknowledged");
    let lanes: i64 = redis.zcard(keys.lanes()).await.unwrap();
    assert_eq!(lanes, 0, "every lane drained");
    drop(redis_server);
}

/// One delivery per job (`max_deliveries` 1), and a model that fails every fourth call:
/// each delivery stores three new parts and then fails. A delivery that stored new parts
/// does not count, so the job goes on and finishes, and no part is paid for twice.
#[tokio::test]
async fn a_delivery_that_stored_parts_is_not_counted() {
    const EVERY: usize = 4;
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::ZERO).await;
    model.fail_every(EVERY);
    let mut settings = model_settings(&env, model.url("/v1"), 4_096);
    settings.llm.max_attempts = 1;
    settings.llm.breaker_failures = 100;
    settings.llm.parallel_parts = 1;
    settings.worker.max_deliveries = 1;
    let (services, mut consumer) = world(
        settings,
        &env,
        vec![job(0, long_text(60_000, "deliveries"))],
    )
    .await;

    let mut runs = 0;
    let mut parts_after_first = None;
    while env.count("summaries").await == 0 && runs < 20 {
        consumer.run_once().await.unwrap();
        runs += 1;
        if runs == 1 {
            parts_after_first = Some(env.count("summary_parts").await);
        }
        assert_eq!(env.dead_letters().await, 0, "after run {runs}");
    }
    assert_eq!(env.count("summaries").await, 1, "done after {runs} runs");
    assert_eq!(
        parts_after_first,
        Some((EVERY - 1) as i64),
        "the first delivery stored the parts it got before the failure"
    );

    let seen = model.jobs();
    let failures = seen.iter().filter(|s| s.status == 500).count();
    assert!(
        failures >= 2,
        "several deliveries each met a failure: {failures}"
    );
    assert_eq!(model.refusals(), 0);
    // No input was answered twice: every stored part was reused, not paid again.
    let answered = model.answered();
    let inputs: HashSet<(Kind, &str)> =
        answered.iter().map(|s| (s.kind, s.data.as_str())).collect();
    assert_eq!(inputs.len(), answered.len(), "a part was paid for twice");
    let (_, prompt_tokens, _, stored_parts) = summary_row(&env).await;
    assert_eq!(stored_parts, Some(answered.len() as i32));
    assert_eq!(prompt_tokens, Some(usage_sums(&answered).0));
    assert_eq!(env.dead_letters().await, 0);
    assert_eq!(env.count("outbox").await, 1);
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        0
    );

    // Every part's call of every delivery is in the job's history: those that failed
    // (kept before each delivery was settled) and those that answered.
    let calls = summaryd::db::model_calls::for_job(&services.pg, &job(0, String::new()).job_id)
        .await
        .unwrap();
    assert_eq!(calls.len(), seen.len(), "one row per request the model saw");
    let failed = calls
        .iter()
        .filter(|c| c.error_class.as_deref() == Some("status_500"))
        .count();
    assert_eq!(failed, failures);
    assert_eq!(
        calls.iter().filter(|c| c.error_class.is_none()).count(),
        answered.len()
    );
    assert!(
        calls.windows(2).all(|w| w[0].delivery <= w[1].delivery),
        "ordered by delivery"
    );
}

/// The other side of the rule: a delivery of a job in parts that stored nothing new before
/// it failed is a failed delivery like any other, so a model that fails every call still
/// dead-letters the job when its deliveries run out (and never retries it without end).
#[actix_web::test]
async fn a_delivery_that_stored_nothing_counts() {
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::ZERO).await;
    model.fail_every(1);
    let mut settings = model_settings(&env, model.url("/v1"), 4_096);
    settings.llm.max_attempts = 1;
    settings.llm.breaker_failures = 100;
    settings.llm.parallel_parts = 1;
    settings.worker.max_deliveries = 1;
    settings.worker.claim_idle = Duration::from_millis(50);
    let (_services, mut consumer) = world(
        settings,
        &env,
        vec![job(0, long_text(60_000, "no progress"))],
    )
    .await;

    let mut runs = 0;
    while env.dead_letters().await == 0 && runs < 20 {
        consumer.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        runs += 1;
    }
    assert_eq!(
        env.dead_letters().await,
        1,
        "dead-lettered after {runs} runs"
    );
    assert_eq!(env.count("summary_parts").await, 0);
    assert_eq!(env.count("summaries").await, 0);
    let calls = model.jobs().len();
    assert!(
        (1..=2).contains(&calls),
        "one failed part per delivery, no endless retry: {calls} calls"
    );
}

/// The worker's own bound: a job whose plan needs more than twice `SUMMARYD_LLM_MAX_PARTS`
/// calls (the intake refuses such texts; this one was put on the stream directly, as an
/// older version or a changed setting could leave it) is dead-lettered before any call.
#[actix_web::test]
async fn a_plan_past_twice_max_parts_is_dead_lettered_before_any_call() {
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::ZERO).await;
    let mut settings = model_settings(&env, model.url("/v1"), 4_096);
    let text = long_text(60_000, "over the cap");
    let planned = summaryd::llm::most_calls(&summaryd::llm::fits(&settings.llm), &text);
    settings.llm.max_parts = planned / 2 - 1;
    let (_services, mut consumer) = world(settings, &env, vec![job(0, text)]).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(env.dead_letters().await, 1);
    assert!(model.jobs().is_empty(), "no call was paid for");
    assert_eq!(env.count("summaries").await, 0);

    // At exactly twice the cap, the job runs.
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::ZERO).await;
    let mut settings = model_settings(&env, model.url("/v1"), 4_096);
    let text = long_text(60_000, "at the cap");
    let planned = summaryd::llm::most_calls(&summaryd::llm::fits(&settings.llm), &text);
    settings.llm.max_parts = planned.div_ceil(2);
    let (_services, mut consumer) = world(settings, &env, vec![job(0, text)]).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(env.dead_letters().await, 0);
    assert_eq!(env.count("summaries").await, 1);
}

/// The intake's promise: a text it accepts needs at most `SUMMARYD_LLM_MAX_PARTS` model
/// calls (`llm::most_calls`, the plan `Fit::calls_for` makes), and the worker stops a plan
/// only past twice that. With `max_parts` set to exactly what the intake computed for the
/// text, the job is accepted, and must finish within that many calls.
#[actix_web::test]
async fn a_text_accepted_within_max_parts_finishes_within_them() {
    let env = TestEnv::new().await;
    let model = ContextModel::start(4_096, Duration::ZERO).await;
    let mut settings = model_settings(&env, model.url("/v1"), 4_096);
    let text = long_text(60_000, "quarterly");
    let needed = summaryd::llm::most_calls(&summaryd::llm::fits(&settings.llm), &text);
    settings.llm.max_parts = needed;
    let services = env
        .services()
        .settings(settings)
        .build_with_configured_models();
    let app = web::init_service(summaryd::api::app(
        services.api(),
        Roles::all(),
        Shutdown::new(),
    ))
    .await;
    let body = json!({"text": text, "notify": "ops@example.com"}).to_string();
    let res = web::call_service(
        &app,
        api_requests::post("acme", "within-max-parts-key-1", &body).to_request(),
    )
    .await;
    assert_eq!(
        res.status(),
        202,
        "accepted: {needed} calls is within max_parts"
    );
    let mut consumer = Consumer::new(services.worker(), "w-max-parts");
    consumer.ensure_group().await.unwrap();
    assert_eq!(consumer.run_once().await.unwrap(), 1);

    assert_eq!(
        env.dead_letters().await,
        0,
        "an accepted text is not dead-lettered for its plan"
    );
    assert_eq!(env.count("summaries").await, 1);
    let calls = model.jobs().len();
    assert!(
        calls <= needed,
        "the intake planned at most {needed} calls; the worker made {calls}"
    );
}
