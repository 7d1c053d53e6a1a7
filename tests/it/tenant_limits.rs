//! Per-tenant limits from the tokens file, enforced in Redis (`docs/reference.md`, Tenants):
//! they hold for all API replicas together, `max_in_flight` counts jobs accepted and not yet
//! finished (freed on done and on dead-letter, taken again by `dlq replay`), and a replay of
//! an accepted request is never charged or refused. Effects are read from Redis and Postgres.

use std::sync::Arc;
use std::time::Duration;

use actix_web::test::{self, TestRequest};
use redis::AsyncCommands;
use summaryd::api;
use summaryd::config::roles::Roles;
use summaryd::llm::LlmError;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::ensure_group;
use summaryd::stream::dead_letters;
use summaryd::worker::Consumer;

use crate::shared::fabricate::rewind_rate;
use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, TestEnv};

const TOKEN: &str = "acme-limits-token";

fn tokens_file(limits: &str) -> tempfile::NamedTempFile {
    crate::shared::api_requests::tokens_file(&[("acme", TOKEN, limits)])
}

fn post(key: &str) -> TestRequest {
    TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Authorization", format!("Bearer {TOKEN}")))
        .set_payload(format!(
            r#"{{"text":"Limits test {key}. Revenue grew.","notify":"am@example.com"}}"#
        ))
}

/// Services of one replica: its own pools, token store and actix app; Redis is shared.
fn replica(env: &TestEnv, file: &tempfile::NamedTempFile, llm: FakeLlm) -> Services {
    let mut settings = env.settings.clone();
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    env.services().settings(settings).llm(Arc::new(llm)).build()
}

/// Jobs queued, on the job stream or in a tenant's lane.
async fn stream_len(env: &TestEnv) -> u64 {
    crate::shared::api_requests::stream_len(env).await as u64
}

async fn in_flight(env: &TestEnv, services: &Services) -> Vec<String> {
    let mut ids: Vec<String> = env
        .redis()
        .await
        .smembers(services.keys.get(0).in_flight("acme"))
        .await
        .unwrap();
    ids.sort();
    ids
}

