//! Every model call a job makes is kept (`model_calls`), through the worker against real
//! Redis and Postgres with the fake model: one row per attempt, with its delivery, cost and
//! error class, whether the job succeeds, retries or is dead-lettered; and retention
//! removes them.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use summaryd::config::Settings;
use summaryd::config::roles::Roles;
use summaryd::db;
use summaryd::domain::{Email, Job, JobId, ModelCall, SummaryReady, TenantId, WebhookUrl};
use summaryd::infra::keys::GROUP;
use summaryd::llm::LlmError;
use summaryd::relay::relay_once;
use summaryd::stream::consumer_group::ensure_group;
use summaryd::stream::enqueue;
use summaryd::worker::Consumer;

use crate::shared::fabricate;
use crate::shared::fakes::Step;
use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, FakeMailer, TestEnv};

/// Long enough that nothing in a test becomes idle by itself.
const NEVER_IDLE_MS: u64 = 600_000;

struct World {
    env: TestEnv,
    services: Services,
    redis: MultiplexedConnection,
    llm: Arc<FakeLlm>,
}

impl World {
    async fn new(llm: FakeLlm, adjust: impl FnOnce(&mut Settings)) -> Self {
        let env = TestEnv::new().await;
        let mut settings = env.settings.clone();
        settings.llm.max_attempts = 1;
        settings.llm.backoff = Duration::from_millis(1);
        settings.llm.max_backoff = Duration::from_millis(5);
        adjust(&mut settings);
        let llm = Arc::new(llm);
        let services = env
            .services()
            .settings(settings)
            .llm(llm.clone())
            .mailer(Arc::new(FakeMailer::new()))
            .build();
        let mut redis = env.redis().await;
        ensure_group(&mut redis, services.keys.get(0))
            .await
            .unwrap();
        Self {
            env,
            services,
            redis,
            llm,
        }
    }

    fn consumer(&self) -> Consumer {
        let mut c = Consumer::new(self.services.worker(), "w-calls");
        c.config.claim_idle = Duration::from_millis(NEVER_IDLE_MS);
        c
    }

    async fn enqueue(&mut self, job: &Job) -> String {
        enqueue(&mut self.redis, self.services.keys.get(0), job)
            .await
            .unwrap()
    }

    /// Let the consumer claim `entry` again, as a redelivery.
    async fn make_idle(&mut self, entry: &str) {
        fabricate::make_idle(&mut self.redis, self.services.keys.get(0), entry).await;
    }

    async fn calls(&self, job: &Job) -> Vec<ModelCall> {
        db::model_calls::for_job(&self.services.pg, &job.job_id)
            .await
            .unwrap()
    }
}

