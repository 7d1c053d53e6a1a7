//! The model behind one trait; the provider is chosen by configuration.
//!
//! Providers make exactly one attempt per call: `crate::retry` owns timeouts, classification
//! and backoff, so no layer multiplies the other's retries.

mod builtin;
mod guard;
mod openai;
mod retry_after;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use builtin::BuiltinSummariser;
pub use guard::{Guarded, check_input};
pub use openai::{OpenAiClient, PROMPT_PREFIX, prompt};

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

/// A provider that cannot be built from the settings; names the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum LlmConfigError {
    #[error("{setting}: {reason}")]
    Invalid {
        setting: &'static str,
        reason: String,
    },
    #[error("could not build the HTTP client for the model API: {0}")]
    Client(String),
}

/// Build the configured provider, wrapped in the input-size guard (`SUMMARYD_LLM_MAX_INPUT_CHARS`).
pub fn from_settings(settings: &LlmSettings) -> Result<Arc<dyn Llm>, LlmConfigError> {
    let provider: Arc<dyn Llm> = match settings.provider {
        LlmProvider::Builtin => Arc::new(BuiltinSummariser),
        LlmProvider::Openai => {
            let client = OpenAiClient::new(settings)?;
            if !client.has_api_key() {
                // Fine for local OpenAI-compatible servers; a hosted API will answer 401.
                tracing::info!(
                    "SUMMARYD_LLM_API_KEY / OPENAI_API_KEY not set: model requests carry no Authorization header"
                );
            }
            Arc::new(client)
        }
    };
    Ok(Arc::new(Guarded::new(provider, settings.max_input_chars)))
}
