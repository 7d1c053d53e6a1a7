//! The README's Rust receiver (docs/examples/webhook_receiver.rs), compiled here and run
//! against a real request of the relay: the example a client copies verifies what summaryd
//! sends, and refuses what it must refuse.

use std::time::{Duration, SystemTime};

use summaryd::config::roles::Roles;
use summaryd::domain::WebhookSecret;

use crate::shared::http_stub::{HttpStub, Reply};
use crate::shared::running::Running;
use crate::shared::{TestEnv, eventually};

#[path = "../../docs/examples/webhook_receiver.rs"]
mod example;

#[tokio::test]
async fn the_readme_s_rust_receiver_verifies_a_real_webhook_and_refuses_a_forged_one() {
    let env = TestEnv::new().await;
    let receiver = HttpStub::start(Reply::text(200, "ok")).await;
    let secret = WebhookSecret::generate();
    let secrets_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secrets_file.path(), format!("{secret}\n")).unwrap();
    let mut settings = env.settings.clone();
    settings.webhook.secrets_file = Some(secrets_file.path().to_path_buf());
    settings.webhook.allow_http = true;
    settings.webhook.allow_private = true;
    let app = env
        .services()
        .settings(settings)
        .application(Roles::all())
        .await;
    let running = Running::start(app);
    let response = reqwest::Client::new()
        .post(format!("{}/v1/summaries", running.base))
        .header("Idempotency-Key", "webhook-example-0001")
        .header("X-Tenant-Id", "acme")
        .json(&serde_json::json!({
            "text": "Q3 call notes: renewal agreed. Pricing follows next week.",
            "webhook": {"url": receiver.url("/hooks/summaryd")},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert!(
        eventually(Duration::from_secs(20), || async {
            !receiver.requests().is_empty()
        })
        .await,
        "the webhook arrives"
    );
    running.stop().await;

    let request = &receiver.requests()[0];
    let header = |name: &str| request.header(name).unwrap_or_default().to_owned();
    let (id, timestamp, signature) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let verify = |secret: &str, body: &[u8], now: i64| {
        example::verify_webhook(secret, &id, &timestamp, &signature, body, now)
    };
    assert_eq!(verify(&secret, &request.body, now), Ok(()));
    assert_eq!(request.json()["type"], "summary.completed");

    let mut forged = request.body.clone();
    forged.extend_from_slice(b" ");
    assert_eq!(
        verify(&secret, &forged, now),
        Err("no valid signature"),
        "a changed body"
    );
    assert_eq!(
        verify(&WebhookSecret::generate(), &request.body, now),
        Err("no valid signature"),
        "another secret"
    );
    assert_eq!(
        verify(&secret, &request.body, now + 600),
        Err("webhook-timestamp too far from now"),
        "a replay ten minutes later"
    );
}
