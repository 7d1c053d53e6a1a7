//! Outages and races that must cost no job (`docs/delivery.md`): a Postgres outage of
//! several claim-idle periods, a delivery slower than `claim_idle_ms`, a mail provider down
//! for longer than ten backoffs, GET while a job finishes, consumer cleanup on a quiet
//! system, a loop whose every pass fails, and a malformed dead letter among good ones.
//! Real Redis and Postgres (a private Postgres where the test stops it); effects counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::test::{self as actix_test, TestRequest};
use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamInfoConsumersReply, StreamPendingCountReply};
use secrecy::ExposeSecret;
use summaryd::api::summaries::{JobStatus, read_job};
use summaryd::config::roles::{Role, Roles};
use summaryd::config::{MailProvider, Settings};
use summaryd::domain::{Email, Job, JobId, SummaryReady, TenantId};
use summaryd::infra::keys::GROUP;
use summaryd::relay::relay_pass;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::ensure_group;
use summaryd::stream::{enqueue, job_state};
use summaryd::worker::Consumer;

use crate::shared::fabricate::{make_idle, make_outbox_due};
use crate::shared::http_stub::{HttpStub, Reply};
use crate::shared::servers::{PgCluster, test_dir};
use crate::shared::test_env::{Services, pg_connect};
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually, eventually_every};

