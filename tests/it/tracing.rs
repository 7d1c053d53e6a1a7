//! Traces in-process: the whole application exporting into an in-memory exporter, read back
//! to check that one job is one trace from the POST to the email, with the model calls,
//! the commit and the send where they belong. (The same over OTLP/HTTP to a real receiver,
//! and the redelivery of a killed worker: `tests/chaos/tracing.rs`.)
//!
//! The tracer is process-wide, so the first test here installs it for the whole binary; the
//! spans of other tests running beside it are told apart by job id.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{KeyValue, Value as OtelValue};
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SimpleSpanProcessor, SpanData, SpanProcessor,
};
use serde_json::{Value, json};
use summaryd::config::roles::Roles;
use summaryd::db::outbox;
use summaryd::db::summaries;
use summaryd::domain::{Email, Job, JobId, SummaryReady, TenantId, TraceContext};
use summaryd::infra::telemetry;
use summaryd::llm::LlmError;
use tracing::Instrument;

use crate::shared::fakes::Step;
use crate::shared::running::Running;
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually};

/// The tenant of this file's jobs: only their spans are kept (the tracer is process-wide,
/// so every test running beside these makes spans too).
const TENANT: &str = "traced";

/// The exporter this file's spans go to, once the first test here asked.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        // Exported as each span ends, so a test never waits for a batch.
        let processor = OnlyTraced(SimpleSpanProcessor::new(exporter.clone()));
        let installed = telemetry::init_traces_only(processor, false);
        // Leaked on purpose: the provider must outlive every test of the binary.
        std::mem::forget(installed.expect("no other global subscriber in this binary"));
        exporter
    })
}

/// Passes on the spans of [`TENANT`] (and the spans of no tenant, the tests' own) only.
#[derive(Debug)]
struct OnlyTraced<P>(P);

