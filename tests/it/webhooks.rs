//! Signed webhooks end to end (CONTRACT §9): a job's `summary.completed` or
//! `summary.failed` is committed as an outbox row, and the relay signs and posts it to a
//! receiver on loopback (`HttpStub`). Every request a test is about is checked by the
//! Standard Webhooks reference library, not by summaryd's own signing code; effects are read
//! from the requests received, the outbox and `webhook_endpoints` rows, and Redis.
//!
//! Receivers listen on 127.0.0.1 over plain http, so the settings allow private targets and
//! http, except in the tests of those rules.

use std::sync::Arc;
use std::time::Duration;

use actix_web::test::{self, TestRequest};
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde_json::{Value, json};
use summaryd::api;
use summaryd::api::auth::token_sha256;
use summaryd::config::Settings;
use summaryd::config::roles::Roles;
use summaryd::db::summaries::{CommitOutcome, commit_with_outbox};
use summaryd::domain::{Job, JobId, TenantId, WebhookSecret, WebhookUrl};
use summaryd::llm::LlmError;
use summaryd::relay::{PassReport, relay_pass};
use summaryd::shutdown::Shutdown;
use summaryd::worker::Consumer;
use tempfile::NamedTempFile;

use crate::shared::api_requests::{get, post, stream_len};
use crate::shared::http_stub::{HttpStub, Recorded, Reply};
use crate::shared::standard_webhooks::{verify, verify_all};
use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually, model_summary};

const TEXT: &str = "Quarterly numbers are up. Churn is down. The board meets on Friday.";

/// Header mode's `SUMMARYD_WEBHOOK_SECRETS_FILE`: one secret a line, the first signs first.
fn secrets_file(secrets: &[&str]) -> NamedTempFile {
    let mut file = NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, secrets.join("\n").as_bytes()).unwrap();
    file
}

/// Settings for receivers on loopback: private targets and plain http allowed, header
/// mode's secrets from `secrets`, and a relay that retries at once (no backoff) so a test
/// drives each attempt with one pass.
fn loopback(env: &TestEnv, secrets: Option<&NamedTempFile>) -> Settings {
    let mut s = env.settings.clone();
    s.webhook.allow_private = true;
    s.webhook.allow_http = true;
    s.webhook.secrets_file = secrets.map(|f| f.path().to_path_buf());
    s.webhook.timeout = Duration::from_secs(5);
    s.relay.backoff = Duration::ZERO;
    s.relay.max_backoff = Duration::ZERO;
    s.relay.lease = Duration::from_secs(60);
    s
}

/// One request to the in-process API: (status, body as JSON).
async fn call(services: &Services, req: TestRequest) -> (u16, Value) {
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, req.to_request()).await;
    let status = res.status().as_u16();
    let bytes = test::read_body(res).await;
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, body)
}

/// A POST whose body is `body`.
fn post_json(tenant: &str, key: &str, body: &Value) -> TestRequest {
    post(tenant, key, &body.to_string())
}

fn with_webhook(url: &str) -> Value {
    json!({"text": TEXT, "webhook": {"url": url}})
}

/// POST `body` and expect a 202: the job id.
async fn accept(services: &Services, tenant: &str, key: &str, body: &Value) -> JobId {
    let (status, answer) = call(services, post_json(tenant, key, body)).await;
    assert_eq!(status, 202, "{answer}");
    answer["job_id"].as_str().unwrap().parse().unwrap()
}

/// One worker pass over the stream: the jobs it settled.
async fn work(services: &Services) -> usize {
    let mut consumer = Consumer::new(services.worker(), "w-webhooks");
    consumer.ensure_group().await.unwrap();
    consumer.run_once().await.unwrap()
}

async fn relay(services: &Services) -> PassReport {
    relay_pass(&services.relay()).await.unwrap()
}

/// A finished job with a webhook to `url` and no email, committed as the worker commits
/// one; `url` is taken as stored, without the intake rules (as a job accepted under other
/// rules, or a name that resolved elsewhere then).
async fn commit(services: &Services, tenant: &str, n: u32, url: &str) -> JobId {
    let job = Job {
        job_id: JobId::from_scoped_key(&format!("idem:{tenant}:POST:/v1/summaries:webhook-{n}")),
        tenant: TenantId::parse(tenant).unwrap(),
        text: TEXT.into(),
        notify: None,
        webhook: Some(WebhookUrl::from_stored(url).unwrap()),
        created_at: Utc::now(),
    };
    let outcome = commit_with_outbox(&services.pg, &job, &model_summary("Numbers up."))
        .await
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Inserted);
    job.job_id
}

/// The webhook-id of a job's event, spelt out as the contract has it.
fn webhook_id(job: JobId, event: &str) -> String {
    format!("msg_{}_{event}", job.as_uuid().simple())
}

