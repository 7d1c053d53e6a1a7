//! No job stalls the others, and no half-broken dependency dead-letters work
//! (`docs/delivery.md`): a text the model refuses with 403 or fails with 500 while every
//! other text passes, a Postgres that answers reads but refuses writes, a shutdown in the
//! middle of a slow delivery, a claim taken from a running delivery, Redis failing while a
//! job is dead-lettered, and the delivery count's idempotent re-claim. Real Redis and
//! Postgres; the model is a fake (an HTTP server on loopback where its status codes matter).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use summaryd::config::{LlmProvider, Settings};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::keys::{GROUP, RedisKeys};
use summaryd::llm::LlmError;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::{
    ClaimCount, Reclaimed, claim_own, delivery_count, ensure_group, read_new,
};
use summaryd::stream::job_state::{self, REFUNDS, Status};
use summaryd::stream::{Delivery, enqueue};
use summaryd::worker::{Consumer, run};

use crate::shared::http_stub::{Connections, Reply, Request, Server, handler};
use crate::shared::test_env::{Services, pg_base_url, pg_connect};
use crate::shared::{FakeLlm, TestEnv, eventually};

/// The marker a poisonous text carries.
const POISON: &str = "POISON";

fn job(tenant: &str, key: &str, text: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:{tenant}:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse(tenant).unwrap(),
        text: text.into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// A model API that answers every text with a summary, except texts carrying [`POISON`],
/// which it answers `poison_status` (a guardrail proxy's 403, a model that crashes on them).
/// Probes (one completion token) always pass. Records which requests were jobs' calls.
struct GuardedModel {
    server: Server,
    calls: Arc<Mutex<Vec<String>>>,
}

impl GuardedModel {
    async fn start(poison_status: u16) -> GuardedModel {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let answer = handler(calls.clone(), move |calls, request: Request| async move {
            let body = request.json();
            if body["max_tokens"].as_u64() == Some(1) {
                return Reply::completion("ok");
            }
            let text = body["messages"].to_string();
            let poisonous = text.contains(POISON);
            calls.lock().unwrap().push(text);
            if poisonous {
                Reply::json(poison_status, json!({"error": {"message": "refused"}}))
            } else {
                Reply::completion("A summary.")
            }
        });
        let server = Server::start(answer, Connections::KeepAlive).await;
        GuardedModel { server, calls }
    }

    /// Jobs' calls whose text carried the marker, and the others.
    fn calls(&self) -> (usize, usize) {
        let calls = self.calls.lock().unwrap();
        let poison = calls.iter().filter(|t| t.contains(POISON)).count();
        (poison, calls.len() - poison)
    }
}

/// Settings for the guarded model: a breaker cooldown far longer than the test may wait, so
/// a job that held the others back until a cooldown passed fails it.
fn guarded_settings(env: &TestEnv, model: &GuardedModel) -> Settings {
    let mut s = env.settings.clone();
    s.llm.provider = LlmProvider::Openai;
    s.llm.base_url = model.server.url("/v1").into();
    s.llm.api_key = Some("sk-test-0000".into());
    s.llm.max_attempts = 2;
    s.llm.backoff = Duration::from_millis(1);
    s.llm.max_backoff = Duration::from_millis(5);
    s.llm.call_timeout = Duration::from_secs(2);
    s.llm.breaker_failures = 3;
    s.llm.breaker_cooldown = Duration::from_secs(120);
    s.worker.max_deliveries = 3;
    // Counted retries wait at most half of this.
    s.worker.claim_idle = Duration::from_secs(2);
    s
}

/// `n` consumers of `services`, each its own task, until `shutdown`.
fn consumers(
    services: &Services,
    n: usize,
    shutdown: &Shutdown,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let (worker, shutdown) = (services.worker(), shutdown.clone());
            tokio::spawn(async move {
                run(worker, format!("w-{i}"), shutdown).await.unwrap();
            })
        })
        .collect()
}

