//! The model behind one trait; the provider is chosen by configuration.
//!
//! Providers make exactly one attempt per call: `crate::retry` owns timeouts, classification
//! and backoff, so no layer multiplies the other's retries.

mod builtin;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use builtin::BuiltinSummariser;

use crate::config::{LlmProvider, LlmSettings};

/// What went wrong in one model call. `crate::retry::is_retryable` decides what each means.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    #[error("model call timed out")]
    Timeout,
    #[error("connection to the model API failed: {0}")]
    Connect(String),
    #[error("model API answered {status}: {message}")]
    Status {
        status: u16,
        /// From `Retry-After` / `retry-after-ms`; capped by the retry module.
        retry_after: Option<Duration>,
        message: String,
    },
    #[error("malformed model response: {0}")]
    Malformed(String),
    #[error("input can never be summarised: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Other(String),
}

#[async_trait]
pub trait Llm: Send + Sync {
    /// Summarise `text`. One attempt; the caller bounds it with a wall-clock timeout.
    async fn summarise(&self, text: &str) -> Result<String, LlmError>;
}

#[derive(Debug, thiserror::Error)]
pub enum LlmConfigError {
    #[error("SUMMARYD_LLM_PROVIDER=openai is not available in this build yet")]
    ProviderUnavailable,
}

/// Build the configured provider.
pub fn from_settings(settings: &LlmSettings) -> Result<Arc<dyn Llm>, LlmConfigError> {
    match settings.provider {
        LlmProvider::Builtin => Ok(Arc::new(BuiltinSummariser)),
        LlmProvider::Openai => Err(LlmConfigError::ProviderUnavailable),
    }
}
