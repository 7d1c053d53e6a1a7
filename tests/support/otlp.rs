//! An OTLP/HTTP trace receiver the tests start: `tests/support/otlp_receiver.py` (run by
//! `scripts/otlp-receiver.sh`), which decodes exports with the OpenTelemetry project's own
//! protobuf classes (`opentelemetry-proto` from PyPI), so a span counts only if a real
//! collector would read it. One process per receiver, on a port of its own, killed on drop.
//!
//! ```ignore
//! let otlp = OtlpReceiver::start().await;
//! // the process under test gets `otlp.env()`:
//! //   SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint(), OTEL_BSP_SCHEDULE_DELAY=100
//! let spans = otlp
//!     .wait_for(|s| s.iter().any(|s| s.name == "send"), Duration::from_secs(20))
//!     .await;
//! let post = spans.one("POST /v1/summaries");
//! let trace = spans.trace(&post.trace_id);
//! assert_eq!(trace.children_of(post).len(), 1, "{}", trace.render());
//! assert_eq!(post.attr_str("summaryd.job_id"), Some(job_id.as_str()));
//! ```
//!
//! The first start on a machine installs the packages into a venv (a few seconds; the
//! script's lock makes concurrent first starts wait for one install); later starts take a
//! fraction of a second.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The script that installs the receiver's packages and runs it.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/otlp-receiver.sh");

/// What tests give `OTEL_BSP_SCHEDULE_DELAY` (ms): the batch processor exports every 100 ms
/// instead of every 5 s, so spans arrive while a test waits for them.
pub const TEST_SCHEDULE_DELAY_MS: u64 = 100;

/// How long the receiver may take to say it listens: a first start installs a venv from
/// PyPI (and python3-venv from apt on a bare machine).
const START_LIMIT: Duration = Duration::from_secs(300);

/// How the receiver answers exports.
#[derive(Debug, Clone, Default)]
pub struct ReceiverOptions {
    /// Hold every export's answer this long (a slow collector). The spans of a held export
    /// are kept only once it is answered.
    pub delay: Duration,
    /// Answer every export with this status and keep nothing (a collector refusing, e.g.
    /// 503); `None`: 200 with an empty `ExportTraceServiceResponse`.
    pub status: Option<u16>,
}

/// A span as the receiver decoded it. Ids are lowercase hex; attribute values are JSON
/// (ints as numbers, strings, bools, arrays; a key-value list as an object, bytes as hex).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    /// The W3C `tracestate` the span carries ("" when none).
    pub trace_state: String,
    pub name: String,
    /// The proto enum's name: `SPAN_KIND_SERVER`, `SPAN_KIND_CLIENT`, `SPAN_KIND_CONSUMER`,
    /// `SPAN_KIND_PRODUCER`, `SPAN_KIND_INTERNAL` (or `SPAN_KIND_UNSPECIFIED`).
    pub kind: String,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    pub attributes: Map<String, Value>,
    pub events: Vec<Event>,
    pub links: Vec<Link>,
    pub status: Status,
    /// The resource's attributes (`service.name`, ...).
    pub resource: Map<String, Value>,
    /// The instrumentation scope's name.
    pub scope: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    pub name: String,
    pub time_unix_nano: u64,
    pub attributes: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Link {
    pub trace_id: String,
    pub span_id: String,
    pub trace_state: String,
    pub attributes: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Status {
    /// `STATUS_CODE_UNSET`, `STATUS_CODE_OK` or `STATUS_CODE_ERROR`.
    pub code: String,
    pub message: String,
}

/// The receiver's counters (`GET /stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Stats {
    /// Exports answered 200 (their spans kept).
    pub exports: u64,
    /// Exports answered otherwise: `--status`, a wrong content type, a malformed body.
    pub rejected: u64,
    /// Spans kept now.
    pub spans: u64,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }

    /// A string attribute; `None` when absent or of another type.
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(Value::as_str)
    }

    /// An int attribute; `None` when absent or of another type (a string "2" is not 2).
    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(Value::as_i64)
    }

    pub fn attr_bool(&self, key: &str) -> Option<bool> {
        self.attr(key).and_then(Value::as_bool)
    }

    pub fn is_root(&self) -> bool {
        self.parent_span_id.is_none()
    }

    pub fn is_error(&self) -> bool {
        self.status.code == "STATUS_CODE_ERROR"
    }

    /// Whether this span is a link's target: some link of `other` points at it.
    pub fn is_linked_from(&self, other: &Span) -> bool {
        other
            .links
            .iter()
            .any(|l| l.trace_id == self.trace_id && l.span_id == self.span_id)
    }

    /// Every string anywhere in the span (attribute, event and link values, status message,
    /// name), for "this text appears in no span" checks.
    pub fn strings(&self) -> Vec<String> {
        fn walk(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::String(s) => out.push(s.clone()),
                Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
                Value::Object(map) => map.values().for_each(|i| walk(i, out)),
                _ => {}
            }
        }
        let mut out = vec![self.name.clone(), self.status.message.clone()];
        self.attributes.values().for_each(|v| walk(v, &mut out));
        for e in &self.events {
            out.push(e.name.clone());
            e.attributes.values().for_each(|v| walk(v, &mut out));
        }
        for l in &self.links {
            l.attributes.values().for_each(|v| walk(v, &mut out));
        }
        out
    }
}

