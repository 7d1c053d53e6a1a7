//! Tenants' token budgets (`docs/tenants.md`, Budgets): a job's worst case is reserved in
//! the step that accepts it, so no number of concurrent requests on any number of API
//! processes admits more than fits; finishing a job replaces its reservation by what it
//! spent, a dead letter releases it, a replay is never charged, and a new period starts
//! from nothing. Effects are read from Redis (the budget hash, the stream, job states).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::test::{self, TestRequest};
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use summaryd::api;
use summaryd::config::roles::Roles;
use summaryd::domain::{Budget, BudgetPeriod, Email, Job, JobId, TenantId};
use summaryd::infra::keys::RedisKeys;
use summaryd::llm::LlmError;
use summaryd::shutdown::Shutdown;
use summaryd::stream::budget::{self, Admission};
use summaryd::stream::consumer_group::{self as group, ensure_group};
use summaryd::stream::job_state::{Reservation, SeenReservation};
use summaryd::stream::{EnqueueOnce, Limit, TenantLimits, dead_letters};
use summaryd::worker::Consumer;

use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, TestEnv};

const TOKEN: &str = "acme-budget-token";

fn tokens_file(budget: &str) -> tempfile::NamedTempFile {
    crate::shared::api_requests::tokens_file(&[("acme", TOKEN, budget)])
}

/// Every key is 20 characters, so every text is as long and costs as much.
fn key(n: usize) -> String {
    format!("budget-test-key-{n:04}")
}

fn text(key: &str) -> String {
    format!("Budget test {key}. Revenue grew. Costs fell.")
}

fn post(key: &str) -> TestRequest {
    TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Authorization", format!("Bearer {TOKEN}")))
        .set_payload(format!(
            r#"{{"text":"{}","notify":"am@example.com"}}"#,
            text(key)
        ))
}

/// The worst case the API reserves for one job of [`post`]: the same helper, the same
/// primary provider.
fn cost(env: &TestEnv) -> u64 {
    summaryd::llm::fits(&env.settings.llm)[0].worst_case_tokens(&text(&key(0)))
}

fn replica(env: &TestEnv, file: &tempfile::NamedTempFile, llm: FakeLlm) -> Services {
    let mut settings = env.settings.clone();
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    env.services().settings(settings).llm(Arc::new(llm)).build()
}

/// The period hash's fields now (today, UTC).
async fn budget_hash(
    env: &TestEnv,
    keys: &RedisKeys,
    period: BudgetPeriod,
) -> HashMap<String, u64> {
    let period_id = period.id(Utc::now());
    env.redis()
        .await
        .hgetall(keys.budget("acme", &period_id))
        .await
        .unwrap()
}

/// Jobs queued: on the job stream or in a tenant's lane.
async fn stream_len(env: &TestEnv) -> u64 {
    crate::shared::api_requests::stream_len(env).await as u64
}

async fn job_state(env: &TestEnv, keys: &RedisKeys, job_id: &str) -> HashMap<String, String> {
    env.redis()
        .await
        .hgetall(keys.job(job_id.parse().unwrap()))
        .await
        .unwrap()
}

fn seconds_to_midnight() -> i64 {
    let now = Utc::now();
    (BudgetPeriod::Day.resets_at(now) - now).num_seconds()
}