async fn status(redis: &mut MultiplexedConnection, keys: &RedisKeys, job: &Job) -> Option<Status> {
    job_state::get(redis, keys, job.job_id)
        .await
        .unwrap()
        .map(|state| state.status)
}

/// The poisonous job is dead-lettered after `max_deliveries` calls and the good jobs, queued
/// behind it, all finish long before the breaker's cooldown (two minutes) could pass.
async fn poison_is_dead_lettered_and_the_rest_finish(poison_status: u16, poisons: usize) {
    let model = GuardedModel::start(poison_status).await;
    let env = TestEnv::new().await;
    let settings = guarded_settings(&env, &model);
    let services = env
        .services()
        .settings(settings)
        .build_with_configured_models();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let poison: Vec<Job> = (0..poisons)
        .map(|n| {
            job(
                "evil",
                &format!("poison-{n}"),
                &format!("{POISON} number {n}"),
            )
        })
        .collect();
    for job in &poison {
        enqueue(&mut redis, services.keys.get(0), job)
            .await
            .unwrap();
    }
    let good: Vec<Job> = (0..20)
        .map(|n| job("good", &format!("good-{n}"), &format!("Call notes {n}.")))
        .collect();
    for job in &good {
        enqueue(&mut redis, services.keys.get(0), job)
            .await
            .unwrap();
    }
    let shutdown = Shutdown::new();
    let tasks = consumers(&services, 2, &shutdown);

    assert!(
        eventually(Duration::from_secs(30), || async {
            env.count("summaries").await == 20 && env.dead_letters().await == poisons as u64
        })
        .await,
        "summaries {} (want 20), dead letters {} (want {poisons}), calls {:?}",
        env.count("summaries").await,
        env.dead_letters().await,
        model.calls()
    );
    shutdown.trigger();
    for task in tasks {
        task.await.unwrap();
    }
    for job in &poison {
        assert_eq!(
            status(&mut redis, services.keys.get(0), job).await,
            Some(Status::Failed)
        );
    }
    // What `summaryd dlq list --json` prints: why the last counted delivery failed.
    let mut listed = Vec::new();
    summaryd::ops::dlq::list(&services.redis, &services.keys, 10, true, &mut listed)
        .await
        .unwrap();
    let listed = String::from_utf8(listed).unwrap();
    assert_eq!(
        listed.matches("the last failed:").count(),
        poisons,
        "each dead letter names its last failure: {listed}"
    );
    let (poison_calls, good_calls) = model.calls();
    // Each of its deliveries counted: at most `max_attempts` calls for each of three.
    assert!(
        (3 * poisons..=3 * 2 * poisons).contains(&poison_calls),
        "{poison_calls} calls of the poisonous jobs"
    );
    assert_eq!(good_calls, 20, "every other job paid once");
    assert_eq!(env.count("outbox").await, 20);
}

#[tokio::test]
async fn a_text_the_model_refuses_with_403_is_dead_lettered_and_holds_no_one_back() {
    poison_is_dead_lettered_and_the_rest_finish(403, 1).await;
}

#[tokio::test]
async fn two_texts_the_model_fails_with_500_are_dead_lettered_and_hold_no_one_back() {
    poison_is_dead_lettered_and_the_rest_finish(500, 2).await;
}

/// `ALTER DATABASE … SET default_transaction_read_only` for this test's own database, and
/// end its sessions so the pool's new ones pick it up (a failover to a read-only node).
async fn set_read_only(env: &TestEnv, on: bool) {
    let admin = pg_connect(&format!("{}/postgres", pg_base_url())).await;
    let set = if on {
        format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            env.db_name
        )
    } else {
        format!(
            "ALTER DATABASE \"{}\" RESET default_transaction_read_only",
            env.db_name
        )
    };
    admin.batch_execute(&set).await.unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&env.db_name],
        )
        .await
        .unwrap();
}

