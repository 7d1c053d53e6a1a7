//! Where a text that does not fit a model's context is cut, and how many calls a long text
//! costs. Pure: no I/O, no model.
//!
//! A text is cut at paragraph boundaries (a blank line) where the paragraphs fit, at
//! sentence boundaries inside a paragraph that does not, then at spaces, and only inside
//! a word that alone is longer than a part, at a character boundary. Consecutive parts
//! share a small overlap (the last sentences of one begin the next), so a statement cut
//! in two is read whole at least once.

use std::ops::Range;

use super::tokens::TokenCounter;

/// The overlap between consecutive parts: a tenth of a part, at most this many tokens.
const MAX_OVERLAP_TOKENS: usize = 200;
/// Tokens the whitespace between two units may add once they are joined.
const JOIN_TOKENS: usize = 1;

/// One piece of the text that fits a part: its byte range and its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unit {
    range: Range<usize>,
    tokens: usize,
}

/// The boundaries a text is cut at, coarsest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Paragraph,
    Sentence,
    Word,
    Bytes,
}

impl Level {
    fn finer(self) -> Level {
        match self {
            Level::Paragraph => Level::Sentence,
            Level::Sentence => Level::Word,
            Level::Word | Level::Bytes => Level::Bytes,
        }
    }
}

/// `text` cut into parts of at most `room` tokens each (as `counter` counts them), in
/// order, consecutive parts overlapping by up to a tenth of `room`. One part when the text
/// fits; none for an empty text.
pub fn split_text(text: &str, room: usize, counter: &TokenCounter) -> Vec<String> {
    split_with(text, room, &|s: &str| counter.count(s))
}

/// [`split_text`] with any way of counting.
fn split_with(text: &str, room: usize, count: &impl Fn(&str) -> usize) -> Vec<String> {
    let room = room.max(1);
    let mut units = Vec::new();
    cut(
        text,
        0..text.len(),
        Level::Paragraph,
        room,
        count,
        &mut units,
    );
    pack(&units, room, overlap_tokens(room))
        .into_iter()
        .map(|r| text[r].to_owned())
        .collect()
}

/// The overlap for parts of `room` tokens.
fn overlap_tokens(room: usize) -> usize {
    (room / 10).min(MAX_OVERLAP_TOKENS)
}

/// The units of `text[range]` at `level`, each cut finer until it fits `room` tokens as
/// `count` counts them.
fn cut(
    text: &str,
    range: Range<usize>,
    level: Level,
    room: usize,
    count: &impl Fn(&str) -> usize,
    out: &mut Vec<Unit>,
) {
    for piece in boundaries(text, range, level, room) {
        let piece = trimmed(text, piece);
        if piece.is_empty() {
            continue;
        }
        let tokens = count(&text[piece.clone()]);
        if tokens <= room || level == Level::Bytes {
            out.push(Unit {
                range: piece,
                tokens,
            });
        } else {
            cut(text, piece, level.finer(), room, count, out);
        }
    }
}

/// `range` without the whitespace at its ends, so parts neither begin nor end with it.
fn trimmed(text: &str, range: Range<usize>) -> Range<usize> {
    let s = &text[range.clone()];
    let start = range.start + (s.len() - s.trim_start().len());
    let end = range.end - (s.len() - s.trim_end().len());
    start..end.max(start)
}

