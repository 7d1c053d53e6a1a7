//! The test harness shared by the two integration-test binaries (`tests/it`, `tests/chaos`),
//! included by path from each: the isolated world a test runs in (its own database and Redis
//! key prefix), the one services/application builder, the loopback HTTP and SMTP servers,
//! the fake providers, the request helpers for the in-process API, the Standard Webhooks
//! reference verifier for recorded webhook requests, an OTLP trace receiver decoding what is
//! exported with the OpenTelemetry protobuf classes, the private Redis and Postgres servers
//! (with certificates made per test) the TLS and durability tests start, and a headless
//! Chromium for browser tests.

#![allow(dead_code, unused_imports)] // each test binary uses a different part of this module

pub mod api_requests;
pub mod browser;
pub mod certs;
pub mod cleanup;
pub mod console;
pub mod fabricate;
pub mod fakes;
pub mod http_request;
pub mod http_stub;
pub mod log_capture;
pub mod otlp;
pub mod redis_cluster;
pub mod replicas;
pub mod running;
pub mod script;
pub mod servers;
pub mod smtp_sink;
pub mod standard_webhooks;
pub mod test_env;

use std::future::Future;
use std::time::Duration;

pub use fakes::{FakeLlm, FakeMailer, model_summary};
pub use test_env::TestEnv;

/// A deployment key for providers built outside an application (the `log` provider hashes
/// recipients with it).
pub fn log_key() -> std::sync::Arc<summaryd::infra::log_key::DeploymentKey> {
    use summaryd::infra::log_key::{DeploymentKey, LogKey};
    std::sync::Arc::new(DeploymentKey::Fixed(LogKey::from_bytes([42; 32])))
}

/// Poll `check` until true, for at most `limit`; false if it never was. The one way tests
/// wait for an effect: every look is immediate, then every 20 ms.
pub async fn eventually<F, Fut>(limit: Duration, check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_every(limit, Duration::from_millis(20), check).await
}

/// [`eventually`], looking every `every`: for a check that is costly (new connections) or
/// that must not hammer a system under load, as a real client would not.
pub async fn eventually_every<F, Fut>(limit: Duration, every: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}
