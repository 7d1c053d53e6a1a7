//! A W3C trace context (`traceparent`, `tracestate`) as it crosses the queue and the
//! outbox: the api stores the context of its accept with the job, the worker continues
//! from it, the commit stores its own with the outbox rows, and the relay continues from
//! that. Parsed once where it comes in (a request header, a stream field, a column), so a
//! value of this type is always well-formed and never more than a few hundred bytes.

/// The longest `tracestate` kept: the W3C limit is 32 members, and 512 characters is what
/// the specification says a vendor may count on being propagated; anything longer is
/// dropped (the `traceparent` alone still joins the trace).
const MAX_TRACESTATE: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// A `traceparent` that is not a valid W3C header of a version we can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid traceparent: {0}")]
pub struct InvalidTraceContext(&'static str);

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl TraceContext {
    /// `traceparent` as the W3C Trace Context specification defines it
    /// (`{version}-{trace-id}-{parent-id}-{flags}`, lowercase hex, ids not all zero),
    /// and a `tracestate` that is kept only when it is short visible ASCII.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, InvalidTraceContext> {
        let traceparent = traceparent.trim();
        let mut parts = traceparent.splitn(5, '-');
        let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(InvalidTraceContext("expected four dash-separated fields"));
        };
        let rest = parts.next();
        if version.len() != 2 || !is_lower_hex(version) || version == "ff" {
            return Err(InvalidTraceContext("bad version"));
        }
        // Version 00 has exactly four fields; a later version may append more, which we
        // may ignore but must not mistake for part of the flags.
        if version == "00" && rest.is_some() {
            return Err(InvalidTraceContext("version 00 has four fields"));
        }
        if trace_id.len() != 32 || !is_lower_hex(trace_id) || trace_id.bytes().all(|b| b == b'0') {
            return Err(InvalidTraceContext("bad trace-id"));
        }
        if parent_id.len() != 16 || !is_lower_hex(parent_id) || parent_id.bytes().all(|b| b == b'0')
        {
            return Err(InvalidTraceContext("bad parent-id"));
        }
        if flags.len() != 2 || !is_lower_hex(flags) {
            return Err(InvalidTraceContext("bad trace-flags"));
        }
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= MAX_TRACESTATE
                    && s.bytes()
                        .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
            })
            .map(str::to_owned);
        Ok(Self {
            traceparent: format!("{version}-{trace_id}-{parent_id}-{flags}"),
            tracestate,
        })
    }

    /// The `traceparent` header value (always version 00's four fields).
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32 hex digits naming the trace.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16 hex digits naming the span this context continues from.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the caller recorded (sampled) its side of the trace.
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_into_its_parts() {
        let trace =
            TraceContext::parse(VALID, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(trace.traceparent(), VALID);
        assert_eq!(trace.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.span_id(), "00f067aa0ba902b7");
        assert!(trace.sampled());
        assert_eq!(
            trace.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let unsampled = TraceContext::parse(&VALID.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.sampled());
        assert_eq!(unsampled.tracestate(), None);
        // Surrounding whitespace (a header value's) is not part of it.
        assert_eq!(
            TraceContext::parse(&format!(" {VALID} "), None)
                .unwrap()
                .traceparent(),
            VALID
        );
    }

    #[test]
    fn a_later_version_is_read_as_version_00_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let trace = TraceContext::parse(later, None).unwrap();
        assert_eq!(
            trace.traceparent(),
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            // Version ff is forbidden; version 00 has exactly four fields.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            // All-zero ids, uppercase or non-hex digits, wrong lengths.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::parse(bad, None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_unusable_tracestate_is_dropped_and_the_traceparent_kept() {
        for state in ["", "   ", "a=b\u{7}", &"k=v,".repeat(200), "caf\u{e9}=1"] {
            let trace = TraceContext::parse(VALID, Some(state)).unwrap();
            assert_eq!(trace.tracestate(), None, "{state:?}");
        }
    }
}
