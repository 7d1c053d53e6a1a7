//! Idempotency-Key: one job per scoped key, replays answer from the store, conflicts and
//! mismatches never run the handler, and the compare-and-set guard keeps a late request
//! from overwriting or deleting a newer one's record. Effects are counted on Redis itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::test;
use futures_util::future::join_all;
use redis::AsyncCommands;
use serde_json::{Value, json};
use summaryd::api::{self, ApiError, IdempotencyStore, Outcome, StoreError, StoredResponse};
use summaryd::domain::{IdempotencyKey, SummaryRequest, TenantId};
use summaryd::keys::ScopedKey;
use summaryd::roles::Roles;
use summaryd::shutdown::Shutdown;
use summaryd::stream::{self, JobMessage, JobPayload};
use tokio::sync::Notify;

use crate::api::support::*;
use crate::common::TestEnv;

fn store_of(services: &summaryd::context::Services) -> IdempotencyStore {
    IdempotencyStore::new(
        services.redis.clone(),
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

async fn record(env: &TestEnv, key: &str) -> Option<Value> {
    let mut r = env.redis().await;
    let raw: Option<String> = r.get(key).await.unwrap();
    raw.map(|s| serde_json::from_str(&s).unwrap())
}

/// Wait until `key` exists and then until it has expired. Only the tests that exercise a
/// lock TTL use this, with a 1 s TTL; the bound is a safety net, not an assertion.
async fn wait_for_expiry(env: &TestEnv, key: &str) {
    let mut r = env.redis().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while Instant::now() < deadline {
        let exists: bool = r.exists(key).await.unwrap();
        if exists && !seen {
            let ttl_ms: i64 = r.pttl(key).await.unwrap();
            assert!(
                (1..=1000).contains(&ttl_ms),
                "marker has the lock TTL: {ttl_ms}"
            );
        }
        seen |= exists;
        if seen && !exists {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{key} did not expire");
}

#[actix_web::test]
async fn new_key_enqueues_once_and_replay_returns_the_same_body_without_enqueueing() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
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
    let app = test::init_service(api::app(services(&env), Roles::all(), Shutdown::new())).await;
    let key = "uuid-v5-key-000001";
    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    assert_eq!(job_id, job_id_for("acme", key));
    assert_eq!(uuid::Uuid::parse_str(&job_id).unwrap().get_version_num(), 5);
    let [msg] = stream_messages(&env).await.try_into().unwrap();
    assert_eq!(
        msg.job_id.to_string(),
        job_id,
        "the enqueued job carries it"
    );
    assert_eq!(msg.tenant, "acme");
}

#[actix_web::test]
async fn concurrent_requests_with_one_key_enqueue_exactly_once() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let key = "concurrent-key-0001";
    let calls = (0..10).map(|_| test::call_service(&app, post("acme", key, BODY).to_request()));
    let responses = join_all(calls).await;

    let mut fresh = Vec::new();
    let mut conflicts = 0;
    let mut replays = Vec::new();
    for res in responses {
        match (res.status().as_u16(), header(&res, "idempotent-replayed")) {
            (202, None) => fresh.push(json_body(res).await),
            (202, Some(_)) => replays.push(json_body(res).await),
            (409, _) => {
                assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
                assert_problem(res, 409).await;
                conflicts += 1;
            }
            (other, _) => panic!("unexpected status {other}"),
        }
    }
    // Which duplicates arrive while the first is still running is up to the scheduler; the
    // store-level test below pins that down. Here: one winner, and nobody else enqueues.
    assert_eq!(fresh.len(), 1, "exactly one request ran the handler");
    assert!(
        replays.iter().all(|b| *b == fresh[0]),
        "replays answer the winner's body"
    );
    assert_eq!(conflicts + replays.len(), 9);
    assert_eq!(stream_len(&env).await, 1, "one stream entry");
    assert_eq!(idempotency_count(&services, "new"), 1);
    assert_eq!(idempotency_count(&services, "conflict") as usize, conflicts);
}

#[actix_web::test]
async fn duplicates_while_the_first_runs_get_in_progress_and_never_run_the_handler() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let store = store_of(&services);
    let key = format!("{}idem:test:concurrent", env.settings.key_prefix);
    let handler_calls = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let gate = Notify::new();

    let runs = (0..10).map(|_| async {
        let out = store
            .run(&key, "fp", || async {
                handler_calls.fetch_add(1, Ordering::SeqCst);
                gate.notified().await; // hold the lock until every duplicate has answered
                Ok::<_, StoreError>(accepted("j"))
            })
            .await;
        finished.fetch_add(1, Ordering::SeqCst);
        out
    });
    let release = async {
        while finished.load(Ordering::SeqCst) < 9 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
    };
    let (results, ()) = tokio::join!(join_all(runs), release);

    assert_eq!(handler_calls.load(Ordering::SeqCst), 1);
    let fresh = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Fresh(_))))
        .count();
    let in_progress = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::InProgress)))
        .count();
    assert_eq!((fresh, in_progress), (1, 9), "{results:?}");
    assert_eq!(record(&env, &key).await.unwrap()["state"], "done");
    assert_eq!(idempotency_count(&services, "conflict"), 9);
}