fn job(key: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Quarterly report {key}. Revenue grew. Costs fell.").into(),
        notify: Some(Email::parse("team@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

fn status(code: u16) -> LlmError {
    LlmError::Status {
        status: code,
        retry_after: None,
        message: format!("HTTP {code}"),
    }
}

/// `(delivery, seq, error_class, prompt_tokens, completion_tokens)` of one call.
type Shape<'a> = (u32, u32, Option<&'a str>, Option<u32>, Option<u32>);

fn shape(calls: &[ModelCall]) -> Vec<Shape<'_>> {
    calls
        .iter()
        .map(|c| {
            (
                c.delivery,
                c.seq,
                c.error_class.as_deref(),
                c.prompt_tokens,
                c.completion_tokens,
            )
        })
        .collect()
}

#[tokio::test]
async fn a_job_that_succeeds_first_time_has_one_call_with_its_tokens() {
    let mut w = World::new(FakeLlm::ok().reporting(120, 30), |_| {}).await;
    let j = job("first-time");
    w.enqueue(&j).await;
    let before = Utc::now();
    assert_eq!(w.consumer().run_once().await.unwrap(), 1);
    assert_eq!(w.env.count("summaries").await, 1);

    let calls = w.calls(&j).await;
    assert_eq!(shape(&calls), [(1, 0, None, Some(120), Some(30))]);
    let call = &calls[0];
    assert_eq!(call.provider, "builtin");
    assert_eq!(call.model, "builtin");
    assert!(call.duration_ms < 5_000, "{call:?}");
    assert!(
        call.at >= before - chrono::Duration::milliseconds(1) && call.at <= Utc::now(),
        "{call:?}"
    );
    // The committing delivery's calls ride on the summary's row: no row of their own.
    let pg = w.env.pg().await;
    let stored: serde_json::Value = pg
        .query_one("SELECT model_calls FROM summaries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored.as_array().map(Vec::len), Some(1), "{stored}");
    assert_eq!(stored[0]["prompt_tokens"], 120);
    assert_eq!(w.env.count("model_calls").await, 0);
    // Another job's calls are not this one's.
    assert!(w.calls(&job("never-enqueued")).await.is_empty());
}

/// A retryable failure spends the first delivery; the second succeeds. Both calls are
/// kept, under their own delivery: the failed one before the first delivery was settled,
/// the second with the summary.
#[tokio::test]
async fn a_retryable_failure_then_success_keeps_both_calls_under_their_deliveries() {
    let llm =
        FakeLlm::with(vec![Step::Fail(status(503))], Step::Ok(String::new())).reporting(80, 20);
    let mut w = World::new(llm, |_| {}).await;
    let j = job("503-then-ok");
    let entry = w.enqueue(&j).await;
    let mut c = w.consumer();
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(w.env.count("summaries").await, 0);
    assert_eq!(
        shape(&w.calls(&j).await),
        [(1, 0, Some("status_503"), None, None)],
        "the failed delivery's call is kept before the job is retried"
    );

    w.make_idle(&entry).await;
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(w.env.count("summaries").await, 1);
    assert_eq!(w.llm.calls(), 2);
    assert_eq!(
        shape(&w.calls(&j).await),
        [
            (1, 0, Some("status_503"), None, None),
            (2, 0, None, Some(80), Some(20)),
        ]
    );
}

/// Attempts retried inside one delivery are calls of that delivery, in order.
#[tokio::test]
async fn attempts_retried_within_a_delivery_are_numbered_in_order() {
    let llm = FakeLlm::with(
        vec![Step::Fail(LlmError::Timeout), Step::Fail(status(429))],
        Step::Ok(String::new()),
    )
    .reporting(5, 1);
    let mut w = World::new(llm, |s| s.llm.max_attempts = 3).await;
    let j = job("retried-in-process");
    w.enqueue(&j).await;
    assert_eq!(w.consumer().run_once().await.unwrap(), 1);
    assert_eq!(w.env.count("summaries").await, 1);
    assert_eq!(
        shape(&w.calls(&j).await),
        [
            (1, 0, Some("timeout"), None, None),
            (1, 1, Some("status_429"), None, None),
            (1, 2, None, Some(5), Some(1)),
        ]
    );
}

/// A job out of deliveries is dead-lettered; every call it made on the way is kept.
#[tokio::test]
async fn a_dead_lettered_job_keeps_every_failed_call() {
    let mut w = World::new(FakeLlm::failing(status(503)), |s| {
        s.llm.max_attempts = 2;
        s.worker.max_deliveries = 2;
    })
    .await;
    let j = job("always-503");
    let entry = w.enqueue(&j).await;
    let mut c = w.consumer();
    assert_eq!(c.run_once().await.unwrap(), 1);
    w.make_idle(&entry).await;
    assert_eq!(c.run_once().await.unwrap(), 1);
    w.make_idle(&entry).await;
    assert_eq!(
        c.run_once().await.unwrap(),
        1,
        "the claim that dead-letters"
    );
    assert_eq!(w.env.dead_letters().await, 1);
    assert_eq!(w.llm.calls(), 4);
    let failed = Some("status_503");
    assert_eq!(
        shape(&w.calls(&j).await),
        [
            (1, 0, failed, None, None),
            (1, 1, failed, None, None),
            (2, 0, failed, None, None),
            (2, 1, failed, None, None),
        ]
    );

    // A request the model refuses is dead-lettered at once, with its one call.
    let mut w = World::new(FakeLlm::failing(status(400)), |_| {}).await;
    let j = job("bad-request");
    w.enqueue(&j).await;
    assert_eq!(w.consumer().run_once().await.unwrap(), 1);
    assert_eq!(w.env.dead_letters().await, 1);
    assert_eq!(
        shape(&w.calls(&j).await),
        [(1, 0, Some("status_400"), None, None)]
    );
}

/// Postgres refusing the calls' write does not hold the delivery up: it is settled as it
/// would be without the history (left pending for a retry), and the loss is counted.
#[tokio::test]
async fn a_failed_write_of_the_calls_is_counted_and_the_job_settled_all_the_same() {
    let mut w = World::new(FakeLlm::failing(status(503)), |_| {}).await;
    let pg = w.env.pg().await;
    pg.execute("ALTER TABLE model_calls RENAME TO model_calls_away", &[])
        .await
        .unwrap();
    let j = job("history-unwritable");
    w.enqueue(&j).await;
    assert_eq!(w.consumer().run_once().await.unwrap(), 1);
    let retries = w.services.metrics.jobs.with_label_values(&["retry"]).get();
    assert_eq!(retries, 1, "settled as a counted failure");
    let metrics = w.services.metrics.render();
    assert!(
        metrics.contains("summaryd_model_calls_unrecorded_total 1"),
        "{metrics}"
    );
    let pending: redis::streams::StreamPendingReply = w
        .redis
        .xpending(w.services.keys.get(0).stream(), GROUP)
        .await
        .unwrap();
    assert_eq!(pending.count(), 1, "the job waits for its redelivery");
}

/// Retention: a job's calls go with its summary's text, and every call once as old as a
/// dead letter may be, finished job or not.
#[tokio::test]
async fn retention_removes_calls_with_the_summary_text_and_at_the_dead_letter_horizon() {
    let llm = FakeLlm::with(vec![Step::Fail(status(400))], Step::Ok(String::new()));
    let mut w = World::new(llm, |s| {
        s.retention.summaries_s = 3_600;
        s.retention.dead_letters_s = 7 * 86_400;
        s.retention.outbox_sent_s = 0;
    })
    .await;
    let dead = job("dead");
    w.enqueue(&dead).await;
    let mut c = w.consumer();
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(w.env.dead_letters().await, 1);
    let done = job("done");
    w.enqueue(&done).await;
    assert_eq!(c.run_once().await.unwrap(), 1);
    relay_once(&w.services.relay()).await.unwrap();
    assert_eq!(w.calls(&dead).await.len(), 1);
    assert_eq!(w.calls(&done).await.len(), 1);

    let maintenance = w.services.maintenance(Roles::all());
    // Nothing is old enough yet.
    let report = maintenance.run_at(Utc::now()).await.unwrap();
    assert_eq!(report.model_calls, 0);
    // The dead letter's call is a row; the finished job's is on its summary.
    assert_eq!(w.env.count("model_calls").await, 1);

    // Past the summaries' horizon: the finished job's text goes, and its calls with it.
    let report = maintenance
        .run_at(Utc::now() + chrono::Duration::hours(2))
        .await
        .unwrap();
    assert_eq!(report.summaries, 1);
    assert!(
        w.calls(&done).await.is_empty(),
        "gone with the summary text"
    );
    assert_eq!(w.calls(&dead).await.len(), 1, "the dead letter's stay");

    // Past the dead letters' horizon: the rest.
    let report = maintenance
        .run_at(Utc::now() + chrono::Duration::days(8))
        .await
        .unwrap();
    assert_eq!(report.model_calls, 1);
    assert_eq!(w.env.count("model_calls").await, 0);
    // The outbox row of the finished job is untouched by any of it (sent rows are kept).
    let outbox = db::outbox::for_job(&w.services.pg, &done.job_id)
        .await
        .unwrap();
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].dedupe_key, SummaryReady::dedupe_key(done.job_id));
}

