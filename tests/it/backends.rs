//! Managed-backend behaviour against real servers the tests start themselves: Postgres over
//! TLS with libpq's sslmode meanings, Redis durability settings read at startup, and the
//! private ops listener.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use summaryd::app::Application;
use summaryd::config::roles::{Role, Roles};
use summaryd::db::DbError;
use summaryd::infra::postgres::PostgresError;
use summaryd::shutdown::Shutdown;

use crate::shared::certs::TestCa;
use crate::shared::log_capture::Captured;
use crate::shared::servers::{PgCluster, RedisProc, test_dir};
use crate::shared::{FakeLlm, FakeMailer, TestEnv};

async fn ssl_in_use(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0)
}

#[tokio::test]
async fn postgres_over_tls_migrates_and_pools_with_verify_full_verify_ca_and_require() {
    let dir = test_dir("pg-tls");
    let ca = TestCa::new(dir.path(), "pg");
    let server = ca.server("pg-server", &["localhost"]);
    let pg = PgCluster::start_tls(dir.path(), &server);

    // verify-full through the certificate's name: create the database, migrate, pool.
    let url = pg.url("localhost", "summaryd", "sslmode=verify-full");
    summaryd::db::migrate::run(&url, Some(&ca.ca_file))
        .await
        .expect("migrate over verify-full");
    let pool = summaryd::infra::postgres::pool(&url, Some(&ca.ca_file), 2).expect("pool");
    let client = pool
        .get()
        .await
        .expect("pooled connection over verify-full");
    assert!(ssl_in_use(&client).await, "the pooled session is encrypted");
    let summaries: i64 = client
        .query_one("SELECT count(*) FROM summaries", &[])
        .await
        .expect("migrated table")
        .get(0);
    assert_eq!(summaries, 0);

    // The CA named in the URL instead of the setting; no sslmode then means verify-full.
    let in_url = pg.url(
        "localhost",
        "summaryd",
        &format!("sslrootcert={}", ca.ca_file.display()),
    );
    let target = summaryd::infra::postgres::PgTarget::parse(&in_url, None).unwrap();
    assert_eq!(target.mode, summaryd::infra::postgres::SslMode::VerifyFull);
    let (client, task) = target.connect().await.expect("sslrootcert= in the URL");
    assert!(ssl_in_use(&client).await);
    task.abort();

    // verify-ca: the chain is checked, the name (127.0.0.1 is not in the certificate) is not.
    let by_ip = pg.url("127.0.0.1", "summaryd", "sslmode=verify-ca");
    let (client, task) = summaryd::infra::postgres::PgTarget::parse(&by_ip, Some(&ca.ca_file))
        .unwrap()
        .connect()
        .await
        .expect("verify-ca ignores the host name");
    assert!(ssl_in_use(&client).await);
    task.abort();

    // require without a CA: encrypted, nothing verified (libpq's meaning). The server only
    // accepts TLS sessions (hostssl), so a cleartext fallback could not have connected.
    let require = pg.url("127.0.0.1", "summaryd", "sslmode=require");
    let pool = summaryd::infra::postgres::pool(&require, None, 1).expect("pool");
    let client = pool.get().await.expect("require connects without a CA");
    assert!(ssl_in_use(&client).await);
}

#[tokio::test]
async fn postgres_tls_refusals_name_the_server_and_the_reason() {
    let dir = test_dir("pg-tls-refused");
    let ca = TestCa::new(dir.path(), "pg");
    let other_ca = TestCa::new(dir.path(), "other");
    let server = ca.server("pg-server", &["localhost"]);
    let pg = PgCluster::start_tls(dir.path(), &server);
    let addr = format!("127.0.0.1:{}", pg.port);

    // verify-full against a name the certificate does not carry.
    let wrong_host = pg.url("127.0.0.1", "postgres", "sslmode=verify-full");
    let err = summaryd::db::migrate::run(&wrong_host, Some(&ca.ca_file))
        .await
        .expect_err("the host name does not match");
    assert!(
        matches!(err, DbError::Connect(PostgresError::Tls { .. })),
        "{err:?}"
    );
    let shown = err.to_string();
    for part in [addr.as_str(), "sslmode=verify-full", "not valid for name"] {
        assert!(shown.contains(part), "{part:?} missing from: {shown}");
    }

    // A CA that did not sign the server's certificate.
    let wrong_ca = pg.url("localhost", "postgres", "sslmode=verify-ca");
    let err = summaryd::infra::postgres::PgTarget::parse(&wrong_ca, Some(&other_ca.ca_file))
        .unwrap()
        .connect()
        .await
        .expect_err("unknown issuer");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    // The server refuses cleartext, so disable fails: the modes above really used TLS.
    let clear = pg.url("127.0.0.1", "postgres", "sslmode=disable");
    let err = summaryd::infra::postgres::PgTarget::parse(&clear, None)
        .unwrap()
        .connect()
        .await
        .expect_err("hostssl only");
    assert!(matches!(err, PostgresError::Connect(_)), "{err:?}");
}

