//! Shards (`SUMMARYD_STREAM_SHARDS`, `docs/scaling.md`), on one Redis node and on a real
//! local Redis Cluster (three primaries with a replica each): each tenant's jobs, records
//! and lanes live under its shard's hash tag; the workers drain every shard and do each job
//! once; dead letters are listed, replayed and purged by retention across shards; the
//! gauges say what each shard holds; and a process refuses a shard count that would strand
//! work.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use summaryd::app::{Application, StartError};
use summaryd::config::Settings;
use summaryd::config::roles::{Role, Roles};
use summaryd::infra::keys::Shards;
use summaryd::infra::redis::routed::scan_every_master;
use summaryd::llm::LlmError;
use summaryd::stream::layout::LayoutError;

use crate::shared::redis_cluster::RedisCluster;
use crate::shared::running::Running;
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually};

/// Tenants and the shard each maps to with three shards (pinned in `infra::keys`).
const TENANTS: [(&str, u16); 6] = [
    ("acme", 0),
    ("globex", 1),
    ("initech", 1),
    ("umbrella", 2),
    ("hooli", 2),
    ("default", 1),
];
const PER_TENANT: usize = 4;

/// `env`'s settings with `shards`, on the env's Redis or on `cluster`.
fn sharded(env: &TestEnv, shards: u16, cluster: Option<&RedisCluster>) -> Settings {
    let mut settings = env.settings.clone();
    if let Some(cluster) = cluster {
        settings.redis_url = cluster.url().into();
    }
    settings.stream.shards = shards;
    settings.worker.consumers = 2;
    settings.maintenance.interval = Duration::from_millis(50);
    settings
}

async fn app(
    settings: &Settings,
    roles: &[Role],
    llm: FakeLlm,
    mailer: &Arc<FakeMailer>,
) -> Result<Application, StartError> {
    Application::build(
        settings.clone(),
        Roles::of(roles),
        Arc::new(llm),
        mailer.clone(),
        false,
    )
    .await
}

async fn post_all(base: &str) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for (tenant, _) in TENANTS {
        for n in 0..PER_TENANT {
            let res = client
                .post(format!("{base}/v1/summaries"))
                .header("Idempotency-Key", key(tenant, n))
                .header("X-Tenant-Id", tenant)
                .json(&json!({"text": format!("Job {n} of {tenant}. Revenue grew."), "notify": "ops@example.com"}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 202);
            let body: serde_json::Value = res.json().await.unwrap();
            ids.push(body["job_id"].as_str().unwrap().to_owned());
        }
    }
    ids
}

fn key(tenant: &str, n: usize) -> String {
    format!("shard-test-{tenant}-{n:04}")
}