#[actix_web::test]
async fn same_key_with_a_different_body_is_422_and_enqueues_nothing() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let key = "mismatch-key-00001";
    let first = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let before = record(&env, &record_key(&services, "acme", key)).await;

    let other = r#"{"text":"A different document.","notify":"ops@example.com"}"#;
    let res = test::call_service(&app, post("acme", key, other).to_request()).await;
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
async fn handler_errors_and_5xx_release_the_key_so_a_retry_runs() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let store = store_of(&services);
    let key = format!("{}idem:test:release", env.settings.key_prefix);
    let calls = AtomicUsize::new(0);

    let out = store
        .run(&key, "fp", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, StoreError>(StoredResponse {
                status: 500,
                body: json!({"oops": true}),
            })
        })
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Fresh(ref r) if r.status == 500));
    assert_eq!(record(&env, &key).await, None, "a 5xx is not stored");

    let err = store
        .run(&key, "fp", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<StoredResponse, _>(ApiError::RedisUnavailable("enqueue failed".into()))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::RedisUnavailable(_)));
    assert_eq!(record(&env, &key).await, None, "an error releases the key");

    let out = store
        .run(&key, "fp", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, StoreError>(accepted("j"))
        })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Fresh(accepted("j")));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "each retry ran the handler"
    );
    let replay = store
        .run(&key, "fp", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, StoreError>(accepted("other"))
        })
        .await
        .unwrap();
    assert_eq!(replay, Outcome::Replayed(accepted("j")));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a finished key does not run the handler"
    );
}

#[actix_web::test]
async fn a_crashed_request_blocks_retries_until_its_lock_expires_then_the_retry_gets_the_same_job_id()
 {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.idempotency.lock_ttl_s = 1; // the crash-recovery time, tiny for the test
    let services = services_with(&env, settings);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let key = "crash-key-00000001";
    let tenant = TenantId::parse("acme").unwrap();
    let scoped = ScopedKey::summaries(&tenant, &IdempotencyKey::parse(key).unwrap());
    let redis_key = services.keys.idempotency(&scoped);

    // The first request enqueues, then its process dies before FINALISE: the run future is
    // dropped, so nothing releases the marker.
    let store = store_of(&services);
    let enqueued = Notify::new();
    let fp = fingerprint(BODY);
    let doomed = store.run(&redis_key, &fp, || async {
        let parsed: SummaryRequest = serde_json::from_str(BODY).unwrap();
        let valid = parsed.validate().unwrap();
        let msg = JobMessage {
            job_id: scoped.job_id(),
            tenant: tenant.to_string(),
            payload: JobPayload {
                text: valid.text,
                notify: valid.notify.to_string(),
            },
            created_at: chrono::Utc::now(),
        };
        let mut conn = services.redis.get().await?;
        stream::enqueue(&mut conn, &services.keys, &msg).await?;
        enqueued.notify_one();
        std::future::pending::<Result<StoredResponse, ApiError>>().await
    });
    tokio::select! {
        _ = doomed => panic!("the doomed request never finishes"),
        () = enqueued.notified() => {}
    }
    assert_eq!(stream_len(&env).await, 1);

    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
    assert_problem(res, 409).await;

    wait_for_expiry(&env, &redis_key).await;
    let res = test::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    assert_eq!(job_id, scoped.job_id().to_string());
    // The retry enqueued again, under the same job id, so the worker collapses the two.
    let ids: Vec<String> = stream_messages(&env)
        .await
        .iter()
        .map(|m| m.job_id.to_string())
        .collect();
    assert_eq!(ids, vec![job_id.clone(), job_id]);
}

