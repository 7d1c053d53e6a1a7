//! Context guard: text the model can never take is refused before any network call.
//!
//! An oversized input fails identically on every attempt (a 400 "context length exceeded"),
//! so sending it only costs money and delays the dead letter. `from_settings` wraps every
//! provider in [`Guarded`]; the API calls [`check_input`] to answer 413 up front.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Completion, Llm, LlmError};
use crate::config::LlmSettings;

/// `Err(InvalidInput)` when `text` has more than `settings.max_input_chars` characters.
pub fn check_input(settings: &LlmSettings, text: &str) -> Result<(), LlmError> {
    check_len(settings.max_input_chars, text)
}

fn check_len(max_chars: usize, text: &str) -> Result<(), LlmError> {
    // A UTF-8 char is at least one byte, so a short byte length settles it without a scan;
    // otherwise look only as far as the first char past the limit.
    if text.len() <= max_chars || text.chars().nth(max_chars).is_none() {
        return Ok(());
    }
    Err(LlmError::InvalidInput(format!(
        "text is longer than {max_chars} characters (SUMMARYD_LLM_MAX_INPUT_CHARS)"
    )))
}

/// A provider that first checks the input budget.
pub struct Guarded {
    inner: Arc<dyn Llm>,
    max_input_chars: usize,
}

impl Guarded {
    pub fn new(inner: Arc<dyn Llm>, max_input_chars: usize) -> Self {
        Self {
            inner,
            max_input_chars,
        }
    }
}

impl fmt::Debug for Guarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("max_input_chars", &self.max_input_chars)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Llm for Guarded {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        check_len(self.max_input_chars, text)?;
        self.inner.summarise(text).await
    }

    async fn probe(&self) -> Result<Option<crate::domain::TokenUsage>, LlmError> {
        self.inner.probe().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_characters_not_bytes() {
        assert!(check_len(3, "abc").is_ok());
        assert!(check_len(3, "äöü").is_ok(), "6 bytes but 3 chars");
        assert!(matches!(
            check_len(3, "abcd"),
            Err(LlmError::InvalidInput(_))
        ));
        assert!(matches!(
            check_len(3, "äöüß"),
            Err(LlmError::InvalidInput(_))
        ));
    }
}