/// `text[range]` cut at `level`'s boundaries; the pieces cover the range, in order.
fn boundaries(text: &str, range: Range<usize>, level: Level, room: usize) -> Vec<Range<usize>> {
    let s = &text[range.clone()];
    let base = range.start;
    let mut cuts = vec![0];
    match level {
        Level::Paragraph => {
            // After a run of two or more line breaks (with only spaces between them).
            let mut newlines = 0;
            for (i, c) in s.char_indices() {
                match c {
                    '\n' => newlines += 1,
                    ' ' | '\t' | '\r' => {}
                    _ => {
                        if newlines >= 2 {
                            cuts.push(i);
                        }
                        newlines = 0;
                    }
                }
            }
        }
        Level::Sentence => {
            // After a sentence's end mark followed by whitespace, and after a line break.
            let mut after_mark = false;
            for (i, c) in s.char_indices() {
                if matches!(c, '。' | '！' | '？') {
                    cuts.push(i + c.len_utf8());
                    after_mark = false;
                } else if c == '\n' {
                    // The line break itself is trimmed off either side.
                    cuts.push(i);
                    after_mark = false;
                } else if c.is_whitespace() && after_mark {
                    cuts.push(i);
                    after_mark = false;
                } else {
                    after_mark = matches!(c, '.' | '!' | '?' | ';');
                }
            }
        }
        Level::Word => {
            let mut in_space = false;
            for (i, c) in s.char_indices() {
                if c.is_whitespace() {
                    in_space = true;
                } else if in_space {
                    cuts.push(i);
                    in_space = false;
                }
            }
        }
        Level::Bytes => {
            // A token is at least one byte (and the estimate counts fewer tokens than
            // bytes), so `room` bytes are at most `room` tokens.
            let mut at = 0;
            while s.len() - at > room {
                let mut next = at + room;
                while !s.is_char_boundary(next) {
                    next -= 1;
                }
                if next == at {
                    // `room` is smaller than one character: take the character.
                    next = at + s[at..].chars().next().map_or(1, char::len_utf8);
                }
                cuts.push(next);
                at = next;
            }
        }
    }
    // Cuts rise (each level pushes them in order; `dedup` drops repeats). A cut at the
    // very end makes an empty last piece, which `cut` skips like a blank one.
    cuts.dedup();
    let ends = cuts.iter().skip(1).copied().chain([s.len()]);
    cuts.iter()
        .zip(ends)
        .map(|(&start, end)| base + start..base + end)
        .collect()
}

/// Consecutive units packed into parts of at most `room` tokens; each part after the
/// first starts with the last units of the one before, up to `overlap` tokens, when they
/// leave room for the next new unit. Every part takes at least one new unit.
fn pack(units: &[Unit], room: usize, overlap: usize) -> Vec<Range<usize>> {
    let mut parts: Vec<Range<usize>> = Vec::new();
    let (mut first, mut fresh) = (0, 0);
    while fresh < units.len() {
        let mut tokens: usize = units[first..fresh]
            .iter()
            .map(|u| u.tokens + JOIN_TOKENS)
            .sum();
        let mut end = fresh;
        while end < units.len() && (end == fresh || tokens + units[end].tokens <= room) {
            tokens += units[end].tokens + JOIN_TOKENS;
            end += 1;
        }
        parts.push(first..end);
        let begun = first;
        (first, fresh) = (end, end);
        if end == units.len() {
            break;
        }
        // The overlap: the last units of the previous part, as long as they leave room for
        // the next new unit (so never the whole part: that one did not have the room).
        let mut tail = 0;
        for unit in units[begun..end].iter().rev() {
            let add = unit.tokens + JOIN_TOKENS;
            if tail + add > overlap || tail + add + units[end].tokens > room {
                break;
            }
            tail += add;
            first -= 1;
        }
    }
    parts
        .into_iter()
        .map(|r| units[r.start].range.start..units[r.end - 1].range.end)
        .collect()
}

/// Consecutive items (by their tokens) grouped so each group's total is at most `room`;
/// an item larger than `room` is a group of its own.
pub fn group(tokens: &[usize], room: usize) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut total = 0;
    for (i, &t) in tokens.iter().enumerate() {
        if i > start && total + t > room {
            groups.push(start..i);
            start = i;
            total = 0;
        }
        total += t;
    }
    if start < tokens.len() {
        groups.push(start..tokens.len());
    }
    groups
}