fn completed_id(job: JobId) -> String {
    webhook_id(job, "summary_completed")
}

/// An outbox row as the relay left it.
#[derive(Debug)]
struct Row {
    topic: String,
    attempts: i32,
    last_status: Option<i32>,
    last_error: Option<String>,
    sent: bool,
    failed: bool,
    skipped: bool,
    first_failed: bool,
    /// Seconds from now until the row is due.
    due_in_s: f64,
}

impl Row {
    fn error(&self) -> &str {
        self.last_error.as_deref().unwrap_or_default()
    }
}

async fn row(env: &TestEnv, dedupe_key: &str) -> Row {
    let r = env
        .pg()
        .await
        .query_one(
            "SELECT topic, attempts, last_status, last_error, sent_at IS NOT NULL, \
                    failed_at IS NOT NULL, skipped_at IS NOT NULL, first_failed_at IS NOT NULL, \
                    extract(epoch FROM next_attempt_at - now())::float8 \
               FROM outbox WHERE dedupe_key = $1",
            &[&dedupe_key],
        )
        .await
        .unwrap_or_else(|e| panic!("outbox row {dedupe_key}: {e}"));
    Row {
        topic: r.get(0),
        attempts: r.get(1),
        last_status: r.get(2),
        last_error: r.get(3),
        sent: r.get(4),
        failed: r.get(5),
        skipped: r.get(6),
        first_failed: r.get(7),
        due_in_s: r.get(8),
    }
}

/// (disabled, reason, failing) of the tenant's endpoint `url`; `None` without a row.
async fn endpoint(env: &TestEnv, tenant: &str, url: &str) -> Option<(bool, Option<String>, bool)> {
    env.pg()
        .await
        .query_opt(
            "SELECT disabled_at IS NOT NULL, disabled_reason, failing_since IS NOT NULL \
               FROM webhook_endpoints WHERE tenant = $1 AND url = $2",
            &[&tenant, &url],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
}

fn deliveries(services: &Services, result: &str) -> u64 {
    services
        .metrics
        .webhook_deliveries
        .with_label_values(&[result])
        .get()
}

fn timestamp(request: &Recorded) -> i64 {
    request
        .header("webhook-timestamp")
        .expect("webhook-timestamp")
        .parse()
        .expect("webhook-timestamp is Unix seconds")
}

fn instant(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {value}"))
        .parse()
        .unwrap_or_else(|e| panic!("{value}: {e}"))
}

/// Every key under the test's prefix.
async fn redis_keys(env: &TestEnv) -> Vec<String> {
    env.redis()
        .await
        .keys(format!("{}*", env.settings.key_prefix))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_job_with_only_a_webhook_is_summarised_and_its_signed_summary_completed_delivered() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(200, "thanks")).await;
    let services = env.services().settings(loopback(&env, Some(&file))).build();
    let url = receiver.url("/hooks/summaryd?source=test");

    let job = accept(&services, "acme", "webhook-only-00001", &with_webhook(&url)).await;
    assert_eq!(work(&services).await, 1);
    assert_eq!(env.count("outbox").await, 1, "one webhook row, no email");
    let report = relay(&services).await;
    assert_eq!((report.sent, report.claimed), (1, 1), "{report:?}");

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let payloads = verify_all(&secret, &requests).await;
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/hooks/summaryd?source=test");
    assert_eq!(
        request.header("webhook-id"),
        Some(completed_id(job).as_str())
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    let agent = request.header("user-agent").unwrap_or_default();
    assert!(agent.starts_with("summaryd/"), "{agent}");
    let age = Utc::now().timestamp() - timestamp(request);
    assert!(
        (-300..=300).contains(&age),
        "webhook-timestamp is now: {age} s off"
    );

    // The body says what the summaries row says.
    let summary = env
        .pg()
        .await
        .query_one(
            "SELECT summary, model, completed_at FROM summaries WHERE job_id = $1",
            &[&job.as_uuid()],
        )
        .await
        .unwrap();
    let (text, model, completed_at): (String, String, DateTime<Utc>) =
        (summary.get(0), summary.get(1), summary.get(2));
    let payload = &payloads[0];
    assert_eq!(payload, &request.json(), "the library returns the body");
    assert_eq!(payload["type"], "summary.completed");
    let data = &payload["data"];
    assert_eq!(data["job_id"], job.to_string());
    assert_eq!(data["status"], "done");
    assert_eq!(data["summary"], text.as_str());
    assert_eq!(data["model"], model.as_str());
    assert_eq!(instant(&data["completed_at"]), completed_at);
    assert_eq!(instant(&payload["timestamp"]), completed_at);
    assert!(data.get("error").is_none(), "{payload}");
    // And what GET says.
    let (status, view) = call(&services, get("acme", &job.to_string())).await;
    assert_eq!(status, 200);
    assert_eq!(view["status"], "done");
    assert_eq!(view["summary"], data["summary"]);
    assert_eq!(
        instant(&view["completed_at"]),
        instant(&data["completed_at"])
    );

    let delivered = row(&env, &completed_id(job)).await;
    assert_eq!(delivered.topic, "webhook");
    assert!(
        delivered.sent && !delivered.failed && !delivered.skipped,
        "{delivered:?}"
    );
    assert_eq!(delivered.last_status, Some(200));
    assert_eq!(delivered.attempts, 0, "delivered at the first attempt");
    assert_eq!(deliveries(&services, "delivered"), 1);
    assert_eq!(
        env.count("webhook_endpoints").await,
        0,
        "a healthy endpoint has no row"
    );

    assert_eq!(relay(&services).await.claimed, 0, "nothing left to send");
    assert_eq!(receiver.requests().len(), 1);
}

#[tokio::test]
async fn a_job_with_notify_and_a_webhook_gets_both_from_independent_rows() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    // The receiver is down at first: the email must not wait for it, nor be sent again.
    receiver.script(vec![Reply::text(500, "deploying")]);
    let mailer = Arc::new(FakeMailer::new());
    let services = env
        .services()
        .settings(loopback(&env, Some(&file)))
        .mailer(mailer.clone())
        .build();
    let body =
        json!({"text": TEXT, "notify": "ops@example.com", "webhook": {"url": receiver.url("/h")}});

    let job = accept(&services, "acme", "webhook-and-mail-01", &body).await;
    assert_eq!(work(&services).await, 1);
    let topics: Vec<String> = env
        .pg()
        .await
        .query("SELECT topic FROM outbox ORDER BY topic", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(topics, ["email.summary_ready", "webhook"]);

    let first = relay(&services).await;
    assert_eq!((first.sent, first.retrying), (1, 1), "{first:?}");
    let sent = mailer.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1, format!("summary_ready:{job}"));
    assert_eq!(sent[0].0.to, "ops@example.com");
    assert!(row(&env, &completed_id(job)).await.first_failed);

    let second = relay(&services).await;
    assert_eq!(
        (second.sent, second.claimed),
        (1, 1),
        "only the webhook again: {second:?}"
    );
    assert_eq!(mailer.attempts(), 1, "the email is not sent again");
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    let payloads = verify_all(&secret, &requests).await;
    assert_eq!(payloads[1]["data"]["job_id"], job.to_string());
    let summary = payloads[1]["data"]["summary"].as_str().expect("a summary");
    assert!(sent[0].0.text.contains(summary), "one summary, two effects");
    assert!(row(&env, &completed_id(job)).await.sent);
    assert!(row(&env, &format!("summary_ready:{job}")).await.sent);
}

