//! The maintenance task as each role runs it: the cluster-wide gauges on a process without
//! a worker (an api replica measures the queue it feeds, a relay-only replica has no Redis
//! and exports no stream gauge at all, never a 0), a failed read removing its gauges, and
//! the sweep of tenants' in-flight sets that takes out members whose job finished or is gone.

use std::time::Duration;

use actix_web::test::{self, TestRequest};
use chrono::{SubsecRound, Utc};
use redis::AsyncCommands;
use serde_json::{Value, json};
use summaryd::api;
use summaryd::api::auth::token_sha256;
use summaryd::app::Application;
use summaryd::config::roles::{Role, Roles};
use summaryd::db;
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::keys::GROUP;
use summaryd::maintenance::Maintenance;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::ensure_group;
use summaryd::stream::job_entry;

use crate::shared::{TestEnv, eventually, model_summary};

/// The value of an unlabelled series in a scrape, `None` when it is not exported.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

const STREAM_GAUGES: [&str; 4] = [
    "summaryd_stream_lag",
    "summaryd_stream_pending",
    "summaryd_oldest_queued_age_seconds",
    "summaryd_dead_letters",
];

async fn start(env: &TestEnv, roles: &[Role]) -> (Application, String) {
    let mut settings = env.settings.clone();
    // Refresh often, so the test waits for the first refresh, not for the default interval.
    settings.maintenance.interval = Duration::from_millis(50);
    let app = env
        .services()
        .settings(settings)
        .application(Roles::of(roles))
        .await;
    let base = format!("http://127.0.0.1:{}", app.port());
    (app, base)
}

async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let res = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    res.text().await.unwrap()
}

