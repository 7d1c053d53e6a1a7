//! The HTTP API (docs/reference.md) against real Redis and Postgres: bad input never
//! enqueues, GET reports each state for its own tenant only, ops routes per role.

use actix_web::http::StatusCode;
use actix_web::test::{self, TestRequest};
use redis::AsyncCommands;
use serde_json::json;
use summaryd::api;
use summaryd::config::roles::{Role, Roles};
use summaryd::db;
use summaryd::shutdown::Shutdown;
use summaryd::stream::job_state::Status;

use crate::shared::TestEnv;
use crate::shared::api_requests::*;

const TENANT: &str = "X-Tenant-Id";
const KEY: &str = "Idempotency-Key";
const CONTENT_TYPE: &str = "Content-Type";

/// What a bad request's problem must name for the client to fix: a body field (also named
/// in `detail`), a header, or neither (the body as a whole).
#[derive(Debug, Clone, Copy)]
enum Names {
    Field(&'static str),
    Header(&'static str),
    Neither,
}

impl Names {
    fn field(self) -> Option<&'static str> {
        match self {
            Names::Field(f) => Some(f),
            _ => None,
        }
    }

    fn header(self) -> Option<&'static str> {
        match self {
            Names::Header(h) => Some(h),
            _ => None,
        }
    }
}

/// (what, headers changed from a well-formed POST (`None` removes one), body, status, names)
type BadInput<'a> = (
    &'a str,
    &'a [(&'a str, Option<&'a str>)],
    &'a str,
    u16,
    Names,
);

/// A well-formed POST with `changes` applied; every case gets its own valid key, so no
/// case's idempotency record could answer another's.
fn spoilt_post(n: usize, changes: &[(&str, Option<&str>)], body: &str) -> TestRequest {
    let key = format!("bad-input-key-{n:04}");
    let mut headers = vec![
        (TENANT, Some("acme")),
        (KEY, Some(key.as_str())),
        (CONTENT_TYPE, Some("application/json")),
    ];
    for (name, value) in changes {
        // A change to a header the POST lacks would leave the request well-formed.
        let Some(slot) = headers.iter_mut().find(|(h, _)| h == name) else {
            panic!("no {name} header to change");
        };
        slot.1 = *value;
    }
    let mut req = TestRequest::post().uri("/v1/summaries");
    for (name, value) in headers {
        if let Some(value) = value {
            req = req.insert_header((name, value));
        }
    }
    req.set_payload(body.to_owned())
}