/// Queries over a set of spans (a `Vec<Span>` or a slice); the owned results (`trace`) can
/// be queried again.
pub trait Spans {
    fn all(&self) -> &[Span];

    /// The spans named `name`, in arrival order.
    fn named(&self, name: &str) -> Vec<&Span> {
        self.all().iter().filter(|s| s.name == name).collect()
    }

    /// The one span named `name`; panics (listing every span) unless there is exactly one.
    fn one(&self, name: &str) -> &Span {
        let found = self.named(name);
        assert_eq!(
            found.len(),
            1,
            "expected exactly one span named {name:?}, found {}:\n{}",
            found.len(),
            render(self.all())
        );
        found[0]
    }

    /// The span with this id.
    fn by_id(&self, span_id: &str) -> Option<&Span> {
        self.all().iter().find(|s| s.span_id == span_id)
    }

    /// The spans of one trace, in start order.
    fn trace(&self, trace_id: &str) -> Vec<Span> {
        let mut spans: Vec<Span> = self
            .all()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect();
        spans.sort_by_key(|s| (s.start_time_unix_nano, s.end_time_unix_nano));
        spans
    }

    /// The distinct trace ids.
    fn trace_ids(&self) -> BTreeSet<String> {
        self.all().iter().map(|s| s.trace_id.clone()).collect()
    }

    /// The direct children of `span` (same trace, parent = its id), in start order.
    fn children_of(&self, span: &Span) -> Vec<&Span> {
        let mut children: Vec<&Span> = self
            .all()
            .iter()
            .filter(|s| {
                s.trace_id == span.trace_id && s.parent_span_id.as_deref() == Some(&span.span_id)
            })
            .collect();
        children.sort_by_key(|s| s.start_time_unix_nano);
        children
    }

    /// The parent of `span`, when it is among these spans.
    fn parent_of(&self, span: &Span) -> Option<&Span> {
        let parent = span.parent_span_id.as_deref()?;
        self.all()
            .iter()
            .find(|s| s.trace_id == span.trace_id && s.span_id == parent)
    }

    /// The chain from `span` up to the highest ancestor present, `span` first.
    fn ancestors_of<'a>(&'a self, span: &'a Span) -> Vec<&'a Span> {
        let mut chain = vec![span];
        while let Some(parent) = self.parent_of(chain[chain.len() - 1]) {
            if chain.len() > self.all().len() {
                break; // a cycle would be the exporter's bug; do not loop on it
            }
            chain.push(parent);
        }
        chain
    }

    /// The root spans (no parent).
    fn roots(&self) -> Vec<&Span> {
        self.all().iter().filter(|s| s.is_root()).collect()
    }

    /// The spans as an indented tree per trace, for assertion messages.
    fn render(&self) -> String {
        render(self.all())
    }
}

impl Spans for [Span] {
    fn all(&self) -> &[Span] {
        self
    }
}

impl Spans for Vec<Span> {
    fn all(&self) -> &[Span] {
        self
    }
}

/// Each trace as a tree: name, kind, ids, status, attributes and links; a span whose
/// parent is missing is shown as a root marked `(parent … not received)`.
pub fn render(spans: &[Span]) -> String {
    fn line(out: &mut String, spans: &[Span], span: &Span, depth: usize) {
        let attrs: Vec<String> = span
            .attributes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = write!(
            out,
            "{:indent$}{} [{}] span {}",
            "",
            span.name,
            span.kind.trim_start_matches("SPAN_KIND_"),
            span.span_id,
            indent = depth * 2 + 2
        );
        if depth == 0
            && let Some(p) = &span.parent_span_id
        {
            let _ = write!(out, " (parent {p} not received)");
        }
        if span.status.code != "STATUS_CODE_UNSET" {
            let _ = write!(out, " {} {:?}", span.status.code, span.status.message);
        }
        let _ = writeln!(out, " {{{}}}", attrs.join(", "));
        for l in &span.links {
            let _ = writeln!(
                out,
                "{:indent$}link -> {}/{}",
                "",
                l.trace_id,
                l.span_id,
                indent = depth * 2 + 6
            );
        }
        for child in spans.children_of(span) {
            line(out, spans, child, depth + 1);
        }
    }
    let mut out = String::new();
    for trace_id in spans.trace_ids() {
        let trace = spans.trace(&trace_id);
        let _ = writeln!(out, "trace {trace_id}");
        for span in &trace {
            if spans.parent_of(span).is_none() {
                line(&mut out, &trace, span, 0);
            }
        }
    }
    if out.is_empty() {
        out.push_str("  (no spans)\n");
    }
    out
}

/// A running receiver; the process is killed when this is dropped.
pub struct OtlpReceiver {
    child: tokio::process::Child,
    port: u16,
    http: reqwest::Client,
}