/// Model calls a text of `parts` parts needs at most: one per part, then the combinations,
/// level by level, with every summary as long as `summary_tokens` allows (the worst
/// case) and as many summaries per combination as fit `combine_room` (at least two).
pub fn calls_for(parts: usize, combine_room: usize, summary_tokens: usize) -> usize {
    if parts <= 1 {
        return parts;
    }
    let per = (combine_room / summary_tokens.max(1)).max(2);
    let mut calls = parts;
    let mut level = parts;
    while level > 1 {
        level = level.div_ceil(per);
        calls += level;
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per word, so tests can reason in words.
    fn words() -> impl Fn(&str) -> usize {
        |s: &str| s.split_whitespace().count()
    }

    fn split_by(text: &str, room: usize, count: impl Fn(&str) -> usize) -> Vec<String> {
        split_with(text, room, &count)
    }

    #[test]
    fn a_text_that_fits_is_one_part_and_an_empty_one_none() {
        let counter = TokenCounter::Estimate;
        assert_eq!(split_text("Short. Text.", 100, &counter), ["Short. Text."]);
        assert!(split_text("", 100, &counter).is_empty());
        assert!(split_text("  \n\n ", 100, &counter).is_empty());
    }

    #[test]
    fn paragraphs_are_kept_whole_when_they_fit() {
        let text = "one two three\n\nfour five six\n\nseven eight nine";
        let parts = split_by(text, 7, words());
        assert_eq!(
            parts,
            ["one two three\n\nfour five six", "seven eight nine"]
        );
    }

    #[test]
    fn a_long_paragraph_is_cut_at_sentences_then_words_then_bytes() {
        let text = "One two three. Four five six. Seven eight nine.";
        let parts = split_by(text, 3, words());
        assert_eq!(
            parts,
            ["One two three.", "Four five six.", "Seven eight nine."]
        );
        let text = "one two three four five six seven";
        let parts = split_by(text, 3, words());
        assert!(parts.iter().all(|p| words()(p) <= 3), "{parts:?}");
        assert_eq!(parts.first().map(String::as_str), Some("one two"));
        let long_word = "x".repeat(25);
        let parts = split_by(&long_word, 10, |s: &str| s.len());
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert!(parts.iter().all(|p| p.len() <= 10));
        assert_eq!(parts.concat(), long_word);
    }

    #[test]
    fn a_paragraph_is_a_blank_line_apart_and_its_lines_stay_together() {
        // Paragraph units: "a b\nc d" is 4 tokens with no join between its lines.
        let text = "a b\nc d\n\ne f g";
        assert_eq!(split_by(text, 4, words()), ["a b\nc d", "e f g"]);
        // A line of spaces or tabs between the breaks is still a blank line.
        let text = "a b\nc d\n \t\r\ne f g";
        assert_eq!(split_by(text, 4, words()), ["a b\nc d", "e f g"]);
        // One line break is no paragraph: a long paragraph is cut at its lines.
        let text = "one two\nthree four";
        assert_eq!(split_by(text, 2, words()), ["one two", "three four"]);
    }

    #[test]
    fn cjk_sentences_end_at_their_own_marks() {
        let text = "会議を始めた。議事録を読んだ。次回を決めた。";
        // One "token" per character: each sentence is 7.
        let parts = split_by(text, 8, |s: &str| s.chars().count());
        assert_eq!(
            parts,
            ["会議を始めた。", "議事録を読んだ。", "次回を決めた。"]
        );
    }

    #[test]
    fn bytes_are_cut_at_character_boundaries() {
        let text = "会議の議事録会議の議事録";
        let parts = split_by(text, 4, |s: &str| s.len());
        assert!(
            parts.iter().all(|p| !p.is_empty() && p.len() <= 4),
            "{parts:?}"
        );
        assert_eq!(parts.concat(), text);
        // A room smaller than one character still advances, one character at a time.
        let parts = split_by("ab会", 1, |s: &str| s.len());
        assert_eq!(parts, ["a", "b", "会"]);
    }

    #[test]
    fn consecutive_parts_overlap_by_their_last_sentences() {
        let sentence = |i: usize| format!("Sentence {i} has five words.");
        let text: Vec<String> = (0..40).map(sentence).collect();
        let text = text.join(" ");
        let parts = split_by(&text, 60, words());
        assert!(parts.len() > 3, "{}", parts.len());
        for pair in parts.windows(2) {
            assert!(words()(&pair[0]) <= 60 && words()(&pair[1]) <= 60);
            // The last sentence of a part begins the next (the overlap is 6 tokens: one
            // sentence and the space after it).
            let last = pair[0].rsplit(". ").next().unwrap_or_default();
            assert!(pair[1].starts_with(last.trim()), "{pair:?}");
        }
        // Nothing is lost: every sentence is in some part.
        for i in 0..40 {
            assert!(parts.iter().any(|p| p.contains(&sentence(i))), "{i}");
        }
    }

    #[test]
    fn every_part_fits_and_the_parts_cover_the_text_in_order() {
        let counter = TokenCounter::Estimate;
        let para = "Revenue grew eleven percent in the third quarter. Renewals led. ".repeat(30);
        let text = vec![para; 12].join("\n\n");
        for room in [40, 100, 400, 1_000] {
            let parts = split_text(&text, room, &counter);
            assert!(parts.len() > 1, "{room}");
            assert!(parts.iter().all(|p| counter.count(p) <= room), "{room}");
            // Each part is found at or after where the previous one began.
            let mut from = 0usize;
            for p in &parts {
                let at = text[from..].find(p.as_str()).map(|i| i + from);
                assert!(at.is_some(), "{room}: a part out of order");
                from = at.unwrap_or(0) + 1;
            }
            assert!(text.trim_end().ends_with(parts.last().unwrap().trim_end()));
        }
    }

    #[test]
    fn an_overlap_counts_against_the_part_it_begins() {
        let units: Vec<Unit> = [3, 3, 2, 2]
            .into_iter()
            .enumerate()
            .map(|(i, tokens)| Unit {
                range: i..i + 1,
                tokens,
            })
            .collect();
        // 3 + 1 + 3 = 7 fits 8; the second part begins with the second unit (3 + 1 of
        // overlap), takes the third (7) and has no room for the fourth (9).
        assert_eq!(pack(&units, 8, 4), [0..2, 1..3, 2..4]);
        // Without room for an overlap, parts only follow each other.
        assert_eq!(pack(&units, 8, 0), [0..2, 2..4]);
        // A unit and its join (4) are more than an overlap of 3.
        assert_eq!(pack(&units, 8, 3), [0..2, 2..4]);

        let units = |tokens: &[usize]| -> Vec<Unit> {
            tokens
                .iter()
                .enumerate()
                .map(|(i, &tokens)| Unit {
                    range: i..i + 1,
                    tokens,
                })
                .collect()
        };
        // The overlap (4) and the next unit (4) fill the room exactly: taken.
        assert_eq!(pack(&units(&[3, 3, 4, 4]), 8, 4), [0..2, 1..3, 3..4]);
        // The overlap would leave no room for the next unit (4 + 6 > 8): none.
        assert_eq!(pack(&units(&[3, 3, 6]), 8, 4), [0..2, 2..3]);
    }

    #[test]
    fn items_are_grouped_to_fit() {
        assert_eq!(group(&[3, 3, 3, 3], 6), [0..2, 2..4]);
        assert_eq!(group(&[3, 3, 3], 9), vec![0..3]);
        assert_eq!(group(&[10, 1, 1], 5), [0..1, 1..3]);
        assert_eq!(group(&[1, 10], 5), [0..1, 1..2]);
        assert_eq!(group(&[5, 5], 5), [0..1, 1..2]);
        assert!(group(&[], 5).is_empty());
    }

    #[test]
    fn calls_count_parts_and_every_level_of_combinations() {
        assert_eq!(calls_for(0, 100, 10), 0);
        assert_eq!(calls_for(1, 100, 10), 1);
        // 10 per combination: 25 parts, 3 combinations, 1 of those.
        assert_eq!(calls_for(25, 100, 10), 25 + 3 + 1);
        assert_eq!(calls_for(10, 100, 10), 11);
        assert_eq!(calls_for(11, 100, 10), 11 + 2 + 1);
        // Never fewer than two per combination.
        assert_eq!(calls_for(4, 5, 10), 4 + 2 + 1);
        assert_eq!(calls_for(4, 10, 0), 4 + 1);
    }
}