#[actix_web::test]
async fn every_bad_input_is_a_problem_naming_what_to_fix_and_enqueues_nothing() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let long_key = "k".repeat(129);
    let over_limit = format!(
        r#"{{"text":"{}","notify":"a@b.co"}}"#,
        "x".repeat(services.settings.api.max_body_bytes)
    );
    use Names::{Field, Header, Neither};

    #[rustfmt::skip]
    let cases: &[BadInput] = &[
        ("key missing", &[(KEY, None)], BODY, 400, Header(KEY)),
        ("key too short", &[(KEY, Some("short"))], BODY, 400, Header(KEY)),
        ("key with a space", &[(KEY, Some("0123456789 abcdef"))], BODY, 400, Header(KEY)),
        ("key too long", &[(KEY, Some(&long_key))], BODY, 400, Header(KEY)),
        ("tenant missing", &[(TENANT, None)], BODY, 400, Header(TENANT)),
        ("tenant invalid", &[(TENANT, Some("a:b"))], BODY, 400, Header(TENANT)),
        ("malformed JSON", &[], r#"{"text":"#, 400, Neither),
        ("missing field", &[], r#"{"text":"hello"}"#, 422, Field("notify")),
        ("wrong type", &[], r#"{"text":5,"notify":"a@b.co"}"#, 422, Field("text")),
        ("empty text", &[], r#"{"text":"   ","notify":"a@b.co"}"#, 422, Field("text")),
        ("NUL in text", &[], r#"{"text":"a\u0000b","notify":"a@b.co"}"#, 422, Field("text")),
        ("escape in text", &[], r#"{"text":"red \u001b[31m","notify":"a@b.co"}"#, 422, Field("text")),
        ("bad email", &[], r#"{"text":"hello","notify":"not-an-email"}"#, 422, Field("notify")),
        ("unknown field", &[], r#"{"text":"hello","notify":"a@b.co","cc":"x@y.io"}"#, 422, Field("cc")),
        ("not an object", &[], r#"["hello","a@b.co"]"#, 422, Field("body")),
        ("over the limit", &[], &over_limit, 413, Neither),
        ("wrong content type", &[(CONTENT_TYPE, Some("text/plain"))], BODY, 415, Neither),
        ("missing content type", &[(CONTENT_TYPE, None)], BODY, 415, Neither),
    ];
    for (n, &(what, changes, body, status, names)) in cases.iter().enumerate() {
        let req = spoilt_post(n, changes, body);
        let res = test::call_service(&app, req.to_request()).await;
        assert_eq!(res.status().as_u16(), status, "{what}");
        let p = assert_problem(res, status).await;
        assert_eq!(p["field"].as_str(), names.field(), "{what}: {p}");
        assert_eq!(p["header"].as_str(), names.header(), "{what}: {p}");
        if let Some(field) = names.field() {
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
async fn text_over_max_text_chars_is_413_naming_text_and_never_queued() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.api.max_text_chars = 20;
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    // 21 characters but far below the byte limit: only the text limit refuses it.
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
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("SUMMARYD_API_MAX_TEXT_CHARS"),
        "{p}"
    );
    assert_eq!(
        stream_len(&env).await,
        0,
        "a job that can never succeed is not queued"
    );
    // Exactly at the limit is accepted.
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
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

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
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
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
    assert_eq!(msg.notify.as_ref().unwrap().as_str(), "ops@example.com");
    db::summaries::commit_with_outbox(
        &services.pg,
        &msg,
        &crate::shared::model_summary("Numbers up, churn down."),
    )
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
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let res =
        test::call_service(&app, post("acme", "get-failed-key-0001", BODY).to_request()).await;
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    // What the dead-letter path records for the job.
    let mut r = env.redis().await;
    let _: () = r
        .hset_multiple(
            format!("{}job:{job_id}", env.settings.key_prefix),
            &[
                ("status", Status::Failed.as_str()),
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
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
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
    db::summaries::commit_with_outbox(&services.pg, &done_msg, &crate::shared::model_summary("s"))
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
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
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
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), shutdown.clone())).await;

    let res = test::call_service(&app, TestRequest::get().uri("/healthz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let ready = json_body(res).await;
    // With the worker role, each model provider's breaker is reported too.
    assert_eq!(
        ready["checks"],
        json!({"redis": "ok", "postgres": "ok", "model:builtin": "ok"})
    );

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
    let dead_redis = env.services().settings(settings).build();

    let app = test::init_service(api::app(dead_redis.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    let p = assert_problem(res, 503).await;
    assert!(p["detail"].as_str().unwrap().contains("redis"), "{p}");

    // A relay needs only Postgres.
    let relay = Roles::of(&[Role::Relay]);
    let app = test::init_service(api::app(dead_redis.api(), relay, Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await["checks"], json!({"postgres": "ok"}));
}

#[actix_web::test]
async fn metrics_expose_contract_names_serve_cached_gauges_and_count_route_templates() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, post("acme", "metrics-key-000001", BODY).to_request()).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();
    let res = test::call_service(&app, get("acme", &job_id).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = test::call_service(&app, TestRequest::get().uri("/no/such/route").to_request()).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    // Gauge sources: one pending delivery, one dead letter, one unsent outbox row.
    let mut r = env.redis().await;
    summaryd::stream::consumer_group::ensure_group(&mut r, services.keys.get(0))
        .await
        .unwrap();
    // A consumer's read dispatches the job from its tenant's lane and leaves it pending.
    let taken = summaryd::stream::consumer_group::read_new(
        &mut r,
        services.keys.get(0),
        "c1",
        1,
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(taken.len(), 1);
    let _: String = r
        .xadd(
            services.keys.get(0).dead_letters(),
            "*",
            &[("job_id", job_id.as_str())],
        )
        .await
        .unwrap();
    let [msg] = stream_messages(&env).await.try_into().unwrap();
    db::summaries::commit_with_outbox(&services.pg, &msg, &crate::shared::model_summary("s"))
        .await
        .unwrap();

    let scrape = || async {
        let res = test::call_service(&app, TestRequest::get().uri("/metrics").to_request()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(
            header(&res, "content-type")
                .unwrap()
                .starts_with("text/plain")
        );
        String::from_utf8(test::read_body(res).await.to_vec()).unwrap()
    };
    // A scrape serves the cache: nothing was measured yet, so the gauges are not exported
    // (never a 0 nobody measured).
    let text = scrape().await;
    for name in [
        "summaryd_stream_pending",
        "summaryd_dead_letters",
        "summaryd_outbox_unsent",
        "summaryd_stream_lag",
        "summaryd_oldest_queued_age_seconds",
    ] {
        assert!(
            !text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} exported before any measurement:\n{text}"
        );
    }
    services.maintenance(Roles::all()).run_once().await.unwrap();
    let text = scrape().await;
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
        "summaryd_stream_lag",
        "summaryd_oldest_queued_age_seconds",
        "summaryd_job_latency_seconds",
        "summaryd_http_request_duration_seconds",
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
        "summaryd_stream_lag 0",
        r#"summaryd_http_request_duration_seconds_count{route="/v1/summaries"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    assert!(!text.contains(&job_id), "raw paths must not become labels");

    // Scrapes keep serving the cached value until maintenance refreshes it.
    let _: String = r
        .xadd(
            services.keys.get(0).dead_letters(),
            "*",
            &[("job_id", "another")],
        )
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(
            scrape()
                .await
                .lines()
                .any(|l| l == "summaryd_dead_letters 1")
        );
    }
    services.maintenance(Roles::all()).run_once().await.unwrap();
    assert!(
        scrape()
            .await
            .lines()
            .any(|l| l == "summaryd_dead_letters 2")
    );
}

#[actix_web::test]
async fn openapi_describes_every_route_and_status() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
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
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, TestRequest::get().uri("/v2/nothing").to_request()).await;
    assert_problem(res, 404).await;
    let res = test::call_service(&app, TestRequest::put().uri("/v1/summaries").to_request()).await;
    assert_eq!(header(&res, "allow").as_deref(), Some("POST"));
    assert_problem(res, 405).await;
}

#[actix_web::test]
async fn worker_only_server_serves_ops_routes_but_not_v1() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let server = api::build_server(
        services.api(),
        Roles::of(&[Role::Worker]),
        shutdown.clone(),
        listener,
        None,
        None,
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
        env.services().settings(settings).build().api(),
        Roles::all(),
        shutdown.clone(),
        listener,
        None,
        None,
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
