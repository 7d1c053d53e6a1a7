//! One integration-test binary (one link step) with a module per area.

#[path = "../support/mod.rs"]
mod shared;

mod admin;
mod api;
mod app;
mod auth;
mod backends;
mod browser_smoke;
mod budgets;
mod bulk;
mod console;
mod console_browser;
mod fairness;
mod finishing;
mod front_door;
mod group_commit;
mod healthcheck;
mod idempotency;
mod long_documents;
mod maintenance;
mod model_api_retries;
mod model_calls;
mod model_chain;
mod otlp_receiver;
mod outages;
mod pause;
mod properties;
mod provider_limits;
mod providers;
mod recipients;
mod redis_cluster;
mod relay_http_mail;
mod relay_outbox;
mod replicas;
mod retention;
mod retry_policy;
mod shards;
mod stalls;
mod tenant_limits;
mod tracing;
mod webhook_admin;
mod webhook_example;
mod webhook_verifier;
mod webhooks;
mod worker;

#[tokio::test]
async fn harness_gives_each_test_a_migrated_database_and_prefix() {
    let a = shared::TestEnv::new().await;
    let b = shared::TestEnv::new().await;
    assert_ne!(a.db_name, b.db_name);
    assert_ne!(a.settings.key_prefix, b.settings.key_prefix);
    assert_eq!(a.count("summaries").await, 0);
    assert_eq!(a.count("outbox").await, 0);
}