#[tokio::test]
async fn a_dead_lettered_job_sends_one_summary_failed_with_gets_error_even_when_its_settlement_is_retried()
 {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(204, "")).await;
    // The model refuses the request for good: the job is dead-lettered on its first delivery.
    let llm = Arc::new(FakeLlm::failing(LlmError::Status {
        status: 400,
        retry_after: None,
        message: "HTTP 400".into(),
    }));
    let mut settings = loopback(&env, Some(&file));
    settings.llm.backoff = Duration::from_millis(1);
    settings.llm.max_backoff = Duration::from_millis(5);
    let services = env.services().settings(settings).llm(llm.clone()).build();
    let job = accept(
        &services,
        "acme",
        "webhook-dead-00001",
        &with_webhook(&receiver.url("/failed")),
    )
    .await;

    // The first settlement records the event, then its dead letter fails (the dead-letter
    // stream's key holds a string): Redis failing between the two writes.
    let dead_key = services.keys.get(0).dead_letters();
    let mut redis = env.redis().await;
    let _: () = redis.set(&dead_key, "in the way").await.unwrap();
    let consumer = Consumer::new(services.worker(), "w-dead");
    consumer.ensure_group().await.unwrap();
    let consumer = tokio::sync::Mutex::new(consumer);
    let _ = consumer.lock().await.run_once().await;
    let failed_id = webhook_id(job, "summary_failed");
    assert_eq!(
        env.count("outbox").await,
        1,
        "recorded before the dead letter"
    );
    let (_, view) = call(&services, get("acme", &job.to_string())).await;
    assert_eq!(view["status"], "queued", "not dead-lettered yet: {view}");

    // The settlement is retried once Redis takes the dead letter.
    let _: () = redis.del(&dead_key).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            let _ = consumer.lock().await.run_once().await;
            env.dead_letters().await == 1
        })
        .await,
        "the job is dead-lettered"
    );
    assert_eq!(env.count("outbox").await, 1, "one summary.failed row");
    assert_eq!(llm.calls(), 1, "the settlement was retried, not the job");
    assert_eq!(env.count("summaries").await, 0);
    let (status, view) = call(&services, get("acme", &job.to_string())).await;
    assert_eq!(status, 200);
    assert_eq!(view["status"], "failed");
    let error = view["error"].as_str().expect("GET says why").to_owned();

    let report = relay(&services).await;
    assert_eq!(report.sent, 1, "{report:?}");
    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let payloads = verify_all(&secret, &requests).await;
    assert_eq!(requests[0].header("webhook-id"), Some(failed_id.as_str()));
    let payload = &payloads[0];
    assert_eq!(payload["type"], "summary.failed");
    let data = &payload["data"];
    assert_eq!(data["job_id"], job.to_string());
    assert_eq!(data["status"], "failed");
    assert_eq!(
        data["error"],
        error.as_str(),
        "the tenant's wording, as GET has it"
    );
    for absent in ["summary", "model", "completed_at"] {
        assert!(data.get(absent).is_none(), "{absent}: {payload}");
    }
    let delivered = row(&env, &failed_id).await;
    assert!(delivered.sent, "{delivered:?}");
    assert_eq!(delivered.last_status, Some(204));
}

