//! The HTTP contract (CONTRACT.md §3) against real Redis and Postgres: bad input never
//! enqueues, GET reports each state for its own tenant only, ops routes per role.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::test::{self, TestRequest};
use redis::AsyncCommands;
use serde_json::{Value, json};
use summaryd::api;
use summaryd::context::Services;
use summaryd::db;
use summaryd::domain::{IdempotencyKey, TenantId};
use summaryd::keys::{GROUP, ScopedKey};
use summaryd::roles::{Role, Roles};
use summaryd::shutdown::Shutdown;
use summaryd::stream::{JobMessage, job_state};

use crate::common::{FakeLlm, FakeMailer, TestEnv};

/// Helpers shared with `idempotency.rs`.
pub mod support {
    use super::*;

    pub const BODY: &str =
        r#"{"text":"Quarterly numbers are up. Churn is down.","notify":"ops@example.com"}"#;

    pub fn services(env: &TestEnv) -> Services {
        env.services(Arc::new(FakeLlm::ok()), Arc::new(FakeMailer::new()))
    }

    pub fn services_with(env: &TestEnv, settings: summaryd::config::Settings) -> Services {
        env.services_with(
            settings,
            Arc::new(FakeLlm::ok()),
            Arc::new(FakeMailer::new()),
        )
    }

    /// A well-formed POST; tests remove or spoil one thing at a time.
    pub fn post(tenant: &str, key: &str, body: &str) -> TestRequest {
        TestRequest::post()
            .uri("/v1/summaries")
            .insert_header(("X-Tenant-Id", tenant))
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Content-Type", "application/json"))
            .set_payload(body.to_owned())
    }

    pub fn get(tenant: &str, job_id: &str) -> TestRequest {
        TestRequest::get()
            .uri(&format!("/v1/summaries/{job_id}"))
            .insert_header(("X-Tenant-Id", tenant))
    }

    pub fn header(res: &actix_web::dev::ServiceResponse<impl Sized>, name: &str) -> Option<String> {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    pub async fn json_body<B: actix_web::body::MessageBody>(
        res: actix_web::dev::ServiceResponse<B>,
    ) -> Value {
        let bytes = test::read_body(res).await;
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    }

    /// Entries on the job stream (XLEN).
    pub async fn stream_len(env: &TestEnv) -> usize {
        let mut r = env.redis().await;
        r.xlen(format!("{}jobs:summaries", env.settings.key_prefix))
            .await
            .unwrap()
    }

    /// Every job message on the stream, oldest first.
    pub async fn stream_messages(env: &TestEnv) -> Vec<JobMessage> {
        let mut r = env.redis().await;
        let reply: redis::streams::StreamRangeReply = r
            .xrange_all(format!("{}jobs:summaries", env.settings.key_prefix))
            .await
            .unwrap();
        reply
            .ids
            .iter()
            .map(|e| JobMessage::from_fields(&e.map).unwrap())
            .collect()
    }

    /// Redis key of the idempotency record for (tenant, key).
    pub fn record_key(services: &Services, tenant: &str, key: &str) -> String {
        let scoped = ScopedKey::summaries(
            &TenantId::parse(tenant).unwrap(),
            &IdempotencyKey::parse(key).unwrap(),
        );
        services.keys.idempotency(&scoped)
    }

    pub fn job_id_for(tenant: &str, key: &str) -> String {
        ScopedKey::summaries(
            &TenantId::parse(tenant).unwrap(),
            &IdempotencyKey::parse(key).unwrap(),
        )
        .job_id()
        .to_string()
    }

    pub fn idempotency_count(services: &Services, outcome: &str) -> u64 {
        services
            .metrics
            .idempotency
            .with_label_values(&[outcome])
            .get()
    }

    pub async fn assert_problem<B: actix_web::body::MessageBody>(
        res: actix_web::dev::ServiceResponse<B>,
        status: u16,
    ) -> Value {
        assert_eq!(res.status().as_u16(), status);
        assert_eq!(
            header(&res, "content-type").as_deref(),
            Some("application/problem+json")
        );
        let p = json_body(res).await;
        assert_eq!(p["status"], status, "{p}");
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "{p}");
        assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()), "{p}");
        assert!(p["type"].as_str().is_some(), "{p}");
        p
    }
}

use support::*;

/// (what, request, expected status, expected `field`, expected `header`)
type BadInput<'a> = (&'a str, TestRequest, u16, Option<&'a str>, Option<&'a str>);

