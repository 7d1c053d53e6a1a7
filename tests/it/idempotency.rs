//! Idempotency-Key: one job per scoped key, replays answer from the store, mismatches never
//! enqueue, and accepting a key is one atomic Redis step: the job, its state and the final
//! response appear together or not at all, so there is no in-progress state to observe.
//! Effects are counted on Redis itself (stream entries, records, job state).

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::test;
use futures_util::future::join_all;
use redis::AsyncCommands;
use serde_json::{Value, json};
use summaryd::api::{self, IdempotencyStore, Outcome, StoreError, StoredResponse};
use summaryd::config::roles::Roles;
use summaryd::domain::{IdempotencyKey, Job, SummaryRequest, TenantId};
use summaryd::infra::keys::ScopedKey;
use summaryd::shutdown::Shutdown;
use summaryd::stream::TenantLimits;

use crate::shared::api_requests::*;
use crate::shared::test_env::Services;
use crate::shared::{TestEnv, eventually};

const OTHER_BODY: &str = r#"{"text":"A different document.","notify":"ops@example.com"}"#;

fn store_of(services: &Services) -> IdempotencyStore {
    IdempotencyStore::new(
        services.redis_shared.clone(),
        services.keys.clone(),
        services.metrics.clone(),
        &services.settings.idempotency,
    )
}

fn accepted(job: &str) -> StoredResponse {
    StoredResponse {
        status: 202,
        body: json!({"job_id": job, "status": "queued"}),
    }
}

/// The job message the API builds for `body` under (tenant, key).
fn job_message(tenant: &str, key: &str, body: &str) -> Job {
    let parsed: SummaryRequest = serde_json::from_str(body).unwrap();
    let valid = parsed
        .validate(summaryd::domain::WebhookRules::default())
        .unwrap();
    Job {
        job_id: scoped(tenant, key).job_id(&valid.fingerprint().unwrap()),
        tenant: TenantId::parse(tenant).unwrap(),
        text: valid.text.into(),
        notify: valid.notify,
        webhook: valid.webhook,
        created_at: chrono::Utc::now(),
    }
}

fn scoped(tenant: &str, key: &str) -> ScopedKey {
    ScopedKey::summaries(
        &TenantId::parse(tenant).unwrap(),
        &IdempotencyKey::parse(key).unwrap(),
    )
}

async fn record(env: &TestEnv, key: &str) -> Option<Value> {
    let mut r = env.redis().await;
    let raw: Option<String> = r.get(key).await.unwrap();
    raw.map(|s| serde_json::from_str(&s).unwrap())
}

/// The per-job state hash GET reads (empty when absent).
async fn job_state(env: &TestEnv, job_id: &str) -> std::collections::HashMap<String, String> {
    let mut r = env.redis().await;
    r.hgetall(format!("{}job:{job_id}", env.settings.key_prefix))
        .await
        .unwrap()
}

#[actix_web::test]
async fn new_key_enqueues_once_and_replay_returns_the_same_body_without_enqueueing() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "replay-key-0000001";

    let first = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert!(header(&first, "idempotent-replayed").is_none());
    let location = header(&first, "location").unwrap();
    let first_body = json_body(first).await;
    let job_id = first_body["job_id"].as_str().unwrap().to_owned();
    assert_eq!(first_body, json!({"job_id": job_id, "status": "queued"}));
    assert_eq!(location, format!("/v1/summaries/{job_id}"));
    assert_eq!(stream_len(&env).await, 1);

    // The stored record: done, our fingerprint, the response, and the long TTL.
    let stored = record(&env, &record_key(&services, "acme", key))
        .await
        .unwrap();
    assert_eq!(stored["state"], "done");
    assert_eq!(stored["status"], 202);
    assert_eq!(stored["body"], first_body);
    let fp = fingerprint(BODY);
    assert_eq!(stored["fp"], fp.as_str());
    let mut r = env.redis().await;
    let ttl: i64 = r.ttl(record_key(&services, "acme", key)).await.unwrap();
    assert!(ttl > 30 && ttl <= 86_400, "result TTL, not lock TTL: {ttl}");
    // Written in the same step: the job's state, which GET reads until the summary exists.
    let state = job_state(&env, &job_id).await;
    assert_eq!(state.get("status").map(String::as_str), Some("queued"));
    assert_eq!(state.get("tenant").map(String::as_str), Some("acme"));

    // Same body with other whitespace and field order: a replay, not a mismatch.
    let reordered = "{ \"notify\": \"ops@example.com\",\n  \"text\": \"Quarterly numbers are up. Churn is down.\" }";
    for body in [BODY, reordered] {
        let again = test::call_service(&app, post("acme", key, body).to_request()).await;
        assert_eq!(again.status(), StatusCode::ACCEPTED);
        assert_eq!(
            header(&again, "idempotent-replayed").as_deref(),
            Some("true")
        );
        assert_eq!(
            header(&again, "location").as_deref(),
            Some(location.as_str())
        );
        assert_eq!(json_body(again).await, first_body);
    }
    assert_eq!(stream_len(&env).await, 1, "replays enqueue nothing");
    assert_eq!(idempotency_count(&services, "new"), 1);
    assert_eq!(idempotency_count(&services, "replayed"), 2);
}

