//! Token mode (docs/reference.md, Tenants): the tenant comes from the bearer token,
//! X-Tenant-Id is ignored, and nothing is enqueued for a request that is not authenticated.

use actix_web::test::{self, TestRequest};
use summaryd::api;
use summaryd::api::auth::token_sha256;
use summaryd::config::Settings;
use summaryd::config::roles::Roles;
use summaryd::domain::{IdempotencyKey, TenantId};
use summaryd::infra::keys::ScopedKey;
use summaryd::shutdown::Shutdown;

use crate::shared::TestEnv;

const BODY: &str = r#"{"text":"Renewal agreed.","notify":"am@example.com"}"#;

fn tokens_file(extra_for_acme: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let text = format!(
        "[tenants.acme]\ntoken_sha256 = \"{}\"\n{extra_for_acme}\n\n[tenants.globex]\ntoken_sha256 = \"{}\"\n",
        token_sha256("acme-secret-token"),
        token_sha256("globex-secret-token"),
    );
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file
}

fn post(token: Option<&str>, key: &str) -> TestRequest {
    let mut req = TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Idempotency-Key", key))
        // Ignored in token mode: a client cannot act for another tenant by naming it.
        .insert_header(("X-Tenant-Id", "globex"))
        .set_payload(BODY);
    if let Some(token) = token {
        req = req.insert_header(("Authorization", format!("Bearer {token}")));
    }
    req
}

/// Jobs queued, on the job stream or in a tenant's lane.
async fn stream_len(env: &TestEnv) -> u64 {
    crate::shared::api_requests::stream_len(env).await as u64
}

fn settings_with(env: &TestEnv, file: &tempfile::NamedTempFile) -> Settings {
    let mut settings = env.settings.clone();
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    settings
}

#[actix_web::test]
async fn the_token_names_the_tenant_and_bad_tokens_are_401() {
    let env = TestEnv::new().await;
    let file = tokens_file("");
    let services = env.services().settings(settings_with(&env, &file)).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

    let key = "token-mode-key-00001";
    let res = test::call_service(&app, post(Some("acme-secret-token"), key).to_request()).await;
    assert_eq!(res.status(), 202);
    let body: serde_json::Value = test::read_body_json(res).await;
    let expected = ScopedKey::summaries(
        &TenantId::parse("acme").unwrap(),
        &IdempotencyKey::parse(key).unwrap(),
    )
    .job_id(
        &serde_json::from_str::<summaryd::domain::SummaryRequest>(BODY)
            .unwrap()
            .validate(summaryd::domain::WebhookRules::default())
            .unwrap()
            .fingerprint()
            .unwrap(),
    );
    assert_eq!(
        body["job_id"],
        expected.to_string(),
        "scoped to the token's tenant"
    );

    for token in [None, Some("wrong-token"), Some("")] {
        let res = test::call_service(&app, post(token, "token-mode-key-00002").to_request()).await;
        assert_eq!(res.status(), 401, "{token:?}");
        assert_eq!(res.headers().get("www-authenticate").unwrap(), "Bearer");
        assert_eq!(
            res.headers().get("content-type").unwrap(),
            "application/problem+json"
        );
    }
    assert_eq!(
        stream_len(&env).await,
        1,
        "only the authenticated request was enqueued"
    );

    // The job is visible to its tenant only; another tenant's token gets 404.
    let get = |token: &str| {
        TestRequest::get()
            .uri(&format!("/v1/summaries/{expected}"))
            .insert_header(("Authorization", format!("Bearer {token}")))
            .to_request()
    };
    assert_eq!(
        test::call_service(&app, get("acme-secret-token"))
            .await
            .status(),
        200
    );
    assert_eq!(
        test::call_service(&app, get("globex-secret-token"))
            .await
            .status(),
        404
    );
}

#[actix_web::test]
async fn a_tenant_over_its_rate_gets_429_with_retry_after() {
    let env = TestEnv::new().await;
    let file = tokens_file("rate_per_s = 0.01\nburst = 2");
    let services = env.services().settings(settings_with(&env, &file)).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    for n in 0..2 {
        let res = test::call_service(
            &app,
            post(Some("acme-secret-token"), &format!("rate-limit-key-{n:05}")).to_request(),
        )
        .await;
        assert_eq!(res.status(), 202);
    }
    let res = test::call_service(
        &app,
        post(Some("acme-secret-token"), "rate-limit-key-00009").to_request(),
    )
    .await;
    assert_eq!(res.status(), 429);
    let wait: u64 = res
        .headers()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1);
    let res = test::call_service(
        &app,
        post(Some("globex-secret-token"), "rate-limit-key-00010").to_request(),
    )
    .await;
    assert_eq!(res.status(), 202, "other tenants keep their own budget");
    assert_eq!(stream_len(&env).await, 3);
}

#[test]
fn an_invalid_tokens_file_is_a_configuration_error_naming_the_setting() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, b"[tenants.acme]\ntoken_sha256 = \"not-hex\"\n").unwrap();
    let mut settings = Settings::default();
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    let err = summaryd::api::auth::from_settings(&settings.auth, &settings.notify)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("SUMMARYD_AUTH_TOKENS_FILE") && err.contains("64 hex"),
        "{err}"
    );
}