#[tokio::test]
async fn a_500_is_retried_with_the_same_webhook_id_and_each_attempt_is_signed_afresh() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    receiver.script(vec![Reply::text(500, "internal error")]);
    let services = env.services().settings(loopback(&env, Some(&file))).build();
    let job = commit(&services, "acme", 1, &receiver.url("/hook")).await;
    let id = completed_id(job);

    let first = relay(&services).await;
    assert_eq!((first.retrying, first.sent), (1, 0), "{first:?}");
    let failed = row(&env, &id).await;
    assert_eq!(failed.attempts, 1);
    assert_eq!(failed.last_status, Some(500));
    assert!(failed.error().contains("500"), "{failed:?}");
    assert!(
        failed.first_failed && !failed.sent && !failed.failed,
        "{failed:?}"
    );
    assert_eq!(deliveries(&services, "retrying"), 1);
    let url = receiver.url("/hook");
    assert_eq!(
        endpoint(&env, "acme", &url).await,
        Some((false, None, true)),
        "the failure opened a run of failures"
    );

    let second = relay(&services).await;
    assert_eq!(second.sent, 1, "{second:?}");
    assert_eq!(
        endpoint(&env, "acme", &url).await,
        Some((false, None, false)),
        "the delivery ended it"
    );
    let delivered = row(&env, &id).await;
    assert!(delivered.sent, "{delivered:?}");
    assert_eq!(
        delivered.attempts, 1,
        "one failed attempt before the delivery"
    );
    assert_eq!(delivered.last_status, Some(200));
    assert_eq!(deliveries(&services, "delivered"), 1);

    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    verify_all(&secret, &requests).await;
    for request in &requests {
        assert_eq!(request.header("webhook-id"), Some(id.as_str()));
        let age = Utc::now().timestamp() - timestamp(request);
        assert!((-300..=300).contains(&age), "{age}");
    }
    assert_eq!(requests[0].body, requests[1].body, "the same event");
    assert!(timestamp(&requests[1]) >= timestamp(&requests[0]));
}

#[tokio::test]
async fn retry_after_of_a_429_or_503_sets_when_the_row_is_next_due_capped_by_max_backoff() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let mut settings = loopback(&env, Some(&file));
    settings.relay.max_backoff = Duration::from_secs(60);
    let services = env.services().settings(settings.clone()).build();

    for (n, status) in [(1, 429), (2, 503)] {
        let receiver =
            HttpStub::start(Reply::text(status, "busy").with_header("Retry-After", "30")).await;
        let job = commit(&services, "acme", n, &receiver.url("/hook")).await;
        let report = relay(&services).await;
        assert_eq!(
            (report.claimed, report.retrying),
            (1, 1),
            "{status}: {report:?}"
        );
        let waiting = row(&env, &completed_id(job)).await;
        assert_eq!(waiting.last_status, Some(i32::from(status)));
        assert!(
            (25.0..=35.0).contains(&waiting.due_in_s),
            "{status}: due in {} s, not the receiver's 30",
            waiting.due_in_s
        );
        assert_eq!(receiver.requests().len(), 1);
        verify_all(&secret, &receiver.requests()).await;
    }

    // SUMMARYD_RELAY_MAX_BACKOFF_MS caps the receiver's wait.
    settings.relay.max_backoff = Duration::from_secs(5);
    let capped = env.services().settings(settings).build();
    let receiver = HttpStub::start(Reply::text(429, "busy").with_header("Retry-After", "30")).await;
    let job = commit(&capped, "acme", 3, &receiver.url("/hook")).await;
    let report = relay(&capped).await;
    assert_eq!((report.claimed, report.retrying), (1, 1), "{report:?}");
    let waiting = row(&env, &completed_id(job)).await;
    assert!(
        (3.0..=6.0).contains(&waiting.due_in_s),
        "due in {} s, not the 5 s cap",
        waiting.due_in_s
    );
}