/// A world whose Postgres refuses writes, `configure`d, with `n` jobs on the stream (keys
/// `{key}-0`, …): the services, the model, the jobs and their entry ids.
async fn writes_refused(
    env: &TestEnv,
    key: &str,
    n: usize,
    configure: impl FnOnce(&mut Settings),
) -> (Services, Arc<FakeLlm>, Vec<Job>, Vec<String>) {
    let model = Arc::new(FakeLlm::ok());
    let mut settings = env.settings.clone();
    configure(&mut settings);
    let services = env.services().settings(settings).llm(model.clone()).build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    // Connect the pool first, so the switch meets connections in use, as a failover does.
    drop(services.pg.get().await.unwrap());
    set_read_only(env, true).await;
    let jobs: Vec<Job> = (0..n)
        .map(|n| job("acme", &format!("{key}-{n}"), &format!("Call notes {n}.")))
        .collect();
    let mut ids = Vec::new();
    for job in &jobs {
        ids.push(
            enqueue(&mut redis, services.keys.get(0), job)
                .await
                .unwrap(),
        );
    }
    (services, model, jobs, ids)
}

#[tokio::test]
async fn a_postgres_that_refuses_writes_is_an_outage_and_the_model_is_paid_once_per_job() {
    let env = TestEnv::new().await;
    let (services, model, jobs, _) = writes_refused(&env, "ro", 10, |s| {
        s.worker.max_deliveries = 2;
    })
    .await;
    let mut redis = env.redis().await;
    let shutdown = Shutdown::new();
    let tasks = consumers(&services, 2, &shutdown);

    // The consumers meet the refusal at the commit, after paying the model, and stop. A
    // consumer learns of its commit's refusal while its next job runs (the commit goes on
    // without it: `worker/finishing.rs`), so it pays for at most that one job more, whose
    // summary is kept too: the last assertion shows none is paid again.
    assert!(eventually(Duration::from_secs(10), || async { model.calls() >= 1 }).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.dead_letters().await,
        0,
        "a refused write is no job's fault"
    );
    let paid_during = model.calls();
    assert!(
        paid_during <= 2 * 2,
        "{paid_during} calls: consumers kept taking jobs"
    );
    for job in &jobs {
        assert_eq!(
            status(&mut redis, services.keys.get(0), job).await,
            Some(Status::Queued)
        );
    }

    set_read_only(&env, false).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.count("summaries").await == 10
        })
        .await,
        "{} summaries after Postgres took writes again",
        env.count("summaries").await
    );
    shutdown.trigger();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(env.dead_letters().await, 0);
    assert_eq!(env.count("outbox").await, 10);
    assert_eq!(
        model.calls(),
        10,
        "the summaries written before were kept, not paid again"
    );
}

