//! The whole application in-process: real HTTP on port 0, real Redis and Postgres, fake
//! model and mail provider. Proves the roles are wired together and stop cleanly.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use summaryd::app::Application;
use summaryd::config::roles::{Role, Roles};
use summaryd::config::{LlmProvider, MailProvider, Settings};

use crate::shared::running::Running;
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually};

async fn start(env: &TestEnv, roles: Roles, llm: Arc<FakeLlm>, mailer: Arc<FakeMailer>) -> Running {
    let mut settings = env.settings.clone();
    settings.worker.consumers = 2;
    let app = env
        .services()
        .settings(settings)
        .llm(llm)
        .mailer(mailer)
        .application(roles)
        .await;
    Running::start(app)
}

fn post(client: &reqwest::Client, base: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/v1/summaries"))
        .header("Idempotency-Key", key)
        .header("X-Tenant-Id", "acme")
        .json(body)
}

#[tokio::test]
async fn a_posted_job_becomes_one_summary_and_one_email() {
    let env = TestEnv::new().await;
    let llm = Arc::new(FakeLlm::ok());
    let mailer = Arc::new(FakeMailer::new());
    let app = start(&env, Roles::all(), llm.clone(), mailer.clone()).await;
    let client = reqwest::Client::new();
    let body = json!({"text": "Quarterly revenue grew. Churn fell. Hiring paused.", "notify": "ops@example.com"});

    let first = post(&client, &app.base, "app-test-key-0000001", &body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 202);
    let first: Value = first.json().await.unwrap();
    let job_id = first["job_id"].as_str().unwrap().to_owned();

    let done = eventually(Duration::from_secs(15), || {
        let (client, url) = (
            client.clone(),
            format!("{}/v1/summaries/{job_id}", app.base),
        );
        async move {
            let r = client
                .get(url)
                .header("X-Tenant-Id", "acme")
                .send()
                .await
                .unwrap();
            let v: Value = r.json().await.unwrap();
            v["status"] == "done"
        }
    })
    .await;
    assert!(done, "job reached done");
    assert!(
        eventually(Duration::from_secs(15), || async {
            // Sent means the provider took it AND the relay recorded it; stopping between
            // the two would leave the row for the next relay to resend, which is correct
            // but not what this test checks.
            !mailer.sent().is_empty() && env.count("outbox WHERE sent_at IS NOT NULL").await == 1
        })
        .await,
        "email sent and recorded"
    );

    // A client retry after completion is a replay: same job, no new work.
    let replay = post(&client, &app.base, "app-test-key-0000001", &body)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 202);
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    let replay: Value = replay.json().await.unwrap();
    assert_eq!(replay["job_id"], first["job_id"]);

    app.stop().await;
    assert_eq!(llm.calls(), 1);
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(env.count("outbox WHERE sent_at IS NOT NULL").await, 1);
    let sent = mailer.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1, format!("summary_ready:{job_id}"));
    assert_eq!(sent[0].0.to, "ops@example.com");
    assert!(sent[0].0.text.contains(&job_id));
}

async fn wait_done(client: &reqwest::Client, base: &str, job_id: &str) -> Value {
    let url = format!("{base}/v1/summaries/{job_id}");
    let last = std::cell::RefCell::new(Value::Null);
    let done = eventually(Duration::from_secs(15), || async {
        let r = client
            .get(&url)
            .header("X-Tenant-Id", "acme")
            .send()
            .await
            .unwrap();
        let view: Value = r.json().await.unwrap();
        let done = view["status"] == "done";
        *last.borrow_mut() = view;
        done
    })
    .await;
    let last = last.into_inner();
    assert!(done, "job {job_id} never reached done: {last}");
    last
}