#[actix_web::test]
async fn fifty_concurrent_posts_on_two_api_processes_admit_exactly_the_ten_that_fit() {
    let env = TestEnv::new().await;
    let cost = cost(&env);
    let file = tokens_file(&format!(
        "budget_tokens = {}\nbudget_period = \"day\"",
        10 * cost
    ));
    let (a, b) = (
        replica(&env, &file, FakeLlm::ok()),
        replica(&env, &file, FakeLlm::ok()),
    );
    let app_a = test::init_service(api::app(a.api(), Roles::all(), Shutdown::new())).await;
    let app_b = test::init_service(api::app(b.api(), Roles::all(), Shutdown::new())).await;

    // All 50 in flight at once, alternating between the two processes.
    let calls = (0..50).map(|n| {
        let (app_a, app_b) = (&app_a, &app_b);
        async move {
            let req = post(&key(n)).to_request();
            let res = if n % 2 == 0 {
                test::call_service(app_a, req).await
            } else {
                test::call_service(app_b, req).await
            };
            let status = res.status().as_u16();
            let retry_after = res
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().parse::<i64>().unwrap());
            let body: serde_json::Value = test::read_body_json(res).await;
            (n, status, retry_after, body)
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let accepted: Vec<_> = answers.iter().filter(|a| a.1 == 202).collect();
    let refused: Vec<_> = answers.iter().filter(|a| a.1 == 429).collect();
    assert_eq!(accepted.len(), 10, "exactly what fits, never 11");
    assert_eq!(refused.len(), 40);
    for (_, _, retry_after, body) in &refused {
        assert!(
            body["type"]
                .as_str()
                .unwrap()
                .ends_with("/budget-exhausted"),
            "{body}"
        );
        assert!(
            body["detail"].as_str().unwrap().contains("resets at"),
            "{body}"
        );
        // Until the period resets: midnight UTC, whole seconds rounded up.
        let wait = retry_after.expect("Retry-After");
        let midnight = seconds_to_midnight();
        assert!(
            (midnight - 5..=midnight + 5).contains(&wait),
            "{wait} vs {midnight}"
        );
    }

    // The effects: ten entries, ten reservations, each noted in its job's state; nothing of
    // the refused forty.
    assert_eq!(stream_len(&env).await, 10);
    let hash = budget_hash(&env, a.keys.get(0), BudgetPeriod::Day).await;
    assert_eq!(hash.get("reserved"), Some(&(10 * cost)), "{hash:?}");
    assert_eq!(hash.get("used").copied().unwrap_or(0), 0);
    let today = BudgetPeriod::Day.id(Utc::now());
    for (_, _, _, body) in &accepted {
        let state = job_state(&env, a.keys.get(0), body["job_id"].as_str().unwrap()).await;
        assert_eq!(state["budget_reserved"], cost.to_string(), "{state:?}");
        assert_eq!(state["budget_period"], today);
    }
    // A refused request stored no record: its retry is a new request, not a replay.
    let records: Vec<String> = env
        .redis()
        .await
        .keys(format!("{}idem:acme:*", env.settings.key_prefix))
        .await
        .unwrap();
    assert_eq!(records.len(), 10, "{records:?}");

    // A replay of an accepted request, on either process, is answered and costs nothing.
    let accepted_key = key(accepted[0].0);
    for app in [&app_a, &app_b] {
        let res = test::call_service(app, post(&accepted_key).to_request()).await;
        assert_eq!(res.status(), 202);
        assert_eq!(res.headers().get("idempotent-replayed").unwrap(), "true");
    }
    assert_eq!(
        budget_hash(&env, a.keys.get(0), BudgetPeriod::Day).await,
        hash
    );
    assert_eq!(stream_len(&env).await, 10);
}

#[actix_web::test]
async fn a_finished_job_gives_back_what_it_did_not_spend_so_the_next_one_fits() {
    let env = TestEnv::new().await;
    let cost = cost(&env);
    let file = tokens_file(&format!(
        "budget_tokens = {}\nbudget_period = \"month\"",
        2 * cost
    ));
    // Every call reports 100 + 20 tokens, far below the worst case.
    let services = replica(&env, &file, FakeLlm::ok().reporting(100, 20));
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    ensure_group(&mut env.redis().await, services.keys.get(0))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..2 {
        let res = test::call_service(&app, post(&key(n)).to_request()).await;
        assert_eq!(res.status(), 202);
        let body: serde_json::Value = test::read_body_json(res).await;
        ids.push(body["job_id"].as_str().unwrap().to_owned());
    }
    let res = test::call_service(&app, post(&key(2)).to_request()).await;
    assert_eq!(
        res.status(),
        429,
        "the two reservations take the whole budget"
    );

    let mut worker = Consumer::new(services.worker(), "budget-worker");
    let mut done = 0;
    while done < 2 {
        done += worker.run_once().await.unwrap();
    }
    assert_eq!(env.count("summaries").await, 2);
    let hash = budget_hash(&env, services.keys.get(0), BudgetPeriod::Month).await;
    assert_eq!(hash.get("reserved").copied().unwrap_or(0), 0, "{hash:?}");
    assert_eq!(hash.get("used"), Some(&240), "what the provider reported");
    for id in &ids {
        assert!(job_state(&env, services.keys.get(0), id).await.is_empty());
    }
    // `summaryd budget show` reads the same: the tokens file's budget, Redis's counters.
    let store = summaryd::api::auth::TokenStore::load(file.path()).unwrap();
    let mut r = env.redis().await;
    let rows = summaryd::ops::budget::rows(&mut r, &services.keys, &store, None, Utc::now())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (row.tenant.as_str(), row.period.as_str()),
        ("acme", BudgetPeriod::Month.id(Utc::now()).as_str())
    );
    assert_eq!(
        (row.budget_tokens, row.reserved, row.used, row.left),
        (2 * cost, 0, 240, 2 * cost - 240)
    );
    let other =
        summaryd::ops::budget::rows(&mut r, &services.keys, &store, Some("globex"), Utc::now())
            .await
            .unwrap();
    assert!(other.is_empty());

    // The unused reservations are back: a job that did not fit now does.
    let res = test::call_service(&app, post(&key(2)).to_request()).await;
    assert_eq!(res.status(), 202);
    let hash = budget_hash(&env, services.keys.get(0), BudgetPeriod::Month).await;
    assert_eq!(hash.get("reserved"), Some(&cost));
    assert_eq!(hash.get("used"), Some(&240));

    // Settling is once only: a second ack of a finished job (its reservation gone with
    // its state) changes nothing.
    let job = Job {
        job_id: ids[0].parse::<JobId>().unwrap(),
        tenant: TenantId::parse("acme").unwrap(),
        text: text(&key(0)).into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    };
    let stale = budget::Settle {
        reservation: summaryd::stream::job_state::Reservation {
            period_id: BudgetPeriod::Month.id(Utc::now()),
            tokens: cost,
        },
        spent: Some(1),
    };
    summaryd::stream::consumer_group::ack_settling(
        &mut env.redis().await,
        services.keys.get(0),
        "0-1",
        &job,
        Some(&stale),
    )
    .await
    .unwrap();
    assert_eq!(
        budget_hash(&env, services.keys.get(0), BudgetPeriod::Month).await,
        hash
    );
}

/// The dispatch that hands out an entry reads its job's reservation in the same step, so
/// the worker's acknowledgement needs no read of its own; a consumer that claims the entry
/// after its first consumer died was not handed the reservation and reads the job state.
#[actix_web::test]
async fn the_dispatch_hands_out_the_reservation_with_the_entry() {
    let env = TestEnv::new().await;
    let cost = cost(&env);
    let file = tokens_file(&format!(
        "budget_tokens = {}\nbudget_period = \"month\"",
        2 * cost
    ));
    let services = replica(&env, &file, FakeLlm::ok().reporting(100, 20));
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let keys = services.keys.get(0);
    ensure_group(&mut env.redis().await, keys).await.unwrap();
    let res = test::call_service(&app, post(&key(0)).to_request()).await;
    assert_eq!(res.status(), 202);
    let body: serde_json::Value = test::read_body_json(res).await;
    let job_id: JobId = body["job_id"].as_str().unwrap().parse().unwrap();

    let mut conn = env.redis().await;
    let taken = group::read_now(&mut conn, keys, "dispatched-and-died", 1)
        .await
        .unwrap();
    let [delivery] = taken.as_slice() else {
        panic!("{taken:?}")
    };
    let reservation = Reservation {
        period_id: BudgetPeriod::Month.id(Utc::now()),
        tokens: cost,
    };
    assert_eq!(
        delivery.reservation,
        SeenReservation::Read {
            job_id: job_id.to_string(),
            reservation: Some(reservation.clone()),
        }
    );
    assert_eq!(delivery.reservation.of(job_id), Some(Some(reservation)));
    // Read for another job than the one asked about: not taken as that job's.
    assert_eq!(delivery.reservation.of(budget_job(1).job_id), None);

    // The consumer it was handed to is gone; another claims it and settles the budget
    // from the job state.
    let mut rescuer = Consumer::new(services.worker(), "budget-rescuer");
    rescuer.config.claim_idle = Duration::ZERO;
    assert_eq!(rescuer.run_once().await.unwrap(), 1);
    assert_eq!(env.count("summaries").await, 1);
    let hash = budget_hash(&env, keys, BudgetPeriod::Month).await;
    assert_eq!(hash.get("reserved").copied().unwrap_or(0), 0, "{hash:?}");
    assert_eq!(hash.get("used"), Some(&120), "what the provider reported");

    // A job without a budget: read with its entry, and nothing there.
    let mut plain = budget_job(2);
    plain.tenant = TenantId::parse("plain").unwrap();
    summaryd::stream::enqueue(&mut conn, keys, &plain)
        .await
        .unwrap();
    let taken = group::read_now(&mut conn, keys, "plain-consumer", 1)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].reservation.of(plain.job_id), Some(None));
}

