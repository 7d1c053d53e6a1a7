//! What fits one provider: its context window, less the answer (`max_tokens`) and the
//! instructions of each prompt, counted by the provider's own [`TokenCounter`]. The chain
//! asks it before every call (a prompt that does not fit is split, never sent), the API
//! asks it what a text would cost before accepting it.

use super::prompts::{Prompt, PromptKind, SUMMARY_OVERHEAD};
use super::split;
use super::tokens::TokenCounter;

/// Tokens kept free of every prompt besides what is counted: a counter that is off by a
/// little (the estimate for a tokenizer it does not know, a chat template's extra tokens)
/// must not make a prompt that "fits" overflow.
fn margin(context: usize) -> usize {
    16 + context / 50
}

/// One provider's room for data, by prompt kind.
#[derive(Debug, Clone, Copy)]
pub struct Fit {
    counter: TokenCounter,
    max_tokens: usize,
    /// Indexed by [`kind_index`].
    rooms: [usize; 3],
}

fn kind_index(kind: PromptKind) -> usize {
    match kind {
        PromptKind::Document => 0,
        PromptKind::Part => 1,
        PromptKind::Combine => 2,
    }
}

impl Fit {
    pub fn new(counter: TokenCounter, context_tokens: u32, max_tokens: u32) -> Self {
        let context = context_tokens as usize;
        let max_tokens = max_tokens as usize;
        let room = |kind: PromptKind| {
            context
                .saturating_sub(max_tokens)
                .saturating_sub(kind.overhead())
                .saturating_sub(margin(context))
        };
        Self {
            counter,
            max_tokens,
            rooms: [
                room(PromptKind::Document),
                room(PromptKind::Part),
                room(PromptKind::Combine),
            ],
        }
    }

    /// Tokens of data a prompt of `kind` may carry.
    pub fn room(&self, kind: PromptKind) -> usize {
        self.rooms[kind_index(kind)]
    }

    pub fn counter(&self) -> &TokenCounter {
        &self.counter
    }

    /// Tokens one summary may take inside a combination.
    pub fn summary_tokens(&self) -> usize {
        self.max_tokens + SUMMARY_OVERHEAD
    }

    /// Whether `prompt` fits: its data within the room of its kind (by its length alone
    /// when that settles it, see [`TokenCounter::at_most`]).
    pub fn fits(&self, prompt: &Prompt) -> bool {
        let room = self.room(prompt.kind());
        prompt.data_bytes() <= room || prompt.data_tokens(&self.counter) <= room
    }

    /// The model calls `text` costs on this provider at most: one when it fits, otherwise
    /// one per part and the combinations of their summaries (every summary as long as it
    /// may be).
    pub fn calls_for(&self, text: &str) -> usize {
        if self.counter.at_most(text, self.room(PromptKind::Document)) {
            return 1;
        }
        let parts = split::split_text(text, self.room(PromptKind::Part), &self.counter).len();
        split::calls_for(parts, self.room(PromptKind::Combine), self.summary_tokens())
    }

    /// The most tokens `text` may cost on this provider (what a budget reserves): every
    /// call's prompt (its instructions and its data, counted as the chain counts them) and
    /// `max_tokens` of answer per call. One call when the text fits; otherwise each part,
    /// then the combinations level by level as [`split::calls_for`] plans them, with every
    /// summary as long as it may be.
    pub fn worst_case_tokens(&self, text: &str) -> u64 {
        let answer = self.max_tokens as u64;
        let call = |kind: PromptKind, data: usize| (kind.overhead() + data) as u64 + answer;
        if self.counter.at_most(text, self.room(PromptKind::Document)) {
            return call(PromptKind::Document, self.counter.count(text));
        }
        let parts = split::split_text(text, self.room(PromptKind::Part), &self.counter);
        let mut total: u64 = parts
            .iter()
            .map(|part| call(PromptKind::Part, self.counter.count(part)))
            .sum();
        let summary = self.summary_tokens();
        let per = (self.room(PromptKind::Combine) / summary.max(1)).max(2);
        let mut level = parts.len();
        while level > 1 {
            let groups = level.div_ceil(per);
            total += (groups * PromptKind::Combine.overhead() + level * summary) as u64
                + groups as u64 * answer;
            level = groups;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_is_the_context_less_the_answer_the_instructions_and_a_margin() {
        let counter = TokenCounter::Estimate;
        let fit = Fit::new(counter, 4_096, 512);
        for kind in [PromptKind::Document, PromptKind::Part, PromptKind::Combine] {
            assert_eq!(
                fit.room(kind),
                4_096 - 512 - kind.overhead() - (16 + 4_096 / 50),
                "{kind:?}"
            );
        }
        assert_eq!(fit.summary_tokens(), 512 + SUMMARY_OVERHEAD);
        let room = fit.room(PromptKind::Document);
        // The estimate: 2.5 bytes per token.
        let fits = "a".repeat(room * 5 / 2);
        assert!(fit.fits(&Prompt::Document(fits.clone())));
        assert_eq!(fit.calls_for(&fits), 1);
        let over = "a".repeat(room * 5 / 2 + 3);
        assert!(!fit.fits(&Prompt::Document(over)));
        // A context smaller than what the prompt needs has no room, not a negative one.
        assert_eq!(Fit::new(counter, 100, 512).room(PromptKind::Part), 0);
    }

    #[test]
    fn a_long_text_costs_its_parts_and_their_combinations() {
        let fit = Fit::new(TokenCounter::Estimate, 4_096, 512);
        let text = "Revenue grew eleven percent in the third quarter. ".repeat(1_200);
        let parts = split::split_text(&text, fit.room(PromptKind::Part), fit.counter()).len();
        assert!(parts > 5, "{parts}");
        let calls = fit.calls_for(&text);
        assert_eq!(
            calls,
            split::calls_for(parts, fit.room(PromptKind::Combine), fit.summary_tokens())
        );
        assert!(calls > parts);
    }

    #[test]
    fn the_worst_case_is_every_call_s_prompt_and_answer() {
        let fit = Fit::new(TokenCounter::Estimate, 4_096, 512);
        // One call: the instructions, the text, and a whole answer.
        let short = "Revenue grew eleven percent.";
        assert_eq!(
            fit.worst_case_tokens(short),
            (PromptKind::Document.overhead() + TokenCounter::Estimate.count(short) + 512) as u64
        );
        // In parts: each part's call, then the combinations, each summary as long as it may be.
        let text = "Revenue grew eleven percent in the third quarter. ".repeat(1_200);
        let parts = split::split_text(&text, fit.room(PromptKind::Part), fit.counter());
        let calls = fit.calls_for(&text);
        let combines = calls - parts.len();
        let part_tokens: usize = parts
            .iter()
            .map(|p| PromptKind::Part.overhead() + fit.counter().count(p) + 512)
            .sum();
        let worst = fit.worst_case_tokens(&text);
        assert!(worst > part_tokens as u64, "{worst}");
        let combine_tokens = worst - part_tokens as u64;
        // Every combination carries at most a context's worth, and at least its answer.
        assert!(combine_tokens >= (combines * (512 + PromptKind::Combine.overhead())) as u64);
        assert!(
            combine_tokens <= (combines * 4_096) as u64,
            "{combine_tokens}"
        );
        // Never less than what the text alone is.
        assert!(worst > TokenCounter::Estimate.count(&text) as u64);
    }
}
