//! A deterministic extractive summariser with no network: the default provider, so a fresh
//! deployment works end to end without an API key.
//!
//! Sentences are scored by the normalised frequency of their content words; the best few are
//! returned in their original order.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{Completion, Llm, LlmError};

/// Sentences in a summary: enough for the gist, short enough to read in an email.
pub(crate) const SUMMARY_SENTENCES: usize = 3;
/// Upper bound of a summary in characters, so one huge sentence cannot make a huge email.
pub(crate) const MAX_SUMMARY_CHARS: usize = 1_000;

/// Small English stopword list: words that carry no topic and would otherwise dominate.
const STOPWORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "an", "and", "any", "are", "as", "at", "be", "been",
    "but", "by", "can", "could", "did", "do", "does", "for", "from", "had", "has", "have", "he",
    "her", "his", "i", "if", "in", "into", "is", "it", "its", "me", "more", "my", "no", "not",
    "of", "on", "or", "our", "she", "so", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "those", "to", "too", "us", "very", "was", "we", "were", "what",
    "when", "which", "who", "will", "with", "would", "you", "your",
];

#[derive(Debug, Default)]
pub struct BuiltinSummariser;

#[async_trait]
impl Llm for BuiltinSummariser {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        summarise(text)
            .map(Completion::without_usage)
            .ok_or_else(|| LlmError::InvalidInput("text has no content".into()))
    }
}

/// The summary of `text`, or `None` when there is nothing but whitespace to summarise.
pub fn summarise(text: &str) -> Option<String> {
    let sentences = split_sentences(text);
    if sentences.is_empty() {
        return None;
    }
    let picked = pick_sentences(&sentences, SUMMARY_SENTENCES);
    let mut out = String::new();
    for s in picked {
        // CJK text runs sentences together without a space.
        if !out.is_empty() && !out.ends_with(is_cjk_terminator) {
            out.push(' ');
        }
        out.push_str(s);
    }
    Some(bound(out, MAX_SUMMARY_CHARS))
}

fn is_terminator(c: char) -> bool {
    matches!(c, '.' | '!' | '?') || is_cjk_terminator(c)
}

fn is_cjk_terminator(c: char) -> bool {
    matches!(c, '。' | '！' | '？')
}

/// Split on `.!?`, `。！？` (runs like `?!` or `...` stay with their sentence) and newlines.
/// Returns trimmed, non-empty slices of `text`.
fn split_sentences(text: &str) -> Vec<&str> {
    let mut sentences = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = if c == '\n' || c == '\r' {
            Some(i)
        } else if is_terminator(c) {
            let mut end = i + c.len_utf8();
            while let Some(&(j, next)) = chars.peek() {
                if !is_terminator(next) {
                    break;
                }
                end = j + next.len_utf8();
                chars.next();
            }
            Some(end)
        } else {
            None
        };
        if let Some(end) = end {
            push_trimmed(&mut sentences, &text[start..end]);
            start = end;
            // Skip the newline itself, which belongs to no sentence.
            if c == '\n' || c == '\r' {
                start = i + c.len_utf8();
            }
        }
    }
    push_trimmed(&mut sentences, &text[start..]);
    sentences
}

fn push_trimmed<'a>(out: &mut Vec<&'a str>, s: &'a str) {
    let s = s.trim();
    if !s.is_empty() {
        out.push(s);
    }
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK Extension A
        | 0x4E00..=0x9FFF    // CJK Unified Ideographs
        | 0xF900..=0xFAFF) // CJK Compatibility Ideographs
}

/// Lowercased content words. CJK has no spaces, so each ideograph counts as a word.
fn words(sentence: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let flush = |current: &mut String, out: &mut Vec<String>| {
        if !current.is_empty() && !STOPWORDS.contains(&current.as_str()) {
            out.push(std::mem::take(current));
        }
        current.clear();
    };
    for c in sentence.chars() {
        if is_cjk(c) {
            flush(&mut current, &mut out);
            out.push(c.to_string());
        } else if c.is_alphanumeric() {
            current.extend(c.to_lowercase());
        } else {
            flush(&mut current, &mut out);
        }
    }
    flush(&mut current, &mut out);
    out
}

