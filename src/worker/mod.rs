//! The worker role: consumers that take jobs off the stream, and the summary job handler.

mod consumer;
mod handler;

pub use consumer::{Consumer, ConsumerConfig, WorkerError, consumer_name, run};
pub use handler::{JobOutcome, handle_summary_job};
