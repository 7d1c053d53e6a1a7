//! The model behind one trait; the provider is chosen by configuration.
//!
//! Providers make exactly one attempt per call: `crate::retry` owns timeouts and backoff, so
//! no layer multiplies the other's retries. Whether an error is worth another attempt is
//! decided once, below, by [`LlmError`]'s [`Classify`] impl.

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
use crate::failure::{Classify, Disposition};

/// The 4xx statuses a later attempt can fix (the set the OpenAI SDK retries); every 5xx too.
const TRANSIENT_4XX: [u16; 3] = [408, 409, 429];

/// What went wrong in one model call; its [`Classify`] impl says what each means.
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

impl Classify for LlmError {
    /// Unknown errors are not retried: they are bugs until logs prove otherwise, and would
    /// fail the same way every time.
    fn disposition(&self) -> Disposition {
        match self {
            LlmError::Timeout | LlmError::Connect(_) => Disposition::TRANSIENT,
            LlmError::Status {
                status,
                retry_after,
                ..
            } => Disposition::of_http_status(*status, &TRANSIENT_4XX, *retry_after),
            LlmError::Malformed(_) | LlmError::InvalidInput(_) | LlmError::Other(_) => {
                Disposition::Permanent
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<Duration>) -> LlmError {
        LlmError::Status {
            status: code,
            retry_after,
            message: String::new(),
        }
    }

    #[test]
    fn classification_matches_the_design() {
        assert!(LlmError::Timeout.is_transient());
        assert!(LlmError::Connect("reset".into()).is_transient());
        for code in [408, 409, 429, 500, 502, 503, 504, 599] {
            assert!(status(code, None).is_transient(), "{code} must retry");
        }
        for code in [400, 401, 403, 404, 413, 422] {
            assert!(!status(code, None).is_transient(), "{code} must not retry");
        }
        assert!(!LlmError::Malformed("x".into()).is_transient());
        assert!(!LlmError::InvalidInput("x".into()).is_transient());
        assert!(!LlmError::Other("x".into()).is_transient());
    }

    #[test]
    fn a_transient_status_carries_the_servers_retry_after() {
        let after = Some(Duration::from_millis(1_500));
        assert_eq!(
            status(429, after).disposition(),
            Disposition::Transient { retry_after: after }
        );
        assert_eq!(status(400, after).disposition(), Disposition::Permanent);
    }
}