impl<P: SpanProcessor> SpanProcessor for OnlyTraced<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        match attr_str(&span, "summaryd.tenant") {
            Some(tenant) if tenant != TENANT => {}
            _ => self.0.on_end(span),
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn attr_str(span: &SpanData, key: &str) -> Option<String> {
    attr(span, key).map(|v| v.as_str().into_owned())
}

fn spans_of(job_id: &str) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| attr_str(s, "summaryd.job_id").as_deref() == Some(job_id))
        .collect()
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name} span in {:#?}", names(spans));
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

fn is_child(child: &SpanData, parent: &SpanData) -> bool {
    child.span_context.trace_id() == parent.span_context.trace_id()
        && child.parent_span_id == parent.span_context.span_id()
}

#[tokio::test]
async fn one_job_is_one_trace_from_the_post_to_the_email() {
    exporter();
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.llm.backoff = Duration::from_millis(1);
    settings.llm.max_backoff = Duration::from_millis(5);
    // The first call times out, the retry answers: two chat spans, the first failed.
    let llm = Arc::new(
        FakeLlm::with(vec![Step::Fail(LlmError::Timeout)], Step::Ok(String::new()))
            .reporting(42, 7),
    );
    let mailer = Arc::new(FakeMailer::new());
    let app = env
        .services()
        .settings(settings)
        .llm(llm.clone())
        .mailer(mailer.clone())
        .application(Roles::all())
        .await;
    let app = Running::start(app);
    let text = "Quarterly revenue grew by nine percent. Churn fell. Hiring paused.";
    let recipient = "traced-recipient@example.com";
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/summaries", app.base))
        .header("Idempotency-Key", "tracing-test-key-00001")
        .header("X-Tenant-Id", TENANT)
        .header("traceparent", caller)
        .header("tracestate", "congo=t61rcWkgMzE")
        .json(&json!({"text": text, "notify": recipient}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    let answer: Value = answer.json().await.unwrap();
    let job_id = answer["job_id"].as_str().unwrap().to_owned();
    assert!(
        eventually(Duration::from_secs(20), || async {
            !named(&spans_of(&job_id), "send").is_empty()
        })
        .await,
        "the send span arrives: {:?}",
        names(&spans_of(&job_id))
    );
    app.stop().await;
    let spans = spans_of(&job_id);

    // The caller's trace goes on through every hop.
    let caller = TraceContext::parse(caller, None).unwrap();
    let post = one(&spans, "POST /v1/summaries");
    assert_eq!(post.span_kind, SpanKind::Server);
    assert_eq!(post.span_context.trace_id().to_string(), caller.trace_id());
    assert_eq!(post.parent_span_id.to_string(), caller.span_id());
    assert_eq!(
        post.span_context.trace_state().header(),
        "congo=t61rcWkgMzE"
    );
    let enqueue = one(&spans, "enqueue");
    assert_eq!(enqueue.span_kind, SpanKind::Client);
    assert!(is_child(enqueue, post));
    let deliver = one(&spans, "deliver");
    assert_eq!(deliver.span_kind, SpanKind::Consumer);
    assert!(
        is_child(deliver, enqueue),
        "the first delivery continues the accept"
    );
    assert_eq!(
        attr(deliver, "summaryd.deliveries"),
        Some(&OtelValue::I64(1))
    );
    assert!(deliver.links.is_empty());

    let chats: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(chats.len(), 2, "{:?}", names(&spans));
    let (failed, answered) = if matches!(chats[0].status, Status::Error { .. }) {
        (chats[0], chats[1])
    } else {
        (chats[1], chats[0])
    };
    for chat in [failed, answered] {
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert!(is_child(chat, deliver));
        assert_eq!(
            attr_str(chat, "gen_ai.operation.name").as_deref(),
            Some("chat")
        );
        let model = attr_str(chat, "gen_ai.request.model").unwrap();
        assert_eq!(chat.name, format!("chat {model}"));
        assert!(attr_str(chat, "gen_ai.provider.name").is_some());
        assert_eq!(attr(chat, "gen_ai.input.messages"), None, "no content");
        assert_eq!(attr(chat, "gen_ai.output.messages"), None, "no content");
    }
    assert_eq!(attr_str(failed, "error.type").as_deref(), Some("timeout"));
    assert!(matches!(answered.status, Status::Unset));
    assert_eq!(
        attr_str(answered, "gen_ai.response.model"),
        attr_str(answered, "gen_ai.request.model")
    );
    assert_eq!(
        attr(answered, "gen_ai.usage.input_tokens"),
        Some(&OtelValue::I64(42))
    );
    assert_eq!(
        attr(answered, "gen_ai.usage.output_tokens"),
        Some(&OtelValue::I64(7))
    );

    let commit = one(&spans, "commit");
    assert!(is_child(commit, deliver));
    assert_eq!(
        attr_str(commit, "db.system.name").as_deref(),
        Some("postgresql")
    );
    let send = one(&spans, "send");
    assert!(
        is_child(send, commit),
        "the send continues the commit's context"
    );
    assert_eq!(
        attr_str(send, "summaryd.topic").as_deref(),
        Some("email.summary_ready")
    );

    // Every span names the job and tenant, and none carries the text, the summary (the
    // fake model's starts with the text) or the recipient.
    for span in &spans {
        assert_eq!(
            attr_str(span, "summaryd.tenant").as_deref(),
            Some(TENANT),
            "{}",
            span.name
        );
        for kv in &span.attributes {
            let value = kv.value.as_str();
            for secret in [text, recipient, "Quarterly revenue"] {
                assert!(!value.contains(secret), "{} carries {}", span.name, kv.key);
            }
        }
    }
}

/// The outbox row carries the context of the commit that wrote it, and the relay's claim
/// reads it back.
#[tokio::test]
async fn an_outbox_row_carries_its_commits_trace_context_to_the_claim() {
    exporter();
    let env = TestEnv::new().await;
    let services = env.services().build().relay();
    let commit = |n: u32| {
        let job = Job {
            job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:traced-{n}")),
            tenant: TenantId::parse(TENANT).unwrap(),
            text: "A traced report.".into(),
            notify: Some(Email::parse("traced@example.com").unwrap()),
            webhook: None,
            created_at: chrono::Utc::now(),
        };
        let pg = services.pg.clone();
        async move {
            summaries::commit_with_outbox(&pg, &job, &crate::shared::model_summary("Traced."))
                .await
                .unwrap();
            job.job_id
        }
    };
    let parent = tracing::info_span!(target: telemetry::TARGET, "test parent");
    let (traced, expected) = async {
        let job_id = commit(1).await;
        (job_id, telemetry::current().unwrap())
    }
    .instrument(parent)
    .await;
    commit(2).await;

    let rows = outbox::claim_due(
        &services.pg,
        SummaryReady::TOPIC,
        10,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    // Oldest first: the traced commit's row, then the other.
    let stored = rows[0].trace.clone().expect("a traced row");
    // The commit span's own context: the parent's trace, another span.
    assert_eq!(stored.trace_id(), expected.trace_id());
    assert_ne!(stored.span_id(), expected.span_id());
    assert!(stored.sampled());
    let commit_span = spans_of(&traced.to_string())
        .into_iter()
        .find(|s| s.name == "commit")
        .expect("the commit span");
    assert_eq!(
        commit_span.span_context.span_id().to_string(),
        stored.span_id()
    );
    // Outside every span the commit's own span starts a trace, and the row carries that.
    let own = rows[1].trace.clone().expect("the commit span's own trace");
    assert_ne!(own.trace_id(), expected.trace_id());
}
