//! How the service waits and decides whether to try again: backoff growth and jitter, the
//! circuit breaker in front of a provider, and the vocabulary for failures. Pure: nothing
//! here does I/O.

pub(crate) mod backoff;
pub(crate) mod breaker;
pub mod failure;
