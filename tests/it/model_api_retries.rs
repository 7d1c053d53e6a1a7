//! The OpenAI-compatible client under the retry policy and the worker, against a real HTTP
//! server on loopback: what is retried, how long it waits, and what dead-letters at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use summaryd::config::{LlmProvider, LlmSettings, Settings};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::llm::retry::{Deadline, RetryError, RetryPolicy, complete_with_retries};
use summaryd::llm::{LlmError, OpenAiClient, ProviderConfig};
use summaryd::resilience::failure::Classify;
use summaryd::stream::consumer_group::pending_count;
use summaryd::stream::enqueue;
use summaryd::worker::{Consumer, WorkerServices};

use crate::shared::http_stub::{HttpStub, Reply, closed_port_url};
use crate::shared::{FakeMailer, TestEnv};

fn settings_for(base_url: &str) -> LlmSettings {
    LlmSettings {
        provider: LlmProvider::Openai,
        base_url: base_url.into(),
        api_key: Some("sk-test".into()),
        call_timeout: Duration::from_secs(2),
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(8),
        ..Settings::default().llm
    }
}

async fn call(stub_url: &str, adjust: impl FnOnce(&mut LlmSettings)) -> Result<String, RetryError> {
    let mut settings = settings_for(stub_url);
    adjust(&mut settings);
    let client = OpenAiClient::new(&ProviderConfig::primary(&settings)).unwrap();
    let policy = RetryPolicy::from_settings(&settings);
    complete_with_retries(
        &client,
        "Renewal agreed. Pricing to follow.",
        Deadline::after(Duration::from_secs(30)),
        &policy,
        None,
    )
    .await
    .map(|completion| completion.summary)
}

#[tokio::test]
async fn rate_limited_with_retry_after_waits_then_succeeds() {
    let stub = HttpStub::start(Reply::completion("Renewal agreed.")).await;
    stub.script(vec![
        Reply::json(429, serde_json::json!({"error": {"message": "slow down"}}))
            .with_header("Retry-After", "1"),
    ]);
    let started = Instant::now();
    let summary = call(&stub.url("/v1"), |_| {}).await.unwrap();
    assert_eq!(summary, "Renewal agreed.");
    assert_eq!(stub.requests().len(), 2);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was honoured"
    );
}

#[tokio::test]
async fn retry_after_ms_is_honoured() {
    let stub = HttpStub::start(Reply::completion("ok")).await;
    stub.script(vec![
        Reply::json(429, serde_json::json!({})).with_header("retry-after-ms", "300"),
    ]);
    let started = Instant::now();
    call(&stub.url("/v1"), |_| {}).await.unwrap();
    assert_eq!(stub.requests().len(), 2);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn service_unavailable_twice_then_ok_takes_three_calls() {
    let stub = HttpStub::start(Reply::completion("ok")).await;
    stub.script(vec![Reply::text(503, "busy"), Reply::text(503, "busy")]);
    assert_eq!(call(&stub.url("/v1"), |_| {}).await.unwrap(), "ok");
    assert_eq!(stub.requests().len(), 3);
}

#[tokio::test]
async fn unauthorized_and_malformed_answers_are_permanent_after_one_call() {
    for reply in [
        Reply::json(401, serde_json::json!({"error": {"message": "bad key"}})),
        Reply::json(200, serde_json::json!({"choices": []})),
    ] {
        let stub = HttpStub::start(reply).await;
        let err = call(&stub.url("/v1"), |_| {}).await.unwrap_err();
        assert!(!err.is_transient(), "{err}");
        assert_eq!(stub.requests().len(), 1, "{err}");
    }
}

#[tokio::test]
async fn a_dripping_response_is_cut_by_the_call_timeout_and_retried() {
    let stub = HttpStub::start(Reply::completion("finally")).await;
    stub.script(vec![Reply::Drip {
        every: Duration::from_millis(200),
    }]);
    let started = Instant::now();
    let summary = call(&stub.url("/v1"), |s| {
        s.call_timeout = Duration::from_millis(500)
    })
    .await
    .unwrap();
    assert_eq!(summary, "finally");
    assert_eq!(stub.requests().len(), 2);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the first call ran to its timeout"
    );
}

#[tokio::test]
async fn connection_refused_is_retried_and_reported_transient() {
    let url = closed_port_url("/v1");
    let err = call(&url, |s| s.max_attempts = 2).await.unwrap_err();
    assert!(
        matches!(err, RetryError::Llm(LlmError::Connect(_))),
        "{err}"
    );
    assert!(err.is_transient());
}

fn job() -> Job {
    Job {
        job_id: JobId::from_scoped_key("idem:acme:POST:/v1/summaries:model-retries-1"),
        tenant: TenantId::parse("acme").unwrap(),
        text: "Long call notes.".into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// A worker whose model is the OpenAI client pointed at `url`.
async fn worker(env: &TestEnv, url: &str) -> (Consumer, WorkerServices) {
    let mut settings = env.settings.clone();
    settings.llm = settings_for(url);
    let llm = summaryd::llm::from_settings(&settings.llm).unwrap();
    let services = env
        .services()
        .settings(settings)
        .llm(llm)
        .mailer(Arc::new(FakeMailer::new()))
        .build()
        .worker();
    let consumer = Consumer::new(services.clone(), "w-1");
    consumer.ensure_group().await.unwrap();
    let mut redis = services.redis.get().await.unwrap();
    enqueue(&mut redis, services.keys.get(0), &job())
        .await
        .unwrap();
    (consumer, services)
}

#[tokio::test]
async fn a_bad_request_from_the_model_api_dead_letters_after_one_call() {
    let env = TestEnv::new().await;
    let stub = HttpStub::start(Reply::json(
        400,
        serde_json::json!({"error": {"message": "context length exceeded"}}),
    ))
    .await;
    let (mut consumer, services) = worker(&env, &stub.url("/v1")).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(stub.requests().len(), 1);
    assert_eq!(env.dead_letters().await, 1);
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        0
    );
    assert_eq!(env.count("summaries").await, 0);
}

#[tokio::test]
async fn an_unreachable_model_api_leaves_the_job_pending_for_redelivery() {
    let env = TestEnv::new().await;
    let url = closed_port_url("/v1");
    let (mut consumer, services) = worker(&env, &url).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(env.dead_letters().await, 0);
    let mut redis = services.redis.get().await.unwrap();
    assert_eq!(
        pending_count(&mut redis, services.keys.get(0))
            .await
            .unwrap(),
        1
    );
}
