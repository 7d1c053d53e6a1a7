//! The model step with several providers: the fallback chain, the circuit breakers, the
//! fault classification (the job's, the provider's, transient) and what every job cost.
//! Real HTTP servers on loopback stand in for the providers; Redis and Postgres are real.

use std::time::{Duration, Instant};

use actix_web::test as web;
use chrono::Utc;
use serde_json::{Value, json};
use summaryd::cli::UsageArgs;
use summaryd::config::roles::Roles;
use summaryd::config::{FallbackSettings, LlmProvider, Settings};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::{delivery_count, pending_count};
use summaryd::stream::enqueue;
use summaryd::worker::{Consumer, WorkerError};

use crate::shared::http_stub::{HttpStub, Reply, Request};
use crate::shared::test_env::Services;
use crate::shared::{TestEnv, eventually};

const PRIMARY: &str = "primary-model";
const LOCAL: &str = "local-model";

/// A chat completion that reports its usage, as OpenAI and most compatible servers do.
fn completion(content: &str, prompt: u32, completion: u32) -> Reply {
    Reply::json(
        200,
        json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}
        }),
    )
}

fn error(status: u16, message: &str) -> Reply {
    Reply::json(status, json!({"error": {"message": message}}))
}

/// Settings with the primary at `primary` and, when given, one fallback at `fallback`: two
/// attempts per delivery, a breaker that opens on the third failure in a row, a short
/// cooldown, and waits short enough for a test.
fn settings(env: &TestEnv, primary: &HttpStub, fallback: Option<&HttpStub>) -> Settings {
    let mut s = env.settings.clone();
    s.llm.provider = LlmProvider::Openai;
    s.llm.base_url = primary.url("/v1").into();
    s.llm.model = PRIMARY.into();
    s.llm.api_key = Some("sk-primary-0000".into());
    s.llm.max_attempts = 2;
    s.llm.backoff = Duration::from_millis(1);
    s.llm.max_backoff = Duration::from_millis(5);
    s.llm.call_timeout = Duration::from_secs(2);
    s.llm.breaker_failures = 3;
    s.llm.breaker_cooldown = Duration::from_millis(200);
    s.llm.fallback = fallback
        .map(|f| FallbackSettings {
            provider: LlmProvider::Openai,
            base_url: f.url("/v1").into(),
            model: LOCAL.into(),
            api_key_env: None,
            call_timeout: None,
            context_tokens: None,
            rpm: None,
            tpm: None,
            price_per_mtok_input: None,
            price_per_mtok_output: None,
        })
        .into_iter()
        .collect();
    s
}

fn job(n: usize) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:chain-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Call notes number {n}: the renewal is at risk.").into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// The services with the configured providers, a consumer, and `jobs` jobs on the stream.
async fn world(settings: Settings, env: &TestEnv, jobs: usize) -> (Services, Consumer) {
    let services = env
        .services()
        .settings(settings)
        .build_with_configured_models();
    let consumer = Consumer::new(services.worker(), "w-chain");
    consumer.ensure_group().await.unwrap();
    let mut redis = services.redis.get().await.unwrap();
    for n in 0..jobs {
        enqueue(&mut redis, services.keys.get(0), &job(n))
            .await
            .unwrap();
    }
    (services, consumer)
}