/// Once a key's record has expired, the same key with another body is another request: a
/// new job with its own summary and email. The first job, its summary and its email are
/// untouched, and the second client is never told the first text's summary.
#[tokio::test]
async fn a_key_reused_with_another_body_after_its_record_expired_is_a_new_job() {
    let env = TestEnv::new().await;
    let llm = Arc::new(FakeLlm::ok());
    let mailer = Arc::new(FakeMailer::new());
    let app = start(&env, Roles::all(), llm.clone(), mailer.clone()).await;
    let client = reqwest::Client::new();
    let key = "reused-after-expiry-1";
    let first_body = json!({"text": "Alpha renewed the contract.", "notify": "ops@example.com"});
    let second_body = json!({"text": "Beta cancelled the pilot.", "notify": "ops@example.com"});

    let first: Value = post(&client, &app.base, key, &first_body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first_id = first["job_id"].as_str().unwrap().to_owned();
    let first_done = wait_done(&client, &app.base, &first_id).await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            mailer.sent().len() == 1
        })
        .await,
        "first email sent"
    );

    // The record expires (as after SUMMARYD_IDEMPOTENCY_RESULT_TTL_S).
    let record = summaryd::infra::keys::RedisKeys::new(env.settings.key_prefix.clone())
        .idempotency(&summaryd::infra::keys::ScopedKey::summaries(
            &summaryd::domain::TenantId::parse("acme").unwrap(),
            &summaryd::domain::IdempotencyKey::parse(key).unwrap(),
        ));
    let deleted: u64 = redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut env.redis().await)
        .await
        .unwrap();
    assert_eq!(deleted, 1);

    let second = post(&client, &app.base, key, &second_body)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 202);
    assert!(second.headers().get("Idempotent-Replayed").is_none());
    let second: Value = second.json().await.unwrap();
    let second_id = second["job_id"].as_str().unwrap().to_owned();
    assert_ne!(second_id, first_id, "another body is another job");
    let second_done = wait_done(&client, &app.base, &second_id).await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            mailer.sent().len() == 2
        })
        .await,
        "second email sent"
    );
    assert_ne!(second_done["summary"], first_done["summary"]);
    assert!(
        second_done["summary"]
            .as_str()
            .unwrap()
            .contains("Beta cancelled"),
        "{second_done}"
    );
    // The first job is as it was.
    let again = wait_done(&client, &app.base, &first_id).await;
    assert_eq!(again, first_done);

    app.stop().await;
    assert_eq!(llm.calls(), 2);
    assert_eq!(env.count("summaries").await, 2);
    let sent = mailer.sent();
    let mut keys: Vec<String> = sent.iter().map(|(_, k)| k.clone()).collect();
    keys.sort();
    let mut expected = vec![
        format!("summary_ready:{first_id}"),
        format!("summary_ready:{second_id}"),
    ];
    expected.sort();
    assert_eq!(keys, expected, "one email per job");
    let second_mail = sent.iter().find(|(_, k)| k.ends_with(&second_id)).unwrap();
    assert!(second_mail.0.text.contains("Beta cancelled"));
    assert!(!second_mail.0.text.contains("Alpha"));
}

#[tokio::test]
async fn a_worker_only_process_serves_health_but_not_the_api() {
    let env = TestEnv::new().await;
    let app = start(
        &env,
        Roles::of(&[Role::Worker]),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
    )
    .await;
    let client = reqwest::Client::new();
    let health = client
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let body = json!({"text": "Some text.", "notify": "a@example.com"});
    let res = post(&client, &app.base, "worker-only-key-00001", &body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    app.stop().await;
    let len = crate::shared::api_requests::stream_len(&env).await;
    assert_eq!(len, 0, "nothing enqueued");
}

#[tokio::test]
async fn shutdown_stops_every_role_promptly_and_closes_the_listener() {
    let env = TestEnv::new().await;
    let app = start(
        &env,
        Roles::all(),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
    )
    .await;
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let base = app.base.clone();
    app.stop().await;
    // (readyz answering 503 once shutdown begins is covered in api.rs, where it can be
    // observed without racing the listener's close.)
    let after = client.get(format!("{base}/healthz")).send().await;
    assert!(
        after.is_err(),
        "the listener is closed after shutdown: {after:?}"
    );
}

/// Make invalid the one setting only `role` reads; returns the variable an error must name.
fn break_setting_of(role: Role, settings: &mut Settings, bad_tokens: &Path) -> &'static str {
    match role {
        Role::Api => {
            settings.auth.tokens_file = Some(bad_tokens.to_path_buf());
            "SUMMARYD_AUTH_TOKENS_FILE"
        }
        Role::Worker => {
            settings.llm.provider = LlmProvider::Openai;
            settings.llm.base_url = "not a url".into();
            "SUMMARYD_LLM_BASE_URL"
        }
        Role::Relay => {
            settings.mail.provider = MailProvider::Http;
            settings.mail.http_url = None;
            "SUMMARYD_MAIL_HTTP_URL"
        }
    }
}

/// `summaryd serve` builds a provider or loads the tokens file only for the roles that use
/// it (the tokens file: the api, and the relay, which signs each tenant's webhooks with its
/// `webhook_secrets`): a setting that only other roles read cannot stop a process from
/// starting.
#[tokio::test]
async fn each_role_builds_only_the_providers_it_uses() {
    let env = TestEnv::new().await;
    let mut tokens = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut tokens, b"[tenants.acme]\ntoken_sha256 = \"x\"\n").unwrap();
    for role in Role::ALL {
        let mut settings = env.settings.clone();
        let setting = break_setting_of(role, &mut settings, tokens.path());
        let readers = match role {
            Role::Api => vec![Role::Api, Role::Relay],
            other => vec![other],
        };
        let start =
            |roles: &[Role]| Application::from_settings(settings.clone(), Roles::of(roles), false);
        for reader in &readers {
            let err = start(&[*reader])
                .await
                .err()
                .expect("a setting the role reads is broken");
            assert!(err.is_configuration(), "{reader}: {err}");
            assert!(err.to_string().contains(setting), "{reader}: {err}");
        }
        let others: Vec<Role> = Role::ALL
            .into_iter()
            .filter(|r| !readers.contains(r))
            .collect();
        if let Err(e) = start(&others).await {
            panic!("{setting} stopped {others:?} from starting: {e}");
        }
    }
}