async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn gauge(text: &str, shard: u16, state: &str) -> Option<f64> {
    let series = format!("summaryd_stream_shard_entries{{shard=\"{shard}\",state=\"{state}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.parse().unwrap())
}

#[tokio::test]
async fn three_shards_on_one_node_keep_each_tenant_in_its_shard_and_do_every_job_once() {
    let env = TestEnv::new().await;
    every_job_once_in_its_tenants_shard(&env, sharded(&env, 3, None)).await;
}

#[tokio::test]
async fn three_shards_on_a_cluster_keep_each_tenant_in_its_shard_and_do_every_job_once() {
    let cluster = RedisCluster::start();
    let env = TestEnv::new().await;
    every_job_once_in_its_tenants_shard(&env, sharded(&env, 3, Some(&cluster))).await;
}

async fn every_job_once_in_its_tenants_shard(env: &TestEnv, settings: Settings) {
    let prefix = settings.key_prefix.clone();
    let mailer = Arc::new(FakeMailer::new());
    let api = Running::start(
        app(&settings, &[Role::Api], FakeLlm::ok(), &mailer)
            .await
            .unwrap(),
    );
    let ids = post_all(&api.base).await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());

    // Where the accepts went: the tenant's shard, and nowhere else.
    let services = env.services().settings(settings.clone()).build();
    let mut redis = services.redis.get().await.unwrap();
    for (tenant, shard) in TENANTS {
        let tag = format!("{prefix}{{s{shard}}}");
        let record: bool = redis
            .exists(format!(
                "{tag}idem:{tenant}:POST:/v1/summaries:{}",
                key(tenant, 0)
            ))
            .await
            .unwrap();
        assert!(record, "{tenant}'s record is in shard {shard}");
        let lane: u64 = redis
            .xlen(format!("{tag}jobs:summaries:lane:{tenant}"))
            .await
            .unwrap();
        assert_eq!(lane, PER_TENANT as u64, "{tenant}'s lane in shard {shard}");
        for other in (0..3).filter(|s| *s != shard) {
            let elsewhere: bool = redis
                .exists(format!("{prefix}{{s{other}}}jobs:summaries:lane:{tenant}"))
                .await
                .unwrap();
            assert!(!elsewhere, "{tenant} has no lane in shard {other}");
        }
    }
    let untagged = scan_every_master(&mut redis, &format!("{prefix}jobs:*"), None, 500)
        .await
        .unwrap();
    assert!(untagged.is_empty(), "no unsharded key: {untagged:?}");

    // The gauges: each shard's queued jobs (acme 4; globex, initech, default 12; the rest 8).
    let queued = [4.0, 12.0, 8.0];
    let last = std::cell::RefCell::new(String::new());
    let measured = eventually(Duration::from_secs(10), || async {
        let text = metrics(&api.base).await;
        let ok = (0..3u16).all(|s| gauge(&text, s, "queued") == Some(queued[usize::from(s)]));
        *last.borrow_mut() = text;
        ok
    })
    .await;
    assert!(measured, "per-shard gauges:\n{}", last.borrow());

    // Workers drain every shard: each job one summary and one email.
    let worker = Running::start(
        app(
            &settings,
            &[Role::Worker, Role::Relay],
            FakeLlm::ok(),
            &mailer,
        )
        .await
        .unwrap(),
    );
    let all = ids.len();
    assert!(
        eventually(Duration::from_secs(30), || async {
            mailer.sent().len() >= all
        })
        .await,
        "every job emailed: {} of {all}",
        mailer.sent().len()
    );
    assert_eq!(env.count("summaries").await, all as i64);
    let shards = Shards::new(&prefix, 3, false);
    let drained = eventually(Duration::from_secs(10), || async {
        let mut redis = services.redis.get().await.unwrap();
        let mut left = 0u64;
        for keys in shards.all() {
            let n: u64 = redis.xlen(keys.stream()).await.unwrap();
            let lanes: u64 = redis.zcard(keys.lanes()).await.unwrap();
            left += n + lanes;
        }
        left == 0
    })
    .await;
    assert!(drained, "every shard's stream and lanes are empty");
    // Nothing more arrives later: once per job.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = mailer.sent();
    assert_eq!(sent.len(), all);
    worker.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn dead_letters_of_every_shard_are_listed_replayed_and_then_done_once() {
    let env = TestEnv::new().await;
    dead_letters_across_shards(&env, sharded(&env, 3, None)).await;
}

#[tokio::test]
async fn dead_letters_of_every_shard_of_a_cluster_are_listed_replayed_and_then_done_once() {
    let cluster = RedisCluster::start();
    let env = TestEnv::new().await;
    dead_letters_across_shards(&env, sharded(&env, 3, Some(&cluster))).await;
}

async fn dead_letters_across_shards(env: &TestEnv, mut settings: Settings) {
    settings.worker.max_deliveries = 1;
    let mailer = Arc::new(FakeMailer::new());
    let refused = LlmError::Status {
        status: 400,
        retry_after: None,
        message: "refused".into(),
    };
    let failing = env
        .services()
        .settings(settings.clone())
        .llm(Arc::new(FakeLlm::failing(refused)))
        .mailer(mailer.clone())
        .application(Roles::of(&[Role::Api, Role::Worker]))
        .await;
    let failing = Running::start(failing);
    let ids = post_all(&failing.base).await;
    let all = ids.len();
    let dead = eventually(Duration::from_secs(30), || async {
        let text = metrics(&failing.base).await;
        (0..3u16)
            .map(|s| gauge(&text, s, "dead").unwrap_or(0.0))
            .sum::<f64>()
            == all as f64
    })
    .await;
    assert!(dead, "every job dead-lettered, counted per shard");
    let text = metrics(&failing.base).await;
    assert_eq!(gauge(&text, 1, "dead"), Some(12.0), "{text}");
    failing.stop().await;

    let services = env.services().settings(settings.clone()).build();
    let mut listed = Vec::new();
    summaryd::ops::dlq::list(&services.redis, &services.keys, 100, true, &mut listed)
        .await
        .unwrap();
    let listed = String::from_utf8(listed).unwrap();
    assert_eq!(listed.lines().count(), all, "{listed}");
    for id in &ids {
        assert!(listed.contains(id.as_str()), "{id} listed");
    }
    // hooli's (shard 2) are purged by id, as retention or an operator would: gone from
    // every listing, never done.
    let hooli: Vec<String> = listed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|d| d["tenant"] == "hooli")
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(hooli.len(), PER_TENANT, "{listed}");
    let purged = summaryd::ops::dlq::purge(
        &services.redis,
        &services.keys,
        &hooli,
        Some(Duration::ZERO),
        &mut Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(purged, PER_TENANT as u64);
    let all = all - PER_TENANT;
    let report =
        summaryd::ops::dlq::replay(&services.redis, &services.keys, &[], true, &mut Vec::new())
            .await
            .unwrap();
    assert_eq!(report.replayed, all);

    let healthy = env
        .services()
        .settings(settings.clone())
        .mailer(mailer.clone())
        .application(Roles::of(&[Role::Worker, Role::Relay]))
        .await;
    let healthy = Running::start(healthy);
    assert!(
        eventually(Duration::from_secs(30), || async {
            mailer.sent().len() >= all
        })
        .await,
        "every replayed job emailed: {} of {all}",
        mailer.sent().len()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mailer.sent().len(), all);
    let pg = env.pg().await;
    let hooli_done: i64 = pg
        .query_one("SELECT count(*) FROM summaries WHERE tenant = 'hooli'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(hooli_done, 0, "purged dead letters are never done");
    let mut redis = services.redis.get().await.unwrap();
    for keys in services.keys.all() {
        let left: u64 = redis.xlen(keys.dead_letters()).await.unwrap();
        assert_eq!(left, 0, "shard {} has no dead letter left", keys.shard());
    }
    healthy.stop().await;
}

#[tokio::test]
async fn a_shard_count_that_would_strand_queued_jobs_is_refused_at_start() {
    let env = TestEnv::new().await;
    let mailer = Arc::new(FakeMailer::new());
    // One job queued under the unsharded layout.
    let one = sharded(&env, 1, None);
    let api = Running::start(
        app(&one, &[Role::Api], FakeLlm::ok(), &mailer)
            .await
            .unwrap(),
    );
    let res = reqwest::Client::new()
        .post(format!("{}/v1/summaries", api.base))
        .header("Idempotency-Key", "stranded-job-0000001")
        .header("X-Tenant-Id", "acme")
        .json(&json!({"text": "Queued before the change.", "notify": "ops@example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    api.stop().await;

    let three = sharded(&env, 3, None);
    let refused = app(&three, &[Role::Worker], FakeLlm::ok(), &mailer).await;
    match refused {
        Err(StartError::Layout(LayoutError::Stranded {
            layout, entries, ..
        })) => {
            assert_eq!(layout, "the unsharded key names");
            assert_eq!(entries, 1);
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a worker with 3 shards started over a queued unsharded job"),
    }
    // The unchanged count still starts, and the job is still there for it.
    let again = app(&one, &[Role::Worker], FakeLlm::ok(), &mailer).await;
    assert!(again.is_ok());
}

/// The idempotency table on a cluster with three shards, for tenants in each: a new key
/// enqueues once, a replay answers the same job and enqueues nothing, another body under the
/// key is 422 and enqueues nothing, the same key under each tenant is its own job, and
/// twenty concurrent requests with one key enqueue one job.
#[actix_web::test]
async fn the_idempotency_table_holds_on_a_cluster_in_every_shard() {
    use actix_web::test;
    use summaryd::shutdown::Shutdown;

    use crate::shared::api_requests::{header, json_body, post};

    let cluster = RedisCluster::start();
    let env = TestEnv::new().await;
    let settings = sharded(&env, 3, Some(&cluster));
    let services = env.services().settings(settings.clone()).build();
    let app = test::init_service(summaryd::api::app(
        services.api(),
        Roles::of(&[Role::Api]),
        Shutdown::new(),
    ))
    .await;
    let body = r#"{"text":"Quarterly numbers are up.","notify":"ops@example.com"}"#;
    let other = r#"{"text":"Another document.","notify":"ops@example.com"}"#;
    let mut redis = services.redis.get().await.unwrap();
    let mut queued = async |tenant: &str| -> u64 {
        let keys = services.keys.of_tenant(tenant);
        redis.xlen(keys.lane(tenant)).await.unwrap()
    };
    let key = "table-key-000000001";
    let mut jobs = HashSet::new();
    for (tenant, _) in [TENANTS[0], TENANTS[1], TENANTS[3]] {
        let first = test::call_service(&app, post(tenant, key, body).to_request()).await;
        assert_eq!(first.status(), 202);
        let job = json_body(first).await["job_id"].clone();
        jobs.insert(job.to_string());
        let again = test::call_service(&app, post(tenant, key, body).to_request()).await;
        assert_eq!(again.status(), 202);
        assert_eq!(
            header(&again, "idempotent-replayed").as_deref(),
            Some("true")
        );
        assert_eq!(json_body(again).await["job_id"], job);
        let reused = test::call_service(&app, post(tenant, key, other).to_request()).await;
        assert_eq!(reused.status(), 422);
        assert_eq!(queued(tenant).await, 1, "{tenant}: one job for the key");

        let contended = format!("table-race-{tenant}-0001");
        let answers = futures_util::future::join_all(
            (0..20).map(|_| test::call_service(&app, post(tenant, &contended, body).to_request())),
        )
        .await;
        assert!(
            answers
                .iter()
                .all(|r| r.status() == 202 || r.status() == 409)
        );
        assert_eq!(
            queued(tenant).await,
            2,
            "{tenant}: one job for the raced key"
        );
    }
    // The same key under each tenant was that tenant's own job.
    assert_eq!(jobs.len(), 3);
}
