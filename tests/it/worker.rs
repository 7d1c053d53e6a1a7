//! The worker against real Redis and Postgres: crashes at every step, redelivery, dead
//! letters, concurrency and shutdown. Effects are counted: model calls, summaries rows,
//! outbox rows, pending entries, dead letters.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamPendingCountReply, StreamPendingReply, StreamReadOptions, StreamReadReply,
};
use summaryd::config::Settings;
use summaryd::domain::{Email, Job, JobId, SummaryReady, TenantId};
use summaryd::infra::keys::GROUP;
use summaryd::llm::LlmError;
use summaryd::relay::relay_once;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::ensure_group;
use summaryd::stream::job_state::{self, Status};
use summaryd::stream::{enqueue, job_entry};
use summaryd::worker::{Consumer, JobOutcome, consumer_name, handle_summary_job, run};

use crate::shared::fabricate;
use crate::shared::fakes::Step;
use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually, eventually_every};

/// Long enough that nothing in a test becomes idle by itself.
const NEVER_IDLE_MS: u64 = 600_000;

struct World {
    env: TestEnv,
    llm: Arc<FakeLlm>,
    mailer: Arc<FakeMailer>,
    services: Services,
    redis: MultiplexedConnection,
}

impl World {
    async fn new(llm: FakeLlm) -> Self {
        Self::with_settings(llm, |_| {}).await
    }

    async fn with_settings(llm: FakeLlm, adjust: impl FnOnce(&mut Settings)) -> Self {
        let env = TestEnv::new().await;
        let mut settings = env.settings.clone();
        // Fast, deterministic backoff between in-process attempts.
        settings.llm.backoff = Duration::from_millis(1);
        settings.llm.max_backoff = Duration::from_millis(5);
        adjust(&mut settings);
        let llm = Arc::new(llm);
        let mailer = Arc::new(FakeMailer::new());
        let services = env
            .services()
            .settings(settings)
            .llm(llm.clone())
            .mailer(mailer.clone())
            .build();
        let mut redis = env.redis().await;
        ensure_group(&mut redis, services.keys.get(0))
            .await
            .unwrap();
        Self {
            env,
            llm,
            mailer,
            services,
            redis,
        }
    }

    /// Two relay passes, as the design's crash test runs them.
    async fn relay_twice(&self) {
        relay_once(&self.services.relay()).await.unwrap();
        relay_once(&self.services.relay()).await.unwrap();
    }

    /// Dedupe keys of every email the fake provider accepted.
    fn emails(&self) -> Vec<String> {
        self.mailer.sent().into_iter().map(|(_, key)| key).collect()
    }

    fn consumer(&self, name: &str, claim_idle_ms: u64) -> Consumer {
        let mut c = Consumer::new(self.services.worker(), name);
        c.config.claim_idle = Duration::from_millis(claim_idle_ms);
        c
    }

    async fn enqueue(&mut self, msg: &Job) -> String {
        enqueue(&mut self.redis, self.services.keys.get(0), msg)
            .await
            .unwrap()
    }

    /// XREADGROUP one entry as `consumer`, like a worker that then dies.
    async fn read_as(&mut self, consumer: &str) -> (String, Job) {
        let opts = StreamReadOptions::default().group(GROUP, consumer).count(1);
        let reply: StreamReadReply = self
            .redis
            .xread_options(&[self.services.keys.get(0).stream()], &[">"], &opts)
            .await
            .unwrap();
        let entry = reply.keys[0].ids[0].clone();
        let msg = job_entry::from_fields(&entry.map).unwrap();
        (entry.id, msg)
    }

    async fn pending(&mut self) -> usize {
        let reply: StreamPendingReply = self
            .redis
            .xpending(self.services.keys.get(0).stream(), GROUP)
            .await
            .unwrap();
        reply.count()
    }

    /// (id, consumer, times_delivered) of every pending entry.
    async fn pending_entries(&mut self) -> Vec<(String, String, usize)> {
        let reply: StreamPendingCountReply = self
            .redis
            .xpending_count(self.services.keys.get(0).stream(), GROUP, "-", "+", 100)
            .await
            .unwrap();
        reply
            .ids
            .into_iter()
            .map(|p| (p.id, p.consumer, p.times_delivered))
            .collect()
    }

    async fn make_idle(&mut self, msg_id: &str) {
        fabricate::make_idle(&mut self.redis, self.services.keys.get(0), msg_id).await;
    }

