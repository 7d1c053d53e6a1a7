//! The fleet-wide pause (`summaryd pause` / `resume`): while paused, jobs posted wait on
//! the stream with no delivery, the model is not called, an entry pending at the pause is
//! not taken over, the process stays ready; after resume every job finishes. The command
//! line writes and clears the one Redis key the workers read. Real Redis and Postgres,
//! fake model.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamPendingCountReply;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, Pause, TenantId};
use summaryd::infra::keys::{GROUP, RedisKeys};
use summaryd::stream::consumer_group::{ensure_group, read_new};
use summaryd::stream::{enqueue, pause};

use crate::shared::fabricate::make_idle;
use crate::shared::running::Running;
use crate::shared::{FakeLlm, TestEnv, eventually};

fn job(key: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Notes {key}. The rollout waits for the incident review.").into(),
        notify: Some(Email::parse("ops@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// (id, consumer, times delivered) of every pending entry.
async fn pending(
    redis: &mut MultiplexedConnection,
    keys: &RedisKeys,
) -> Vec<(String, String, usize)> {
    let reply: StreamPendingCountReply = redis
        .xpending_count(keys.stream(), GROUP, "-", "+", 1000)
        .await
        .unwrap();
    reply
        .ids
        .into_iter()
        .map(|p| (p.id, p.consumer, p.times_delivered))
        .collect()
}

async fn post(client: &reqwest::Client, base: &str, key: &str) -> String {
    let response = client
        .post(format!("{base}/v1/summaries"))
        .header("Idempotency-Key", key)
        .header("X-Tenant-Id", "acme")
        .json(&json!({"text": format!("Notes {key}. Revenue grew. Churn fell."), "notify": "ops@example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202, "{key}");
    let body: Value = response.json().await.unwrap();
    body["job_id"].as_str().unwrap().to_owned()
}

async fn status(client: &reqwest::Client, base: &str, job_id: &str) -> Value {
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

async fn metrics(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn a_pause() -> Pause {
    Pause::new("test:ops", Some("incident 7".into()), Utc::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_spends_no_delivery_and_resume_finishes_every_waiting_job() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.worker.consumers = 2;
    // An entry idle this long is taken over: the one pending at the pause qualifies at once.
    settings.worker.claim_idle = Duration::from_millis(300);
    settings.maintenance.interval = Duration::from_millis(100);
    let llm = Arc::new(FakeLlm::ok());
    let app = env
        .services()
        .settings(settings)
        .llm(llm.clone())
        .application(Roles::of(&[Role::Api, Role::Worker]))
        .await;
    let handles = app.handles().clone();
    let keys = handles.keys.get(0).clone();
    let app = Running::start(app);
    let client = reqwest::Client::new();
    let mut redis = env.redis().await;

    post(&client, &app.base, "pause-flowing-0001").await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            env.count("summaries").await == 1
        })
        .await,
        "jobs flow before the pause"
    );

    assert!(pause::pause(&mut redis, &keys, &a_pause()).await.unwrap());
    let second = Pause::new("test:late", None, Utc::now());
    assert!(
        !pause::pause(&mut redis, &keys, &second).await.unwrap(),
        "already paused"
    );
    assert_eq!(
        pause::current(&mut redis, &keys)
            .await
            .unwrap()
            .unwrap()
            .by(),
        "test:ops",
        "the first pauser stays on record"
    );
    let paused = || {
        handles
            .worker_gate
            .down()
            .iter()
            .any(|(name, why)| *name == "paused" && why.contains("test:ops"))
    };
    assert!(
        eventually(Duration::from_secs(5), || async { paused() }).await,
        "the process follows the pause within its poll: {:?}",
        handles.worker_gate.down()
    );
    // A consumer that looked at the gate just before it closed may still be in its last
    // read (BLOCK is 50 ms in tests).
    tokio::time::sleep(Duration::from_millis(300)).await;

    // An entry pending at the pause, its worker gone: idle past claim_idle, so a consumer
    // would take it over (one more delivery) at its next claim, were it not paused.
    let held = job("pause-held-0001");
    ensure_group(&mut redis, &keys).await.unwrap();
    enqueue(&mut redis, &keys, &held).await.unwrap();
    let taken = read_new(&mut redis, &keys, "gone-worker", 1, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let held_id = taken[0].id.clone();
    make_idle(&mut redis, &keys, &held_id).await;

    let mut waiting = Vec::new();
    for n in 0..3 {
        waiting.push(post(&client, &app.base, &format!("pause-waiting-{n:04}")).await);
    }
    // Several passes of both consumers (probes every 0.2–2 s) and many gauge refreshes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    assert_eq!(llm.calls(), 1, "no model call while paused");
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(
        pending(&mut redis, &keys).await,
        [(held_id.clone(), "gone-worker".to_owned(), 1)],
        "no posted job was delivered and the pending one was not taken over"
    );
    for job_id in &waiting {
        assert_eq!(status(&client, &app.base, job_id).await["status"], "queued");
    }
    let ready = client
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "a paused worker is ready");
    assert!(handles.metrics.failing_loops().is_empty());
    assert_eq!(
        handles
            .metrics
            .loop_errors
            .with_label_values(&["worker", "paused"])
            .get(),
        0,
        "waiting out a pause is no failed pass"
    );
    assert!(
        metrics(&client, &app.base)
            .await
            .contains("\nsummaryd_consumption_paused 1\n")
    );

    let lifted = pause::resume(&mut redis, &keys).await.unwrap().unwrap();
    assert_eq!(lifted.by(), "test:ops");
    assert_eq!(lifted.reason(), Some("incident 7"));
    assert_eq!(pause::resume(&mut redis, &keys).await.unwrap(), None);
    assert!(
        eventually(Duration::from_secs(15), || async {
            env.count("summaries").await == 5
        })
        .await,
        "every waiting job finished after resume ({} summaries)",
        env.count("summaries").await
    );
    let row = env
        .pg()
        .await
        .query_one(
            "SELECT count(*) FROM summaries WHERE job_id::text = $1",
            &[&held.job_id.to_string()],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        1,
        "the entry pending at the pause finished"
    );
    assert_eq!(llm.calls(), 5, "one call per job");
    assert!(pending(&mut redis, &keys).await.is_empty());
    assert!(
        eventually(Duration::from_secs(5), || async {
            metrics(&client, &app.base)
                .await
                .contains("\nsummaryd_consumption_paused 0\n")
        })
        .await
    );
    app.stop().await;
}

/// A worker that starts while the fleet is paused reads the pause before any consumer
/// runs: not even its first pass takes a job.
#[tokio::test]
async fn a_worker_starting_into_a_paused_fleet_takes_nothing() {
    let env = TestEnv::new().await;
    let llm = Arc::new(FakeLlm::ok());
    let keys = RedisKeys::new(env.settings.key_prefix.clone());
    let mut redis = env.redis().await;
    ensure_group(&mut redis, &keys).await.unwrap();
    let queued = job("pause-at-start-0001");
    enqueue(&mut redis, &keys, &queued).await.unwrap();
    assert!(pause::pause(&mut redis, &keys, &a_pause()).await.unwrap());

    let mut settings = env.settings.clone();
    settings.worker.consumers = 2;
    let app = env
        .services()
        .settings(settings)
        .llm(llm.clone())
        .application(Roles::of(&[Role::Worker]))
        .await;
    let app = Running::start(app);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(llm.calls(), 0);
    assert!(pending(&mut redis, &keys).await.is_empty(), "no delivery");

    assert!(pause::resume(&mut redis, &keys).await.unwrap().is_some());
    assert!(
        eventually(Duration::from_secs(15), || async {
            env.count("summaries").await == 1
        })
        .await,
        "the job finishes once resumed: dead letters {:?}, pending {:?}, {} calls",
        summaryd::stream::dead_letters::list(&mut redis, &keys, 10)
            .await
            .unwrap(),
        pending(&mut redis, &keys).await,
        llm.calls()
    );
    app.stop().await;
}

fn summaryd(env: &TestEnv, redis_url: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_summaryd"))
        .args(args)
        .env("SUMMARYD_REDIS_URL", redis_url)
        .env(
            "SUMMARYD_DATABASE_URL",
            env.settings.database_url.expose_secret(),
        )
        .env("SUMMARYD_KEY_PREFIX", &env.settings.key_prefix)
        .env("USER", "ana")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn the_command_line_pauses_and_resumes_through_the_one_key() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let env = rt.block_on(TestEnv::new());
    let url = env.settings.redis_url.expose_secret().to_owned();
    let key = RedisKeys::new(env.settings.key_prefix.clone()).paused();
    let stored = || -> Option<Value> {
        rt.block_on(async {
            let text: Option<String> = env.redis().await.get(&key).await.unwrap();
            text.map(|t| serde_json::from_str(&t).unwrap())
        })
    };

    let (code, out) = summaryd(&env, &url, &["pause", "--reason", "x"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("paused by cli:ana@"), "{out}");
    let value = stored().expect("the key is set");
    assert!(
        value["by"].as_str().unwrap().starts_with("cli:ana@"),
        "{value}"
    );
    assert_eq!(value["reason"], "x");
    chrono::DateTime::parse_from_rfc3339(value["since"].as_str().unwrap()).unwrap();

    let (code, out) = summaryd(&env, &url, &["pause", "--reason", "y"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("already paused by cli:ana@"), "{out}");
    assert_eq!(stored().unwrap(), value, "the first pause stays");

    let (code, out) = summaryd(&env, &url, &["resume"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("resumed") && out.contains(": x"), "{out}");
    assert_eq!(stored(), None);
    let (code, out) = summaryd(&env, &url, &["resume"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("was not paused"), "{out}");

    // Redis does not answer: a runtime failure, and nothing claims it worked.
    let closed = crate::shared::http_stub::closed_port_url("").replace("http://", "redis://");
    let (code, out) = summaryd(&env, &closed, &["pause"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("paused by"), "{out}");
    drop(env);
    drop(rt);
}
