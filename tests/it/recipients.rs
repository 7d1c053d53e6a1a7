//! Whom summaryd emails for a client (`docs/security.md`, "Abuse: summaryd as a mail
//! relay"): `notify` must be a public dotted domain name the tenant's policy allows, refused
//! with a 422 naming `notify` before anything is stored; and one recipient gets at most
//! `notify_per_hour` jobs' emails from one tenant in any rolling hour, counted in the same
//! atomic step that accepts a job (429; a replay is never refused). Effects are read from
//! Redis: the stream, idempotency records, the recipient's window.

use actix_web::test::{self, TestRequest};
use redis::AsyncCommands;
use summaryd::api;
use summaryd::api::auth::token_sha256;
use summaryd::config::DomainList;
use summaryd::config::roles::Roles;
use summaryd::domain::Email;
use summaryd::infra::keys::ScopedKey;
use summaryd::shutdown::Shutdown;

use crate::shared::TestEnv;
use crate::shared::test_env::Services;

const ACME: &str = "acme-recipients-token";
const GLOBEX: &str = "globex-recipients-token";

fn tokens_file(acme: &str, globex: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let text = format!(
        "[tenants.acme]\ntoken_sha256 = \"{}\"\n{acme}\n[tenants.globex]\ntoken_sha256 = \"{}\"\n{globex}\n",
        token_sha256(ACME),
        token_sha256(GLOBEX)
    );
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file
}

fn body(key: &str, notify: &str) -> String {
    serde_json::json!({"text": format!("Recipients test {key}. Revenue grew."), "notify": notify})
        .to_string()
}

fn post_as(token: &str, key: &str, notify: &str) -> TestRequest {
    TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Authorization", format!("Bearer {token}")))
        .set_payload(body(key, notify))
}

fn post_header_mode(tenant: &str, key: &str, notify: &str) -> TestRequest {
    TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("X-Tenant-Id", tenant))
        .set_payload(body(key, notify))
}

/// Jobs queued, on the job stream or in a tenant's lane.
async fn stream_len(env: &TestEnv) -> u64 {
    crate::shared::api_requests::stream_len(env).await as u64
}

async fn has_record(env: &TestEnv, services: &Services, tenant: &str, key: &str) -> bool {
    let scoped = ScopedKey::summaries(
        &summaryd::domain::TenantId::parse(tenant).unwrap(),
        &summaryd::domain::IdempotencyKey::parse(key).unwrap(),
    );
    env.redis()
        .await
        .exists(services.keys.get(0).idempotency(&scoped))
        .await
        .unwrap()
}

fn token_mode(env: &TestEnv, file: &tempfile::NamedTempFile) -> Services {
    let mut settings = env.settings.clone();
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    env.services().settings(settings).build()
}

async fn problem<B: actix_web::body::MessageBody>(
    res: actix_web::dev::ServiceResponse<B>,
) -> serde_json::Value {
    test::read_body_json(res).await
}

#[actix_web::test]
async fn a_tenants_notify_domains_refuse_other_recipients_before_anything_is_stored() {
    let env = TestEnv::new().await;
    let file = tokens_file(r#"notify_domains = ["acme.com", "*.acme.com"]"#, "");
    let services = token_mode(&env, &file);
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

    for (n, outside) in ["a@evil.io", "a@acme.com.evil.io", "a@notacme.com"]
        .into_iter()
        .enumerate()
    {
        let key = format!("domains-outside-{n:04}");
        let res = test::call_service(&app, post_as(ACME, &key, outside).to_request()).await;
        assert_eq!(res.status(), 422, "{outside}");
        let p = problem(res).await;
        assert_eq!(p["field"], "notify", "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("acme.com, *.acme.com"),
            "{p}"
        );
        assert!(
            !has_record(&env, &services, "acme", &key).await,
            "{outside}"
        );
    }
    assert_eq!(stream_len(&env).await, 0, "nothing refused is queued");

    for (n, inside) in ["a@acme.com", "b@eu.acme.com", "c@ACME.com"]
        .into_iter()
        .enumerate()
    {
        let key = format!("domains-inside-{n:04}");
        let res = test::call_service(&app, post_as(ACME, &key, inside).to_request()).await;
        assert_eq!(res.status(), 202, "{inside}");
    }
    // A tenant without a policy may notify any domain.
    let res = test::call_service(
        &app,
        post_as(GLOBEX, "domains-globex-0001", "a@evil.io").to_request(),
    )
    .await;
    assert_eq!(res.status(), 202);
    assert_eq!(stream_len(&env).await, 4);
}

#[actix_web::test]
async fn header_mode_holds_every_tenant_to_summaryd_notify_domains() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.notify.domains = Some(DomainList::Joined("example.com,*.example.org".into()));
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

    let res = test::call_service(
        &app,
        post_header_mode("t1", "header-outside-0001", "a@acme.com").to_request(),
    )
    .await;
    assert_eq!(res.status(), 422);
    assert_eq!(problem(res).await["field"], "notify");
    for (n, ok) in ["a@example.com", "a@x.example.org"].into_iter().enumerate() {
        let key = format!("header-inside-{n:04}");
        let res = test::call_service(&app, post_header_mode("t1", &key, ok).to_request()).await;
        assert_eq!(res.status(), 202, "{ok}");
    }
    assert_eq!(stream_len(&env).await, 2);
}