/// A consumer whose last commit Postgres refused learns it at its next pass, before it
/// takes more work: the finisher had ended, so the pass settles it first (refund, held
/// summary, gate closed) and takes nothing, rather than paying the model for another job.
#[tokio::test]
async fn a_pass_settles_a_finished_commits_refusal_before_it_takes_more_work() {
    let env = TestEnv::new().await;
    let (services, model, _, ids) = writes_refused(&env, "refused", 2, |_| {}).await;
    let mut redis = env.redis().await;
    let mut consumer = Consumer::new(services.worker(), "w-refused");
    assert_eq!(consumer.pass().await.unwrap(), 1);
    assert_eq!(model.calls(), 1);
    // The refusal comes back in milliseconds; the finisher has ended well before this.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let next = consumer.pass().await;
    assert!(
        matches!(next, Err(summaryd::worker::WorkerError::Paused { .. })),
        "the refusal closed the gate before a take: {next:?}"
    );
    assert_eq!(model.calls(), 1, "no model call for the second job");
    assert_eq!(
        delivery_count(&mut redis, services.keys.get(0), &ids[0])
            .await
            .unwrap(),
        Some(0),
        "the refused delivery was refunded"
    );
    assert_eq!(
        delivery_count(&mut redis, services.keys.get(0), &ids[1])
            .await
            .unwrap(),
        None,
        "the second job was not taken"
    );

    set_read_only(&env, false).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while env.count("summaries").await < 2 {
        assert!(
            tokio::time::Instant::now() < until,
            "both jobs commit once Postgres takes writes"
        );
        // Paused until the gate's probe finds Postgres back.
        let _ = consumer.run_once().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(model.calls(), 2, "the refused job's summary was kept");
}

/// A world whose model takes a minute per call, `configure`d, with one job on the stream:
/// the services, the model, the job and its entry id.
async fn one_slow_job(
    env: &TestEnv,
    key: &str,
    configure: impl FnOnce(&mut Settings),
) -> (Services, Arc<FakeLlm>, Job, String) {
    let model = Arc::new(FakeLlm::slow(Duration::from_secs(60)));
    let mut settings = env.settings.clone();
    configure(&mut settings);
    let services = env.services().settings(settings).llm(model.clone()).build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let slow = job("acme", key, "Call notes.");
    let id = enqueue(&mut redis, services.keys.get(0), &slow)
        .await
        .unwrap();
    (services, model, slow, id)
}

#[tokio::test]
async fn a_delivery_cut_short_by_shutdown_is_refunded() {
    let env = TestEnv::new().await;
    let (services, model, slow, id) = one_slow_job(&env, "slow-at-shutdown", |s| {
        s.shutdown.grace = Duration::from_secs(3);
    })
    .await;
    let mut redis = env.redis().await;
    let shutdown = Shutdown::new();
    let tasks = consumers(&services, 1, &shutdown);
    assert!(eventually(Duration::from_secs(10), || async { model.calls() == 1 }).await);
    assert_eq!(
        delivery_count(&mut redis, services.keys.get(0), &id)
            .await
            .unwrap(),
        Some(1)
    );

    shutdown.trigger();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the consumer stops within the grace period")
            .unwrap();
    }
    assert_eq!(
        delivery_count(&mut redis, services.keys.get(0), &id)
            .await
            .unwrap(),
        Some(0),
        "still pending, and the cut-short delivery does not count"
    );
    let refunds: Option<u64> = redis
        .hget(services.keys.get(0).job(slow.job_id), REFUNDS)
        .await
        .unwrap();
    assert_eq!(refunds, Some(1));
    assert_eq!(model.in_flight(), 0, "the model call was abandoned");
    assert_eq!(env.count("summaries").await, 0);
}

#[tokio::test]
async fn a_delivery_whose_claim_was_taken_stops_paying_for_its_model_call() {
    let env = TestEnv::new().await;
    let (services, model, _, id) = one_slow_job(&env, "taken", |s| {
        // The running delivery re-claims its entry every 100 ms.
        s.worker.claim_idle = Duration::from_millis(300);
    })
    .await;
    let mut redis = env.redis().await;
    let mut consumer = Consumer::new(services.worker(), "w-slow");
    let delivery = tokio::spawn(async move { consumer.run_once().await.unwrap() });
    assert!(eventually(Duration::from_secs(10), || async { model.calls() == 1 }).await);

    // Another consumer takes the entry (as after a stall past `claim_idle`).
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(services.keys.get(0).stream())
        .arg(GROUP)
        .arg("w-thief")
        .arg(0)
        .arg(&id)
        .query_async(&mut redis)
        .await
        .unwrap();
    let taken = tokio::time::timeout(Duration::from_secs(5), delivery)
        .await
        .expect("the delivery stops once its claim is gone")
        .unwrap();
    assert_eq!(taken, 1);
    assert_eq!(model.in_flight(), 0, "its model call was abandoned");
    let owner: redis::streams::StreamPendingCountReply = redis
        .xpending_count(services.keys.get(0).stream(), GROUP, &id, &id, 1)
        .await
        .unwrap();
    assert_eq!(
        owner.ids[0].consumer, "w-thief",
        "the entry stays with its taker"
    );
    assert_eq!(env.count("summaries").await, 0);
}

