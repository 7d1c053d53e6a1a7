//! Requests to the in-process API (`actix_web::test`) and reading its answers, for the
//! tests of the HTTP contract, and the Redis state those requests leave behind.

use actix_web::test::{self, TestRequest};
use redis::AsyncCommands;
use serde_json::Value;
use summaryd::domain::{IdempotencyKey, Job, TenantId};
use summaryd::infra::keys::{RedisKeys, ScopedKey};
use summaryd::stream::job_entry;

use crate::shared::TestEnv;
use crate::shared::test_env::Services;

pub const BODY: &str =
    r#"{"text":"Quarterly numbers are up. Churn is down.","notify":"ops@example.com"}"#;

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

/// Jobs queued: entries on the job stream and in every tenant's lane (the API puts a job
/// in its tenant's lane; dispatch moves it onto the stream).
pub async fn stream_len(env: &TestEnv) -> usize {
    queued_entries(env).await.len()
}

/// Every job message queued (the job stream's entries, then each active lane's, oldest
/// first within each).
pub async fn stream_messages(env: &TestEnv) -> Vec<Job> {
    queued_entries(env)
        .await
        .iter()
        .map(|e| job_entry::from_fields(&e.map).unwrap())
        .collect()
}

/// The raw entries of the job stream and of every active lane (found through the active
/// lanes set, as the service finds them).
pub async fn queued_entries(env: &TestEnv) -> Vec<redis::streams::StreamId> {
    let keys = RedisKeys::new(env.settings.key_prefix.clone());
    let mut r = env.redis().await;
    let reply: redis::streams::StreamRangeReply = r.xrange_all(keys.stream()).await.unwrap();
    let mut entries = reply.ids;
    let tenants: Vec<String> = r.zrange(keys.lanes(), 0, -1).await.unwrap();
    for tenant in tenants {
        let lane: redis::streams::StreamRangeReply =
            r.xrange_all(keys.lane(&tenant)).await.unwrap();
        entries.extend(lane.ids);
    }
    entries
}

/// Redis key of the idempotency record for (tenant, key).
pub fn record_key(services: &Services, tenant: &str, key: &str) -> String {
    let scoped = ScopedKey::summaries(
        &TenantId::parse(tenant).unwrap(),
        &IdempotencyKey::parse(key).unwrap(),
    );
    services.keys.get(0).idempotency(&scoped)
}

/// The job id the API derives for `body` under (tenant, key).
pub fn job_id_for(tenant: &str, key: &str, body: &str) -> String {
    let request: summaryd::domain::SummaryRequest = serde_json::from_str(body).unwrap();
    ScopedKey::summaries(
        &TenantId::parse(tenant).unwrap(),
        &IdempotencyKey::parse(key).unwrap(),
    )
    .job_id(
        &request
            .validate(summaryd::domain::WebhookRules::default())
            .unwrap()
            .fingerprint()
            .unwrap(),
    )
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

/// A tokens file with one table per `(tenant, token, extra lines)`: the token's SHA-256
/// and the tenant's other fields (limits, budget, weight, …) as TOML lines.
pub fn tokens_file(tenants: &[(&str, &str, &str)]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let mut text = String::new();
    for (tenant, token, extra) in tenants {
        text.push_str(&format!(
            "[tenants.{tenant}]\ntoken_sha256 = \"{}\"\n{extra}\n",
            summaryd::api::auth::token_sha256(token)
        ));
    }
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file
}