/// Five jobs wait and no worker runs anywhere: two were taken by a consumer that died
/// (pending), three were never delivered (lag). The api replica reports exactly that, so
/// the queue alerts can fire; the relay replica, which has no Redis, reports the outbox
/// and no stream gauge at all.
#[tokio::test]
async fn without_a_worker_the_api_measures_the_queue_and_the_relay_exports_no_stream_gauge() {
    let env = TestEnv::new().await;
    let (api_app, api_base) = start(&env, &[Role::Api]).await;
    let (relay_app, relay_base) = start(&env, &[Role::Relay]).await;
    let shutdown = Shutdown::new();
    let api_task = tokio::spawn(api_app.run(shutdown.clone()));
    let relay_task = tokio::spawn(relay_app.run(shutdown.clone()));
    let client = reqwest::Client::new();
    for n in 0..5 {
        let res = client
            .post(format!("{api_base}/v1/summaries"))
            .header("Idempotency-Key", format!("no-worker-key-{n:06}"))
            .header("X-Tenant-Id", "acme")
            .json(&json!({"text": format!("Waiting job {n}. Revenue grew."), "notify": "ops@example.com"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 202);
    }
    let mut redis = env.redis().await;
    let keys = summaryd::infra::keys::RedisKeys::new(env.settings.key_prefix.clone());
    ensure_group(&mut redis, &keys).await.unwrap();
    // A worker dispatches two (from the tenant's lane onto the stream) and dies.
    let taken = summaryd::stream::consumer_group::read_new(
        &mut redis,
        &keys,
        "a-worker-that-died",
        2,
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(taken.len(), 2);
    assert_eq!(
        crate::shared::api_requests::stream_len(&env).await,
        5,
        "every accepted job is queued: on the stream or in its lane"
    );

    let last = std::cell::RefCell::new(String::new());
    let measured = eventually(Duration::from_secs(10), || async {
        let text = scrape(&client, &api_base).await;
        let ok = sample(&text, "summaryd_stream_lag") == Some(3.0)
            && sample(&text, "summaryd_stream_pending") == Some(2.0)
            && sample(&text, "summaryd_oldest_queued_age_seconds").is_some_and(|age| age > 0.0)
            && sample(&text, "summaryd_dead_letters") == Some(0.0)
            && sample(&text, "summaryd_outbox_unsent") == Some(0.0);
        *last.borrow_mut() = text;
        ok
    })
    .await;
    assert!(
        measured,
        "the api reports the real backlog:\n{}",
        last.borrow()
    );

    // The relay has refreshed what it can measure (the outbox) at least once...
    let relay_refreshed = eventually(Duration::from_secs(10), || async {
        let text = scrape(&client, &relay_base).await;
        let ok = sample(&text, "summaryd_outbox_unsent") == Some(0.0)
            && sample(&text, "summaryd_gauges_refreshed_timestamp_seconds").is_some();
        *last.borrow_mut() = text;
        ok
    })
    .await;
    assert!(relay_refreshed, "relay gauges:\n{}", last.borrow());
    // ...and exports no stream gauge: not 0, absent.
    let text = scrape(&client, &relay_base).await;
    for name in STREAM_GAUGES {
        assert_eq!(sample(&text, name), None, "{name} on the relay:\n{text}");
    }

    shutdown.trigger();
    for task in [api_task, relay_task] {
        let result = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("stops within the grace period")
            .expect("no panic");
        assert!(result.is_ok(), "{result:?}");
    }
    // Nothing consumed the jobs: the numbers above were the queue, not a worker's doing.
    assert_eq!(crate::shared::api_requests::stream_len(&env).await, 5);
}

/// A read that fails removes the gauges of its source instead of keeping a value that looks
/// current; the next good read brings them back. The other source's gauge is unaffected.
#[tokio::test]
async fn a_failed_redis_read_removes_the_stream_gauges_until_a_read_succeeds() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let mut broken = env.settings.clone();
    broken.redis_url = crate::shared::http_stub::closed_port_url("")
        .replace("http://", "redis://")
        .into();
    let broken = env.services().settings(broken).build();
    let good = Maintenance::new(
        &services.settings,
        services.pg.clone(),
        Some(services.redis.clone()),
        services.keys.clone(),
        services.metrics.clone(),
    );
    // The same process's metrics, with Redis unreachable.
    let down = Maintenance::new(
        &services.settings,
        services.pg.clone(),
        Some(broken.redis.clone()),
        services.keys.clone(),
        services.metrics.clone(),
    );
    let _: String = env
        .redis()
        .await
        .xadd(services.keys.get(0).stream(), "*", &[("job_id", "x")])
        .await
        .unwrap();

    good.run_once().await.unwrap();
    let text = services.metrics.render();
    assert_eq!(sample(&text, "summaryd_stream_lag"), Some(1.0), "{text}");
    let refreshed = sample(&text, "summaryd_gauges_refreshed_timestamp_seconds").unwrap();

    assert!(down.run_once().await.is_err(), "Redis is down");
    let text = services.metrics.render();
    for name in STREAM_GAUGES {
        assert_eq!(sample(&text, name), None, "{name} kept:\n{text}");
    }
    assert_eq!(sample(&text, "summaryd_outbox_unsent"), Some(0.0));
    assert_eq!(
        sample(&text, "summaryd_gauges_refreshed_timestamp_seconds"),
        Some(refreshed),
        "a partial refresh does not move the timestamp"
    );

    good.run_once().await.unwrap();
    let text = services.metrics.render();
    assert_eq!(sample(&text, "summaryd_stream_lag"), Some(1.0), "{text}");
}

const TOKEN: &str = "acme-sweep-token";

fn post(key: &str) -> TestRequest {
    TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Authorization", format!("Bearer {TOKEN}")))
        .set_payload(format!(
            r#"{{"text":"Sweep test {key}. Revenue grew.","notify":"am@example.com"}}"#
        ))
}

fn job(name: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{name}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Fabricated job {name}. Revenue grew.").into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now().trunc_subsecs(6),
    }
}

/// Members left behind by finished or vanished jobs filled the tenant's `max_in_flight`
/// and every new POST got 429. One maintenance pass removes exactly those: a finished job's
/// member (its state left behind too, as after a manual XACK), a member with no job at all
/// and one that is not a job id; the live jobs stay (queued with state, a pending entry of an
/// older version without state, a dead letter without state, a dead-lettered job with its
/// state), and the limit counts them again, no more and no less.
#[actix_web::test]
async fn the_sweep_removes_members_of_finished_and_gone_jobs_and_frees_their_slots() {
    let env = TestEnv::new().await;
    let mut tokens = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut tokens,
        format!(
            "[tenants.acme]\ntoken_sha256 = \"{}\"\nmax_in_flight = 7\n",
            token_sha256(TOKEN)
        )
        .as_bytes(),
    )
    .unwrap();
    let mut settings = env.settings.clone();
    settings.auth.tokens_file = Some(tokens.path().to_path_buf());
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let keys = services.keys.get(0).clone();
    let set = keys.in_flight("acme");
    let mut redis = env.redis().await;
    ensure_group(&mut redis, &keys).await.unwrap();

    // Live: accepted through the API, queued with its state.
    let res = test::call_service(&app, post("sweep-live-key-0001").to_request()).await;
    assert_eq!(res.status(), 202);
    let body: Value = test::read_body_json(res).await;
    let live = body["job_id"].as_str().unwrap().to_owned();

    // Live: an entry of an older version, pending for a consumer, with no job state.
    let legacy = job("legacy-pending");
    let _: String = redis
        .xadd(keys.stream(), "*", &job_entry::to_fields(&legacy))
        .await
        .unwrap();
    let _: redis::streams::StreamReadReply = redis
        .xread_options(
            &[keys.stream()],
            &[">"],
            &redis::streams::StreamReadOptions::default().group(GROUP, "old-consumer"),
        )
        .await
        .unwrap();
    // Live: a dead letter with no job state, and a dead-lettered job with its state.
    let dead = job("dead-without-state");
    let _: String = redis
        .xadd(keys.dead_letters(), "*", &job_entry::to_fields(&dead))
        .await
        .unwrap();
    let failed = job("dead-with-state");
    let _: () = redis
        .hset_multiple(
            keys.job(failed.job_id),
            &[("tenant", "acme"), ("status", "failed"), ("error", "x")],
        )
        .await
        .unwrap();
    // Leaked: a finished job (summary committed) whose member and state were left behind.
    let finished = job("finished");
    db::summaries::commit_with_outbox(&services.pg, &finished, &model_summary("done"))
        .await
        .unwrap();
    let _: () = redis
        .hset_multiple(
            keys.job(finished.job_id),
            &[("tenant", "acme"), ("status", "queued")],
        )
        .await
        .unwrap();
    // Leaked: a job nothing knows of, and a member that is no job id.
    let vanished = job("vanished");
    let members = [
        legacy.job_id.to_string(),
        dead.job_id.to_string(),
        failed.job_id.to_string(),
        finished.job_id.to_string(),
        vanished.job_id.to_string(),
        "not-a-job-id".to_owned(),
    ];
    let _: () = redis.sadd(&set, &members).await.unwrap();
    let count: u64 = redis.scard(&set).await.unwrap();
    assert_eq!(count, 7);
    let res = test::call_service(&app, post("sweep-new-key-0001").to_request()).await;
    assert_eq!(res.status(), 429, "the leaked members fill the limit");

    let report = services
        .maintenance(Roles::of(&[Role::Worker]))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.in_flight, 3, "{report:?}");
    let mut left: Vec<String> = redis.smembers(&set).await.unwrap();
    left.sort();
    let mut want = vec![
        live.clone(),
        legacy.job_id.to_string(),
        dead.job_id.to_string(),
        failed.job_id.to_string(),
    ];
    want.sort();
    assert_eq!(left, want);
    let text = services.metrics.render();
    assert_eq!(
        sample(
            &text,
            r#"summaryd_maintenance_removed_total{what="in_flight"}"#
        ),
        Some(3.0)
    );
    // The live job's state and entry are untouched: the legacy entry on the job stream, the
    // live job in its tenant's lane.
    let state: bool = redis.exists(keys.job(live.parse().unwrap())).await.unwrap();
    assert!(state);
    let len: u64 = redis.xlen(keys.stream()).await.unwrap();
    assert_eq!(len, 1);
    let lane: u64 = redis.xlen(keys.lane("acme")).await.unwrap();
    assert_eq!(lane, 1);

    // Three slots are free again, and only three: the fourth new job is refused.
    for n in 1..=3 {
        let res =
            test::call_service(&app, post(&format!("sweep-new-key-{n:04}")).to_request()).await;
        assert_eq!(res.status(), 202, "job {n} fits in a freed slot");
    }
    let res = test::call_service(&app, post("sweep-new-key-0004").to_request()).await;
    assert_eq!(res.status(), 429, "the live jobs still count");

    // A second pass finds nothing more to remove.
    let again = services
        .maintenance(Roles::of(&[Role::Worker]))
        .run_once()
        .await
        .unwrap();
    assert_eq!(again.in_flight, 0);
    let count: u64 = redis.scard(&set).await.unwrap();
    assert_eq!(count, 7);
}