#[tokio::test]
async fn a_redis_error_while_dead_lettering_does_not_call_the_model_again() {
    let env = TestEnv::new().await;
    let model = Arc::new(FakeLlm::failing(LlmError::Status {
        status: 400,
        retry_after: None,
        message: "bad request".into(),
    }));
    let services = env.services().llm(model.clone()).build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let refused = job("acme", "refused", "Notes.");
    enqueue(&mut redis, services.keys.get(0), &refused)
        .await
        .unwrap();
    // The dead-letter stream's key holds a string: XADD fails with WRONGTYPE, as a
    // failing Redis would make the step fail.
    let _: () = redis
        .set(services.keys.get(0).dead_letters(), "x")
        .await
        .unwrap();
    let mut consumer = Consumer::new(services.worker(), "w-1");
    assert!(consumer.run_once().await.is_err(), "dead-lettering failed");
    assert_eq!(model.calls(), 1);

    let _: () = redis
        .del(services.keys.get(0).dead_letters())
        .await
        .unwrap();
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(env.dead_letters().await, 1);
    assert_eq!(
        status(&mut redis, services.keys.get(0), &refused).await,
        Some(Status::Failed)
    );
    assert_eq!(model.calls(), 1, "the retry only dead-lettered the job");
}

#[tokio::test]
async fn re_claiming_sets_the_count_so_a_lost_reply_can_be_sent_again_and_refunds_are_bounded() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let mut redis = env.redis().await;
    let keys = services.keys.get(0);
    ensure_group(&mut redis, keys).await.unwrap();
    let bounded = job("acme", "bounded", "Notes.");
    enqueue(&mut redis, keys, &bounded).await.unwrap();
    let delivery: Delivery = read_new(&mut redis, keys, "c-1", 1, Duration::from_millis(10))
        .await
        .unwrap()
        .remove(0);
    let claim = |count| {
        let (mut redis, delivery) = (redis.clone(), delivery.clone());
        async move {
            claim_own(&mut redis, keys, "c-1", &delivery, count)
                .await
                .unwrap()
        }
    };
    let reclaimed = |count, refunded| Some(Reclaimed { count, refunded });

    // A counted retry's claim, sent twice (its first reply was lost), counts once.
    assert_eq!(claim(ClaimCount::Set(2)).await, reclaimed(2, false));
    assert_eq!(claim(ClaimCount::Set(2)).await, reclaimed(2, false));
    // A count that moved without us (the entry was claimed meanwhile) is not ours to set.
    assert_eq!(claim(ClaimCount::Set(4)).await, None);
    assert_eq!(claim(ClaimCount::Keep).await, reclaimed(2, false));

    // Two refunds allowed: each sets the count back; the third is refused.
    let refund = ClaimCount::Refund { to: 1, limit: 2 };
    assert_eq!(claim(refund).await, reclaimed(1, true));
    assert_eq!(claim(ClaimCount::Set(2)).await, reclaimed(2, false));
    assert_eq!(claim(refund).await, reclaimed(1, true));
    assert_eq!(claim(ClaimCount::Set(2)).await, reclaimed(2, false));
    assert_eq!(claim(refund).await, reclaimed(2, false), "refunds used up");
    let refunds: Option<u64> = redis.hget(keys.job(bounded.job_id), REFUNDS).await.unwrap();
    assert_eq!(refunds, Some(2));

    // Another consumer's entry is left alone.
    assert_eq!(
        claim_own(&mut redis, keys, "c-2", &delivery, ClaimCount::Set(3))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        delivery_count(&mut redis, keys, &delivery.id)
            .await
            .unwrap(),
        Some(2)
    );
}