async fn models_of_summaries(env: &TestEnv) -> Vec<(Option<String>, Option<i32>, Option<i32>)> {
    env.pg()
        .await
        .query(
            "SELECT model, prompt_tokens, completion_tokens FROM summaries ORDER BY job_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn max_tokens(request: &Request) -> Option<u64> {
    request.json()["max_tokens"].as_u64()
}

/// Requests that were breaker probes (one completion token) and requests that were jobs.
fn probes_and_jobs(stub: &HttpStub) -> (usize, usize) {
    let requests = stub.requests();
    let probes = requests.iter().filter(|r| max_tokens(r) == Some(1)).count();
    (probes, requests.len() - probes)
}

async fn usage_json(services: &Services, tenant: Option<&str>) -> Vec<Value> {
    let pg = summaryd::infra::connections::pg_pool(&services.settings).unwrap();
    let args = UsageArgs {
        since: Some(Duration::from_secs(3_600)),
        tenant: tenant.map(str::to_owned),
        json: true,
    };
    let mut out = Vec::new();
    summaryd::ops::usage::report(&pg, &args, &mut out)
        .await
        .unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[actix_web::test]
async fn with_the_primary_down_jobs_finish_on_the_fallback_in_their_first_delivery() {
    let env = TestEnv::new().await;
    let primary = HttpStub::start(error(503, "overloaded")).await;
    let fallback = HttpStub::start(completion("Renewal at risk.", 11, 4)).await;
    let (services, mut consumer) = world(settings(&env, &primary, Some(&fallback)), &env, 3).await;

    for _ in 0..3 {
        assert_eq!(consumer.run_once().await.unwrap(), 1);
    }

    // Job 1: two attempts on the primary, then the fallback. Job 2: the primary's third
    // failure in a row opens its breaker, so job 2 and job 3 skip it.
    // (Probes of the open breaker may come on top when the machine is slow; they are not
    // jobs.)
    assert_eq!(probes_and_jobs(&primary).1, 3);
    assert_eq!(fallback.requests().len(), 3);
    for request in fallback.requests() {
        assert_eq!(
            max_tokens(&request),
            Some(512),
            "the completion cap is sent"
        );
        assert_eq!(request.json()["model"], LOCAL);
    }
    assert_eq!(
        models_of_summaries(&env).await,
        vec![(Some(LOCAL.to_string()), Some(11), Some(4)); 3]
    );
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        0
    );
    assert_eq!(env.dead_letters().await, 0);
    assert_eq!(env.count("outbox").await, 3, "one email intent each");

    // GET names the model that wrote the summary.
    let app = web::init_service(summaryd::api::app(
        services.api(),
        Roles::all(),
        Shutdown::new(),
    ))
    .await;
    let job_id = job(0).job_id.to_string();
    let res = web::call_service(
        &app,
        crate::shared::api_requests::get("acme", &job_id).to_request(),
    )
    .await;
    let view = crate::shared::api_requests::json_body(res).await;
    assert_eq!(view["status"], "done");
    assert_eq!(view["model"], LOCAL);

    // Tokens are counted under the model that spent them; the primary's breaker is open.
    let metrics = services.metrics.render();
    for line in [
        r#"summaryd_llm_tokens_total{kind="prompt",model="local-model"} 33"#,
        r#"summaryd_llm_tokens_total{kind="completion",model="local-model"} 12"#,
        r#"summaryd_llm_breaker_open{provider="openai:primary-model"} 1"#,
        r#"summaryd_llm_breaker_open{provider="openai:local-model"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }

    // `summaryd usage --json`: the sums the fake servers returned, per tenant and model.
    assert_eq!(
        usage_json(&services, None).await,
        vec![json!({"tenant": "acme", "model": LOCAL, "jobs": 3,
                    "prompt_tokens": 33, "completion_tokens": 12})]
    );
    assert!(usage_json(&services, Some("other")).await.is_empty());
}

#[tokio::test]
async fn a_primary_answering_401_opens_at_once_and_jobs_go_to_the_fallback() {
    for status in [401, 403, 404] {
        let env = TestEnv::new().await;
        let primary = HttpStub::start(error(status, "Incorrect API key provided")).await;
        let fallback = HttpStub::start(completion("Fine.", 5, 1)).await;
        let (_services, mut consumer) =
            world(settings(&env, &primary, Some(&fallback)), &env, 3).await;
        for _ in 0..3 {
            assert_eq!(consumer.run_once().await.unwrap(), 1);
        }
        assert_eq!(
            probes_and_jobs(&primary).1,
            1,
            "{status}: one call, not retried (probes aside)"
        );
        assert_eq!(fallback.requests().len(), 3, "{status}");
        assert_eq!(env.dead_letters().await, 0, "{status}");
        assert_eq!(env.count("summaries").await, 3, "{status}");
    }
}

#[tokio::test]
async fn a_bad_request_is_dead_lettered_after_one_call_and_never_tried_elsewhere() {
    let env = TestEnv::new().await;
    let primary = HttpStub::start(error(400, "maximum context length exceeded")).await;
    let fallback = HttpStub::start(completion("never", 1, 1)).await;
    let (services, mut consumer) = world(settings(&env, &primary, Some(&fallback)), &env, 1).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(probes_and_jobs(&primary), (0, 1));
    assert!(
        fallback.requests().is_empty(),
        "the fallback is never called"
    );
    assert_eq!(env.dead_letters().await, 1);
    assert_eq!(env.count("summaries").await, 0);
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        0
    );
}

/// With no fallback, a misconfigured provider makes jobs wait, not dead-letter: the delivery
/// that met it is refunded, no other job is taken, `/readyz` says why (and stays 200), and
/// once the key works again one probe closes the breaker and every job is done.
#[actix_web::test]
async fn with_no_fallback_a_401_makes_jobs_wait_until_a_probe_passes() {
    let env = TestEnv::new().await;
    let primary = HttpStub::start(error(401, "Incorrect API key provided")).await;
    let mut settings = settings(&env, &primary, None);
    // One delivery per job: any delivery spent on the outage would dead-letter it.
    settings.worker.max_deliveries = 1;
    settings.worker.claim_idle = Duration::from_millis(50);
    let (services, mut consumer) = world(settings, &env, 2).await;

    assert_eq!(
        consumer.run_once().await.unwrap(),
        1,
        "the first job meets the 401"
    );
    for _ in 0..3 {
        match consumer.run_once().await {
            Err(WorkerError::Paused { dependency, .. }) => assert_eq!(dependency, "model"),
            other => panic!("expected a pause, got {other:?}"),
        }
    }
    assert_eq!(
        probes_and_jobs(&primary).1,
        1,
        "one job call; any probe so far met the 401"
    );
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        1,
        "the second job was not taken"
    );
    // id, consumer, idle ms, deliveries
    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(services.keys.get(0).stream())
        .arg("summarizers")
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        delivery_count(&mut redis, services.keys.get(0), &pending[0].0)
            .await
            .unwrap(),
        Some(0),
        "the delivery that met the outage was refunded"
    );
    assert_eq!(env.dead_letters().await, 0);

    // /readyz: ready, and the breaker shows.
    let app = web::init_service(summaryd::api::app(
        services.api(),
        Roles::all(),
        Shutdown::new(),
    ))
    .await;
    let res = web::call_service(&app, web::TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), 200);
    let body: Value = web::read_body_json(res).await;
    let check = body["checks"]["model:openai:primary-model"]
        .as_str()
        .unwrap_or_default();
    assert!(
        check.contains("breaker open") && check.contains("401"),
        "{body}"
    );

    // The key is fixed: after the cooldown a probe passes, and both jobs are done.
    // A probe is recorded when it arrives and answered with the reply standing then, so
    // every probe counted here met the 401.
    let failed_probes = probes_and_jobs(&primary).0;
    primary.set_reply(completion("Back.", 9, 2));
    // Passes stay paused until the cooldown is over and the probe passed; then passes that
    // take a job run back to back.
    let consumer = tokio::sync::Mutex::new(consumer);
    let taken = std::cell::Cell::new(0);
    assert!(
        eventually(Duration::from_secs(10), || async {
            let mut consumer = consumer.lock().await;
            while taken.get() < 2 {
                match consumer.run_once().await {
                    Ok(0) | Err(WorkerError::Paused { .. }) => return false,
                    Ok(n) => taken.set(taken.get() + n),
                    Err(e) => panic!("{e}"),
                }
            }
            true
        })
        .await,
        "both jobs taken after the recovery: {}",
        taken.get()
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            env.count("summaries").await == 2
        })
        .await,
        "both jobs done after the recovery"
    );
    let (probes, jobs) = probes_and_jobs(&primary);
    assert_eq!(probes - failed_probes, 1, "one probe closed the breaker");
    assert_eq!(jobs, 3, "the refused call and one call per job");
    assert_eq!(env.dead_letters().await, 0);
    assert_eq!(
        models_of_summaries(&env).await,
        vec![(Some(PRIMARY.to_string()), Some(9), Some(2)); 2]
    );
    let res = web::call_service(&app, web::TestRequest::get().uri("/readyz").to_request()).await;
    let body: Value = web::read_body_json(res).await;
    assert_eq!(body["checks"]["model:openai:primary-model"], "ok", "{body}");
}

/// A primary that sends its headers and then one byte a second is cut off by the call
/// timeout (wall clock, not per read), its connection is closed, and the fallback answers
/// within the same delivery.
#[tokio::test]
async fn a_dripping_primary_is_cut_by_the_call_timeout_and_the_fallback_answers() {
    let env = TestEnv::new().await;
    let primary = HttpStub::start(Reply::Drip {
        every: Duration::from_secs(1),
    })
    .await;
    let fallback = HttpStub::start(completion("Fallback.", 3, 1)).await;
    let mut settings = settings(&env, &primary, Some(&fallback));
    settings.llm.call_timeout = Duration::from_millis(500);
    settings.llm.max_attempts = 1;
    let (_services, mut consumer) = world(settings, &env, 1).await;
    let started = Instant::now();
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "cut by the 500 ms call timeout: {took:?}"
    );
    assert_eq!(probes_and_jobs(&primary), (0, 1));
    assert_eq!(
        models_of_summaries(&env).await,
        vec![(Some(LOCAL.to_string()), Some(3), Some(1))]
    );
    assert!(
        primary.wait_all_closed(Duration::from_secs(3)).await,
        "the dripping connection was released"
    );
}
