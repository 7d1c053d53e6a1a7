//! The Redis Stream that carries jobs from the API to the workers.
//!
//! - `job_entry`: a `domain::Job` as a stream entry (the on-wire field names).
//! - `enqueue`: put a job on the stream with its state, plainly or once per idempotency
//!   key (`enqueue_once.lua`).
//! - `consumer_group`: the group plumbing a worker uses: read, reclaim, count deliveries, ack.
//! - `job_state`: the per-job hash GET reads until Postgres has the summary.
//! - `dead_letters`: the dead-letter stream: move a job there, list, filter, replay, count.
//! - `bulk`: an operator's replay or purge of many dead letters, resumable by any process.
//! - `pause`: the fleet-wide pause of consumption (who, why, since when).
//! - `lanes`: per-tenant lanes in front of the stream and the dispatch that schedules them
//!   fairly (weights, `max_concurrent`).
//! - `tenant_limits`: per-tenant rate and in-flight limits, checked in the enqueue script.
//! - `budget`: per-tenant token budgets, reserved in the enqueue script, settled when the
//!   job finishes.
//! - `layout`: the refusal to start over work another shard count left behind.
//! - `replicas`: confirming that writes reached the primary's replicas (WAIT).

pub mod budget;
pub mod bulk;
pub mod consumer_group;
pub mod dead_letters;
mod enqueue;
pub mod job_entry;
pub mod job_state;
pub mod lanes;
pub mod layout;
pub mod pause;
pub mod replicas;
pub mod tenant_limits;

pub use consumer_group::Delivery;
pub use enqueue::{
    Admit, ENQUEUE_ONCE_LUA, EnqueueOnce, IdempotencyRecord, enqueue, enqueue_once,
    enqueue_once_confirmed,
};
pub use job_entry::MalformedMessage;
pub use tenant_limits::{Limit, OverLimit, TenantLimits};