/// The relay-abuse targets of an open form: the sending machine, internal hosts, bare
/// names, and addresses that read as another one in a log or a mail client.
#[actix_web::test]
async fn recipients_that_are_not_public_dotted_names_are_422_naming_notify() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    for (n, bad) in [
        "a@localhost",
        "x@10.0.0.5",
        "x@[10.0.0.5]",
        "a@b",
        "a@b.co\u{202E}",
        "a\u{0085}b@b.co",
        "a\u{200B}@b.co",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("bad-recipient-{n:04}");
        let res = test::call_service(&app, post_header_mode("t1", &key, bad).to_request()).await;
        assert_eq!(res.status(), 422, "{bad:?}");
        let p = problem(res).await;
        assert_eq!(p["field"], "notify", "{bad:?}: {p}");
        assert!(!has_record(&env, &services, "t1", &key).await);
    }
    let res = test::call_service(
        &app,
        post_header_mode("t1", "good-recipient-01", "ops@example.test").to_request(),
    )
    .await;
    assert_eq!(res.status(), 202, "reserved test names stay valid");
    assert_eq!(stream_len(&env).await, 1);
}

#[actix_web::test]
async fn notify_per_hour_counts_per_recipient_and_tenant_and_never_refuses_a_replay() {
    let env = TestEnv::new().await;
    // acme has its own figure; globex takes the deployment's default.
    let file = tokens_file("notify_per_hour = 2", "");
    let mut settings = env.settings.clone();
    settings.notify.per_hour = Some(1);
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    let call = |token: &'static str, key: &'static str, to: &'static str| {
        test::call_service(&app, post_as(token, key, to).to_request())
    };

    assert_eq!(
        call(ACME, "notify-rate-0001", "bob@acme.com")
            .await
            .status(),
        202
    );
    // Another spelling of the same mailbox counts against the same window.
    assert_eq!(
        call(ACME, "notify-rate-0002", "BOB@Acme.COM")
            .await
            .status(),
        202
    );
    let refused = call(ACME, "notify-rate-0003", "bob@acme.com").await;
    assert_eq!(refused.status(), 429);
    let wait: u64 = refused
        .headers()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (3590..=3600).contains(&wait),
        "the oldest email ages out in an hour: {wait}"
    );
    let p = problem(refused).await;
    assert!(
        p["detail"].as_str().unwrap().contains("notify_per_hour"),
        "{p}"
    );
    assert!(!has_record(&env, &services, "acme", "notify-rate-0003").await);
    assert_eq!(stream_len(&env).await, 2, "a refused job is not queued");

    // A replay of an accepted request is answered from its record, never refused.
    let replay = call(ACME, "notify-rate-0001", "bob@acme.com").await;
    assert_eq!(replay.status(), 202);
    assert_eq!(replay.headers().get("idempotent-replayed").unwrap(), "true");
    // Another recipient has a window of its own, and so has another tenant.
    assert_eq!(
        call(ACME, "notify-rate-0004", "carol@acme.com")
            .await
            .status(),
        202
    );
    assert_eq!(
        call(GLOBEX, "notify-rate-0005", "bob@acme.com")
            .await
            .status(),
        202
    );
    assert_eq!(
        call(GLOBEX, "notify-rate-0006", "bob@acme.com")
            .await
            .status(),
        429,
        "the default SUMMARYD_NOTIFY_PER_HOUR holds for a tenant without its own"
    );

    // The window holds the accepted jobs' ids, keyed by a hash of the mailbox.
    let bob = Email::parse_recipient("bob@acme.com")
        .unwrap()
        .recipient_id();
    let window = services.keys.get(0).notify_window("acme", &bob);
    let mut redis = env.redis().await;
    let members: Vec<(String, f64)> = redis.zrange_withscores(&window, 0, -1).await.unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    let ttl: i64 = redis.pttl(&window).await.unwrap();
    assert!((3_500_000..=3_600_000).contains(&ttl), "{ttl}");

    // An hour later both have aged out: the recipient may be emailed again.
    for (member, score) in &members {
        let _: () = redis
            .zadd(&window, member, score - 3_600_001.0)
            .await
            .unwrap();
    }
    assert_eq!(
        call(ACME, "notify-rate-0003", "bob@acme.com")
            .await
            .status(),
        202
    );
    let members: Vec<String> = redis.zrange(&window, 0, -1).await.unwrap();
    assert_eq!(
        members.len(),
        1,
        "aged-out members are trimmed: {members:?}"
    );
    assert_eq!(stream_len(&env).await, 5);
}