#[actix_web::test]
async fn job_id_is_the_uuid_v5_of_the_scoped_key() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "uuid-v5-key-000001";
    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    assert_eq!(job_id, job_id_for("acme", key, BODY));
    assert_eq!(uuid::Uuid::parse_str(&job_id).unwrap().get_version_num(), 5);
    let [msg] = stream_messages(&env).await.try_into().unwrap();
    assert_eq!(
        msg.job_id.to_string(),
        job_id,
        "the enqueued job carries it"
    );
    assert_eq!(msg.tenant.as_str(), "acme");
}

#[actix_web::test]
async fn concurrent_requests_with_one_key_enqueue_exactly_once() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "concurrent-key-0001";
    let calls = (0..10).map(|_| test::call_service(&app, post("acme", key, BODY).to_request()));
    let responses = join_all(calls).await;

    let mut fresh = Vec::new();
    let mut replays = Vec::new();
    for res in responses {
        match (res.status().as_u16(), header(&res, "idempotent-replayed")) {
            (202, None) => fresh.push(json_body(res).await),
            (202, Some(_)) => replays.push(json_body(res).await),
            (other, _) => panic!("unexpected status {other}: there is no in-progress state"),
        }
    }
    assert_eq!(fresh.len(), 1, "exactly one request enqueued");
    assert_eq!(replays.len(), 9, "every other one is a replay, none a 409");
    assert!(
        replays.iter().all(|b| *b == fresh[0]),
        "replays answer the winner's body"
    );
    assert_eq!(stream_len(&env).await, 1, "one stream entry");
    assert_eq!(idempotency_count(&services, "new"), 1);
    assert_eq!(idempotency_count(&services, "replayed"), 9);
    assert_eq!(idempotency_count(&services, "conflict"), 0);
}

/// The same race, but as separate processes would run it: one connection per contender,
/// on a multi-threaded runtime, all released at once. Redis runs the script of exactly
/// one of them against an absent key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contenders_on_separate_connections_enqueue_exactly_once() {
    let env = TestEnv::new().await;
    let key = "race-key-000000001";
    let redis_key = record_key(&env.services().build(), "acme", key);
    let fp = fingerprint(BODY);
    let msg = job_message("acme", key, BODY);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            // Separate services: separate shared connections, like separate API processes.
            let contender = env.services().build();
            let (start, redis_key, fp, msg) =
                (start.clone(), redis_key.clone(), fp.clone(), msg.clone());
            tokio::spawn(async move {
                // Connect first, so the barrier releases requests, not connection attempts.
                let mut conn = contender.redis_shared.get().await.unwrap();
                let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
                let store = store_of(&contender);
                start.wait().await;
                store
                    .enqueue_once(
                        &redis_key,
                        &fp,
                        &msg,
                        accepted(&msg.job_id.to_string()),
                        &TenantLimits::default(),
                    )
                    .await
            })
        })
        .collect();
    let mut fresh = 0;
    let mut replayed = 0;
    for task in tasks {
        match task.await.unwrap().unwrap() {
            Outcome::Fresh(r) => {
                fresh += 1;
                assert_eq!(r, accepted(&msg.job_id.to_string()));
            }
            Outcome::Replayed(r) => {
                replayed += 1;
                assert_eq!(r, accepted(&msg.job_id.to_string()));
            }
        }
    }
    assert_eq!((fresh, replayed), (1, 7));
    let [entry] = stream_messages(&env).await.try_into().unwrap();
    assert_eq!(
        entry.job_id, msg.job_id,
        "the raced job is on the stream once"
    );
    assert_eq!(
        record(&env, &redis_key).await.unwrap()["body"]["job_id"],
        msg.job_id.to_string()
    );
}

