// A receiver's check of a summaryd webhook (Standard Webhooks), in Rust: the README's
// example, and compiled and run against real relay requests by the test suite
// (tests/it/webhook_example.rs includes this file), so it cannot drift from what summaryd
// sends.
//
// Dependencies: hmac 0.13, sha2 0.11, base64 0.22.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How far `webhook-timestamp` may be from the receiver's clock: older requests are
/// refused, so a captured request cannot be replayed later.
const TOLERANCE_S: i64 = 5 * 60;

/// Check one request: `secret` is the `whsec_…` value, `id`, `timestamp` and `signatures`
/// the `webhook-id`, `webhook-timestamp` and `webhook-signature` headers, `body` the raw
/// bytes as received (before any JSON parsing), `now` the receiver's Unix time. Then
/// deduplicate on `id`: a retry carries the same one.
pub fn verify_webhook(
    secret: &str,
    id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now: i64,
) -> Result<(), &'static str> {
    let key = STANDARD
        .decode(
            secret
                .strip_prefix("whsec_")
                .ok_or("secret must start with whsec_")?,
        )
        .map_err(|_| "secret is not base64")?;
    let sent_at: i64 = timestamp.parse().map_err(|_| "bad webhook-timestamp")?;
    if (now - sent_at).abs() > TOLERANCE_S {
        return Err("webhook-timestamp too far from now");
    }
    // Several signatures when summaryd's operator is rotating secrets: one match is enough.
    for signature in signatures.split(' ') {
        let Some(encoded) = signature.strip_prefix("v1,") else {
            continue;
        };
        let Ok(expected) = STANDARD.decode(encoded) else {
            continue;
        };
        let mut mac = HmacSha256::new_from_slice(&key).map_err(|_| "bad key")?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        // Constant-time comparison.
        if mac.verify_slice(&expected).is_ok() {
            return Ok(());
        }
    }
    Err("no valid signature")
}