#[tokio::test]
async fn during_a_rotation_each_request_carries_both_signatures_and_verifies_with_either() {
    let env = TestEnv::new().await;
    let (new, old) = (WebhookSecret::generate(), WebhookSecret::generate());
    let file = secrets_file(&[&new, &old]);
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    let services = env.services().settings(loopback(&env, Some(&file))).build();
    commit(&services, "acme", 1, &receiver.url("/hook")).await;
    assert_eq!(relay(&services).await.sent, 1);

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let signatures: Vec<&str> = requests[0]
        .header("webhook-signature")
        .unwrap_or_default()
        .split(' ')
        .collect();
    assert_eq!(signatures.len(), 2, "{signatures:?}");
    assert!(
        signatures.iter().all(|s| s.starts_with("v1,")),
        "{signatures:?}"
    );
    // A receiver that has moved to the new secret, one that has not yet, and a stranger.
    verify_all(&new, &requests).await;
    verify_all(&old, &requests).await;
    let stranger = verify(&WebhookSecret::generate(), &requests).await;
    assert!(!stranger[0].ok, "{stranger:?}");
}

#[tokio::test]
async fn a_410_disables_the_endpoint_for_its_tenant_only_and_later_events_to_it_are_skipped() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    receiver.script(vec![Reply::text(410, "this hook was deleted")]);
    let services = env.services().settings(loopback(&env, Some(&file))).build();
    let url = receiver.url("/hook");

    let gone = commit(&services, "acme", 1, &url).await;
    let report = relay(&services).await;
    assert_eq!(
        (report.skipped, report.stuck, report.retrying),
        (1, 0, 0),
        "{report:?}"
    );
    let skipped = row(&env, &completed_id(gone)).await;
    assert!(
        skipped.skipped && !skipped.sent && !skipped.failed,
        "{skipped:?}"
    );
    assert_eq!(skipped.last_status, Some(410));
    let (disabled, reason, _) = endpoint(&env, "acme", &url).await.expect("endpoint row");
    assert!(disabled);
    assert_eq!(reason.as_deref(), Some("410 Gone"));
    assert_eq!(endpoint(&env, "globex", &url).await, None);
    assert_eq!(deliveries(&services, "skipped"), 1);

    // The tenant's next event to that URL is recorded skipped, not sent.
    let later = commit(&services, "acme", 2, &url).await;
    let report = relay(&services).await;
    assert_eq!((report.skipped, report.sent), (1, 0), "{report:?}");
    assert_eq!(
        receiver.requests().len(),
        1,
        "nothing sent to a disabled endpoint"
    );
    let skipped = row(&env, &completed_id(later)).await;
    assert!(skipped.skipped && !skipped.sent, "{skipped:?}");
    assert_eq!(skipped.attempts, 0);
    assert!(skipped.error().contains("disabled"), "{skipped:?}");
    assert_eq!(deliveries(&services, "skipped"), 2);
    assert!(
        services
            .metrics
            .render()
            .contains(r#"summaryd_webhook_deliveries_total{result="skipped"} 2"#)
    );

    // Another tenant's use of the same URL is its own.
    let other = commit(&services, "globex", 3, &url).await;
    let report = relay(&services).await;
    assert_eq!(report.sent, 1, "{report:?}");
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    verify_all(&secret, &requests).await;
    assert_eq!(
        requests[1].header("webhook-id"),
        Some(completed_id(other).as_str())
    );
    assert_eq!(
        relay(&services).await.claimed,
        0,
        "skipped rows are finished"
    );
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_row_retries() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let elsewhere = HttpStub::start(Reply::text(200, "ok")).await;
    let receiver = HttpStub::start(
        Reply::text(302, "moved").with_header("Location", &elsewhere.url("/landing")),
    )
    .await;
    let services = env.services().settings(loopback(&env, Some(&file))).build();
    let job = commit(&services, "acme", 1, &receiver.url("/hook")).await;

    for attempt in 1..=2 {
        let report = relay(&services).await;
        assert_eq!(report.retrying, 1, "{report:?}");
        let retrying = row(&env, &completed_id(job)).await;
        assert_eq!(retrying.attempts, attempt);
        assert_eq!(retrying.last_status, Some(302));
        assert!(!retrying.sent && !retrying.failed, "{retrying:?}");
        assert!(retrying.error().contains("redirect"), "{retrying:?}");
    }
    assert_eq!(receiver.requests().len(), 2);
    assert!(elsewhere.requests().is_empty(), "the redirect was followed");
}