#[actix_web::test]
async fn every_bad_input_is_a_problem_naming_what_to_fix_and_enqueues_nothing() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let ok_key = |n: usize| format!("bad-input-key-{n:04}");
    let over_limit = format!(
        r#"{{"text":"{}","notify":"a@b.co"}}"#,
        "x".repeat(services.settings.api.max_body_bytes)
    );

    let cases: Vec<BadInput> = vec![
        (
            "key missing",
            TestRequest::post()
                .uri("/v1/summaries")
                .insert_header(("X-Tenant-Id", "acme"))
                .insert_header(("Content-Type", "application/json"))
                .set_payload(BODY),
            400,
            None,
            Some("Idempotency-Key"),
        ),
        (
            "key too short",
            post("acme", "short", BODY),
            400,
            None,
            Some("Idempotency-Key"),
        ),
        (
            "key with a space",
            post("acme", "0123456789 abcdef", BODY),
            400,
            None,
            Some("Idempotency-Key"),
        ),
        (
            "key too long",
            post("acme", &"k".repeat(129), BODY),
            400,
            None,
            Some("Idempotency-Key"),
        ),
        (
            "tenant missing",
            TestRequest::post()
                .uri("/v1/summaries")
                .insert_header(("Idempotency-Key", ok_key(1)))
                .insert_header(("Content-Type", "application/json"))
                .set_payload(BODY),
            400,
            None,
            Some("X-Tenant-Id"),
        ),
        (
            "tenant invalid",
            post("a:b", &ok_key(2), BODY),
            400,
            None,
            Some("X-Tenant-Id"),
        ),
        (
            "malformed JSON",
            post("acme", &ok_key(3), r#"{"text":"#),
            400,
            None,
            None,
        ),
        (
            "missing field",
            post("acme", &ok_key(4), r#"{"text":"hello"}"#),
            422,
            Some("notify"),
            None,
        ),
        (
            "wrong type",
            post("acme", &ok_key(5), r#"{"text":5,"notify":"a@b.co"}"#),
            422,
            Some("text"),
            None,
        ),
        (
            "empty text",
            post("acme", &ok_key(6), r#"{"text":"   ","notify":"a@b.co"}"#),
            422,
            Some("text"),
            None,
        ),
        (
            "bad email",
            post(
                "acme",
                &ok_key(7),
                r#"{"text":"hello","notify":"not-an-email"}"#,
            ),
            422,
            Some("notify"),
            None,
        ),
        (
            "unknown field",
            post(
                "acme",
                &ok_key(8),
                r#"{"text":"hello","notify":"a@b.co","cc":"x@y.io"}"#,
            ),
            422,
            Some("cc"),
            None,
        ),
        (
            "not an object",
            post("acme", &ok_key(9), r#"["hello","a@b.co"]"#),
            422,
            Some("body"),
            None,
        ),
        (
            "over the limit",
            post("acme", &ok_key(10), &over_limit),
            413,
            None,
            None,
        ),
        (
            "wrong content type",
            post("acme", &ok_key(11), BODY).insert_header(("Content-Type", "text/plain")),
            415,
            None,
            None,
        ),
        (
            "missing content type",
            TestRequest::post()
                .uri("/v1/summaries")
                .insert_header(("X-Tenant-Id", "acme"))
                .insert_header(("Idempotency-Key", ok_key(12)))
                .set_payload(BODY),
            415,
            None,
            None,
        ),
    ];
    for (what, req, status, field, header) in cases {
        let res = test::call_service(&app, req.to_request()).await;
        assert_eq!(res.status().as_u16(), status, "{what}");
        let p = assert_problem(res, status).await;
        assert_eq!(p["field"].as_str(), field, "{what}: {p}");
        assert_eq!(p["header"].as_str(), header, "{what}: {p}");
        if let Some(field) = field {
            assert!(p["detail"].as_str().unwrap().contains(field), "{what}: {p}");
        }
    }

    assert_eq!(stream_len(&env).await, 0, "nothing may be enqueued");
    let mut r = env.redis().await;
    let records: Vec<String> = r
        .keys(format!("{}idem:*", env.settings.key_prefix))
        .await
        .unwrap();
    assert!(records.is_empty(), "no idempotency record: {records:?}");
    assert_eq!(idempotency_count(&services, "new"), 0);
}

#[actix_web::test]
async fn text_over_the_model_context_is_413_naming_text_and_never_queued() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.llm.max_input_chars = 20;
    let services = services_with(&env, settings);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    // 21 characters but far below the byte limit: only the context budget refuses it.
    let body = r#"{"text":"ééééééééééééééééééééé","notify":"a@b.co"}"#;
    let res = test::call_service(
        &app,
        post("acme", "context-guard-key-01", body).to_request(),
    )
    .await;
    let p = assert_problem(res, 413).await;
    assert_eq!(p["field"], "text", "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("20 characters"),
        "{p}"
    );
    assert_eq!(
        stream_len(&env).await,
        0,
        "a job that can never succeed is not queued"
    );
    // Exactly at the budget is accepted.
    let body = r#"{"text":"éééééééééééééééééééé","notify":"a@b.co"}"#;
    let res = test::call_service(
        &app,
        post("acme", "context-guard-key-02", body).to_request(),
    )
    .await;
    assert_eq!(res.status().as_u16(), 202);
    assert_eq!(stream_len(&env).await, 1);
}

#[actix_web::test]
async fn redis_unavailable_is_503_with_retry_after_never_500() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    // Nothing listens on port 1: connection refused at once.
    settings.redis_url = "redis://127.0.0.1:1".into();
    let services = services_with(&env, settings);
    let app = test::init_service(api::app(services, Roles::all(), Shutdown::new())).await;

    let res =
        test::call_service(&app, post("acme", "redis-down-key-0001", BODY).to_request()).await;
    assert!(header(&res, "retry-after").is_some());
    assert_problem(res, 503).await;

    let unknown = uuid::Uuid::new_v4().to_string();
    let res = test::call_service(&app, get("acme", &unknown).to_request()).await;
    assert!(header(&res, "retry-after").is_some());
    assert_problem(res, 503).await;

    assert_eq!(stream_len(&env).await, 0);
}

#[actix_web::test]
async fn get_reports_queued_then_done_with_rfc3339_timestamps() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let res =
        test::call_service(&app, post("acme", "get-states-key-0001", BODY).to_request()).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();

    let res = test::call_service(&app, get("acme", &job_id).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let queued = json_body(res).await;
    assert_eq!(queued["status"], "queued");
    assert_eq!(queued["job_id"], job_id.as_str());
    assert!(queued.get("summary").is_none() && queued.get("completed_at").is_none());
    let created = chrono::DateTime::parse_from_rfc3339(queued["created_at"].as_str().unwrap())
        .expect("created_at is RFC 3339");

    // What a worker does when it finishes: commit the summary from the stream message.
    let [msg] = stream_messages(&env).await.try_into().unwrap();
    assert_eq!(msg.job_id.to_string(), job_id);
    assert_eq!(msg.payload.notify, "ops@example.com");
    db::summaries::commit_with_outbox(&services.pg, &msg, "Numbers up, churn down.")
        .await
        .unwrap();

    let res = test::call_service(&app, get("acme", &job_id).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let done = json_body(res).await;
    assert_eq!(done["status"], "done");
    assert_eq!(done["summary"], "Numbers up, churn down.");
    let created_done =
        chrono::DateTime::parse_from_rfc3339(done["created_at"].as_str().unwrap()).unwrap();
    assert_eq!(created_done.timestamp_micros(), created.timestamp_micros());
    let completed =
        chrono::DateTime::parse_from_rfc3339(done["completed_at"].as_str().unwrap()).unwrap();
    assert!(completed >= created);
}

#[actix_web::test]
async fn get_reports_failed_with_the_dead_letter_reason() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let res =
        test::call_service(&app, post("acme", "get-failed-key-0001", BODY).to_request()).await;
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    // What the dead-letter path records for the job.
    let mut r = env.redis().await;
    let _: () = r
        .hset_multiple(
            format!("{}job:{job_id}", env.settings.key_prefix),
            &[
                ("status", job_state::FAILED),
                ("error", "permanent: status_400"),
            ],
        )
        .await
        .unwrap();

    let res = test::call_service(&app, get("acme", &job_id).to_request()).await;
    let failed = json_body(res).await;
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"], "permanent: status_400");
}

#[actix_web::test]
async fn get_is_404_for_other_tenants_unknown_and_malformed_ids() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let res =
        test::call_service(&app, post("acme", "tenant-404-key-0001", BODY).to_request()).await;
    let queued_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    let res =
        test::call_service(&app, post("acme", "tenant-404-key-0002", BODY).to_request()).await;
    let done_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    let done_msg = stream_messages(&env)
        .await
        .into_iter()
        .find(|m| m.job_id.to_string() == done_id)
        .unwrap();
    db::summaries::commit_with_outbox(&services.pg, &done_msg, "s")
        .await
        .unwrap();

    // Another tenant sees neither the queued (Redis) nor the done (Postgres) job: 404, not 403.
    for id in [&queued_id, &done_id] {
        let res = test::call_service(&app, get("globex", id).to_request()).await;
        let p = assert_problem(res, 404).await;
        assert!(!p["detail"].as_str().unwrap().contains("acme"), "{p}");
    }
    let unknown = uuid::Uuid::new_v4().to_string();
    for id in [unknown.as_str(), "not-a-uuid"] {
        let res = test::call_service(&app, get("acme", id).to_request()).await;
        assert_problem(res, 404).await;
    }
    // The owner still sees both.
    for id in [&queued_id, &done_id] {
        let res = test::call_service(&app, get("acme", id).to_request()).await;
        assert_eq!(res.status(), StatusCode::OK);
    }
}

#[actix_web::test]
async fn get_with_postgres_down_is_503() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.database_url = "postgres://postgres@127.0.0.1:1/summaryd".into();
    let services = services_with(&env, settings);
    let app = test::init_service(api::app(services, Roles::all(), Shutdown::new())).await;
    let res = test::call_service(
        &app,
        get("acme", &uuid::Uuid::new_v4().to_string()).to_request(),
    )
    .await;
    assert!(header(&res, "retry-after").is_some());
    assert_problem(res, 503).await;
}

