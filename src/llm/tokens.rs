//! How many tokens a text is for one provider: the model's own tokenizer where one is
//! known (OpenAI's models, by name), a conservative estimate otherwise. Only ever used to
//! decide whether a prompt fits a context and where to cut a long text, so an estimate may
//! be high (more, smaller parts) but should not be low: a provider's own "context length
//! exceeded" answer is the backstop (`llm::chain`), and it costs a call.

use tiktoken_rs::tokenizer::Tokenizer;

/// UTF-8 bytes per token of the estimate. Common tokenizers take about 4 characters of
/// English per token and 1 to 1.5 tokens per CJK character (3 bytes); 2.5 bytes per token
/// over-counts English by about 60% and stays at or above most CJK text, code and numbers.
const ESTIMATE_BYTES_PER_TOKEN: (usize, usize) = (5, 2);

/// Counts tokens for one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCounter {
    /// The model's tokenizer (tiktoken's vocabulary for the model name), loaded the first
    /// time a text is counted with it: most texts fit by their length alone
    /// ([`TokenCounter::at_most`]) and never need it.
    Model(Tokenizer),
    /// No tokenizer is known for the model: [`ESTIMATE_BYTES_PER_TOKEN`].
    Estimate,
}

impl TokenCounter {
    /// The counter for an OpenAI-compatible `model`: its tokenizer when the name is one
    /// of OpenAI's models, the estimate for anything else (a local llama, mistral, ...).
    pub fn for_openai_model(model: &str) -> Self {
        tiktoken_rs::tokenizer::get_tokenizer(model)
            .map_or(TokenCounter::Estimate, TokenCounter::Model)
    }

    /// Tokens of `text`.
    pub fn count(&self, text: &str) -> usize {
        match self {
            TokenCounter::Model(tokenizer) => match tiktoken_rs::bpe_for_tokenizer(*tokenizer) {
                Ok(bpe) => bpe.encode_ordinary(text).len(),
                Err(_) => estimate(text),
            },
            TokenCounter::Estimate => estimate(text),
        }
    }

    /// Whether `text` is at most `limit` tokens, counting only when its length cannot
    /// tell: a token is at least one byte (and the estimate counts fewer tokens than
    /// bytes), so a text of at most `limit` bytes fits without a tokenizer.
    pub fn at_most(&self, text: &str, limit: usize) -> bool {
        text.len() <= limit || self.count(text) <= limit
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
        assert_eq!(model, TokenCounter::Model(Tokenizer::O200kBase));
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

    #[test]
    fn a_text_no_longer_than_the_limit_in_bytes_fits_without_counting() {
        let model = TokenCounter::for_openai_model("gpt-4o");
        let text = "word ".repeat(100);
        assert!(model.at_most(&text, 500), "500 bytes");
        assert!(
            model.at_most(&text, 110),
            "about 100 tokens by the tokenizer"
        );
        assert!(!model.at_most(&text, 90));
        assert!(!model.at_most(&text, 50));
        assert!(TokenCounter::Estimate.at_most(&text, 200));
        assert!(!TokenCounter::Estimate.at_most(&text, 199));
    }
}