/// The target rules at intake (allow_private and allow_http off): a 422 naming
/// `webhook.url`, and nothing stored.
#[tokio::test]
async fn non_public_or_plain_http_targets_are_refused_at_post_and_nothing_is_stored() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let mut strict = env.settings.clone();
    strict.webhook.secrets_file = Some(file.path().to_path_buf());
    let services = env.services().settings(strict.clone()).build();

    let private = [
        "https://127.0.0.1/x",
        "https://[::1]/",
        "https://10.0.0.5/",
        "https://169.254.169.254/latest/meta-data/",
        "https://localhost/",
    ];
    // A dotted name that does not resolve cannot be checked, so it is refused too.
    let mut refused: Vec<String> = private.iter().map(|u| u.to_string()).collect();
    refused.push("http://example.com/".into());
    refused.push("https://hooks.example.invalid/".into());
    // A dotted name the hosts file maps to a non-public address, where this machine has one
    // (Kubernetes pods and many installs do): refused for what it resolves to.
    let resolving = hosts_file_private_name();
    match &resolving {
        Some(name) => refused.push(format!("https://{name}/")),
        None => eprintln!("no dotted non-public name in /etc/hosts; that case is not run"),
    }
    for (n, url) in refused.iter().enumerate() {
        let key = format!("refused-target-{n:04}");
        let (status, problem) = call(&services, post_json("acme", &key, &with_webhook(url))).await;
        assert_eq!(status, 422, "{url}: {problem}");
        assert_eq!(problem["field"], "webhook.url", "{url}: {problem}");
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{url}: {problem}"
        );
    }
    if let Some(name) = &resolving {
        let (_, problem) = call(
            &services,
            post_json(
                "acme",
                "refused-resolved-01",
                &with_webhook(&format!("https://{name}/")),
            ),
        )
        .await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("not a public address"),
            "{name}: {problem}"
        );
    }
    assert_eq!(stream_len(&env).await, 0, "nothing queued");
    assert_eq!(
        redis_keys(&env).await,
        Vec::<String>::new(),
        "no record, no job state"
    );
    assert_eq!(env.count("outbox").await, 0);
    assert_eq!(env.count("webhook_endpoints").await, 0);

    // The operator allows private targets: the same targets are jobs; plain http still
    // needs its own setting.
    let mut relaxed = strict;
    relaxed.webhook.allow_private = true;
    let services = env.services().settings(relaxed).build();
    for (n, url) in private.iter().enumerate() {
        accept(
            &services,
            "acme",
            &format!("allowed-target-{n:04}"),
            &with_webhook(url),
        )
        .await;
    }
    let (status, problem) = call(
        &services,
        post_json(
            "acme",
            "plain-http-target-1",
            &with_webhook("http://example.com/"),
        ),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "webhook.url");
    assert_eq!(stream_len(&env).await, private.len());
}

/// A dotted host name (not `*.localhost`) that `/etc/hosts` maps to an address that is not
/// public, if there is one.
fn hosts_file_private_name() -> Option<String> {
    private_name_in(&std::fs::read_to_string("/etc/hosts").ok()?)
}

fn private_name_in(hosts: &str) -> Option<String> {
    hosts.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let ip: std::net::IpAddr = fields.next()?.parse().ok()?;
        if summaryd::domain::is_public(ip) {
            return None;
        }
        fields
            .find(|name| {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                name.contains('.')
                    && !name.split('.').any(str::is_empty)
                    && name.rsplit('.').next() != Some("localhost")
                    && url::Url::parse(&format!("https://{name}/"))
                        .is_ok_and(|u| matches!(u.host(), Some(url::Host::Domain(_))))
            })
            .map(str::to_owned)
    })
}

/// A target that was allowed when the job was accepted (or that resolves elsewhere now) is
/// checked again when the relay connects: nothing reaches a loopback receiver, and the row
/// is parked naming the address.
#[tokio::test]
async fn the_relay_refuses_non_public_addresses_at_connect_time() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    let mut settings = loopback(&env, Some(&file));
    settings.webhook.allow_private = false;
    let services = env.services().settings(settings).build();
    let port = receiver.addr.port();
    // An IP literal, and a name the resolver finds on loopback.
    let literal = commit(
        &services,
        "acme",
        1,
        &format!("http://127.0.0.1:{port}/hook"),
    )
    .await;
    let named = commit(
        &services,
        "acme",
        2,
        &format!("http://localhost:{port}/hook"),
    )
    .await;

    let report = relay(&services).await;
    assert_eq!(
        (report.stuck, report.sent, report.retrying),
        (2, 0, 0),
        "{report:?}"
    );
    assert!(
        receiver.requests().is_empty(),
        "a request reached a loopback receiver"
    );
    for job in [literal, named] {
        let parked = row(&env, &completed_id(job)).await;
        assert!(parked.failed && !parked.sent, "{parked:?}");
        assert_eq!(parked.last_status, None);
        let error = parked.error();
        assert!(error.contains("not a public address"), "{error}");
        assert!(
            error.contains("127.0.0.1") || error.contains("::1"),
            "{error}"
        );
    }
    assert_eq!(deliveries(&services, "stuck"), 2);
    assert_eq!(
        relay(&services).await.claimed,
        0,
        "parked rows wait for a person"
    );
}