#[actix_web::test]
async fn a_dead_letter_releases_its_reservation() {
    let env = TestEnv::new().await;
    let cost = cost(&env);
    let file = tokens_file(&format!("budget_tokens = {cost}\nbudget_period = \"day\""));
    // The model refuses the job for good: dead-lettered at once.
    let bad_request = LlmError::Status {
        status: 400,
        retry_after: None,
        message: "bad".into(),
    };
    let services = replica(&env, &file, FakeLlm::failing(bad_request));
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    ensure_group(&mut env.redis().await, services.keys.get(0))
        .await
        .unwrap();
    let res = test::call_service(&app, post(&key(0)).to_request()).await;
    assert_eq!(res.status(), 202);
    let body: serde_json::Value = test::read_body_json(res).await;
    let job_id = body["job_id"].as_str().unwrap().to_owned();
    let res = test::call_service(&app, post(&key(1)).to_request()).await;
    assert_eq!(res.status(), 429);

    let mut worker = Consumer::new(services.worker(), "budget-worker");
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(env.dead_letters().await, 1);
    let hash = budget_hash(&env, services.keys.get(0), BudgetPeriod::Day).await;
    assert_eq!(hash.get("reserved").copied().unwrap_or(0), 0, "{hash:?}");
    assert_eq!(
        hash.get("used").copied().unwrap_or(0),
        0,
        "the failed call reported nothing"
    );
    let state = job_state(&env, services.keys.get(0), &job_id).await;
    assert_eq!(state["status"], "failed");
    assert!(!state.contains_key("budget_reserved"), "{state:?}");

    // Released: the next job fits.
    let res = test::call_service(&app, post(&key(1)).to_request()).await;
    assert_eq!(res.status(), 202);
    // A replay of the dead job's request is answered from its record and charged nothing.
    let before = budget_hash(&env, services.keys.get(0), BudgetPeriod::Day).await;
    let res = test::call_service(&app, post(&key(0)).to_request()).await;
    assert_eq!(res.status(), 202);
    assert_eq!(res.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(
        budget_hash(&env, services.keys.get(0), BudgetPeriod::Day).await,
        before
    );
    assert_eq!(env.dead_letters().await, 1);

    // `dlq replay` runs the job again, so it reserves again what it held (never refused,
    // like every replay: here past the budget, which the next admission then sees).
    let mut r = env.redis().await;
    let dead = dead_letters::all_ids(&mut r, services.keys.get(0))
        .await
        .unwrap();
    let replayed = dead_letters::replay(&mut r, services.keys.get(0), &dead[0])
        .await
        .unwrap();
    assert!(
        matches!(replayed, dead_letters::ReplayOutcome::Replayed { .. }),
        "{replayed:?}"
    );
    let hash = budget_hash(&env, services.keys.get(0), BudgetPeriod::Day).await;
    assert_eq!(hash.get("reserved"), Some(&(2 * cost)), "{hash:?}");
    let state = job_state(&env, services.keys.get(0), &job_id).await;
    assert_eq!(state["status"], "queued");
    assert_eq!(state["budget_reserved"], cost.to_string(), "{state:?}");
    let res = test::call_service(&app, post(&key(2)).to_request()).await;
    assert_eq!(res.status(), 429);
}

fn budget_job(n: usize) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{}", key(n))),
        tenant: TenantId::parse("acme").unwrap(),
        text: text(&key(n)).into(),
        notify: None,
        webhook: None,
        created_at: Utc::now(),
    }
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// The period is the one the API's clock is in: driven here through the admission's `now`,
/// at the accepting script itself.
#[tokio::test]
async fn a_new_period_admits_again() {
    let env = &TestEnv::new().await;
    let keys = RedisKeys::new(env.settings.key_prefix.clone());
    let mut r = env.redis().await;
    let budget = Budget {
        tokens: 100,
        period: BudgetPeriod::Day,
        soft_ratio: 0.8,
    };
    let enqueue = |n: usize, now: DateTime<Utc>| {
        let keys = keys.clone();
        let admission = Admission::new(budget, 100, now);
        async move {
            let job = budget_job(n);
            let mut r = env.redis().await;
            summaryd::stream::enqueue_once(
                &mut r,
                &keys,
                &job,
                summaryd::stream::IdempotencyRecord {
                    key: &keys.idempotency(&summaryd::infra::keys::ScopedKey::summaries(
                        &job.tenant,
                        &summaryd::domain::IdempotencyKey::parse(&key(n)).unwrap(),
                    )),
                    value: "{}",
                    ttl_s: 60,
                },
                summaryd::stream::Admit {
                    limits: &TenantLimits::default(),
                    budget: Some(&admission),
                },
            )
            .await
            .unwrap()
        }
    };
    let before_midnight = at("2026-12-02T23:59:59Z");
    assert!(matches!(
        enqueue(0, before_midnight).await,
        EnqueueOnce::Enqueued { .. }
    ));
    match enqueue(1, before_midnight).await {
        EnqueueOnce::Refused(over) => {
            assert_eq!(over.limit(), Limit::Budget);
            assert_eq!(over.retry_after(), std::time::Duration::from_secs(1));
        }
        other => panic!("{other:?}"),
    }
    // Midnight UTC: a new period, a new hash, the same budget again.
    assert!(matches!(
        enqueue(1, at("2026-12-03T00:00:01Z")).await,
        EnqueueOnce::Enqueued { .. }
    ));
    let day = |id: &str| keys.budget("acme", id);
    let old: HashMap<String, u64> = r.hgetall(day("2026-12-02")).await.unwrap();
    let new: HashMap<String, u64> = r.hgetall(day("2026-12-03")).await.unwrap();
    assert_eq!(old.get("reserved"), Some(&100));
    assert_eq!(new.get("reserved"), Some(&100));
    // Kept a while past the period, then gone on its own.
    let ttl: i64 = r.pttl(day("2026-12-02")).await.unwrap();
    assert!(ttl > 86_400_000 && ttl <= 2 * 86_400_000, "{ttl}");
    assert_eq!(stream_len(env).await, 2);
}

