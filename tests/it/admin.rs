//! Operator commands against real Redis and Postgres: dead letters are listed and replayed
//! with the same job id, stuck outbox rows are listed and retried, and no replay or retry
//! ever makes a second summary or a second email.

use std::sync::Arc;

use chrono::Utc;
use serde_json::Value;
use summaryd::cli::{DlqCommand, OutboxCommand};
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::llm::LlmError;
use summaryd::mail::MailError;
use summaryd::ops::{self, AdminCommand, AdminError};
use summaryd::relay::relay_once;
use summaryd::shutdown::Shutdown;
use summaryd::stream::enqueue;
use summaryd::worker::Consumer;

use crate::shared::fakes::{MailStep, Step};
use crate::shared::{FakeLlm, FakeMailer, TestEnv};

fn bad_request() -> LlmError {
    LlmError::Status {
        status: 400,
        retry_after: None,
        message: "context too long".into(),
    }
}

fn job(n: u32) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:admin-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: "The launch slipped a week. Support volume doubled.".into(),
        notify: Some(Email::parse("lead@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

fn output(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap()
}

/// GET /v1/summaries/{id} as tenant acme through a real api-role HTTP server.
async fn get_status(base: &str, job_id: JobId) -> Value {
    reqwest::Client::new()
        .get(format!("{base}/v1/summaries/{job_id}"))
        .header("X-Tenant-Id", "acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn api(env: &TestEnv) -> (String, Shutdown) {
    let app = env.services().application(Roles::of(&[Role::Api])).await;
    let base = format!("http://127.0.0.1:{}", app.port());
    let shutdown = Shutdown::new();
    tokio::spawn(app.run(shutdown.clone()));
    (base, shutdown)
}

#[tokio::test]
async fn a_dead_lettered_job_is_listed_replayed_once_and_finishes_once() {
    let env = TestEnv::new().await;
    // The model rejects the first call for good, then recovers (a fixed deployment).
    let llm = Arc::new(FakeLlm::with(
        vec![Step::Fail(bad_request())],
        Step::Ok(String::new()),
    ));
    let mailer = Arc::new(FakeMailer::new());
    let services = env
        .services()
        .llm(llm.clone())
        .mailer(mailer.clone())
        .build();
    let (base, shutdown) = api(&env).await;
    let msg = job(1);
    let mut redis = services.redis.get().await.unwrap();
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();
    let mut consumer = Consumer::new(services.worker(), "w-1");
    consumer.ensure_group().await.unwrap();
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(llm.calls(), 1, "a 400 is not retried");

    let mut listed = Vec::new();
    ops::dlq::list(&services.redis, &services.keys, 10, true, &mut listed)
        .await
        .unwrap();
    let listed = output(listed);
    let entries: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["job_id"], msg.job_id.to_string());
    assert_eq!(entries[0]["tenant"], "acme");
    assert!(entries[0]["reason"].as_str().unwrap().contains("400"));
    chrono::DateTime::parse_from_rfc3339(entries[0]["failed_at"].as_str().unwrap()).unwrap();
    let failed = get_status(&base, msg.job_id).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["error"].as_str().unwrap().contains("400"));

    let dead_id = entries[0]["id"].as_str().unwrap().to_owned();
    let mut out = Vec::new();
    let replayed = ops::dlq::replay(
        &services.redis,
        &services.keys,
        std::slice::from_ref(&dead_id),
        false,
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(replayed.replayed, 1);
    assert_eq!(get_status(&base, msg.job_id).await["status"], "queued");
    // Running the same replay again finds nothing to do.
    let again = ops::dlq::replay(
        &services.redis,
        &services.keys,
        &[dead_id],
        false,
        &mut Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(again.replayed, 0);

    assert_eq!(consumer.run_once().await.unwrap(), 1);
    relay_once(&services.relay()).await.unwrap();
    relay_once(&services.relay()).await.unwrap();
    let done = get_status(&base, msg.job_id).await;
    assert_eq!(done["status"], "done");
    assert_eq!(
        done["job_id"],
        msg.job_id.to_string(),
        "same job id after replay"
    );
    assert_eq!(llm.calls(), 2);
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(env.count("outbox").await, 1);
    assert_eq!(mailer.sent().len(), 1);
    let mut listed = Vec::new();
    ops::dlq::list(&services.redis, &services.keys, 10, true, &mut listed)
        .await
        .unwrap();
    assert!(output(listed).is_empty(), "dead-letter stream is empty");
    shutdown.trigger();
}

#[tokio::test]
async fn replaying_a_job_that_already_finished_makes_no_second_summary_or_email() {
    let env = TestEnv::new().await;
    let llm = Arc::new(FakeLlm::with(
        vec![Step::Fail(bad_request())],
        Step::Ok(String::new()),
    ));
    let mailer = Arc::new(FakeMailer::new());
    let services = env
        .services()
        .llm(llm.clone())
        .mailer(mailer.clone())
        .build();
    let msg = job(2);
    let mut redis = services.redis.get().await.unwrap();
    // The same job enqueued twice (an API crash after XADD): one copy dead-letters, the
    // other finishes; replaying the dead copy must collapse into a duplicate.
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();
    let mut consumer = Consumer::new(services.worker(), "w-1");
    consumer.ensure_group().await.unwrap();
    consumer.run_once().await.unwrap();
    consumer.run_once().await.unwrap();
    assert_eq!(env.count("summaries").await, 1);
    let replayed = ops::dlq::replay(&services.redis, &services.keys, &[], true, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(replayed.replayed, 1);
    consumer.run_once().await.unwrap();
    relay_once(&services.relay()).await.unwrap();
    assert_eq!(llm.calls(), 2, "the replayed duplicate skips the model");
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(env.count("outbox").await, 1);
    assert_eq!(mailer.sent().len(), 1);
}

#[tokio::test]
async fn stuck_outbox_rows_are_listed_and_retried_by_the_operator() {
    let env = TestEnv::new().await;
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::Fail(|| MailError::SmtpReply {
            server: "mx.test:25".into(),
            code: 550,
            message: "550 mailbox unavailable".into(),
        })],
        MailStep::Deliver,
    ));
    let services = env.services().mailer(mailer.clone()).build();
    let msg = job(3);
    summaryd::db::summaries::commit_with_outbox(
        &services.pg,
        &msg,
        &crate::shared::model_summary("The summary."),
    )
    .await
    .unwrap();
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 0);

    let mut table = Vec::new();
    ops::outbox::stuck(&services.pg, false, &mut table)
        .await
        .unwrap();
    let table = output(table);
    assert!(table.starts_with("id"), "{table}");
    assert!(table.contains("550 mailbox unavailable"), "{table}");
    let mut json = Vec::new();
    ops::outbox::stuck(&services.pg, true, &mut json)
        .await
        .unwrap();
    let row: Value = serde_json::from_str(output(json).trim()).unwrap();
    let fields: Vec<&str> = row
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for f in [
        "id",
        "job_id",
        "topic",
        "dedupe_key",
        "attempts",
        "last_error",
        "created_at",
    ] {
        assert!(fields.contains(&f), "{f} in {fields:?}");
    }
    assert_eq!(row["job_id"], msg.job_id.to_string());
    assert_eq!(row["attempts"], 1);

    // Nothing is resent until a person says so.
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 1);
    let id = row["id"].as_i64().unwrap();
    let n = ops::outbox::retry(&services.pg, &[id], false, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 1);
    assert_eq!(mailer.sent().len(), 1);
    let mut after = Vec::new();
    ops::outbox::stuck(&services.pg, true, &mut after)
        .await
        .unwrap();
    assert!(output(after).is_empty());
    // A retry of a row that was sent resends nothing.
    let n = ops::outbox::retry(&services.pg, &[], true, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(n, 0);
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 0);
    assert_eq!(mailer.sent().len(), 1);
}