/// Two different bodies race for one key: whichever Redis runs first owns the key; every
/// request with that body gets its 202, every request with the other body gets 422, and the
/// stream holds the winner's text only.
#[actix_web::test]
async fn racing_different_bodies_on_one_key_enqueue_once_and_the_other_body_gets_422() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "race-bodies-key-001";
    let calls = (0..10).map(|i| {
        let body = if i % 2 == 0 { BODY } else { OTHER_BODY };
        let app = &app;
        async move {
            let res = test::call_service(app, post("acme", key, body).to_request()).await;
            (body, res.status().as_u16())
        }
    });
    let results = join_all(calls).await;

    let [msg] = stream_messages(&env).await.try_into().unwrap();
    let winner = if matches!(&msg.text, summaryd::domain::JobText::Inline(t) if t.starts_with("Quarterly"))
    {
        BODY
    } else {
        OTHER_BODY
    };
    for (body, status) in results {
        let expected = if body == winner { 202 } else { 422 };
        assert_eq!(status, expected, "body {body}");
    }
    assert_eq!(idempotency_count(&services, "new"), 1);
    assert_eq!(idempotency_count(&services, "replayed"), 4);
    assert_eq!(idempotency_count(&services, "mismatch"), 5);
}

#[actix_web::test]
async fn same_key_with_a_different_body_is_422_and_enqueues_nothing() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "mismatch-key-00001";
    let first = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let before = record(&env, &record_key(&services, "acme", key)).await;

    let res = test::call_service(&app, post("acme", key, OTHER_BODY).to_request()).await;
    let p = assert_problem(res, 422).await;
    assert!(
        p.get("job_id").is_none(),
        "never another request's response"
    );
    assert_eq!(stream_len(&env).await, 1);
    assert_eq!(
        record(&env, &record_key(&services, "acme", key)).await,
        before
    );
    assert_eq!(idempotency_count(&services, "mismatch"), 1);
}

#[actix_web::test]
async fn keys_are_scoped_per_tenant() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "shared-key-0000001";
    let mut ids = Vec::new();
    for tenant in ["acme", "globex"] {
        let res = test::call_service(&app, post(tenant, key, BODY).to_request()).await;
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        assert!(
            header(&res, "idempotent-replayed").is_none(),
            "{tenant} is not a replay"
        );
        let id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
        assert_eq!(id, job_id_for(tenant, key, BODY));
        let stored = record(&env, &record_key(&services, tenant, key))
            .await
            .unwrap();
        assert_eq!(stored["body"]["job_id"], id.as_str());
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1]);
    let on_stream: Vec<(String, String)> = stream_messages(&env)
        .await
        .into_iter()
        .map(|m| (m.tenant.to_string(), m.job_id.to_string()))
        .collect();
    assert_eq!(
        on_stream,
        vec![
            ("acme".to_owned(), ids[0].clone()),
            ("globex".to_owned(), ids[1].clone())
        ]
    );
}