#[tokio::test]
async fn a_receiver_that_never_answers_is_cut_at_the_timeout_and_retried() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let silent = HttpStub::start(Reply::Hang).await;
    let mut settings = loopback(&env, Some(&file));
    settings.webhook.timeout = Duration::from_millis(300);
    let services = env.services().settings(settings).build();
    let job = commit(&services, "acme", 1, &silent.url("/hook")).await;

    let report = tokio::time::timeout(Duration::from_secs(10), relay(&services))
        .await
        .expect("the pass is not held by a receiver that never answers");
    assert_eq!(report.retrying, 1, "{report:?}");
    let retrying = row(&env, &completed_id(job)).await;
    assert_eq!(retrying.attempts, 1);
    assert!(!retrying.sent && !retrying.failed, "{retrying:?}");
    assert_eq!(retrying.last_status, None);
    assert!(
        retrying.error().contains("no answer within 300 ms"),
        "{retrying:?}"
    );
    assert_eq!(silent.requests().len(), 1);
    assert!(
        silent.wait_all_closed(Duration::from_secs(5)).await,
        "the relay hung up"
    );

    // A receiver that answers 200 and then trickles its body has answered: delivered, and
    // the relay does not stay to read the body.
    let trickling = HttpStub::start(Reply::Drip {
        every: Duration::from_millis(50),
    })
    .await;
    let job = commit(&services, "acme", 2, &trickling.url("/hook")).await;
    let report = tokio::time::timeout(Duration::from_secs(10), relay(&services))
        .await
        .expect("the pass is not held by a trickling body");
    assert_eq!(report.sent, 1, "{report:?}");
    assert_eq!(row(&env, &completed_id(job)).await.last_status, Some(200));
    assert!(trickling.wait_all_closed(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_request_needs_notify_or_a_webhook_that_can_be_signed() {
    let env = TestEnv::new().await;
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    let url = receiver.url("/hook");

    // No secret configured: a webhook could not be signed.
    let unsigned = env.services().settings(loopback(&env, None)).build();
    let cases = [
        (json!({"text": TEXT}), "notify"),
        (with_webhook(&url), "webhook"),
    ];
    for (n, (body, field)) in cases.iter().enumerate() {
        let (status, problem) = call(
            &unsigned,
            post_json("acme", &format!("unsigned-{n:08}"), body),
        )
        .await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["field"], *field, "{body}: {problem}");
    }

    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let services = env.services().settings(loopback(&env, Some(&file))).build();
    let cases = [
        (json!({"text": TEXT, "webhook": "https://x"}), "webhook"),
        (
            json!({"text": TEXT, "webhook": {"url": url, "secret": "hunter2"}}),
            "webhook",
        ),
        (json!({"text": TEXT, "webhook": {}}), "webhook.url"),
    ];
    for (n, (body, field)) in cases.iter().enumerate() {
        let (status, problem) = call(
            &services,
            post_json("acme", &format!("malformed-{n:08}"), body),
        )
        .await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["field"], *field, "{body}: {problem}");
    }
    assert_eq!(stream_len(&env).await, 0);
    assert_eq!(redis_keys(&env).await, Vec::<String>::new());

    // The webhook is part of the fingerprint: the same key with another target is a reuse.
    let key = "fingerprint-webhook-1";
    let first = accept(&services, "acme", key, &with_webhook(&url)).await;
    let (status, problem) = call(
        &services,
        post_json("acme", key, &with_webhook(&receiver.url("/other"))),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("Idempotency-Key")
            || problem["title"]
                .as_str()
                .unwrap_or_default()
                .contains("Idempotency-Key"),
        "{problem}"
    );
    assert_eq!(
        accept(&services, "acme", key, &with_webhook(&url)).await,
        first,
        "a replay"
    );
    assert_eq!(stream_len(&env).await, 1);
}