/// The `n` best-scoring sentences, in their original order. Ties go to the earlier one,
/// so the result is deterministic.
fn pick_sentences<'a>(sentences: &[&'a str], n: usize) -> Vec<&'a str> {
    if sentences.len() <= n {
        return sentences.to_vec();
    }
    let per_sentence: Vec<Vec<String>> = sentences.iter().map(|s| words(s)).collect();
    let mut freq: HashMap<&str, u32> = HashMap::new();
    for w in per_sentence.iter().flatten() {
        *freq.entry(w.as_str()).or_default() += 1;
    }
    let max = f64::from(freq.values().copied().max().unwrap_or(1).max(1));
    let mut scored: Vec<(usize, f64)> = per_sentence
        .iter()
        .enumerate()
        .map(|(i, ws)| {
            let score = ws
                .iter()
                .map(|w| f64::from(freq.get(w.as_str()).copied().unwrap_or(0)) / max)
                .sum();
            (i, score)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<usize> = scored.iter().take(n).map(|(i, _)| *i).collect();
    chosen.sort_unstable();
    chosen.into_iter().map(|i| sentences[i]).collect()
}

/// At most `max` characters, cut on a char boundary with an ellipsis.
fn bound(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sentence_comes_back_trimmed() {
        assert_eq!(
            summarise("  Hello world.  \n").as_deref(),
            Some("Hello world.")
        );
        assert_eq!(summarise("no terminator").as_deref(), Some("no terminator"));
    }

    #[test]
    fn empty_and_whitespace_have_nothing_to_summarise() {
        assert_eq!(summarise(""), None);
        assert_eq!(summarise(" \n\t \r\n"), None);
    }

    #[test]
    fn picks_the_most_representative_sentences_in_original_order() {
        let text = "Revenue grew in the north region. The weather was nice. \
                    Revenue in the north region beat the plan. Lunch was pasta! \
                    The north region revenue team hired two people? Someone sneezed.";
        let summary = summarise(text).unwrap_or_default();
        assert_eq!(
            summary,
            "Revenue grew in the north region. Revenue in the north region beat the plan. \
             The north region revenue team hired two people?"
        );
    }

    #[test]
    fn is_deterministic() {
        let text = "b a. a b. c d. d c. e f. f e. a b c d e f.";
        let first = summarise(text);
        for _ in 0..20 {
            assert_eq!(summarise(text), first);
        }
    }

    #[test]
    fn splits_cjk_and_newlines() {
        assert_eq!(
            split_sentences("今日は晴れ。明日は雨！本当？\nline two\n\nThree...  Four?!"),
            vec![
                "今日は晴れ。",
                "明日は雨！",
                "本当？",
                "line two",
                "Three...",
                "Four?!"
            ]
        );
        let summary =
            summarise("東京は大きい。東京は古い。猫。犬。東京タワー。").unwrap_or_default();
        assert!(
            summary.starts_with("東京は大きい。東京は古い。"),
            "{summary}"
        );
    }

    #[test]
    fn output_is_bounded_on_a_char_boundary() {
        let huge = "é🎉".repeat(5_000);
        let summary = summarise(&huge).unwrap_or_default();
        assert_eq!(summary.chars().count(), MAX_SUMMARY_CHARS);
        assert!(summary.ends_with('…'));
        let many = "Word salad again and again. ".repeat(10_000);
        assert!(summarise(&many).unwrap_or_default().chars().count() <= MAX_SUMMARY_CHARS);
    }

    #[test]
    fn never_panics_on_odd_input() {
        for text in [
            "🎉",
            "...",
            "。。。",
            "?!?!",
            "\u{0}",
            "a\u{301}.",
            "\r\r\n",
            "ß. Ǆ. İ.",
        ] {
            let _ = summarise(text);
        }
        assert_eq!(summarise("...").as_deref(), Some("..."));
    }
}