/// A script that fails in Redis (here: the tenant's lane holds a string, so XADD fails) leaves
/// nothing behind: no record, no job state, no entry. The client's retry then enqueues.
#[actix_web::test]
async fn a_failed_enqueue_stores_nothing_and_the_retry_enqueues() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "failed-enqueue-key-1";
    let stream_key = services.keys.get(0).lane("acme");
    let mut r = env.redis().await;
    let () = r.set(&stream_key, "not a stream").await.unwrap();

    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert!(header(&res, "retry-after").is_some());
    assert_problem(res, 503).await;
    assert_eq!(
        record(&env, &record_key(&services, "acme", key)).await,
        None
    );
    assert!(
        job_state(&env, &job_id_for("acme", key, BODY))
            .await
            .is_empty()
    );
    assert_eq!(idempotency_count(&services, "new"), 0);

    let () = r.del(&stream_key).await.unwrap();
    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert!(
        header(&res, "idempotent-replayed").is_none(),
        "not a replay"
    );
    assert_eq!(
        json_body(res).await["job_id"],
        job_id_for("acme", key, BODY)
    );
    assert_eq!(stream_len(&env).await, 1);
}

/// Older versions wrote an in-progress marker while their handler ran. During a rolling
/// upgrade this version may meet one: 409 for the same body, 422 for another, and nothing
/// is enqueued or overwritten.
#[actix_web::test]
async fn an_in_progress_marker_of_an_older_version_is_409_and_never_overwritten() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let key = "old-marker-key-0001";
    let marker = json!({"state": "in_progress", "fp": fingerprint(BODY), "token": "t"});
    let mut r = env.redis().await;
    let () = r
        .set_ex(record_key(&services, "acme", key), marker.to_string(), 30)
        .await
        .unwrap();

    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
    assert_problem(res, 409).await;
    let res = test::call_service(&app, post("acme", key, OTHER_BODY).to_request()).await;
    assert_problem(res, 422).await;

    assert_eq!(stream_len(&env).await, 0);
    assert_eq!(
        record(&env, &record_key(&services, "acme", key)).await,
        Some(marker)
    );
    assert_eq!(idempotency_count(&services, "conflict"), 1);
    assert_eq!(idempotency_count(&services, "mismatch"), 1);
}

/// Redis drops the API's shared connection (as on a restart): a request may get 503 (and
/// then nothing was enqueued), never 500, and the connection is replaced, so the client's
/// retry with the same key succeeds.
#[actix_web::test]
async fn the_shared_connection_is_replaced_after_redis_drops_it() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, post("acme", "before-drop-key-01", BODY).to_request()).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);

    let mut shared = services.redis_shared.get().await.unwrap();
    let id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut shared)
        .await
        .unwrap();
    let mut r = env.redis().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(killed, 1);

    // Bounded: the replacement connects on the next command after the failure.
    let key = "after-drop-key-001";
    let accepted = std::cell::RefCell::new(None);
    assert!(
        eventually(Duration::from_secs(1), || async {
            let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
            if res.status() == StatusCode::ACCEPTED {
                *accepted.borrow_mut() = Some(res);
                return true;
            }
            assert_problem(res, 503).await;
            assert_eq!(stream_len(&env).await, 1, "a 503 enqueued nothing");
            false
        })
        .await,
        "the connection was never replaced"
    );
    let accepted_res = accepted.into_inner().expect("accepted");
    assert!(header(&accepted_res, "idempotent-replayed").is_none());
    assert_eq!(stream_len(&env).await, 2);
    let mut again = services.redis_shared.get().await.unwrap();
    let new_id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut again)
        .await
        .unwrap();
    assert_ne!(new_id, id, "a new connection");
}

#[tokio::test]
async fn redis_down_is_unavailable_at_once_and_writes_nothing() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    // Nothing listens on port 1: connection refused.
    settings.redis_url = "redis://127.0.0.1:1".into();
    let down = env.services().settings(settings).build();
    let store = store_of(&down);
    let msg = job_message("acme", "redis-down-key-001", BODY);
    let err = store
        .enqueue_once("any", "fp", &msg, accepted("j"), &TenantLimits::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert_eq!(stream_len(&env).await, 0);
}

/// The fingerprint the API computes for `body`.
fn fingerprint(body: &str) -> String {
    let parsed: SummaryRequest = serde_json::from_str(body).unwrap();
    parsed
        .validate(summaryd::domain::WebhookRules::default())
        .unwrap()
        .fingerprint()
        .unwrap()
}
