//! Getting spans out: OTLP/HTTP protobuf through a batch processor whose queue is bounded,
//! on a thread of its own, so a collector that is down or slow costs a request nothing;
//! what cannot be queued or sent is dropped and counted.

use std::env;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};

/// Spans dropped since the process started: the queue was full or their export failed.
/// Process-wide because the tracer is (one per process, whatever the app instances);
/// `summaryd_otel_spans_dropped_total` reports it.
static DROPPED: AtomicU64 = AtomicU64::new(0);

pub fn spans_dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Export waits at most this long per batch unless `OTEL_EXPORTER_OTLP_TIMEOUT` says
/// otherwise: the SDK's 10 s would hold a full queue behind one slow collector for long.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// The SDK's defaults, which `OTEL_BSP_MAX_QUEUE_SIZE` overrides.
const DEFAULT_QUEUE: usize = 2048;

/// Why export could not be set up; logged, and the process runs without it.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("trace export: {0}")]
    Build(String),
    #[error("trace export needs a Tokio runtime to send from")]
    NoRuntime,
}

/// The traces URL: `SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL, like the standard
/// variable) gets `/v1/traces`; without it the exporter resolves the standard
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` itself. `None`:
/// export is off.
pub(super) fn traces_url(configured: Option<&str>) -> Option<Option<String>> {
    if let Some(base) = configured.map(str::trim).filter(|s| !s.is_empty()) {
        return Some(Some(format!("{}/v1/traces", base.trim_end_matches('/'))));
    }
    let set = |name: &str| env::var(name).is_ok_and(|v| !v.trim().is_empty());
    (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .then_some(None)
}

fn env_millis(names: &[&str]) -> Option<Duration> {
    names
        .iter()
        .find_map(|name| env::var(name).ok()?.trim().parse().ok())
        .map(Duration::from_millis)
}

fn queue_size() -> usize {
    env::var("OTEL_BSP_MAX_QUEUE_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_QUEUE)
}

/// `service.name` is `summaryd` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
/// names it (the SDK's detectors read both).
pub(super) fn resource() -> Resource {
    let named = env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("summaryd").build()
    }
}

/// The OTLP/HTTP exporter behind the bounded batch processor.
pub(super) fn processor(url: Option<String>) -> Result<Bounded, ExportError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| ExportError::NoRuntime)?;
    let timeout = env_millis(&[
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ])
    .unwrap_or(DEFAULT_TIMEOUT);
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| ExportError::Build(e.to_string()))?;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(timeout)
        .with_http_client(OnRuntime { client, runtime });
    if let Some(url) = url {
        builder = builder.with_endpoint(url);
    }
    let exporter = builder
        .build()
        .map_err(|e| ExportError::Build(e.to_string()))?;
    Ok(bounded(exporter, queue_size()))
}

/// `exporter` behind a batch processor holding at most `queue` spans.
pub fn bounded<E: SpanExporter + 'static>(exporter: E, queue: usize) -> Bounded {
    let waiting = Arc::new(AtomicUsize::new(0));
    let counted = Counted {
        inner: exporter,
        waiting: waiting.clone(),
    };
    // BatchConfigBuilder::default reads the OTEL_BSP_* variables; the queue is set to
    // the same bound as the gate in front, so the gate is the one that drops (and counts).
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(queue)
        .build();
    Bounded {
        inner: BatchSpanProcessor::builder(counted)
            .with_batch_config(config)
            .build(),
        waiting,
        queue,
    }
}

/// The batch processor with a gate in front: a span is queued only while fewer than
/// `queue` spans wait for export, otherwise dropped and counted. (The SDK drops on a full
/// queue too, but only logs how many.) `waiting` counts spans handed on and not yet given
/// to the exporter, which is never less than what the processor's own queue holds, so the
/// processor never drops a span this gate let through.
#[derive(Debug)]
pub struct Bounded {
    inner: BatchSpanProcessor,
    waiting: Arc<AtomicUsize>,
    queue: usize,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        if before >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting what leaves the queue and the spans of batches that failed.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    waiting: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.waiting.fetch_sub(spans, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        if result.is_err() {
            DROPPED.fetch_add(spans as u64, Ordering::Relaxed);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The service's reqwest, sending on the Tokio runtime it was built on. The batch
/// processor exports from a thread of its own without a runtime; each request is spawned
/// onto the service's runtime and awaited through its join handle, which needs none.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let response = client.execute(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        });
        let (status, headers, body) = sent.await??;
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    /// A collector that refuses every export.
    #[derive(Debug)]
    struct Refusing;

    impl SpanExporter for Refusing {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Err(OTelSdkError::InternalFailure("refused".into()))
        }
    }

    #[test]
    fn every_span_that_is_not_exported_is_counted_once() {
        let before = spans_dropped();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(bounded(Refusing, 4))
            .build();
        let tracer = provider.tracer("test");
        // More than the queue holds, ended at once: some are refused at the gate, the
        // rest fail in export; each is counted, none twice.
        for _ in 0..10 {
            tracer.start("span").end();
        }
        let _ = provider.force_flush();
        let _ = provider.shutdown();
        assert_eq!(spans_dropped() - before, 10);
    }

    #[test]
    fn the_endpoint_setting_is_a_base_url() {
        assert_eq!(
            traces_url(Some("http://127.0.0.1:4318/")),
            Some(Some("http://127.0.0.1:4318/v1/traces".to_owned()))
        );
        assert_eq!(
            traces_url(Some(" http://collector:4318 ")),
            Some(Some("http://collector:4318/v1/traces".to_owned()))
        );
    }
}
