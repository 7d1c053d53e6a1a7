//! The Redis Stream that carries jobs from the API to the workers: wire format, enqueue,
//! consuming with a consumer group, and the dead-letter stream.

pub mod consumer;
pub mod dead_letter;
pub mod dlq;
mod enqueue;
pub mod job_state;
pub mod message;

pub use consumer::Delivery;
pub use dead_letter::dead_letter;
pub use enqueue::{ENQUEUE_ONCE_LUA, EnqueueOnce, enqueue, enqueue_once};
pub use message::{JobMessage, JobPayload, MalformedMessage};
