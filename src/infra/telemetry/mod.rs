//! Logging: human-readable text on a terminal, JSON lines otherwise (for log shippers).
//! Traces: with an OTLP endpoint set, spans go out over OTLP/HTTP (`docs/tracing.md`);
//! without one nothing of OpenTelemetry is built and the logs are exactly as before.

mod context;
mod export;
mod logs;

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanProcessor};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, OtelSettings};

pub use context::{continue_from, current, headers, link_to};
pub use export::{Bounded, ExportError, bounded, spans_dropped};

/// The target of every exported span, and only of those: the exporter's layer takes this
/// target and no other, and the log formatter leaves these spans out, so the log lines of
/// a process with export on read as they do with it off (plus the trace ids).
pub const TARGET: &str = concat!(env!("CARGO_CRATE_NAME"), "::otel");

/// An exported span ([`TARGET`]) of kind `$kind` for job `$job` of tenant `$tenant`, with
/// room for the status a failure records ([`fail`]) and any further fields; with export
/// off, `Span::none()` and nothing is made.
macro_rules! otel_span {
    ($name:expr, $kind:literal, $job:expr, $tenant:expr $(, $($field:tt)+)?) => {
        if $crate::infra::telemetry::on() {
            ::tracing::info_span!(
                target: $crate::infra::telemetry::TARGET,
                $name,
                "otel.kind" = $kind,
                "summaryd.job_id" = %$job,
                "summaryd.tenant" = %$tenant,
                "otel.status_code" = ::tracing::field::Empty,
                "otel.status_description" = ::tracing::field::Empty,
                "error.type" = ::tracing::field::Empty
                $(, $($field)+)?
            )
        } else {
            ::tracing::Span::none()
        }
    };
}
pub(crate) use otel_span;

/// Mark `span` failed with the failure's class (`transient`, `unavailable`, `permanent`,
/// or a dead letter's reason class): status Error, described by the class, and
/// `error.type`. Never the error's text, which may quote the request.
pub fn fail(span: &tracing::Span, class: &str) {
    span.record("otel.status_code", "error");
    span.record("otel.status_description", class);
    span.record("error.type", class);
}

/// Dependencies that log request data at debug level: tokio-postgres prints every
/// statement's parameters (summaries, recipients). They are held at info whatever
/// `RUST_LOG` says, because logs must never carry request texts or recipients.
const PAYLOAD_LOGGERS: [&str; 1] = ["tokio_postgres=info"];

/// How long shutdown waits for the last spans to reach the collector.
const FLUSH_WAIT: Duration = Duration::from_secs(3);

static ON: AtomicBool = AtomicBool::new(false);
/// The subscriber installed with export on (see `context::current_span_context`).
static INSTALLED: OnceLock<tracing::dispatcher::WeakDispatch> = OnceLock::new();

fn installed() -> Option<tracing::Dispatch> {
    INSTALLED.get()?.upgrade()
}

/// Export is on from here: remember the subscriber just installed.
fn switch_on(capture_content: bool) {
    tracing::dispatcher::get_default(|dispatch| {
        let _ = INSTALLED.set(dispatch.downgrade());
    });
    CAPTURE_CONTENT.store(capture_content, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported. Call sites create their spans only then, so with export off
/// not even a span is made.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether model-call spans carry the prompt and the completion
/// (`SUMMARYD_OTEL_CAPTURE_CONTENT=1`, and export on).
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

fn format_or_default(format: Option<LogFormat>) -> LogFormat {
    format.unwrap_or(if std::io::stdout().is_terminal() {
        LogFormat::Text
    } else {
        LogFormat::Json
    })
}

fn env_filter() -> EnvFilter {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in PAYLOAD_LOGGERS {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Install the global subscriber. `RUST_LOG` filters (default `info`), except for
/// [`PAYLOAD_LOGGERS`].
pub fn init(format: Option<LogFormat>) {
    let builder = tracing_subscriber::fmt().with_env_filter(env_filter());
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = match format_or_default(format) {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Logging as [`init`], and trace export when `otel` or the standard `OTEL_EXPORTER_OTLP_*`
/// variables name an endpoint. Keep the returned [`Tracing`] until the process ends and
/// call [`Tracing::shutdown`] then.
pub fn init_with_traces(format: Option<LogFormat>, otel: &OtelSettings) -> Option<Tracing> {
    let Some(url) = export::traces_url(otel.exporter_otlp_endpoint.as_deref()) else {
        init(format);
        return None;
    };
    let processor = match export::processor(url) {
        Ok(processor) => processor,
        Err(e) => {
            init(format);
            tracing::warn!("traces are not exported: {e}");
            return None;
        }
    };
    let (provider, otel_layer) = provider_and_layer(processor);
    let fmt = tracing_subscriber::fmt::layer();
    // The exported spans stay out of the log lines (see TARGET); RUST_LOG does not decide
    // what is exported.
    let mut log_filter = env_filter();
    if let Ok(directive) = format!("{TARGET}=off").parse() {
        log_filter = log_filter.add_directive(directive);
    }
    let fmt = match format_or_default(format) {
        LogFormat::Text => fmt
            .event_format(logs::WithTraceIds {
                inner: tracing_subscriber::fmt::format(),
                json: false,
            })
            .with_filter(log_filter)
            .boxed(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .map_event_format(|inner| logs::WithTraceIds { inner, json: true })
            .with_filter(log_filter)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(otel_layer)
        .with(fmt)
        .try_init();
    if installed.is_err() {
        return None;
    }
    switch_on(otel.capture_content);
    Some(Tracing { provider })
}

/// Export through `processor` with no log output: for tests that read the spans back
/// (an in-memory exporter behind [`bounded`]). Only the first call in a process installs.
pub fn init_traces_only<P: SpanProcessor + 'static>(
    processor: P,
    capture_content: bool,
) -> Option<Tracing> {
    let (provider, otel_layer) = provider_and_layer(processor);
    tracing_subscriber::registry()
        .with(otel_layer)
        .try_init()
        .ok()?;
    switch_on(capture_content);
    Some(Tracing { provider })
}

fn provider_and_layer<P: SpanProcessor + 'static>(
    processor: P,
) -> (
    SdkTracerProvider,
    impl Layer<tracing_subscriber::Registry> + Send + Sync,
) {
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(export::resource())
        .build();
    let tracer = provider.tracer("summaryd");
    // Only the attributes the call sites give (docs/tracing.md): no source locations,
    // threads, busy/idle times or targets on every span.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
    (provider, layer)
}

/// The running export, to flush when the process stops.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Send what is still queued, waiting at most a few seconds: a collector that is down
    /// must not hold up the exit. Blocking work, so it runs off the runtime's threads.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let _ = tokio::task::spawn_blocking(move || {
            let _ = provider.shutdown_with_timeout(FLUSH_WAIT);
        })
        .await;
    }

    /// Send what is queued now (tests read the spans back after this).
    pub async fn flush(&self) {
        let provider = self.provider.clone();
        let _ = tokio::task::spawn_blocking(move || provider.force_flush()).await;
    }
}