#[actix_web::test]
async fn healthz_is_200_and_readyz_follows_dependencies_and_shutdown() {
    let env = TestEnv::new().await;
    let shutdown = Shutdown::new();
    let app = test::init_service(api::app(services(&env), Roles::all(), shutdown.clone())).await;

    let res = test::call_service(&app, TestRequest::get().uri("/healthz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let ready = json_body(res).await;
    assert_eq!(ready["checks"], json!({"redis": "ok", "postgres": "ok"}));

    shutdown.trigger();
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert!(header(&res, "retry-after").is_some());
    assert_problem(res, 503).await;
    let res = test::call_service(&app, TestRequest::get().uri("/healthz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK, "still alive while draining");
}

#[actix_web::test]
async fn readyz_checks_only_the_dependencies_of_the_enabled_roles() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.redis_url = "redis://127.0.0.1:1".into();
    let dead_redis = services_with(&env, settings);

    let app = test::init_service(api::app(dead_redis.clone(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    let p = assert_problem(res, 503).await;
    assert!(p["detail"].as_str().unwrap().contains("redis"), "{p}");

    // A relay needs only Postgres.
    let relay = Roles::of(&[Role::Relay]);
    let app = test::init_service(api::app(dead_redis, relay, Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await["checks"], json!({"postgres": "ok"}));
}

#[actix_web::test]
async fn metrics_expose_contract_names_refresh_gauges_and_count_route_templates() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let app = test::init_service(api::app(services.clone(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, post("acme", "metrics-key-000001", BODY).to_request()).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    let res = test::call_service(&app, get("acme", &job_id).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = test::call_service(&app, TestRequest::get().uri("/no/such/route").to_request()).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    // Gauge sources: one pending delivery, one dead letter, one unsent outbox row.
    let mut r = env.redis().await;
    let stream = services.keys.stream();
    let _: () = r.xgroup_create(&stream, GROUP, "0").await.unwrap();
    let _: redis::streams::StreamReadReply = r
        .xread_options(
            &[&stream],
            &[">"],
            &redis::streams::StreamReadOptions::default().group(GROUP, "c1"),
        )
        .await
        .unwrap();
    let _: String = r
        .xadd(
            services.keys.dead_letters(),
            "*",
            &[("job_id", job_id.as_str())],
        )
        .await
        .unwrap();
    let [msg] = stream_messages(&env).await.try_into().unwrap();
    db::summaries::commit_with_outbox(&services.pg, &msg, "s")
        .await
        .unwrap();

    let res = test::call_service(&app, TestRequest::get().uri("/metrics").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        header(&res, "content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let text = String::from_utf8(test::read_body(res).await.to_vec()).unwrap();
    for name in [
        "summaryd_http_requests_total",
        "summaryd_idempotency_total",
        "summaryd_jobs_total",
        "summaryd_llm_requests_total",
        "summaryd_llm_request_duration_seconds",
        "summaryd_stream_pending",
        "summaryd_dead_letters",
        "summaryd_outbox_unsent",
        "summaryd_outbox_sent_total",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    for line in [
        r#"summaryd_http_requests_total{route="/v1/summaries",status="202"} 1"#,
        r#"summaryd_http_requests_total{route="/v1/summaries/{job_id}",status="200"} 1"#,
        r#"summaryd_http_requests_total{route="unmatched",status="404"} 1"#,
        r#"summaryd_idempotency_total{outcome="new"} 1"#,
        r#"summaryd_idempotency_total{outcome="conflict"} 0"#,
        "summaryd_stream_pending 1",
        "summaryd_dead_letters 1",
        "summaryd_outbox_unsent 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    assert!(!text.contains(&job_id), "raw paths must not become labels");
}

#[actix_web::test]
async fn openapi_describes_every_route_and_status() {
    let env = TestEnv::new().await;
    let app = test::init_service(api::app(services(&env), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/openapi.json").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let doc = json_body(res).await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/summaries",
        "/v1/summaries/{job_id}",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    let post = &doc["paths"]["/v1/summaries"]["post"];
    for status in ["202", "400", "409", "413", "415", "422", "503"] {
        assert!(
            post["responses"][status].is_object(),
            "POST {status} missing"
        );
    }
    assert!(
        post["responses"]["400"]["content"]["application/problem+json"].is_object(),
        "errors are problem+json"
    );
    let get = &doc["paths"]["/v1/summaries/{job_id}"]["get"];
    for status in ["200", "404", "503"] {
        assert!(get["responses"][status].is_object(), "GET {status} missing");
    }
    for schema in ["CreateSummary", "Accepted", "JobView", "Problem"] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
}

#[actix_web::test]
async fn unknown_routes_and_wrong_methods_are_problems() {
    let env = TestEnv::new().await;
    let app = test::init_service(api::app(services(&env), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/v2/nothing").to_request()).await;
    assert_problem(res, 404).await;
    let res = test::call_service(&app, TestRequest::put().uri("/v1/summaries").to_request()).await;
    assert_eq!(header(&res, "allow").as_deref(), Some("POST"));
    assert_problem(res, 405).await;
}

#[actix_web::test]
async fn worker_only_server_serves_ops_routes_but_not_v1() {
    let env = TestEnv::new().await;
    let services = services(&env);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let server = api::build_server(
        services,
        Roles::of(&[Role::Worker]),
        shutdown.clone(),
        listener,
    )
    .unwrap();
    let running = actix_web::rt::spawn(api::serve_until_shutdown(server, shutdown.clone()));

    let client = reqwest::Client::new();
    let res = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let res = client
        .post(format!("{base}/v1/summaries"))
        .header("X-Tenant-Id", "acme")
        .header("Idempotency-Key", "worker-only-key-0001")
        .header("Content-Type", "application/json")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(
        res.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    assert_eq!(stream_len(&env).await, 0);

    shutdown.trigger();
    running.await.unwrap().unwrap();
    assert!(
        client.get(format!("{base}/healthz")).send().await.is_err(),
        "the server stopped after shutdown"
    );
}

#[actix_web::test]
async fn chunked_body_over_the_limit_is_413_without_content_length() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.api.max_body_bytes = 1024;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = Shutdown::new();
    let server = api::build_server(
        services_with(&env, settings),
        Roles::all(),
        shutdown.clone(),
        listener,
    )
    .unwrap();
    let running = actix_web::rt::spawn(api::serve_until_shutdown(server, shutdown.clone()));

    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/summaries HTTP/1.1\r\nHost: t\r\nX-Tenant-Id: acme\r\n\
                Idempotency-Key: chunked-key-000001\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    conn.write_all(head.as_bytes()).await.unwrap();
    let chunk = "x".repeat(512);
    // Four chunks: twice the limit, with no Content-Length to refuse up front.
    for _ in 0..4 {
        if conn
            .write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
            .await
            .is_err()
        {
            break; // the server may already have answered and closed
        }
    }
    let _ = conn.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("application/problem+json"), "{response}");
    assert_eq!(stream_len(&env).await, 0);

    shutdown.trigger();
    running.await.unwrap().unwrap();
}