    /// Dead-letter entries as field maps.
    async fn dead_letters(&mut self) -> Vec<HashMap<String, String>> {
        let reply: redis::streams::StreamRangeReply = self
            .redis
            .xrange_all(self.services.keys.get(0).dead_letters())
            .await
            .unwrap();
        reply
            .ids
            .into_iter()
            .map(|e| {
                e.map
                    .keys()
                    .map(|k| (k.clone(), e.get::<String>(k).unwrap_or_default()))
                    .collect()
            })
            .collect()
    }

    async fn job_state(&mut self, job_id: JobId) -> Option<job_state::JobState> {
        job_state::get(&mut self.redis, self.services.keys.get(0), job_id)
            .await
            .unwrap()
    }

    fn jobs_counter(&self, outcome: &str) -> u64 {
        self.services
            .metrics
            .jobs
            .with_label_values(&[outcome])
            .get()
    }

    async fn outbox_dedupe_keys(&self) -> Vec<String> {
        self.env
            .pg()
            .await
            .query("SELECT dedupe_key FROM outbox ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
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

#[tokio::test]
async fn crash_between_commit_and_xack_runs_the_model_once() {
    let mut w = World::new(FakeLlm::ok()).await;
    let msg = job("crash-commit-xack");
    w.enqueue(&msg).await;

    // Worker A reads and fully processes the job (DB commit included)...
    let (_, read) = w.read_as("w-a").await;
    assert_eq!(
        handle_summary_job(&w.services.worker(), &read)
            .await
            .unwrap(),
        JobOutcome::Done
    );
    // ...then dies before XACK: the entry is still pending against w-a.
    assert_eq!(w.pending().await, 1);

    let mut b = w.consumer("w-b", 0);
    assert_eq!(b.run_once().await.unwrap(), 1, "reclaimed and redelivered");
    assert_eq!(w.pending().await, 0);
    assert_eq!(w.llm.calls(), 1, "the pre-check skipped the model");
    assert_eq!(w.env.count("summaries").await, 1);
    assert_eq!(
        w.outbox_dedupe_keys().await,
        vec![SummaryReady::dedupe_key(msg.job_id)]
    );
    assert_eq!(w.jobs_counter("duplicate"), 1);
    assert_eq!(
        w.job_state(msg.job_id).await,
        None,
        "state dropped with the ack"
    );
    w.relay_twice().await;
    assert_eq!(
        w.emails(),
        vec![SummaryReady::dedupe_key(msg.job_id)],
        "one email"
    );
}

#[tokio::test]
async fn same_job_enqueued_twice_makes_one_summary_and_one_outbox_row() {
    let mut w = World::new(FakeLlm::ok()).await;
    let msg = job("enqueued-twice");
    w.enqueue(&msg).await;
    w.enqueue(&msg).await;

    let mut c = w.consumer("w-c", NEVER_IDLE_MS);
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(c.run_once().await.unwrap(), 1);

    assert_eq!(w.jobs_counter("done"), 1);
    assert_eq!(w.jobs_counter("duplicate"), 1);
    assert_eq!(w.llm.calls(), 1);
    assert_eq!(w.env.count("summaries").await, 1);
    assert_eq!(
        w.outbox_dedupe_keys().await,
        vec![SummaryReady::dedupe_key(msg.job_id)]
    );
    assert_eq!(w.pending().await, 0);
    w.relay_twice().await;
    assert_eq!(
        w.emails(),
        vec![SummaryReady::dedupe_key(msg.job_id)],
        "one email"
    );
}

#[tokio::test]
async fn slow_worker_and_reclaimer_racing_write_one_outbox_row() {
    let w = World::new(FakeLlm::slow(Duration::from_millis(200))).await;
    let msg = job("racing");

    let (slow, reclaimer) = (w.services.worker(), w.services.worker());
    let (a, b) = tokio::join!(
        handle_summary_job(&slow, &msg),
        handle_summary_job(&reclaimer, &msg)
    );
    let mut outcomes = vec![a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| *o == JobOutcome::Duplicate);
    assert_eq!(outcomes, vec![JobOutcome::Done, JobOutcome::Duplicate]);
    assert_eq!(w.llm.calls(), 2, "both paid for the model");
    assert_eq!(w.env.count("summaries").await, 1);
    assert_eq!(
        w.env.count("outbox").await,
        1,
        "only the winner wrote the email intent"
    );
    w.relay_twice().await;
    assert_eq!(
        w.emails(),
        vec![SummaryReady::dedupe_key(msg.job_id)],
        "one email"
    );
}

#[tokio::test]
async fn killed_consumer_entry_is_claimed_only_after_claim_idle() {
    let mut w = World::new(FakeLlm::with(
        vec![Step::Delay(
            Duration::from_millis(300),
            Box::new(Step::Ok(String::new())),
        )],
        Step::Ok(String::new()),
    ))
    .await;
    let msg = job("killed-after-read");
    w.enqueue(&msg).await;
    let (msg_id, _) = w.read_as("w-a").await; // w-a dies here

    let mut b = w.consumer("w-b", NEVER_IDLE_MS);
    assert_eq!(
        b.run_once().await.unwrap(),
        0,
        "not claimable before claim_idle_ms"
    );
    assert_eq!(
        w.pending_entries().await,
        vec![(msg_id.clone(), "w-a".to_string(), 1)]
    );
    assert_eq!(w.llm.calls(), 0);

    w.make_idle(&msg_id).await;
    let task = tokio::spawn(async move {
        let taken = b.run_once().await.unwrap();
        (b, taken)
    });
    // While B's model call is in flight, the PEL shows the claim.
    assert!(
        eventually_every(Duration::from_secs(1), Duration::from_millis(5), || async {
            w.llm.calls() == 1
        })
        .await,
        "B's model call started"
    );
    assert_eq!(
        w.pending_entries().await,
        vec![(msg_id.clone(), "w-b".to_string(), 2)]
    );
    let (_, taken) = task.await.unwrap();
    assert_eq!(taken, 1);
    assert_eq!(w.pending().await, 0);
    assert_eq!(w.env.count("summaries").await, 1);
    assert_eq!(w.env.count("outbox").await, 1);
}

#[tokio::test]
async fn always_failing_job_is_dead_lettered_on_the_claim_after_max_deliveries() {
    let mut w = World::with_settings(FakeLlm::failing(status(503)), |s| {
        s.llm.max_attempts = 1;
        s.worker.max_deliveries = 3;
    })
    .await;
    // An unrelated entry, just taken by a live consumer: not idle, must not move.
    let bystander = job("bystander");
    w.enqueue(&bystander).await;
    let (bystander_id, _) = w.read_as("w-live").await;

    let failing = job("always-503");
    let failing_id = w.enqueue(&failing).await;
    let mut c = w.consumer("w-c", NEVER_IDLE_MS);
    assert_eq!(
        c.run_once().await.unwrap(),
        1,
        "first delivery via XREADGROUP"
    );
    for delivery in 2..=3 {
        w.make_idle(&failing_id).await;
        assert_eq!(c.run_once().await.unwrap(), 1, "delivery {delivery}");
    }
    assert_eq!(w.llm.calls(), 3, "three model runs");
    assert_eq!(w.jobs_counter("retry"), 3);
    assert!(w.dead_letters().await.is_empty());

    w.make_idle(&failing_id).await;
    assert_eq!(c.run_once().await.unwrap(), 1, "fourth claim");
    assert_eq!(w.llm.calls(), 3, "dead-lettered without another model run");
    assert_eq!(w.jobs_counter("dead_lettered"), 1);

    let dead = w.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]["reason"].contains("exceeded 3 deliveries"),
        "{:?}",
        dead[0]
    );
    assert_eq!(dead[0]["original_id"], failing_id);
    assert_eq!(dead[0]["job_id"], failing.job_id.to_string());
    assert_eq!(dead[0]["tenant"], "acme");
    assert!(dead[0].contains_key("payload") && dead[0].contains_key("failed_at"));
    let state = w.job_state(failing.job_id).await.unwrap();
    assert_eq!(state.status, Status::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("processing failed on each of 3 attempts")
    );

    // What did NOT move: the bystander is still pending, with its owner and count.
    assert_eq!(
        w.pending_entries().await,
        vec![(bystander_id, "w-live".to_string(), 1)]
    );
    assert_eq!(
        w.job_state(bystander.job_id).await.unwrap().status,
        Status::Queued
    );
    assert_eq!(w.env.count("summaries").await, 0);
}

#[tokio::test]
async fn rate_limited_forever_stays_pending_and_is_not_dead_lettered() {
    let mut w = World::with_settings(FakeLlm::failing(status(429)), |s| {
        s.llm.max_attempts = 4;
    })
    .await;
    let msg = job("always-429");
    w.enqueue(&msg).await;
    let mut c = w.consumer("w-c", NEVER_IDLE_MS);
    assert_eq!(c.run_once().await.unwrap(), 1);

    assert_eq!(w.llm.calls(), 4);
    assert_eq!(w.pending().await, 1);
    assert!(w.dead_letters().await.is_empty());
    assert_eq!(w.jobs_counter("retry"), 1);
    assert_eq!(
        w.job_state(msg.job_id).await.unwrap().status,
        Status::Queued
    );
    assert_eq!(w.env.count("summaries").await, 0);
}

#[tokio::test]
async fn bad_request_is_dead_lettered_after_one_call() {
    let mut w = World::new(FakeLlm::failing(status(400))).await;
    let msg = job("bad-request");
    w.enqueue(&msg).await;
    let mut c = w.consumer("w-c", NEVER_IDLE_MS);
    assert_eq!(c.run_once().await.unwrap(), 1);

    assert_eq!(w.llm.calls(), 1);
    assert_eq!(w.pending().await, 0);
    let dead = w.dead_letters().await;
    assert_eq!(dead.len(), 1);
    // Operators get the provider's text; the tenant gets our wording of the class.
    assert!(
        dead[0]["reason"].contains("model API answered 400: HTTP 400"),
        "{:?}",
        dead[0]
    );
    let state = w.job_state(msg.job_id).await.unwrap();
    assert_eq!(state.status, Status::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("the model rejected the request (HTTP 400)")
    );
    assert_eq!(w.env.count("outbox").await, 0);
    assert_eq!(in_flight(&mut w, "acme").await, Vec::<String>::new());
}

/// The tenant's in-flight set (job ids accepted and not finished).
async fn in_flight(w: &mut World, tenant: &str) -> Vec<String> {
    w.redis
        .smembers(w.services.keys.get(0).in_flight(tenant))
        .await
        .unwrap()
}

/// A job the API would refuse (NUL in the text), put on the stream by another producer:
/// Postgres refuses the commit with a data error (class 22), which is permanent. The job is
/// dead-lettered after its first delivery, with a reason saying what was wrong, and never
/// delivered (or paid for) again.
#[tokio::test]
async fn a_commit_postgres_refuses_is_dead_lettered_after_one_delivery() {
    let mut w = World::new(FakeLlm::ok()).await;
    let mut msg = job("nul-text");
    msg.text = "Revenue grew.\u{0}Costs fell.".into();
    w.enqueue(&msg).await;
    assert_eq!(
        in_flight(&mut w, "acme").await,
        vec![msg.job_id.to_string()]
    );
    let mut c = w.consumer("w-c", 0);
    assert_eq!(c.run_once().await.unwrap(), 1);

    assert_eq!(w.llm.calls(), 1);
    assert_eq!(w.pending().await, 0, "not left pending for redelivery");
    let dead = w.dead_letters().await;
    assert_eq!(dead.len(), 1);
    let reason = &dead[0]["reason"];
    assert!(reason.contains("could not be stored"), "{reason}");
    assert!(reason.contains("SQLSTATE 22"), "{reason}");
    let state = w.job_state(msg.job_id).await.unwrap();
    assert_eq!(state.status, Status::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some(
            "the summary could not be stored: the text or summary holds data the database refuses"
        )
    );
    assert_eq!(in_flight(&mut w, "acme").await, Vec::<String>::new());
    // Claim-idle 0: anything still pending would be taken again at once.
    assert_eq!(c.run_once().await.unwrap(), 0);
    assert_eq!(w.llm.calls(), 1);
    assert_eq!(w.env.count("summaries").await, 0);
    assert_eq!(w.env.count("outbox").await, 0);
    assert_eq!(w.jobs_counter("dead_lettered"), 1);
    assert_eq!(w.jobs_counter("retry"), 0);
}

#[tokio::test]
async fn malformed_message_is_dead_lettered_at_once() {
    let mut w = World::new(FakeLlm::ok()).await;
    let id: String = w
        .redis
        .xadd(
            w.services.keys.get(0).stream(),
            "*",
            &[("job_id", "not-a-uuid"), ("payload", "{")],
        )
        .await
        .unwrap();
    let mut c = w.consumer("w-c", NEVER_IDLE_MS);
    assert_eq!(c.run_once().await.unwrap(), 1);

    assert_eq!(w.llm.calls(), 0);
    assert_eq!(w.pending().await, 0);
    let dead = w.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0]["reason"].contains("malformed"), "{:?}", dead[0]);
    assert_eq!(dead[0]["original_id"], id);
    assert_eq!(
        dead[0]["job_id"], "not-a-uuid",
        "original fields kept for a person"
    );
    assert_eq!(w.jobs_counter("dead_lettered"), 1);
}

