//! Fair scheduling between tenants (`docs/tenants.md`, "Fair scheduling"): jobs wait in
//! their tenant's lane and the workers' dispatch moves them onto the job stream in turn.
//! Asserted on the order and concurrency of the model calls a fake model sees, and on the
//! Redis state (lanes, pending entries, running sets): never on timings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::test::{self, TestRequest};
use async_trait::async_trait;
use chrono::Utc;
use redis::AsyncCommands;
use redis::streams::StreamPendingCountReply;
use summaryd::api;
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::keys::GROUP;
use summaryd::llm::{Completion, Llm, LlmError};
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::{ensure_group, read_new};
use summaryd::stream::enqueue;
use summaryd::stream::lanes::max_dispatches_before;
use summaryd::worker::{Consumer, run};

use crate::shared::fabricate::make_idle;
use crate::shared::test_env::Services;
use crate::shared::{TestEnv, eventually};

/// A model that records which tenant each call was for (the text names it), and how many
/// calls of each tenant run at once.
#[derive(Default)]
struct TenantModel {
    latency: Duration,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    order: Vec<String>,
    running: HashMap<String, usize>,
    peak: HashMap<String, usize>,
}

impl TenantModel {
    fn slow(latency: Duration) -> Self {
        Self {
            latency,
            ..Self::default()
        }
    }

    fn order(&self) -> Vec<String> {
        self.seen.lock().unwrap().order.clone()
    }

    fn peak(&self, tenant: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .peak
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}

/// The tenant a job's text names: "fairjob <tenant> <n>.".
fn tenant_in(text: &str) -> Option<String> {
    let rest = &text[text.find("fairjob ")? + "fairjob ".len()..];
    rest.split_whitespace().next().map(str::to_owned)
}

#[async_trait]
impl Llm for TenantModel {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        let tenant = tenant_in(text);
        if let Some(t) = &tenant {
            let mut seen = self.seen.lock().unwrap();
            seen.order.push(t.clone());
            let now = {
                let n = seen.running.entry(t.clone()).or_default();
                *n += 1;
                *n
            };
            let peak = seen.peak.entry(t.clone()).or_default();
            *peak = (*peak).max(now);
        }
        tokio::time::sleep(self.latency).await;
        if let Some(t) = &tenant {
            let mut seen = self.seen.lock().unwrap();
            if let Some(n) = seen.running.get_mut(t) {
                *n -= 1;
            }
        }
        Ok(Completion::without_usage(format!(
            "summary: {}",
            text.chars().take(40).collect::<String>()
        )))
    }
}

fn tokens_file(tenants: &[(&str, &str)]) -> tempfile::NamedTempFile {
    let tokens: Vec<String> = tenants
        .iter()
        .map(|(t, _)| format!("{t}-fair-token"))
        .collect();
    let tables: Vec<(&str, &str, &str)> = tenants
        .iter()
        .zip(&tokens)
        .map(|((tenant, extra), token)| (*tenant, token.as_str(), *extra))
        .collect();
    crate::shared::api_requests::tokens_file(&tables)
}

struct World {
    env: TestEnv,
    model: Arc<TenantModel>,
    services: Services,
    _file: tempfile::NamedTempFile,
}

impl World {
    async fn new(tenants: &[(&str, &str)], model: TenantModel) -> Self {
        let env = TestEnv::new().await;
        let file = tokens_file(tenants);
        let mut settings = env.settings.clone();
        settings.auth.tokens_file = Some(file.path().to_path_buf());
        let model = Arc::new(model);
        let services = env.services().settings(settings).llm(model.clone()).build();
        ensure_group(&mut env.redis().await, services.keys.get(0))
            .await
            .unwrap();
        Self {
            env,
            model,
            services,
            _file: file,
        }
    }

    /// POST `n` jobs for `tenant` through the API (keys `from..from+n`); their job ids.
    async fn post(&self, tenant: &str, from: usize, n: usize) -> Vec<String> {
        let app =
            test::init_service(api::app(self.services.api(), Roles::all(), Shutdown::new())).await;
        let mut ids = Vec::new();
        for i in from..from + n {
            let req = TestRequest::post()
                .uri("/v1/summaries")
                .insert_header(("Content-Type", "application/json"))
                .insert_header(("Idempotency-Key", format!("fairness-key-{tenant}-{i:06}")))
                .insert_header(("Authorization", format!("Bearer {tenant}-fair-token")))
                .set_payload(format!(
                    r#"{{"text":"fairjob {tenant} {i}. Revenue grew.","notify":"ops@example.com"}}"#
                ))
                .to_request();
            let res = test::call_service(&app, req).await;
            assert_eq!(res.status(), 202, "POST {tenant} {i}");
            let body: serde_json::Value = test::read_body_json(res).await;
            ids.push(body["job_id"].as_str().unwrap().to_owned());
        }
        ids
    }

