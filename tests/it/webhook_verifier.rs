//! The webhook verifier of the tests (`shared::standard_webhooks`, the Standard Webhooks
//! reference library behind `scripts/verify-webhooks.sh`) can both pass and fail: requests
//! signed by hand here, sent with reqwest to an `HttpStub`, verify exactly when a receiver
//! should accept them. Without this, a verifier that accepted everything would let any
//! webhook test pass.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{KeyInit, Mac};
use serde_json::json;

use crate::shared::http_stub::{HttpStub, Recorded, Reply};
use crate::shared::standard_webhooks::{verify, verify_all};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// `whsec_` and the base64 of 32 fresh random bytes.
fn new_secret() -> String {
    format!("whsec_{}", BASE64.encode(rand::random::<[u8; 32]>()))
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed with the secret's bytes.
fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let key = BASE64
        .decode(secret.strip_prefix("whsec_").expect("whsec_ prefix"))
        .expect("secret is base64");
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&key).expect("any key length");
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn message_id() -> String {
    format!("msg_{}", uuid::Uuid::new_v4().simple())
}

/// POST `body` with the three Standard Webhooks headers to `stub`; what the stub recorded.
async fn post(stub: &HttpStub, id: &str, timestamp: i64, signature: &str, body: &str) -> Recorded {
    let sent = stub.requests().len();
    let response = reqwest::Client::new()
        .post(stub.url("/hooks/summaryd"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body.to_owned())
        .send()
        .await
        .expect("POST to the stub");
    assert_eq!(response.status(), 204);
    let requests = stub.requests();
    assert_eq!(requests.len(), sent + 1);
    requests.into_iter().next_back().unwrap()
}

async fn receiver() -> HttpStub {
    HttpStub::start(Reply::text(204, "")).await
}

fn payload(n: u32) -> serde_json::Value {
    json!({
        "type": "summary.ready",
        "timestamp": "2026-12-02T11:40:00Z",
        "data": {"job_id": format!("job-{n}"), "summary": "Renewal agreed; pricing next week. ✓"}
    })
}

/// The example of the Standard Webhooks specification: the hand signer below signs what
/// the specification signs, independently of the verifier under test.
#[test]
fn the_hand_signer_reproduces_the_specifications_example() {
    assert_eq!(
        sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#
        ),
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    );
}

#[tokio::test]
async fn a_correctly_signed_request_verifies_and_only_with_its_secret() {
    let stub = receiver().await;
    let secret = new_secret();
    let (id, ts, body) = (message_id(), now(), payload(1).to_string());
    let good = [post(&stub, &id, ts, &sign(&secret, &id, ts, &body), &body).await];

    let verdicts = verify(&secret, &good).await;
    assert!(verdicts[0].ok, "{:?}", verdicts[0]);
    assert_eq!(verdicts[0].payload, Some(payload(1)));
    assert_eq!(verdicts[0].error, None);
    assert_eq!(verify_all(&secret, &good).await, vec![payload(1)]);

    let other = verify(&new_secret(), &good).await;
    assert!(!other[0].ok, "{:?}", other[0]);
    assert_eq!(
        other[0].error.as_deref(),
        Some("WebhookVerificationError: No matching signature found")
    );
    assert_eq!(other[0].payload, None);
}

#[tokio::test]
async fn a_tampered_body_does_not_verify() {
    let stub = receiver().await;
    let secret = new_secret();
    let ts = now();
    let (good_id, good_body) = (message_id(), payload(2).to_string());
    let good = post(
        &stub,
        &good_id,
        ts,
        &sign(&secret, &good_id, ts, &good_body),
        &good_body,
    )
    .await;
    // Signed over one body, sent with another.
    let (id, signed_body) = (message_id(), payload(3).to_string());
    let tampered_body = signed_body.replace("job-3", "job-4");
    assert_ne!(tampered_body, signed_body);
    let tampered = post(
        &stub,
        &id,
        ts,
        &sign(&secret, &id, ts, &signed_body),
        &tampered_body,
    )
    .await;

    let verdicts = verify(&secret, &[good, tampered]).await;
    assert!(verdicts[0].ok, "{:?}", verdicts[0]);
    assert_eq!(verdicts[0].payload, Some(payload(2)));
    assert!(!verdicts[1].ok, "{:?}", verdicts[1]);
    assert_eq!(
        verdicts[1].error.as_deref(),
        Some("WebhookVerificationError: No matching signature found")
    );
}

/// During a rotation the sender signs with the old and the new secret; a receiver that
/// has only one of them accepts the request by its own signature, wherever it stands.
#[tokio::test]
async fn a_signature_list_verifies_by_the_signature_of_the_receivers_secret() {
    let stub = receiver().await;
    let (secret, retired) = (new_secret(), new_secret());
    let (id, ts, body) = (message_id(), now(), payload(5).to_string());
    let both = format!(
        "{} {}",
        sign(&retired, &id, ts, &body),
        sign(&secret, &id, ts, &body)
    );
    let rotated = [post(&stub, &id, ts, &both, &body).await];

    assert_eq!(verify_all(&secret, &rotated).await, vec![payload(5)]);
    assert_eq!(verify_all(&retired, &rotated).await, vec![payload(5)]);
    assert!(!verify(&new_secret(), &rotated).await[0].ok);
}

/// The library refuses a timestamp more than 5 minutes from its clock (replay protection),
/// even under a correct signature.
#[tokio::test]
async fn a_ten_minute_old_timestamp_does_not_verify() {
    let stub = receiver().await;
    let secret = new_secret();
    let (id, ts, body) = (message_id(), now() - 600, payload(6).to_string());
    let stale = post(&stub, &id, ts, &sign(&secret, &id, ts, &body), &body).await;

    let verdicts = verify(&secret, &[stale]).await;
    assert!(!verdicts[0].ok, "{:?}", verdicts[0]);
    assert_eq!(
        verdicts[0].error.as_deref(),
        Some("WebhookVerificationError: Message timestamp too old")
    );
}

/// `verify_all` is the assertion the webhook tests use: it panics, naming the request,
/// when one of them does not verify.
#[tokio::test]
async fn verify_all_panics_naming_the_request_that_does_not_verify() {
    let stub = receiver().await;
    let secret = new_secret();
    let ts = now();
    let (id, body) = (message_id(), payload(7).to_string());
    let good = post(&stub, &id, ts, &sign(&secret, &id, ts, &body), &body).await;
    let unsigned = post(&stub, &message_id(), ts, "v1,", &body).await;

    let failed = tokio::spawn(async move { verify_all(&secret, &[good, unsigned]).await })
        .await
        .expect_err("verify_all must panic");
    let message = failed
        .into_panic()
        .downcast::<String>()
        .map(|m| *m)
        .unwrap_or_default();
    assert!(
        message.contains("1 of 2 webhook requests do not verify")
            && message.contains("request 1 (POST /hooks/summaryd)")
            && message.contains("No matching signature found"),
        "{message}"
    );
}
