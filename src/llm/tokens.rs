//! How many tokens a text is for one provider: the model's own tokenizer where one is
//! known (OpenAI's models, by name), a conservative estimate otherwise. Only ever used to
//! decide whether a prompt fits a context and where to cut a long text, so an estimate may
//! be high (more, smaller parts) but should not be low: a provider's own "context length
//! exceeded" answer is the backstop (`llm::chain`), and it costs a call.

use tiktoken_rs::CoreBPE;

/// UTF-8 bytes per token of the estimate. Common tokenizers take about 4 characters of
/// English per token and 1 to 1.5 tokens per CJK character (3 bytes); 2.5 bytes per token
/// over-counts English by about 60% and stays at or above most CJK text, code and numbers.
const ESTIMATE_BYTES_PER_TOKEN: (usize, usize) = (5, 2);

/// Counts tokens for one provider.
#[derive(Clone, Copy)]
pub enum TokenCounter {
    /// The model's tokenizer (tiktoken's vocabulary for the model name).
    Model(&'static CoreBPE),
    /// No tokenizer is known for the model: [`ESTIMATE_BYTES_PER_TOKEN`].
    Estimate,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TokenCounter::Model(_) => "TokenCounter::Model",
            TokenCounter::Estimate => "TokenCounter::Estimate",
        })
    }
}

impl TokenCounter {
    /// The counter for an OpenAI-compatible `model`: its tokenizer when the name is one
    /// of OpenAI's models, the estimate for anything else (a local llama, mistral, ...).
    pub fn for_openai_model(model: &str) -> Self {
        match tiktoken_rs::tokenizer::get_tokenizer(model) {
            Some(tokenizer) => tiktoken_rs::bpe_for_tokenizer(tokenizer)
                .map_or(TokenCounter::Estimate, TokenCounter::Model),
            None => TokenCounter::Estimate,
        }
    }

    /// Tokens of `text`.
    pub fn count(&self, text: &str) -> usize {
        match self {
            TokenCounter::Model(bpe) => bpe.encode_ordinary(text).len(),
            TokenCounter::Estimate => estimate(text),
        }
    }
}

/// The estimate for `text`: 2.5 bytes per token, rounded up.
pub(crate) fn estimate(text: &str) -> usize {
    let (num, den) = ESTIMATE_BYTES_PER_TOKEN;
    (text.len() * den).div_ceil(num)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_are_counted_by_their_tokenizer_and_others_estimated() {
        let text = "The quarterly revenue grew by eleven percent, driven by renewals.";
        let model = TokenCounter::for_openai_model("gpt-4.1-mini");
        assert!(matches!(model, TokenCounter::Model(_)));
        let counted = model.count(text);
        // o200k takes this sentence in about one token per word.
        assert!((10..=16).contains(&counted), "{counted}");
        assert!(matches!(
            TokenCounter::for_openai_model("llama-3.1-8b-instruct"),
            TokenCounter::Estimate
        ));
        let estimated = TokenCounter::Estimate.count(text);
        assert_eq!(estimated, (text.len() * 2).div_ceil(5));
        assert!(estimated > counted, "the estimate errs high");
        assert_eq!(TokenCounter::Estimate.count(""), 0);
        assert_eq!(estimate("abc"), 2);
        assert_eq!(estimate("abcde"), 2);
        assert_eq!(estimate("abcdef"), 3);
        // CJK: three bytes per character, at least one token per character.
        assert!(estimate("会議の議事録") >= 6);
    }
}
