use async_trait::async_trait;

use super::{Llm, LlmError};

#[derive(Debug, Default)]
pub struct BuiltinSummariser;

#[async_trait]
impl Llm for BuiltinSummariser {
    async fn summarise(&self, text: &str) -> Result<String, LlmError> {
        Ok(text.chars().take(200).collect())
    }
}