    async fn status(&self, tenant: &str, job_id: &str) -> String {
        let app =
            test::init_service(api::app(self.services.api(), Roles::all(), Shutdown::new())).await;
        let req = TestRequest::get()
            .uri(&format!("/v1/summaries/{job_id}"))
            .insert_header(("Authorization", format!("Bearer {tenant}-fair-token")))
            .to_request();
        let body: serde_json::Value =
            test::read_body_json(test::call_service(&app, req).await).await;
        body["status"].as_str().unwrap_or_default().to_owned()
    }

    fn consumer(&self, name: &str) -> Consumer {
        Consumer::new(self.services.worker(), name)
    }

    /// Run `consumer` one pass at a time, `passes` times; how many entries it took.
    async fn passes(&self, consumer: &mut Consumer, passes: usize) -> usize {
        let mut taken = 0;
        for _ in 0..passes {
            taken += consumer.run_once().await.unwrap();
        }
        taken
    }

    async fn running(&self, tenant: &str) -> Vec<String> {
        self.env
            .redis()
            .await
            .smembers(self.services.keys.get(0).running(tenant))
            .await
            .unwrap()
    }

    async fn active_lanes(&self) -> Vec<String> {
        self.env
            .redis()
            .await
            .zrange(self.services.keys.get(0).lanes(), 0, -1)
            .await
            .unwrap()
    }

    /// (entry id, consumer, deliveries) of every pending entry of the job stream.
    async fn pending(&self) -> Vec<(String, String, usize)> {
        let reply: StreamPendingCountReply = self
            .env
            .redis()
            .await
            .xpending_count(self.services.keys.get(0).stream(), GROUP, "-", "+", 1000)
            .await
            .unwrap();
        reply
            .ids
            .into_iter()
            .map(|p| (p.id, p.consumer, p.times_delivered))
            .collect()
    }
}

/// Tenant a has 300 jobs queued and a worker is draining them; tenant b then queues 10.
/// Every one of b's jobs reaches the model before more than the documented bound of a's
/// (10 for equal weights: one of a's per job of b's), however long a's backlog is; and every
/// job is done exactly once. While waiting in its lane, b's job reads as queued.
#[actix_web::test]
async fn a_backlog_of_one_tenant_delays_another_by_a_bounded_number_of_jobs() {
    let w = World::new(&[("a", ""), ("b", "")], TenantModel::default()).await;
    w.post("a", 0, 300).await;
    let mut worker = w.consumer("fair-one");
    assert_eq!(w.passes(&mut worker, 50).await, 50);
    assert_eq!(w.model.order(), vec!["a".to_owned(); 50]);

    let b_jobs = w.post("b", 0, 10).await;
    assert_eq!(w.status("b", &b_jobs[0]).await, "queued");
    // b joins the schedule at the virtual time a's last dispatch started at: ahead of a.
    assert_eq!(w.active_lanes().await, ["b", "a"]);
    while worker.run_once().await.unwrap() > 0 {}

    let order = w.model.order();
    assert_eq!(order.len(), 310, "every job called the model once");
    assert_eq!(w.env.count("summaries").await, 310);
    let last_b = order.iter().rposition(|t| t == "b").unwrap();
    let a_before = order[50..last_b].iter().filter(|t| *t == "a").count() as u64;
    let bound = max_dispatches_before(10, 1.0, 1.0);
    assert!(
        a_before <= bound,
        "{a_before} of a's jobs went before b's last (bound {bound}): {:?}",
        &order[50..=last_b]
    );
    assert!(w.active_lanes().await.is_empty(), "drained lanes leave");
    assert!(w.pending().await.is_empty());
}

/// Weights 3 and 1, both tenants backlogged: of the first 40 dispatches, 30 go to the
/// tenant of weight 3 (±1 for where the cycle is cut).
#[actix_web::test]
async fn weights_give_their_proportion_of_dispatches() {
    let w = World::new(&[("a", "weight = 3.0"), ("b", "")], TenantModel::default()).await;
    w.post("a", 0, 40).await;
    w.post("b", 0, 40).await;
    let mut worker = w.consumer("fair-weights");
    assert_eq!(w.passes(&mut worker, 40).await, 40);
    let order = w.model.order();
    let a = order.iter().filter(|t| *t == "a").count();
    assert!((29..=31).contains(&a), "a had {a} of 40: {order:?}");
    // b is never starved either: it had its turn within every four dispatches.
    for window in order.windows(5) {
        assert!(window.iter().any(|t| t == "b"), "{order:?}");
    }
}

