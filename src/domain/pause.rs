//! A fleet-wide pause of consumption: who asked for it, why, and since when. Written by
//! `summaryd pause` and the console, read by every worker process (`stream/pause.rs` owns
//! how it is stored).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Longest `by` or `reason` kept, in characters: enough for a sentence and a ticket link;
/// the text travels in every worker's log line and in the console, so it stays short.
const MAX_CHARS: usize = 500;

/// Consumption is paused: no worker takes work until it is resumed. Its text fields are
/// one line each (control characters become spaces) and at most [`MAX_CHARS`] long,
/// however they were written, so a log line or a console cell shows them as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Stored")]
pub struct Pause {
    by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    since: DateTime<Utc>,
}

/// The fields as stored, before [`Pause::new`] makes them one line each.
#[derive(Deserialize)]
struct Stored {
    by: String,
    #[serde(default)]
    reason: Option<String>,
    since: DateTime<Utc>,
}

impl From<Stored> for Pause {
    fn from(stored: Stored) -> Self {
        Self::new(stored.by, stored.reason, stored.since)
    }
}

impl Pause {
    /// Who paused when a stored pause cannot be read (see [`Pause::unreadable`]).
    pub const UNKNOWN_BY: &'static str = "unknown";

    /// `by` names who paused (`cli:user@host`, `console:user`); a blank `reason` is none.
    pub fn new(by: impl Into<String>, reason: Option<String>, since: DateTime<Utc>) -> Self {
        let by = one_line(&by.into());
        Self {
            by: if by.is_empty() {
                Self::UNKNOWN_BY.to_owned()
            } else {
                by
            },
            reason: reason.map(|r| one_line(&r)).filter(|r| !r.is_empty()),
            since,
        }
    }

    /// A pause whose stored form cannot be read: paused all the same (a value nobody can
    /// read must not set the workers going), by [`Pause::UNKNOWN_BY`], with the Unix epoch
    /// for the unknown time and `detail` (what was wrong) as the reason.
    pub fn unreadable(detail: &str) -> Self {
        Self::new(
            Self::UNKNOWN_BY,
            Some(format!("the stored pause cannot be read: {detail}")),
            DateTime::<Utc>::UNIX_EPOCH,
        )
    }

    pub fn by(&self) -> &str {
        &self.by
    }

    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    pub fn since(&self) -> DateTime<Utc> {
        self.since
    }
}

/// `paused by B since T[: reason]`, as logs and the command line say it.
impl std::fmt::Display for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "paused by {} since {}",
            self.by,
            self.since
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )?;
        match &self.reason {
            Some(reason) => write!(f, ": {reason}"),
            None => Ok(()),
        }
    }
}

fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_CHARS)
        .collect();
    flat.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().to_utc()
    }

    #[test]
    fn round_trips_as_json_and_leaves_out_a_missing_reason() {
        let pause = Pause::new(
            "cli:ops@host",
            Some("incident 42".into()),
            at("2025-03-01T10:00:00Z"),
        );
        let json = serde_json::to_string(&pause).unwrap();
        assert_eq!(
            json,
            r#"{"by":"cli:ops@host","reason":"incident 42","since":"2025-03-01T10:00:00Z"}"#
        );
        assert_eq!(serde_json::from_str::<Pause>(&json).unwrap(), pause);
        let bare = Pause::new("console:ana", None, at("2025-03-01T10:00:00Z"));
        let json = serde_json::to_string(&bare).unwrap();
        assert!(!json.contains("reason"), "{json}");
        assert_eq!(serde_json::from_str::<Pause>(&json).unwrap(), bare);
    }

    #[test]
    fn text_is_one_line_bounded_and_a_blank_reason_is_none() {
        let pause = Pause::new(" a\nb ", Some(" \t ".into()), Utc::now());
        assert_eq!(pause.by(), "a b");
        assert_eq!(pause.reason(), None);
        let long = Pause::new("", Some("é".repeat(MAX_CHARS + 10)), Utc::now());
        assert_eq!(long.by(), Pause::UNKNOWN_BY);
        assert_eq!(long.reason().unwrap().chars().count(), MAX_CHARS);
        // Stored text is read through the same rules: a forged log line stays one line.
        let stored = r#"{"by":"x\nFAKE LOG LINE","since":"2025-03-01T10:00:00Z"}"#;
        let read: Pause = serde_json::from_str(stored).unwrap();
        assert_eq!(read.by(), "x FAKE LOG LINE");
    }

    #[test]
    fn says_who_since_when_and_why() {
        let pause = Pause::new(
            "cli:ops@host",
            Some("db migration".into()),
            at("2025-03-01T10:00:00.250Z"),
        );
        assert_eq!(
            pause.to_string(),
            "paused by cli:ops@host since 2025-03-01T10:00:00Z: db migration"
        );
        let unreadable = Pause::unreadable("expected value at line 1 column 1");
        assert_eq!(unreadable.by(), "unknown");
        assert_eq!(unreadable.since(), DateTime::<Utc>::UNIX_EPOCH);
        assert!(unreadable.reason().unwrap().contains("line 1"));
    }

    #[test]
    fn what_is_not_a_pause_does_not_parse() {
        for bad in [
            "",
            "paused",
            "{}",
            r#"{"by":"x"}"#,
            r#"{"by":"x","since":"soon"}"#,
        ] {
            assert!(serde_json::from_str::<Pause>(bad).is_err(), "{bad}");
        }
    }
}