/// A subscriber capturing everything this test's thread logs (see providers.rs for why the
/// second dispatcher is needed).
fn capture() -> (
    Captured,
    tracing::subscriber::DefaultGuard,
    tracing::Dispatch,
) {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let second = tracing::Dispatch::new(tracing_subscriber::registry());
    (logs, tracing::subscriber::set_default(subscriber), second)
}

async fn build_api(env: &TestEnv, redis_url: String) -> Application {
    let mut settings = env.settings.clone();
    settings.redis_url = redis_url.into();
    Application::build(
        settings,
        Roles::of(&[Role::Api]),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
        false,
    )
    .await
    .expect("a durability risk is a warning, not a startup failure")
}

#[tokio::test]
async fn redis_without_persistence_and_with_eviction_is_warned_about_by_setting() {
    let env = TestEnv::new().await;
    let dir = test_dir("redis-risky");
    let redis = RedisProc::start(
        dir.path(),
        &[
            "--appendonly".into(),
            "no".into(),
            "--maxmemory-policy".into(),
            "allkeys-lru".into(),
        ],
    );
    let (logs, _guard, _second) = capture();
    let _app = build_api(&env, format!("redis://127.0.0.1:{}", redis.port)).await;
    let text = logs.text();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("redis_setting=\"appendonly\"") && l.contains("persists nothing")),
        "{text}"
    );
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("redis_setting=\"maxmemory-policy\"") && l.contains("allkeys-lru")),
        "{text}"
    );

    // The same check against a durable configuration stays quiet.
    let durable = RedisProc::start(
        dir.path(),
        &[
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "everysec".into(),
            "--maxmemory-policy".into(),
            "noeviction".into(),
        ],
    );
    let (logs, _guard, _second) = capture();
    let _app = build_api(&env, format!("redis://127.0.0.1:{}", durable.port)).await;
    let text = logs.text();
    assert!(!text.contains("redis_setting"), "{text}");
    assert!(text.contains("keep accepted jobs"), "{text}");
}

#[tokio::test]
async fn redis_refusing_config_get_is_reported_once_as_unchecked() {
    let env = TestEnv::new().await;
    let dir = test_dir("redis-managed");
    // What managed Redis does: CONFIG is renamed away.
    let redis = RedisProc::start(
        dir.path(),
        &["--rename-command".into(), "CONFIG".into(), "".into()],
    );
    let (logs, _guard, _second) = capture();
    let _app = build_api(&env, format!("redis://127.0.0.1:{}", redis.port)).await;
    let text = logs.text();
    assert_eq!(
        text.matches("could not check Redis durability settings")
            .count(),
        1,
        "{text}"
    );
    assert!(!text.contains("redis_setting"), "{text}");
}

#[tokio::test]
async fn with_an_ops_listener_v1_and_ops_routes_live_on_separate_ports() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.ops.listen = Some("127.0.0.1:0".parse().unwrap());
    let app = Application::build(
        settings,
        Roles::all(),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
        false,
    )
    .await
    .expect("build app");
    let main = format!("http://127.0.0.1:{}", app.port());
    let ops = format!("http://127.0.0.1:{}", app.ops_port().expect("ops port"));
    let shutdown = Shutdown::new();
    let task = tokio::spawn(app.run(shutdown.clone()));
    let http = reqwest::Client::new();
    let status = |res: reqwest::Response| res.status().as_u16();

    let post = |base: &str| {
        http.post(format!("{base}/v1/summaries"))
            .header("Idempotency-Key", "ops-port-key-000001")
            .header("X-Tenant-Id", "acme")
            .json(&json!({"text": "Revenue grew.", "notify": "ops@example.com"}))
    };
    let accepted = post(&main).send().await.unwrap();
    assert_eq!(accepted.status().as_u16(), 202);
    let job: serde_json::Value = accepted.json().await.unwrap();
    assert_eq!(
        status(post(&ops).send().await.unwrap()),
        404,
        "no /v1 on the ops port"
    );
    let job_path = format!("/v1/summaries/{}", job["job_id"].as_str().unwrap());
    let get = |base: &str| {
        http.get(format!("{base}{job_path}"))
            .header("X-Tenant-Id", "acme")
            .send()
    };
    assert_eq!(status(get(&main).await.unwrap()), 200);
    assert_eq!(status(get(&ops).await.unwrap()), 404);

    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let on_ops = http.get(format!("{ops}{path}")).send().await.unwrap();
        assert_eq!(on_ops.status().as_u16(), 200, "{path} on the ops port");
        let on_main = http.get(format!("{main}{path}")).send().await.unwrap();
        assert_eq!(
            on_main.status().as_u16(),
            404,
            "{path} not on the main port"
        );
    }
    // The ops port's metrics count the API's requests: one state behind both listeners.
    let metrics = http
        .get(format!("{ops}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("summaryd_http_requests_total")
                && l.contains("route=\"/v1/summaries\"")
                && l.contains("status=\"202\"")),
        "{metrics}"
    );

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops within the grace period")
        .expect("no panic")
        .expect("clean exit");
    assert!(
        http.get(format!("{ops}/healthz")).send().await.is_err(),
        "ops listener closed"
    );
}
