//! The worker role: consumers that take jobs off the stream, and the summary job handler.

mod consumer;
mod handler;

use std::sync::Arc;

pub use consumer::{Consumer, ConsumerConfig, WorkerError, consumer_name, run};
pub use handler::{JobOutcome, handle_summary_job};

use crate::config::Settings;
use crate::keys::RedisKeys;
use crate::llm::Llm;
use crate::metrics::Metrics;

/// What the worker uses: the stream (Redis), the summaries and outbox tables (Postgres), and
/// the model. Cheap to clone; every consumer has its own copy.
#[derive(Clone)]
pub struct WorkerServices {
    pub settings: Arc<Settings>,
    pub keys: RedisKeys,
    /// Dedicated connections: a consumer holds one while blocked in XREADGROUP.
    pub redis: deadpool_redis::Pool,
    pub pg: deadpool_postgres::Pool,
    pub llm: Arc<dyn Llm>,
    pub metrics: Arc<Metrics>,
}

/// Say at start-up what in the settings would make the worker pay the model twice.
pub fn warn_about_settings(settings: &Settings) {
    if settings.worker.claim_idle_ms <= settings.job_budget_ms {
        // Correct either way (the handler is idempotent), but a live worker still inside its
        // budget would have its message claimed from under it and the model paid twice.
        tracing::warn!(
            claim_idle_ms = settings.worker.claim_idle_ms,
            job_budget_ms = settings.job_budget_ms,
            "SUMMARYD_WORKER_CLAIM_IDLE_MS should exceed SUMMARYD_JOB_BUDGET_MS (the slowest successful delivery)"
        );
    }
}