fn retry_after<B>(res: &actix_web::dev::ServiceResponse<B>) -> u64 {
    res.headers()
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[actix_web::test]
async fn the_rate_holds_for_two_replicas_together_and_replays_are_never_charged() {
    let env = TestEnv::new().await;
    let file = tokens_file("rate_per_s = 0.01\nburst = 3");
    let (a, b) = (
        replica(&env, &file, FakeLlm::ok()),
        replica(&env, &file, FakeLlm::ok()),
    );
    let app_a = test::init_service(api::app(a.api(), Roles::all(), Shutdown::new())).await;
    let app_b = test::init_service(api::app(b.api(), Roles::all(), Shutdown::new())).await;

    // A burst of 3 for the tenant, whichever replica takes each request.
    let mut statuses = Vec::new();
    for n in 0..6 {
        let req = post(&format!("rate-two-replicas-{n:03}")).to_request();
        let res = if n % 2 == 0 {
            test::call_service(&app_a, req).await
        } else {
            test::call_service(&app_b, req).await
        };
        if res.status() == 429 {
            // 0.01/s: the next job fits in about 100 s.
            let wait = retry_after(&res);
            assert!((90..=100).contains(&wait), "{wait}");
            let p: serde_json::Value = test::read_body_json(res).await;
            assert!(p["detail"].as_str().unwrap().contains("rate"), "{p}");
            statuses.push(429);
        } else {
            statuses.push(res.status().as_u16());
        }
    }
    assert_eq!(statuses, [202, 202, 202, 429, 429, 429]);
    assert_eq!(
        stream_len(&env).await,
        3,
        "only accepted requests are queued"
    );

    // Over the limit, a replay of an accepted request is still answered, on either replica,
    // and costs nothing: a new key is still refused afterwards, the stream is unchanged.
    for app in [&app_a, &app_b] {
        let res = test::call_service(app, post("rate-two-replicas-001").to_request()).await;
        assert_eq!(res.status(), 202);
        assert_eq!(res.headers().get("idempotent-replayed").unwrap(), "true");
    }
    let res = test::call_service(&app_b, post("rate-two-replicas-100").to_request()).await;
    assert_eq!(res.status(), 429);
    assert_eq!(stream_len(&env).await, 3);
}

#[actix_web::test]
async fn max_in_flight_counts_accepted_jobs_until_done_or_dead_lettered() {
    let env = TestEnv::new().await;
    let file = tokens_file("max_in_flight = 2");
    // The worker's model fails the first job permanently, then succeeds.
    let bad_request = LlmError::Status {
        status: 400,
        retry_after: None,
        message: "bad".into(),
    };
    let services = replica(
        &env,
        &file,
        FakeLlm::with(
            vec![crate::shared::fakes::Step::Fail(bad_request)],
            crate::shared::fakes::Step::Ok(String::new()),
        ),
    );
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    ensure_group(&mut env.redis().await, services.keys.get(0))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..2 {
        let res =
            test::call_service(&app, post(&format!("in-flight-key-{n:04}")).to_request()).await;
        assert_eq!(res.status(), 202);
        let body: serde_json::Value = test::read_body_json(res).await;
        ids.push(body["job_id"].as_str().unwrap().to_owned());
    }
    ids.sort();
    assert_eq!(in_flight(&env, &services).await, ids);

    let res = test::call_service(&app, post("in-flight-key-0002").to_request()).await;
    assert_eq!(res.status(), 429);
    assert_eq!(retry_after(&res), 1);
    let p: serde_json::Value = test::read_body_json(res).await;
    assert!(
        p["detail"].as_str().unwrap().contains("max_in_flight"),
        "{p}"
    );
    // A replay is never refused, even at the limit.
    let res = test::call_service(&app, post("in-flight-key-0000").to_request()).await;
    assert_eq!(res.status(), 202);
    assert_eq!(stream_len(&env).await, 2);

    // First job: dead-lettered (model 400). It no longer counts.
    let mut worker = Consumer::new(services.worker(), "limits-worker");
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(in_flight(&env, &services).await.len(), 1);
    let res = test::call_service(&app, post("in-flight-key-0002").to_request()).await;
    assert_eq!(res.status(), 202, "a slot was freed by the dead-letter");
    let res = test::call_service(&app, post("in-flight-key-0003").to_request()).await;
    assert_eq!(res.status(), 429);

    // Second job: done. Its slot is freed too.
    assert_eq!(worker.run_once().await.unwrap(), 1);
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(in_flight(&env, &services).await.len(), 1);
    let res = test::call_service(&app, post("in-flight-key-0003").to_request()).await;
    assert_eq!(res.status(), 202, "a slot was freed by the finished job");
    assert_eq!(in_flight(&env, &services).await.len(), 2);

    // `dlq replay` puts the dead job back in flight (never refused: it was accepted).
    let mut r = env.redis().await;
    let dead = dead_letters::all_ids(&mut r, services.keys.get(0))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let replayed = dead_letters::replay(&mut r, services.keys.get(0), &dead[0])
        .await
        .unwrap();
    let dead_job = match replayed {
        dead_letters::ReplayOutcome::Replayed { job_id, .. } => job_id,
        other => panic!("{other:?}"),
    };
    let now = in_flight(&env, &services).await;
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(now.contains(&dead_job));
}

/// The rate replenishes with time (measured on the accepting replica's clock): one job per
/// 50 ms with a burst of one is refused at once after a job, and accepted again 50 ms later
/// (the stored rate state moved back by one interval, as the clock moving on would).
#[actix_web::test]
async fn the_rate_refills_as_time_passes() {
    let env = TestEnv::new().await;
    let file = tokens_file("rate_per_s = 20.0\nburst = 1");
    let a = replica(&env, &file, FakeLlm::ok());
    let app = test::init_service(api::app(a.api(), Roles::all(), Shutdown::new())).await;
    let first = test::call_service(&app, post("rate-refill-key-000").to_request()).await;
    assert_eq!(first.status(), 202);
    let refused = test::call_service(&app, post("rate-refill-key-001").to_request()).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(
        retry_after(&refused),
        1,
        "50 ms, rounded up to a whole second"
    );
    let mut r = env.redis().await;
    rewind_rate(&mut r, a.keys.get(0), "acme", Duration::from_millis(50)).await;
    let again = test::call_service(&app, post("rate-refill-key-001").to_request()).await;
    assert_eq!(
        again.status(),
        202,
        "the next job fits once its interval has passed"
    );
    assert_eq!(stream_len(&env).await, 2);
}
