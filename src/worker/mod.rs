//! The worker role: consumers that take jobs off the stream, the summary job handler, and
//! the gate that stops the consumers while a dependency (Postgres, every model provider) is
//! down or consumption is paused fleet-wide (`pause.rs`).

mod acker;
mod batching;
mod checker;
mod committer;
mod complete;
mod consumer;
mod dead_reason;
mod delivery;
mod finishing;
pub(crate) mod gate;
mod handler;
mod job_error;
mod liveness;
mod parts;
mod pause;
mod run;
mod settle;
mod take;

use std::sync::Arc;

pub(crate) use acker::Acker;
pub use batching::{Batching, Joining};
pub use checker::{CHECKS_IN_FLIGHT, Checker};
pub use committer::{Committed, Committer};
pub use consumer::{Consumer, ConsumerConfig, WorkerError, consumer_name};
pub use dead_reason::DeadReason;
pub use gate::DependencyGate;
pub use handler::{JobOutcome, handle_summary_job};
pub use job_error::JobError;
pub(crate) use pause::{sync_pause, watch_pause};
pub use run::run;

use crate::config::Settings;
use crate::infra::keys::Shards;
use crate::infra::metrics::Metrics;
use crate::llm::ModelChain;

/// What the worker uses: the stream (Redis), the summaries and outbox tables (Postgres), and
/// the model. Cheap to clone; every consumer has its own copy.
#[derive(Clone)]
pub struct WorkerServices {
    pub(crate) settings: Arc<Settings>,
    pub keys: Shards,
    /// Dedicated connections: a consumer holds one while blocked in XREADGROUP.
    pub redis: crate::infra::redis::RedisPool,
    pub(crate) pg: deadpool_postgres::Pool,
    /// The providers, in order, with their breakers: one per process, shared by its
    /// consumers, so one consumer's failures open a breaker for all of them.
    pub(crate) model: Arc<ModelChain>,
    pub(crate) metrics: Arc<Metrics>,
    /// One per process, shared by its consumers: one consumer seeing a dependency down
    /// stops them all (`docs/delivery.md`).
    pub(crate) gate: Arc<DependencyGate>,
    /// The process's batched pre-checks: whether jobs are finished already, asked
    /// together (`checker.rs`).
    pub(crate) checks: Checker,
    /// The process's group commit: finished jobs are committed together
    /// (`committer.rs`).
    pub(crate) commits: Committer,
    /// The process's batched acknowledgements (`acker.rs`).
    pub(crate) acker: Acker,
}
