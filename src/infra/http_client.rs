//! Helpers shared by the providers that speak HTTP (the model API and the mail API).

/// Error bodies are quoted in `last_error` and logs; this keeps them to a readable line.
pub(crate) const ERROR_EXCERPT_CHARS: usize = 300;

/// The error and its causes ("error sending request: connection refused"), without the URL,
/// whose query string may hold a token.
pub(crate) fn describe(err: reqwest::Error) -> String {
    with_causes(&err.without_url())
}

/// The error and each cause it does not already quote, joined by ": ". For errors kept with
/// their `#[source]` whose Display should still say everything on one log line.
pub(crate) fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whitespace collapsed to single spaces and cut to `ERROR_EXCERPT_CHARS` characters.
pub(crate) fn excerpt(text: &str) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return "(empty body)".into();
    }
    match collapsed.char_indices().nth(ERROR_EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_collapses_and_cuts_on_a_char_boundary() {
        assert_eq!(excerpt("  a \n b  "), "a b");
        assert_eq!(excerpt(""), "(empty body)");
        let long = "é".repeat(ERROR_EXCERPT_CHARS + 5);
        let cut = excerpt(&long);
        assert_eq!(cut.chars().count(), ERROR_EXCERPT_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
