//! Log lines that lead to their trace: with export on, a line written inside an exported
//! span gets its `trace_id` and `span_id`. The line is otherwise the one the formatter
//! writes, so the format does not change; with export off this formatter is not installed.

use std::fmt;

use opentelemetry::trace::SpanContext;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::context::current_span_context;

pub(super) struct WithTraceIds<F> {
    pub(super) inner: F,
    pub(super) json: bool,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some(span) = current_span_context() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&with_ids(&line, &span, self.json))
    }
}

/// `line` with the ids added: as the last members of a JSON object, or as `key=value`
/// pairs at the end of a text line.
fn with_ids(line: &str, span: &SpanContext, json: bool) -> String {
    let (trace_id, span_id) = (span.trace_id(), span.span_id());
    let body = line.trim_end_matches('\n');
    if json {
        if let Some(head) = body.strip_suffix('}') {
            return format!("{head},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}\n");
        }
        return line.to_owned();
    }
    format!("{body} trace_id={trace_id} span_id={span_id}\n")
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    #[test]
    fn ids_join_a_json_object_or_end_a_text_line() {
        let span = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let line = with_ids("{\"level\":\"INFO\",\"message\":\"hi\"}\n", &span, true);
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed["span_id"], "00f067aa0ba902b7");
        assert_eq!(parsed["message"], "hi");
        assert!(line.ends_with("}\n"));
        assert_eq!(
            with_ids("INFO hi\n", &span, false),
            "INFO hi trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7\n"
        );
    }
}