impl OtlpReceiver {
    /// A receiver answering every export at once with 200.
    pub async fn start() -> Self {
        Self::start_with(ReceiverOptions::default()).await
    }

    pub async fn start_with(options: ReceiverOptions) -> Self {
        let mut command = tokio::process::Command::new("bash");
        command
            .arg(SCRIPT)
            // The receiver exits when this pipe closes, so it dies with the test process
            // even when that is killed and `Drop` never runs.
            .arg("--exit-on-stdin-eof")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its own errors (a malformed export, an install failure) show in the test's
            // output; it prints nothing else there.
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if !options.delay.is_zero() {
            command
                .arg("--delay-s")
                .arg(options.delay.as_secs_f64().to_string());
        }
        if let Some(status) = options.status {
            command.arg("--status").arg(status.to_string());
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {SCRIPT}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START_LIMIT, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{SCRIPT} did not print LISTENING within {START_LIMIT:?}"))
            .unwrap_or_else(|e| panic!("reading {SCRIPT}'s stdout: {e}"))
            .unwrap_or_else(|| panic!("{SCRIPT} exited before listening (its stderr is above)"));
        let port = first
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("{SCRIPT} printed {first:?}, not `LISTENING <port>`"));
        Self {
            child,
            port,
            http: reqwest::Client::new(),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The base URL for `SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT` (`http://127.0.0.1:PORT`);
    /// exports go to `{endpoint}/v1/traces`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a summaryd process needs to export here, quickly: the endpoint and
    /// `OTEL_BSP_SCHEDULE_DELAY` = [`TEST_SCHEDULE_DELAY_MS`].
    pub fn env(&self) -> Vec<(String, String)> {
        export_env(&self.endpoint())
    }

    /// Every span received so far, in arrival order.
    pub async fn spans(&self) -> Vec<Span> {
        self.get("/spans").await
    }

    /// Forget the spans received so far.
    pub async fn clear(&self) {
        let url = format!("{}/spans", self.endpoint());
        let status = self
            .http
            .delete(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {url}: {e}"))
            .status();
        assert!(status.is_success(), "DELETE {url}: {status}");
    }

    pub async fn stats(&self) -> Stats {
        self.get("/stats").await
    }

    /// Poll the spans (at once, then every 50 ms) until `pred` holds, and return them; after
    /// `timeout`, panic with the spans seen (as trees). For "nothing more arrives" use
    /// [`Self::try_wait_for`].
    pub async fn wait_for<F>(&self, pred: F, timeout: Duration) -> Vec<Span>
    where
        F: FnMut(&[Span]) -> bool,
    {
        match self.try_wait_for(pred, timeout).await {
            Ok(spans) => spans,
            Err(spans) => panic!(
                "the receiver's spans did not satisfy the condition within {timeout:?}; \
                 received {}:\n{}",
                spans.len(),
                render(&spans)
            ),
        }
    }

    /// [`Self::wait_for`] without the panic: `Err` with the last spans seen at `timeout`.
    pub async fn try_wait_for<F>(
        &self,
        mut pred: F,
        timeout: Duration,
    ) -> Result<Vec<Span>, Vec<Span>>
    where
        F: FnMut(&[Span]) -> bool,
    {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans().await;
            if pred(&spans) {
                return Ok(spans);
            }
            if tokio::time::Instant::now() >= until {
                return Err(spans);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        let url = format!("{}{path}", self.endpoint());
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert!(
            response.status().is_success(),
            "GET {url}: {}",
            response.status()
        );
        response
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: not the expected JSON: {e}"))
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        // kill_on_drop would too; start_kill makes it happen now rather than at the
        // runtime's next reap.
        let _ = self.child.start_kill();
    }
}

/// The export settings for a process sending to `endpoint`: the endpoint and a
/// `OTEL_BSP_SCHEDULE_DELAY` of [`TEST_SCHEDULE_DELAY_MS`].
pub fn export_env(endpoint: &str) -> Vec<(String, String)> {
    vec![
        (
            "SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            endpoint.to_owned(),
        ),
        (
            "OTEL_BSP_SCHEDULE_DELAY".to_owned(),
            TEST_SCHEDULE_DELAY_MS.to_string(),
        ),
    ]
}

/// `http://127.0.0.1:PORT` on a port nothing listens on: a collector that is down
/// (connection refused).
pub fn closed_port_endpoint() -> String {
    crate::shared::http_stub::closed_port_url("")
}

/// The receiver's hand-built sample export (`--print-sample`), gzipped or not, and the ids
/// in it: see `sample_request` in `tests/support/otlp_receiver.py`.
pub async fn sample_export(gzip: bool) -> Vec<u8> {
    let output = tokio::process::Command::new("bash")
        .arg(SCRIPT)
        .arg("--print-sample")
        .arg(if gzip { "gzip" } else { "plain" })
        .stderr(Stdio::inherit())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {SCRIPT}: {e}"));
    assert!(
        output.status.success(),
        "{SCRIPT} --print-sample: {}",
        output.status
    );
    output.stdout
}
