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