#[tokio::test]
async fn finished_job_out_of_deliveries_is_acknowledged_not_dead_lettered() {
    // The summary was committed, but every ack got lost: the job is done, not failed.
    let mut w = World::with_settings(FakeLlm::ok(), |s| s.worker.max_deliveries = 1).await;
    let msg = job("done-but-unacked");
    let msg_id = w.enqueue(&msg).await;
    let (_, read) = w.read_as("w-a").await;
    assert_eq!(
        handle_summary_job(&w.services.worker(), &read)
            .await
            .unwrap(),
        JobOutcome::Done
    );
    w.make_idle(&msg_id).await;

    let mut c = w.consumer("w-c", NEVER_IDLE_MS);
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(w.pending().await, 0);
    assert!(w.dead_letters().await.is_empty());
    assert_eq!(w.job_state(msg.job_id).await, None);
    assert_eq!(w.llm.calls(), 1);
    assert_eq!(w.env.count("outbox").await, 1);
}

#[tokio::test]
async fn eight_consumers_process_sixteen_jobs_eight_at_a_time() {
    let mut w = World::with_settings(FakeLlm::slow(Duration::from_millis(200)), |s| {
        s.worker.consumers = 8;
    })
    .await;
    for i in 0..16 {
        w.enqueue(&job(&format!("concurrent-{i}"))).await;
    }
    let shutdown = Shutdown::new();
    let tasks: Vec<_> = (0..8)
        .map(|i| tokio::spawn(run(w.services.worker(), format!("w-{i}"), shutdown.clone())))
        .collect();

    let all_done = eventually(Duration::from_secs(10), || async {
        w.env.count("summaries").await == 16
    })
    .await;
    shutdown.trigger();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(all_done, "{} of 16 done", w.env.count("summaries").await);
    assert_eq!(w.llm.max_in_flight(), 8);
    assert_eq!(w.llm.calls(), 16);
    assert_eq!(w.env.count("outbox").await, 16);
    assert_eq!(w.pending().await, 0);
}