/// max_concurrent = 2: six consumers, and the fake never sees more than two of the
/// tenant's calls at once (and does see two: the cap is what holds it, not a lack of
/// consumers); the other tenant takes the free consumers. The running set ends empty.
#[actix_web::test]
async fn max_concurrent_is_never_exceeded_fleet_wide() {
    let w = World::new(
        &[("a", "max_concurrent = 2"), ("b", "")],
        TenantModel::slow(Duration::from_millis(300)),
    )
    .await;
    w.post("a", 0, 12).await;
    w.post("b", 0, 6).await;
    let shutdown = Shutdown::new();
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(run(
                w.services.worker(),
                format!("fair-cap-{i}"),
                shutdown.clone(),
            ))
        })
        .collect();
    let done = eventually(Duration::from_secs(60), || async {
        w.env.count("summaries").await == 18
    })
    .await;
    shutdown.trigger();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(done, "{} of 18 done", w.env.count("summaries").await);
    assert_eq!(w.model.peak("a"), 2, "a's calls at once");
    assert_eq!(w.model.order().len(), 18);
    assert!(w.running("a").await.is_empty());
    assert!(w.pending().await.is_empty());
}

/// A consumer dispatches an entry and dies: the entry is pending for it (moved from the
/// lane in the same step), counts against the tenant's max_concurrent (so nothing else of
/// the tenant is dispatched), and another consumer reclaims it after claim_idle as it would
/// any entry; the tenant's next job follows.
#[actix_web::test]
async fn a_dispatched_entry_of_a_consumer_that_dies_is_reclaimed() {
    let w = World::new(&[("a", "max_concurrent = 1")], TenantModel::default()).await;
    w.post("a", 0, 2).await;
    let mut redis = w.env.redis().await;
    let keys = w.services.keys.get(0);
    let taken = read_new(&mut redis, keys, "fair-doomed", 1, Duration::ZERO)
        .await
        .unwrap();
    let [entry] = taken.as_slice() else {
        panic!("{taken:?}")
    };
    assert_eq!(
        w.pending().await,
        [(entry.id.clone(), "fair-doomed".to_owned(), 1)]
    );
    assert_eq!(w.running("a").await, std::slice::from_ref(&entry.id));
    let lane_len: u64 = redis.xlen(keys.lane("a")).await.unwrap();
    assert_eq!(lane_len, 1, "one job left in the lane");
    let other = read_new(&mut redis, keys, "fair-other", 1, Duration::ZERO)
        .await
        .unwrap();
    assert!(other.is_empty(), "a is at its max_concurrent: {other:?}");

    make_idle(&mut redis, keys, &entry.id).await;
    let mut rescuer = w.consumer("fair-rescuer");
    rescuer.config.claim_idle = Duration::from_secs(1);
    assert_eq!(rescuer.run_once().await.unwrap(), 1);
    assert_eq!(w.env.count("summaries").await, 1);
    assert!(w.running("a").await.is_empty(), "the ack freed the slot");
    assert_eq!(rescuer.run_once().await.unwrap(), 1, "the next job follows");
    assert_eq!(w.env.count("summaries").await, 2);
    assert_eq!(w.model.order().len(), 2);
    assert!(w.pending().await.is_empty());
    assert!(w.active_lanes().await.is_empty());
}