/// One sample of `name{labels}` in the rendered metrics.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[tokio::test]
async fn maintenance_exports_the_used_ratio_only_for_tenants_with_a_budget() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let budget = Budget {
        tokens: 1_000,
        period: BudgetPeriod::Day,
        soft_ratio: 0.75,
    };
    // acme has reserved 300 and used 500 of 1,000 today.
    let mut r = env.redis().await;
    let _: () = r
        .hset_multiple(
            services
                .keys
                .get(0)
                .budget("acme", &BudgetPeriod::Day.id(Utc::now())),
            &[("reserved", 300), ("used", 500)],
        )
        .await
        .unwrap();
    let budgets: summaryd::maintenance::BudgetSource =
        Arc::new(move || vec![("acme".to_owned(), budget)]);
    let maintenance = summaryd::maintenance::Maintenance::new(
        &services.settings,
        services.pg.clone(),
        Some(services.redis.clone()),
        services.keys.clone(),
        services.metrics.clone(),
    )
    .with_budgets(Some(budgets));
    maintenance.run_once().await.unwrap();
    let text = services.metrics.render();
    assert_eq!(
        sample(&text, "summaryd_tenant_budget_used_ratio{tenant=\"acme\"}"),
        Some(0.8),
        "{text}"
    );
    assert_eq!(
        sample(&text, "summaryd_tenant_budget_soft_ratio{tenant=\"acme\"}"),
        Some(0.75)
    );
    assert!(
        !text.contains("summaryd_tenant_budget_used_ratio{tenant=\"globex\""),
        "a tenant without a budget has no series"
    );
}
