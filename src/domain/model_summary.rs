use super::ModelCall;

/// A summary as the model step hands it to the database (worker → db): the text, the model
/// that wrote it, and what it cost. The summaries row stores all three; GET reports the
/// model and `summaryd usage` adds up the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSummary {
    pub text: String,
    /// The configured model name of the provider that answered (`[llm] model` or a
    /// fallback's `model`; `builtin` for the built-in summariser). The configured name, not
    /// the one the server echoes: it is what operators chose and what labels metrics by, so
    /// a server cannot make the label set grow.
    pub model: String,
    /// Tokens the provider reported; `None` when its response carried no `usage`. For a
    /// text summarised in parts, the sum over every call of the job whose provider
    /// reported usage.
    pub usage: Option<TokenUsage>,
    /// Model calls the summary took when it was summarised in parts (parts and
    /// combinations); `None` for one call.
    pub parts: Option<u32>,
    /// Every model call the summary took that is not stored yet (each attempt, failed ones
    /// included), committed with it; a summary handed to a later delivery carries them.
    pub calls: Vec<ModelCall>,
}

/// Tokens of one model call, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub(crate) prompt: u32,
    pub(crate) completion: u32,
}

impl TokenUsage {
    pub fn new(prompt: u32, completion: u32) -> Self {
        Self { prompt, completion }
    }

    /// The usage of two calls together; unknown only when neither reported one.
    pub fn sum(a: Option<TokenUsage>, b: Option<TokenUsage>) -> Option<TokenUsage> {
        match (a, b) {
            (None, None) => None,
            (a, b) => {
                let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
                Some(TokenUsage {
                    prompt: a.prompt.saturating_add(b.prompt),
                    completion: a.completion.saturating_add(b.completion),
                })
            }
        }
    }
}