/// The job page's outbox rows: every row of one job, email and webhook, with what the
/// relay did with them, and none of another job's.
#[tokio::test]
async fn a_jobs_outbox_rows_are_read_with_their_attempts() {
    let mut w = World::new(FakeLlm::ok(), |_| {}).await;
    let mut j = job("with-webhook");
    j.webhook = Some(WebhookUrl::from_stored("https://hooks.example.com/summaries").unwrap());
    let other = job("other");
    w.enqueue(&j).await;
    w.enqueue(&other).await;
    let mut c = w.consumer();
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(c.run_once().await.unwrap(), 1);
    let pg = w.env.pg().await;
    pg.execute(
        "UPDATE outbox SET attempts = 2, last_error = 'HTTP 503', last_status = 503 \
          WHERE topic = 'webhook'",
        &[],
    )
    .await
    .unwrap();
    let rows = db::outbox::for_job(&w.services.pg, &j.job_id)
        .await
        .unwrap();
    let topics: Vec<&str> = rows.iter().map(|r| r.topic.as_str()).collect();
    assert_eq!(topics, ["email.summary_ready", "webhook"]);
    let hook = &rows[1];
    assert_eq!(
        (hook.attempts, hook.last_status, hook.last_error.as_deref()),
        (2, Some(503), Some("HTTP 503"))
    );
    assert!(hook.sent_at.is_none() && hook.next_attempt_at.is_some());
    assert!(rows[0].sent_at.is_none());
    let json = serde_json::to_value(&rows[0]).unwrap();
    assert_eq!(json["topic"], "email.summary_ready");
    assert_eq!(
        db::outbox::for_job(&w.services.pg, &other.job_id)
            .await
            .unwrap()
            .len(),
        1
    );
}