#[tokio::test]
async fn in_token_mode_a_tenants_default_webhook_url_and_secrets_are_used() {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    let mut tokens = NamedTempFile::new().unwrap();
    let text = format!(
        "[tenants.acme]\ntoken_sha256 = \"{}\"\nwebhook_url = \"{}\"\nwebhook_secrets = [\"{secret}\"]\n\n\
         [tenants.globex]\ntoken_sha256 = \"{}\"\n",
        token_sha256("acme-webhook-token"),
        receiver.url("/default"),
        token_sha256("globex-webhook-token"),
    );
    std::io::Write::write_all(&mut tokens, text.as_bytes()).unwrap();
    let mut settings = loopback(&env, None);
    settings.auth.tokens_file = Some(tokens.path().to_path_buf());
    let services = env.services().settings(settings).build_with_tokens();
    let as_tenant = |token: &str, key: &str, body: &Value| {
        TestRequest::post()
            .uri("/v1/summaries")
            .insert_header(("Authorization", format!("Bearer {token}")))
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Content-Type", "application/json"))
            .set_payload(body.to_string())
    };

    // A tenant with neither a default nor secrets.
    let (status, problem) = call(
        &services,
        as_tenant(
            "globex-webhook-token",
            "globex-text-only-1",
            &json!({"text": TEXT}),
        ),
    )
    .await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("notify")),
        "{problem}"
    );
    let (status, problem) = call(
        &services,
        as_tenant(
            "globex-webhook-token",
            "globex-webhook-01",
            &with_webhook(&receiver.url("/x")),
        ),
    )
    .await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("webhook")),
        "{problem}"
    );

    // A tenant with both: text alone is a job whose webhook goes to the default.
    let (status, accepted) = call(
        &services,
        as_tenant(
            "acme-webhook-token",
            "acme-text-only-001",
            &json!({"text": TEXT}),
        ),
    )
    .await;
    assert_eq!(status, 202, "{accepted}");
    let job: JobId = accepted["job_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(work(&services).await, 1);
    assert_eq!(relay(&services).await.sent, 1);
    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/default");
    let payloads = verify_all(&secret, &requests).await;
    assert_eq!(payloads[0]["data"]["job_id"], job.to_string());
    assert_eq!(
        requests[0].header("webhook-id"),
        Some(completed_id(job).as_str())
    );
}

#[tokio::test]
async fn a_webhook_failing_past_give_up_is_parked_and_an_endpoint_failing_past_disable_after_is_disabled()
 {
    let env = TestEnv::new().await;
    let secret = WebhookSecret::generate();
    let file = secrets_file(&[&secret]);
    let receiver = HttpStub::start(Reply::text(500, "broken")).await;
    let mut settings = loopback(&env, Some(&file));
    settings.webhook.give_up_s = 3600;
    settings.webhook.disable_after_s = 7200;
    let services = env.services().settings(settings).build();
    let url = receiver.url("/hook");
    let pg = env.pg().await;

    let job = commit(&services, "acme", 1, &url).await;
    assert_eq!(relay(&services).await.retrying, 1);
    let (disabled, _, failing) = endpoint(&env, "acme", &url)
        .await
        .expect("a failing endpoint has a row");
    assert!(failing && !disabled);
    // Its first failure was longer ago than SUMMARYD_WEBHOOK_GIVE_UP_S: the next failure
    // parks it.
    pg.execute(
        "UPDATE outbox SET first_failed_at = now() - interval '2 hours' WHERE dedupe_key = $1",
        &[&completed_id(job)],
    )
    .await
    .unwrap();
    let report = relay(&services).await;
    assert_eq!((report.stuck, report.retrying), (1, 0), "{report:?}");
    let parked = row(&env, &completed_id(job)).await;
    assert!(parked.failed && !parked.sent, "{parked:?}");
    assert_eq!(parked.attempts, 2);
    assert_eq!(parked.last_status, Some(500));
    assert_eq!(deliveries(&services, "stuck"), 1);
    assert_eq!(
        relay(&services).await.claimed,
        0,
        "a parked row is not sent"
    );
    assert_eq!(receiver.requests().len(), 2);
    let (disabled, _, _) = endpoint(&env, "acme", &url).await.unwrap();
    assert!(!disabled, "two hours of failures are within disable_after");

    // Every delivery to the endpoint has failed for longer than
    // SUMMARYD_WEBHOOK_DISABLE_AFTER_S: the next failure disables it.
    pg.execute(
        "UPDATE webhook_endpoints SET failing_since = now() - interval '3 hours'",
        &[],
    )
    .await
    .unwrap();
    let next = commit(&services, "acme", 2, &url).await;
    assert_eq!(relay(&services).await.retrying, 1);
    let (disabled, reason, _) = endpoint(&env, "acme", &url).await.unwrap();
    assert!(disabled);
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("every delivery failed"), "{reason}");
    assert_eq!(receiver.requests().len(), 3);
    // Its retry is skipped, not sent.
    let report = relay(&services).await;
    assert_eq!(report.skipped, 1, "{report:?}");
    assert_eq!(receiver.requests().len(), 3);
    let skipped = row(&env, &completed_id(next)).await;
    assert!(skipped.skipped && !skipped.sent, "{skipped:?}");
    verify_all(&secret, &receiver.requests()).await;
}
