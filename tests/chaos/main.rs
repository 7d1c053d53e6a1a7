//! Crash and chaos tests against the real `summaryd` binary: several processes, kill -9,
//! SIGTERM, dropped Postgres sessions and a restarted Redis. See docs/testing.md.
//!
//! Each test builds its own world (database, key prefix or private Redis, fake model API,
//! mail sink, webhook receiver) and ends with the same exactly-once check: summaries rows =
//! accepted job ids = distinct Idempotency-Keys at the mail sink (and, for jobs that asked
//! for a webhook, = distinct webhook-ids the receiver accepted), and every GET says done.
// The harness draws its fakes' latencies and the chaos schedule at random; the rule that
// every wait comes from the service's backoff module is about the service, not its tests.
#![allow(clippy::disallowed_methods)]

mod harness;
#[path = "../support/mod.rs"]
mod shared;

mod backends;
mod chaos;
mod cleartext;
mod cluster;
mod consumer_cleanup;
mod front_door;
mod group_commit;
mod kill_api;
mod kill_worker;
mod long_documents;
mod model_outage;
mod outages;
mod pg_drop;
mod poison;
mod provider_limits;
mod recipients;
mod redis_restart;
mod sigterm;
mod slow_heads;
mod tracing;
mod webhooks;

/// A fresh run id for idempotency keys, so keys never repeat across runs or tests.
pub fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}
