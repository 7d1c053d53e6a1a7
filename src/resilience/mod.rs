//! How the service waits and decides whether to try again: backoff growth and jitter, and
//! the vocabulary for failures. Pure: nothing here does I/O.

pub(crate) mod backoff;
pub mod failure;