/// One take claims a dead consumer's entry and dispatches a new one in the same round trip:
/// the claimed job runs, the new one is held (nothing would extend its claim while the other
/// runs) and the next take re-claims it before running it, so a consumer that took it over
/// meanwhile is the only one to run it.
#[actix_web::test]
async fn a_new_entry_taken_with_a_claim_runs_next_and_only_while_still_ours() {
    let w = World::new(&[("a", ""), ("b", "")], TenantModel::default()).await;
    let mut redis = w.env.redis().await;
    let keys = w.services.keys.get(0);
    // A consumer that dies holding one job, and one job waiting in a lane.
    let die_holding_one = |name: &'static str| {
        let mut redis = redis.clone();
        async move {
            let taken = read_new(&mut redis, keys, name, 1, Duration::ZERO)
                .await
                .unwrap();
            let [entry] = taken.as_slice() else {
                panic!("{taken:?}")
            };
            make_idle(&mut redis, keys, &entry.id).await;
            entry.id.clone()
        }
    };
    let rescuer = |name: &str| {
        let mut consumer = w.consumer(name);
        consumer.config.claim_idle = Duration::from_secs(1);
        consumer
    };

    w.post("a", 0, 1).await;
    let dead = die_holding_one("fair-doomed").await;
    w.post("b", 0, 1).await;
    let mut first = rescuer("fair-rescuer");
    assert_eq!(first.run_once().await.unwrap(), 1, "the claimed entry runs");
    assert_eq!(w.model.order(), ["a"]);
    let pending = w.pending().await;
    let [(held, owner, 1)] = pending.as_slice() else {
        panic!("b's job, dispatched with the claim and held, count 1: {pending:?}")
    };
    assert!(held != &dead && owner == "fair-rescuer", "{pending:?}");
    assert_eq!(
        first.run_once().await.unwrap(),
        1,
        "the held entry runs next"
    );
    assert_eq!(w.model.order(), ["a", "b"]);
    assert!(w.pending().await.is_empty());

    // Again, and this time another consumer takes the held entry over before the next take.
    w.post("a", 1, 1).await;
    die_holding_one("fair-doomed-2").await;
    w.post("b", 1, 1).await;
    let mut second = rescuer("fair-rescuer-2");
    assert_eq!(second.run_once().await.unwrap(), 1);
    let pending = w.pending().await;
    let [(held, owner, 1)] = pending.as_slice() else {
        panic!("{pending:?}")
    };
    assert_eq!(owner, "fair-rescuer-2");
    make_idle(&mut redis, keys, held).await;
    assert_eq!(rescuer("fair-thief").run_once().await.unwrap(), 1);
    assert_eq!(
        second.run_once().await.unwrap(),
        0,
        "no longer its own: not run"
    );
    assert_eq!(w.model.order().len(), 4, "{:?}", w.model.order());
    assert_eq!(w.env.count("summaries").await, 4);
    assert!(w.pending().await.is_empty());
}

/// A job put straight on the job stream (an older version's accept) is still consumed, and
/// before any lane: it was accepted without a place in the schedule.
#[actix_web::test]
async fn a_job_on_the_job_stream_is_consumed_before_the_lanes() {
    let w = World::new(&[("a", "")], TenantModel::default()).await;
    w.post("a", 0, 1).await;
    let legacy = Job {
        job_id: JobId::from_scoped_key("idem:legacy:POST:/v1/summaries:fair-legacy"),
        tenant: TenantId::parse("legacy").unwrap(),
        text: "fairjob legacy 0. Revenue grew.".to_owned().into(),
        notify: Some(Email::parse("ops@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    };
    enqueue(&mut w.env.redis().await, w.services.keys.get(0), &legacy)
        .await
        .unwrap();
    let mut worker = w.consumer("fair-legacy");
    assert_eq!(w.passes(&mut worker, 2).await, 2);
    assert_eq!(w.model.order(), ["legacy", "a"]);
    assert_eq!(w.env.count("summaries").await, 2);
    assert!(w.pending().await.is_empty());
}

/// A running-set member whose entry is no longer pending (an operator acknowledged it by
/// hand) would hold one of the tenant's max_concurrent slots for ever; maintenance removes
/// it, and the tenant's next job is dispatched.
#[actix_web::test]
async fn maintenance_frees_a_running_slot_whose_entry_is_no_longer_pending() {
    let w = World::new(&[("a", "max_concurrent = 1")], TenantModel::default()).await;
    w.post("a", 0, 2).await;
    let mut redis = w.env.redis().await;
    let keys = w.services.keys.get(0);
    let taken = read_new(&mut redis, keys, "fair-by-hand", 1, Duration::ZERO)
        .await
        .unwrap();
    let [entry] = taken.as_slice() else {
        panic!("{taken:?}")
    };
    let _: i64 = redis
        .xack(keys.stream(), GROUP, &[&entry.id])
        .await
        .unwrap();
    assert_eq!(w.running("a").await, std::slice::from_ref(&entry.id));
    let none = read_new(&mut redis, keys, "fair-next", 1, Duration::ZERO)
        .await
        .unwrap();
    assert!(none.is_empty(), "the leaked member fills the cap: {none:?}");

    let report = w
        .services
        .maintenance(Roles::of(&[Role::Worker]))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.running, 1, "{report:?}");
    assert!(w.running("a").await.is_empty());
    let next = read_new(&mut redis, keys, "fair-next", 1, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(next.len(), 1, "the slot is free again");
    assert_eq!(w.running("a").await, [next[0].id.clone()]);
}
