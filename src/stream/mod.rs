//! The Redis Stream that carries jobs from the API to the workers: wire format, enqueue,
//! consuming with a consumer group, and the dead-letter stream.

pub mod dlq;
mod enqueue;
pub mod job_state;
pub mod message;

pub use enqueue::enqueue;
pub use message::{JobMessage, JobPayload, MalformedMessage};
