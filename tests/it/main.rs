//! One integration-test binary (one link step) with a module per area.

mod common;
#[path = "../shared/mod.rs"]
mod shared;

mod admin;
mod api;
mod app;
mod auth;
mod idempotency;
mod mail_relay;
mod model_retries;
mod providers;
mod relay;
mod retry;
mod worker;

#[tokio::test]
async fn harness_gives_each_test_a_migrated_database_and_prefix() {
    let a = common::TestEnv::new().await;
    let b = common::TestEnv::new().await;
    assert_ne!(a.db_name, b.db_name);
    assert_ne!(a.settings.key_prefix, b.settings.key_prefix);
    assert_eq!(a.count("summaries").await, 0);
    assert_eq!(a.count("outbox").await, 0);
}