/// Each admin command opens only the connection it uses: the dead-letter commands work
/// without a usable Postgres URL, the outbox commands without a usable Redis URL.
#[tokio::test]
async fn admin_commands_open_only_the_connection_they_use() {
    let env = TestEnv::new().await;
    let dlq_list = || {
        AdminCommand::Dlq(DlqCommand::List {
            limit: 10,
            json: false,
        })
    };
    let outbox_stuck = || AdminCommand::Outbox(OutboxCommand::Stuck { json: false });

    let mut no_postgres = env.settings.clone();
    no_postgres.database_url = "not a url".into();
    let mut out = Vec::new();
    ops::run(&no_postgres, dlq_list(), &mut out).await.unwrap();
    assert!(String::from_utf8(out).unwrap().ends_with("(none)\n"));
    let err = ops::run(&no_postgres, outbox_stuck(), &mut Vec::new()).await;
    assert!(matches!(err, Err(AdminError::Setup(_))), "{err:?}");

    let mut no_redis = env.settings.clone();
    no_redis.redis_url = "not a url".into();
    let mut out = Vec::new();
    ops::run(&no_redis, outbox_stuck(), &mut out).await.unwrap();
    assert!(String::from_utf8(out).unwrap().ends_with("(none)\n"));
    let err = ops::run(&no_redis, dlq_list(), &mut Vec::new()).await;
    assert!(matches!(err, Err(AdminError::Setup(_))), "{err:?}");
}