#[tokio::test]
async fn run_stops_promptly_on_shutdown_and_finishes_the_job_in_hand() {
    let mut w = World::new(FakeLlm::slow(Duration::from_millis(300))).await;
    let shutdown = Shutdown::new();
    let task = tokio::spawn(run(w.services.worker(), "w-stop".into(), shutdown.clone()));
    let msg = job("in-hand-at-shutdown");
    w.enqueue(&msg).await;
    assert!(
        eventually_every(Duration::from_secs(1), Duration::from_millis(5), || async {
            w.llm.calls() == 1
        })
        .await,
        "the job is in hand"
    );
    shutdown.trigger();

    let stopped = tokio::time::timeout(Duration::from_secs(3), task).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    assert_eq!(
        w.env.count("summaries").await,
        1,
        "the job in hand finished"
    );
    assert_eq!(w.pending().await, 0);
    assert_eq!(w.llm.calls(), 1, "no new work after shutdown");
}

#[tokio::test]
async fn idle_consumers_with_nothing_pending_are_removed_from_the_group() {
    let mut w =
        World::with_settings(FakeLlm::ok(), |s| s.worker.consumer_gc = Duration::ZERO).await;
    let stream = w.services.keys.get(0).stream();
    for name in ["w-gone", "w-me"] {
        let _: i64 = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&stream)
            .arg(GROUP)
            .arg(name)
            .query_async(&mut w.redis)
            .await
            .unwrap();
    }
    w.enqueue(&job("held")).await;
    w.read_as("w-busy").await;
    // Let every consumer be idle for longer than consumer_gc_ms = 0. A real wait: only
    // Redis's clock sets a consumer's idle time (no command fabricates it), in whole ms.
    tokio::time::sleep(Duration::from_millis(10)).await;

    let removed = summaryd::stream::consumer_group::remove_idle_consumers(
        &mut w.redis,
        w.services.keys.get(0),
        "w-me",
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(removed, vec!["w-gone".to_string()]);

    let info: redis::streams::StreamInfoConsumersReply =
        w.redis.xinfo_consumers(&stream, GROUP).await.unwrap();
    let mut names: Vec<String> = info.consumers.into_iter().map(|c| c.name).collect();
    names.sort();
    assert_eq!(
        names,
        vec!["w-busy", "w-me"],
        "holder of a pending entry and we stay"
    );
}

#[test]
fn consumer_names_are_host_pid_index() {
    let name = consumer_name(3);
    let suffix = format!("-{}-3", std::process::id());
    assert!(name.ends_with(&suffix), "{name}");
    assert!(name.len() > suffix.len(), "has a host part: {name}");
    assert_ne!(consumer_name(0), consumer_name(1));
}