#[actix_web::test]
async fn a_late_finalise_after_the_lock_was_lost_does_not_overwrite_the_newer_result() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.idempotency.lock_ttl_s = 1;
    let services = services_with(&env, settings);
    let store = store_of(&services);
    let key = format!("{}idem:test:lock-lost", env.settings.key_prefix);
    let a_may_finish = Notify::new();

    // A holds the lock past its TTL; B takes the key and finalises; then A finishes.
    let a = store.run(&key, "fp", || async {
        a_may_finish.notified().await;
        Ok::<_, StoreError>(accepted("from-a"))
    });
    let b = async {
        wait_for_expiry(&env, &key).await;
        let b = store
            .run(&key, "fp", || async {
                Ok::<_, StoreError>(accepted("from-b"))
            })
            .await;
        a_may_finish.notify_one();
        b
    };
    let (a, b) = tokio::join!(a, b);

    assert_eq!(
        a.unwrap(),
        Outcome::Fresh(accepted("from-a")),
        "A still answers"
    );
    assert_eq!(b.unwrap(), Outcome::Fresh(accepted("from-b")));
    let stored = record(&env, &key).await.unwrap();
    assert_eq!(
        stored["body"]["job_id"], "from-b",
        "A's finalise did not overwrite B"
    );
    let replay = store
        .run(&key, "fp", || async {
            Ok::<_, StoreError>(accepted("from-c"))
        })
        .await
        .unwrap();
    assert_eq!(replay, Outcome::Replayed(accepted("from-b")));
}

#[actix_web::test]
async fn a_late_release_after_the_lock_was_lost_does_not_delete_the_newer_result() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.idempotency.lock_ttl_s = 1;
    let services = services_with(&env, settings);
    let store = store_of(&services);
    let key = format!("{}idem:test:release-lost", env.settings.key_prefix);
    let a_may_fail = Notify::new();

    let a = store.run(&key, "fp", || async {
        a_may_fail.notified().await;
        Ok::<_, StoreError>(StoredResponse {
            status: 503,
            body: json!({}),
        })
    });
    let b = async {
        wait_for_expiry(&env, &key).await;
        let b = store
            .run(&key, "fp", || async {
                Ok::<_, StoreError>(accepted("from-b"))
            })
            .await;
        a_may_fail.notify_one();
        b
    };
    let (_, b) = tokio::join!(a, b);
    assert_eq!(b.unwrap(), Outcome::Fresh(accepted("from-b")));
    let stored = record(&env, &key)
        .await
        .expect("B's record survives A's release");
    assert_eq!(stored["body"]["job_id"], "from-b");
}

#[actix_web::test]
async fn keys_are_scoped_per_tenant() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
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
        assert_eq!(id, job_id_for(tenant, key));
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
        .map(|m| (m.tenant, m.job_id.to_string()))
        .collect();
    assert_eq!(
        on_stream,
        vec![
            ("acme".to_owned(), ids[0].clone()),
            ("globex".to_owned(), ids[1].clone())
        ]
    );
}

/// The fingerprint the API computes for `body`.
fn fingerprint(body: &str) -> String {
    let parsed: SummaryRequest = serde_json::from_str(body).unwrap();
    parsed.validate().unwrap().fingerprint()
}
