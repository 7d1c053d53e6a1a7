//! Trace contexts in and out of spans: what the stream entry, the outbox row and the
//! webhook request carry is a [`TraceContext`]; only here does it meet OpenTelemetry.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::registry::{LookupSpan, Registry};

use super::on;
use crate::domain::TraceContext;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The OpenTelemetry context of the innermost exported span around the caller: spans of
/// the log (like the worker's `job`) are not exported, so they are looked through.
pub(super) fn current_span_context() -> Option<SpanContext> {
    if !on() {
        return None;
    }
    // The installed subscriber itself, not `dispatcher::get_default`: the log formatter
    // asks from inside the subscriber, where `get_default` answers with a no-op.
    let dispatch = super::installed()?;
    let current = dispatch.current_span();
    let id = current.id()?;
    let registry = dispatch.downcast_ref::<Registry>()?;
    let span = registry.span(id)?;
    span.scope().find_map(|span| {
        let cx = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)?;
        let context = cx.span().span_context().clone();
        context.is_valid().then_some(context)
    })
}

/// The context of the innermost exported span, to store with what this step hands on.
/// `None` when export is off.
pub fn current() -> Option<TraceContext> {
    let context = current_span_context()?;
    let cx = opentelemetry::Context::new().with_remote_span_context(context);
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    TraceContext::parse(
        carrier.get(TRACEPARENT)?,
        carrier.get(TRACESTATE).map(String::as_str),
    )
    .ok()
}

fn remote(context: &TraceContext) -> opentelemetry::Context {
    let mut carrier = HashMap::new();
    carrier.insert(TRACEPARENT.to_owned(), context.traceparent().to_owned());
    if let Some(state) = context.tracestate() {
        carrier.insert(TRACESTATE.to_owned(), state.to_owned());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// Make `span` (just created, not yet entered) a child of `parent`.
pub fn continue_from(span: &Span, parent: &TraceContext) {
    if on() && !span.is_none() {
        // Fails only for a span already started, which a caller of this never has.
        let _ = span.set_parent(remote(parent));
    }
}

/// Link `span` (just created) to `context` without joining its trace: a redelivery is
/// its own trace, pointing back at the one that accepted the job.
pub fn link_to(span: &Span, context: &TraceContext) {
    if on() && !span.is_none() {
        let cx = remote(context);
        span.add_link(cx.span().span_context().clone());
    }
}

/// The `traceparent` and `tracestate` headers naming `context`, for outgoing requests.
pub fn headers(context: &TraceContext) -> Vec<(&'static str, String)> {
    let mut headers = vec![(TRACEPARENT, context.traceparent().to_owned())];
    if let Some(state) = context.tracestate() {
        headers.push((TRACESTATE, state.to_owned()));
    }
    headers
}