fn job(key: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Call notes {key}. Renewal agreed. Pricing next week.").into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

async fn dead_letters(redis: &mut MultiplexedConnection, services: &Services) -> usize {
    redis
        .xlen(services.keys.get(0).dead_letters())
        .await
        .unwrap()
}

/// `consumer` dead-letters `delivery` with the operator's and the tenant's reason; whether
/// it was moved (it is not when the entry is no longer pending for `consumer`).
async fn dead_letter(
    redis: &mut MultiplexedConnection,
    services: &Services,
    consumer: &str,
    delivery: &summaryd::stream::consumer_group::Delivery,
    reasons: (&str, &str),
) -> bool {
    summaryd::stream::dead_letters::add(
        redis,
        services.keys.get(0),
        consumer,
        &delivery.id,
        &delivery.fields,
        summaryd::stream::dead_letters::Why {
            reason: reasons.0,
            class: summaryd::domain::ReasonClass::ModelFailed,
            tenant_error: reasons.1,
        },
    )
    .await
    .unwrap()
}

/// (id, consumer, times_delivered) of every pending entry.
async fn pending(
    redis: &mut MultiplexedConnection,
    services: &Services,
) -> Vec<(String, String, usize)> {
    let reply: StreamPendingCountReply = redis
        .xpending_count(services.keys.get(0).stream(), GROUP, "-", "+", 1000)
        .await
        .unwrap();
    reply
        .ids
        .into_iter()
        .map(|p| (p.id, p.consumer, p.times_delivered))
        .collect()
}

async fn consumer_names(
    redis: &mut MultiplexedConnection,
    services: &Services,
) -> Vec<(String, u64)> {
    let info: StreamInfoConsumersReply = redis
        .xinfo_consumers(services.keys.get(0).stream(), GROUP)
        .await
        .unwrap();
    info.consumers
        .into_iter()
        .map(|c| (c.name, c.idle as u64))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_of_several_claim_idle_periods_spends_no_delivery_and_dead_letters_nothing()
 {
    let dir = test_dir("pg-outage");
    let pg = PgCluster::start_plain(dir.path());
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.database_url = pg.plain_url("summaryd").into();
    summaryd::db::migrate::run(settings.database_url.expose_secret(), None)
        .await
        .unwrap();
    settings.worker.claim_idle = Duration::from_millis(300);
    settings.worker.max_deliveries = 2;
    settings.relay.backoff = Duration::from_millis(10);
    settings.relay.max_backoff = Duration::from_millis(100);
    let llm = Arc::new(FakeLlm::ok());
    let mailer = Arc::new(FakeMailer::new());
    let services = env
        .services()
        .settings(settings.clone())
        .llm(llm.clone())
        .mailer(mailer.clone())
        .build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let shutdown = Shutdown::new();
    let mut tasks = Vec::new();
    for n in 0..2 {
        tasks.push(tokio::spawn(summaryd::worker::run(
            services.worker(),
            format!("pg-outage-{n}"),
            shutdown.clone(),
        )));
    }
    let relay = tokio::spawn(summaryd::relay::run(
        services.relay(),
        "relay".into(),
        shutdown.clone(),
    ));
    let url = settings.database_url.expose_secret().to_owned();
    let summaries = || {
        let url = url.clone();
        async move {
            let client = pg_connect(&url).await;
            let n: i64 = client
                .query_one("SELECT count(*) FROM summaries", &[])
                .await
                .unwrap()
                .get(0);
            n as usize
        }
    };

    for n in 0..3 {
        enqueue(
            &mut redis,
            services.keys.get(0),
            &job(&format!("pg-before-{n}")),
        )
        .await
        .unwrap();
    }
    assert!(eventually(Duration::from_secs(10), || async { summaries().await == 3 }).await);

    pg.stop();
    for n in 0..6 {
        enqueue(
            &mut redis,
            services.keys.get(0),
            &job(&format!("pg-during-{n}")),
        )
        .await
        .unwrap();
    }
    // The consumers meet the outage: the gate closes, and each delivery that met it is
    // refunded and held.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let held = pending(&mut redis.clone(), &services).await;
            !services.worker_gate.down().is_empty()
                && !held.is_empty()
                && held.iter().all(|(_, _, delivered)| *delivered == 0)
        })
        .await,
        "the gate closed and the deliveries that met the outage were refunded: {:?}",
        pending(&mut redis, &services).await
    );
    // Their entries now look idle far past claim_idle_ms, as after an outage of many
    // claim-idle periods: every pass that takes work would claim one, one more delivery each
    // time (before, two such periods dead-lettered a job). Both consumers keep passing.
    for (id, _, _) in pending(&mut redis, &services).await {
        make_idle(&mut redis, services.keys.get(0), &id).await;
    }
    let paused_passes = || {
        services
            .metrics
            .loop_errors
            .with_label_values(&["worker", "postgres_unavailable"])
            .get()
    };
    let idle_from = paused_passes();
    assert!(
        eventually(Duration::from_secs(10), || async {
            paused_passes() >= idle_from + 4
        })
        .await,
        "the consumers kept passing (and probing) while Postgres was down"
    );
    assert_eq!(dead_letters(&mut redis, &services).await, 0);
    let held = pending(&mut redis, &services).await;
    assert!(
        held.len() <= 2,
        "consumers stop taking work while Postgres is down (one entry each at most): {held:?}"
    );
    assert!(
        held.iter().all(|(_, _, delivered)| *delivered == 0),
        "the deliveries that met the outage were refunded: {held:?}"
    );
    assert_eq!(llm.calls(), 3, "no model call while Postgres is down");
    let retries = services.metrics.jobs.with_label_values(&["retry"]).get();
    assert!(
        retries <= 2,
        "paused consumers wait for Postgres instead of retrying in a loop: {retries} retries"
    );
    assert!(
        !services.worker_gate.down().is_empty(),
        "the gate is closed"
    );

    pg.start();
    let back = Instant::now();
    assert!(
        eventually(Duration::from_secs(15), || async {
            summaries().await == 9 && mailer.sent().len() == 9
        })
        .await,
        "every job done and mailed after Postgres returned: {} summaries, {} emails",
        summaries().await,
        mailer.sent().len()
    );
    let recovery = back.elapsed();
    assert!(
        recovery < Duration::from_secs(8),
        "work resumed within seconds, not a claim-idle period later: {recovery:?}"
    );
    assert_eq!(dead_letters(&mut redis, &services).await, 0);
    assert!(pending(&mut redis, &services).await.is_empty());
    assert_eq!(llm.calls(), 9, "one model call per job");
    let keys: BTreeSet<String> = mailer.sent().into_iter().map(|(_, k)| k).collect();
    assert_eq!(keys.len(), 9, "one email per job");
    let outbox: i64 = pg_connect(&url)
        .await
        .query_one("SELECT count(*) FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(outbox, 9);
    assert_eq!(
        services
            .metrics
            .jobs
            .with_label_values(&["dead_lettered"])
            .get(),
        0
    );
    println!("postgres outage: recovered in {recovery:?}");

    shutdown.trigger();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    relay.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_slower_than_claim_idle_keeps_its_entry_and_calls_the_model_once() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.worker.claim_idle = Duration::from_millis(200);
    // One delivery only: a reclaim of the running delivery would dead-letter it at once.
    settings.worker.max_deliveries = 1;
    let llm = Arc::new(FakeLlm::slow(Duration::from_millis(1_200)));
    let services = env.services().settings(settings).llm(llm.clone()).build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let msg = job("slow-delivery");
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();

    let mut slow = Consumer::new(services.worker(), "w-slow");
    let delivery = tokio::spawn(async move { slow.run_once().await.unwrap() });
    // The slow consumer must hold the entry before the reclaimer's first pass, or the
    // reclaimer reads it as new work and the test measures nothing.
    assert!(
        eventually_every(Duration::from_secs(5), Duration::from_millis(5), || async {
            pending(&mut redis.clone(), &services)
                .await
                .iter()
                .any(|(_, consumer, _)| consumer == "w-slow")
        })
        .await,
        "w-slow never read the entry"
    );
    let mut reclaimer = Consumer::new(services.worker(), "w-reclaimer");
    let mut reclaimed = 0;
    let mut passes = 0;
    while !delivery.is_finished() {
        reclaimed += reclaimer.run_once().await.unwrap();
        passes += 1;
        // A real wait: what is proved is that a running delivery keeps its entry's idle
        // time (Redis's clock) below claim_idle_ms, so the time must really pass; idleness
        // made up by the test is what the extension exists to prevent. This only spaces
        // the passes out.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(delivery.await.unwrap(), 1);
    assert!(passes > 5, "the reclaimer tried all along: {passes} passes");
    assert_eq!(reclaimed, 0, "never reclaimed while its delivery ran");
    assert_eq!(llm.calls(), 1);
    assert_eq!(dead_letters(&mut redis, &services).await, 0);
    assert!(pending(&mut redis, &services).await.is_empty());
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(env.count("outbox").await, 1);
    assert_eq!(
        job_state::get(&mut redis, services.keys.get(0), msg.job_id)
            .await
            .unwrap(),
        None,
        "done: no failed state left behind"
    );
}

#[tokio::test]
async fn dead_lettering_an_entry_no_longer_ours_writes_nothing() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let msg = job("not-ours");
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();
    // "w-a" takes it; "w-b" (which the entry was reclaimed from, say) tries to bury it.
    let taken = summaryd::stream::consumer_group::read_new(
        &mut redis,
        services.keys.get(0),
        "w-a",
        1,
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    let exhausted = (
        "exceeded 5 deliveries",
        "processing failed on each of 5 attempts",
    );
    let moved = dead_letter(&mut redis, &services, "w-b", &taken[0], exhausted).await;
    assert!(!moved);
    assert_eq!(dead_letters(&mut redis, &services).await, 0);
    assert_eq!(pending(&mut redis, &services).await.len(), 1, "still w-a's");
    let state = job_state::get(&mut redis, services.keys.get(0), msg.job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.status, job_state::Status::Queued);

    // The holder's own dead-letter moves it: dead entry, acknowledged, state failed.
    assert!(dead_letter(&mut redis, &services, "w-a", &taken[0], exhausted).await);
    assert_eq!(dead_letters(&mut redis, &services).await, 1);
    assert!(pending(&mut redis, &services).await.is_empty());
    let state = job_state::get(&mut redis, services.keys.get(0), msg.job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.status, job_state::Status::Failed);

    // A finished job's state (deleted by the acknowledgement) is not recreated.
    let done = job("done-meanwhile");
    enqueue(&mut redis, services.keys.get(0), &done)
        .await
        .unwrap();
    let taken = summaryd::stream::consumer_group::read_new(
        &mut redis,
        services.keys.get(0),
        "w-a",
        1,
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    let _: () = redis
        .del(services.keys.get(0).job(done.job_id))
        .await
        .unwrap();
    assert!(dead_letter(&mut redis, &services, "w-a", &taken[0], ("x", "x")).await);
    let exists: bool = redis
        .exists(services.keys.get(0).job(done.job_id))
        .await
        .unwrap();
    assert!(!exists, "no tenant-less failed state recreated");
}

#[tokio::test]
async fn a_mail_outage_longer_than_ten_backoffs_parks_nothing_and_sends_each_row_once() {
    let env = TestEnv::new().await;
    let sink = HttpStub::start(Reply::json(200, serde_json::json!({"id": "m"}))).await;
    // 14 passes of 503 for three rows (more than ten backoffs each), then a 409 ("this
    // idempotency key is in progress") for two of them, then 200.
    let mut outage = vec![Reply::text(503, "maintenance"); 42];
    outage.extend(vec![Reply::text(409, "in progress"); 2]);
    sink.script(outage);
    let mut settings: Settings = env.settings.clone();
    settings.mail.provider = MailProvider::Http;
    settings.mail.http_url = Some(sink.url("/v1/emails").into());
    settings.relay.backoff = Duration::from_millis(1);
    settings.relay.max_backoff = Duration::from_millis(2);
    assert_eq!(
        settings.relay.max_attempts, 10,
        "the default attempt budget"
    );
    let mailer = summaryd::mail::from_settings(&settings.mail, crate::shared::log_key()).unwrap();
    let services = env.services().settings(settings).mailer(mailer).build();
    let jobs: Vec<Job> = (0..3).map(|n| job(&format!("mail-outage-{n}"))).collect();
    for j in &jobs {
        summaryd::db::summaries::commit_with_outbox(
            &services.pg,
            j,
            &crate::shared::model_summary("Renewal agreed."),
        )
        .await
        .unwrap();
    }

    let pg = env.pg().await;
    let mut sent = 0;
    let mut passes = 0;
    while sent < 3 && passes < 200 {
        let report = relay_pass(&services.relay()).await.unwrap();
        assert_eq!(report.stuck, 0, "pass {passes}: no row stuck");
        sent += report.sent;
        passes += 1;
        let stuck = summaryd::db::outbox::stuck(&services.pg).await.unwrap();
        assert!(stuck.is_empty(), "pass {passes}: {stuck:?}");
        make_outbox_due(&pg).await;
    }
    assert_eq!(sent, 3, "every row sent once the provider recovered");
    assert_eq!(env.count("outbox WHERE sent_at IS NOT NULL").await, 3);
    assert_eq!(
        env.count("outbox WHERE attempts > 10").await,
        3,
        "each row failed more than ten times before it went out"
    );

    let requests = sink.requests();
    assert_eq!(
        requests.len(),
        42 + 2 + 3,
        "503s, 409s, one delivery per row"
    );
    let mut per_key: BTreeMap<String, BTreeSet<Vec<u8>>> = BTreeMap::new();
    for r in &requests {
        let key = r.header("Idempotency-Key").unwrap().to_owned();
        per_key.entry(key).or_default().insert(r.body.clone());
    }
    let expected: BTreeSet<String> = jobs
        .iter()
        .map(|j| SummaryReady::dedupe_key(j.job_id))
        .collect();
    assert_eq!(per_key.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(
        per_key.values().all(|bodies| bodies.len() == 1),
        "every attempt of a row is the same email with the same key"
    );
    // After the 409s nothing is left unsent: the rows that got one were retried.
    assert_eq!(relay_pass(&services.relay()).await.unwrap().claimed, 0);
}

#[tokio::test]
async fn get_while_the_job_commits_and_is_acknowledged_between_its_reads_answers_done() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let msg = job("get-window");
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();
    let tenant = TenantId::parse("acme").unwrap();

    let queued = read_job(&services.api(), &tenant, msg.job_id, std::future::ready(()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(queued.status, JobStatus::Queued);

    // The state is read (queued); then the worker commits the summary and acknowledges,
    // which deletes the state; then the summary is read.
    let mut consumer = Consumer::new(services.worker(), "w-window");
    let view = read_job(&services.api(), &tenant, msg.job_id, async {
        assert_eq!(consumer.run_once().await.unwrap(), 1);
    })
    .await
    .unwrap()
    .expect("an accepted job is never a 404");
    assert_eq!(view.status, JobStatus::Done);
    assert!(view.summary.is_some());
    assert_eq!(
        job_state::get(&mut redis, services.keys.get(0), msg.job_id)
            .await
            .unwrap(),
        None,
        "the window really closed between the reads"
    );
    assert_eq!(env.count("summaries").await, 1);

    // Another tenant still gets nothing.
    let other = TenantId::parse("globex").unwrap();
    assert!(
        read_job(&services.api(), &other, msg.job_id, std::future::ready(()))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_cleanup_on_a_quiet_system_keeps_live_consumers_and_removes_a_killed_one() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.worker.consumer_gc = Duration::from_millis(300);
    settings.worker.block = Duration::from_millis(300);
    let services = env.services().settings(settings).build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let names = ["live-1", "live-2", "killed"];
    for name in names {
        let _: i64 = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(services.keys.get(0).stream())
            .arg(GROUP)
            .arg(name)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let shutdown = Shutdown::new();
    let mut tasks: BTreeMap<&str, _> = names
        .iter()
        .map(|name| {
            let task = tokio::spawn(summaryd::worker::run(
                services.worker(),
                (*name).to_owned(),
                shutdown.clone(),
            ));
            (*name, task)
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || async {
            let mut r = redis.clone();
            for name in names {
                let marked: bool = r
                    .exists(services.keys.get(0).consumer_alive(name))
                    .await
                    .unwrap();
                if !marked {
                    return false;
                }
            }
            true
        })
        .await,
        "every consumer is running and has marked itself alive"
    );
    // kill -9: the task is gone mid-pass, nothing of its shutdown path runs; its liveness
    // mark is left to lapse.
    tasks.remove("killed").unwrap().abort();

    // Ten cleanup periods of nothing to do. A real window: the live consumers' idle time
    // (Redis's own clock; nothing fabricates it) must pass consumer_gc_ms while nothing
    // removes them, and the killed one's mark must lapse.
    let mut max_live_idle = 0;
    let mut killed_removed_after = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(3_000) {
        let consumers = consumer_names(&mut redis, &services).await;
        for live in ["live-1", "live-2"] {
            let idle = consumers.iter().find(|(n, _)| n == live).map(|(_, i)| *i);
            let idle = idle.unwrap_or_else(|| {
                panic!("live consumer {live} removed after {:?}", started.elapsed())
            });
            max_live_idle = max_live_idle.max(idle);
        }
        if killed_removed_after.is_none() && !consumers.iter().any(|(n, _)| n == "killed") {
            killed_removed_after = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        max_live_idle > 300,
        "on a quiet system live consumers look idle ({max_live_idle} ms), so idle time alone would remove them"
    );
    assert!(
        killed_removed_after.is_some(),
        "the killed consumer was removed"
    );
    shutdown.trigger();
    for (_, t) in tasks {
        t.await.unwrap().unwrap();
    }
}

#[actix_web::test]
async fn a_worker_whose_every_pass_fails_is_counted_and_reported_not_ready_with_the_reason() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let mut redis = env.redis().await;
    // The stream key holds a string: every XGROUP/XREADGROUP answers WRONGTYPE.
    let _: () = redis
        .set(services.keys.get(0).stream(), "not a stream")
        .await
        .unwrap();
    let shutdown = Shutdown::new();
    let worker = tokio::spawn(summaryd::worker::run(
        services.worker(),
        "w-broken".into(),
        shutdown.clone(),
    ));
    let app = actix_test::init_service(summaryd::api::app(
        services.api(),
        Roles::of(&[Role::Worker]),
        shutdown.clone(),
    ))
    .await;
    let failing = || {
        services
            .metrics
            .loop_errors
            .with_label_values(&["worker", "redis_error"])
            .get()
    };
    // The passes are spaced by the worker's error backoff (1 s doubling), a constant.
    assert!(
        eventually(Duration::from_secs(40), || async {
            failing() >= u64::from(summaryd::infra::metrics::FAILED_PASSES_NOT_READY)
        })
        .await,
        "passes kept failing: {}",
        failing()
    );
    let res = actix_test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = actix_test::read_body_json(res).await;
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("worker loop") && detail.contains("WRONGTYPE"),
        "{body}"
    );
    let res = actix_test::call_service(&app, TestRequest::get().uri("/metrics").to_request()).await;
    let text = String::from_utf8(actix_test::read_body(res).await.to_vec()).unwrap();
    assert!(
        text.contains("summaryd_loop_errors_total{kind=\"redis_error\",role=\"worker\"}"),
        "{text}"
    );

    // Fixed: the next pass succeeds and readiness returns.
    let _: () = redis.del(services.keys.get(0).stream()).await.unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            services.metrics.failing_loops().is_empty()
        })
        .await
    );
    let res = actix_test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    shutdown.trigger();
    worker.await.unwrap().unwrap();
}

#[tokio::test]
async fn dlq_replay_all_skips_a_malformed_entry_and_replays_the_rest() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, services.keys.get(0))
        .await
        .unwrap();
    let dead = services.keys.get(0).dead_letters();
    // Oldest first: a malformed message (no job id, no payload), then a real dead job.
    let _: String = redis
        .xadd(&dead, "*", &[("garbage", "x"), ("reason", "malformed")])
        .await
        .unwrap();
    let msg = job("dlq-after-malformed");
    enqueue(&mut redis, services.keys.get(0), &msg)
        .await
        .unwrap();
    let taken = summaryd::stream::consumer_group::read_new(
        &mut redis,
        services.keys.get(0),
        "w-1",
        1,
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    let rejected = (
        "permanent: 400",
        "the model rejected the request (HTTP 400)",
    );
    assert!(dead_letter(&mut redis, &services, "w-1", &taken[0], rejected).await);

    let mut out = Vec::new();
    let report = summaryd::ops::dlq::replay(&services.redis, &services.keys, &[], true, &mut out)
        .await
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert_eq!((report.replayed, report.malformed), (1, 1), "{out}");
    assert!(out.contains("malformed"), "{out}");
    assert_eq!(
        dead_letters(&mut redis, &services).await,
        1,
        "the malformed one stays"
    );
    let state = job_state::get(&mut redis, services.keys.get(0), msg.job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.status, job_state::Status::Queued);
    let mut consumer = Consumer::new(services.worker(), "w-2");
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(env.count("summaries").await, 1);
}

#[test]
fn dlq_replay_exits_1_when_it_skipped_a_malformed_entry() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let env = rt.block_on(TestEnv::new());
    rt.block_on(async {
        let mut redis = env.redis().await;
        let keys = summaryd::infra::keys::RedisKeys::new(env.settings.key_prefix.clone());
        let _: String = redis
            .xadd(keys.dead_letters(), "*", &[("garbage", "x")])
            .await
            .unwrap();
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_summaryd"))
        .args(["dlq", "replay", "--all"])
        .env("SUMMARYD_REDIS_URL", env.settings.redis_url.expose_secret())
        .env(
            "SUMMARYD_DATABASE_URL",
            env.settings.database_url.expose_secret(),
        )
        .env("SUMMARYD_KEY_PREFIX", &env.settings.key_prefix)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("0 of 1 replayed"), "{stdout}");
    drop(env);
    drop(rt);
}
