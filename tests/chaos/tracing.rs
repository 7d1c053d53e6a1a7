//! Traces of the real binary, exported over OTLP/HTTP to the receiver the suite starts
//! (`tests/support/otlp.rs`): kill -9 of the worker in the middle of a delivery, and the
//! redelivery is a trace of its own, linked to the accept's, carried on to the email.

use std::time::Duration;

use crate::harness::client::ApiClient;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions, eventually};
use crate::shared::otlp::{OtlpReceiver, Spans, TEST_SCHEDULE_DELAY_MS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_kill_9_is_a_new_trace_linked_to_the_accept() {
    let otlp = OtlpReceiver::start().await;
    let world = World::new(
        "tracing",
        WorldOptions {
            // Slow enough that the worker is surely mid-call when killed.
            model: ModelBehavior::slow(1_000),
            env: vec![("SUMMARYD_WORKER_CLAIM_IDLE_MS", "2000".into())],
            ..Default::default()
        },
    )
    .await;
    let env = world.env_with(&[
        ("SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint()),
        (
            "OTEL_BSP_SCHEDULE_DELAY",
            TEST_SCHEDULE_DELAY_MS.to_string(),
        ),
    ]);
    let api = world.spawn_with_env("api", "api", &env).await;
    let _relay = world.spawn_with_env("relay", "relay", &env).await;
    let mut worker_a = world.spawn_with_env("worker-a", "worker", &env).await;
    let client = ApiClient::new(api.base_url());
    let run = crate::run_id();
    // The exactly-once check finds each email by its key, so the key is the marker too.
    let marker = format!("trace-{run}-key-0001");
    let accepted = client.submit(&marker, &marker).await;
    let job_id = accepted.job_id.clone();

    assert!(
        eventually(Duration::from_secs(15), || async {
            world.model.in_flight() == 1
        })
        .await,
        "worker A never called the model"
    );
    worker_a.kill9();
    let _worker_b = world.spawn_with_env("worker-b", "worker", &env).await;
    let of_job = |s: &crate::shared::otlp::Span| s.attr_str("summaryd.job_id") == Some(&job_id);
    // The relay may send before worker B's `deliver` span ends (its acknowledgement comes
    // after the commit the relay reads), and each process exports in its own batches: wait
    // for both.
    let spans = otlp
        .wait_for(
            |spans| {
                ["send", "deliver"]
                    .iter()
                    .all(|name| spans.iter().any(|s| s.name == *name && of_job(s)))
            },
            Duration::from_secs(40),
        )
        .await;
    let spans: Vec<_> = spans.into_iter().filter(|s| of_job(s)).collect();

    let post = spans.one("POST /v1/summaries");
    assert_eq!(post.kind, "SPAN_KIND_SERVER");
    assert_eq!(
        post.resource.get("service.name").and_then(|v| v.as_str()),
        Some("summaryd")
    );
    let enqueue = spans.one("enqueue");
    assert_eq!(
        enqueue.parent_span_id.as_deref(),
        Some(post.span_id.as_str())
    );
    assert_eq!(enqueue.trace_id, post.trace_id);

    // Worker A's delivery died with it; worker B's is the second and starts a new trace
    // that links back to the accept.
    let deliver = spans.one("deliver");
    let deliveries = deliver.attr_i64("summaryd.deliveries");
    assert!(deliveries.is_some_and(|n| n > 1), "{}", spans.render());
    assert_eq!(deliver.kind, "SPAN_KIND_CONSUMER");
    assert!(deliver.is_root(), "{}", spans.render());
    assert_ne!(deliver.trace_id, post.trace_id);
    assert!(enqueue.is_linked_from(deliver), "{}", spans.render());

    // The rest of the job goes on in the redelivery's trace: the model call, the commit and
    // the email's send (the outbox row carried the commit's context to the relay).
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert!(!chats.is_empty(), "{}", spans.render());
    for chat in &chats {
        assert_eq!(
            chat.parent_span_id.as_deref(),
            Some(deliver.span_id.as_str())
        );
        assert_eq!(chat.kind, "SPAN_KIND_CLIENT");
        assert_eq!(chat.attr_str("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.attr_str("gen_ai.provider.name"), Some("openai"));
        assert!(chat.attr_str("gen_ai.request.model").is_some());
    }
    let commit = spans.one("commit");
    assert_eq!(
        commit.parent_span_id.as_deref(),
        Some(deliver.span_id.as_str())
    );
    let send = spans.one("send");
    assert_eq!(
        send.parent_span_id.as_deref(),
        Some(commit.span_id.as_str())
    );
    assert_eq!(send.trace_id, deliver.trace_id);
    assert_eq!(send.attr_str("summaryd.topic"), Some("email.summary_ready"));

    // The marker is in the text, the summary and the recipient; no span carries it.
    for span in &spans {
        assert_eq!(
            span.attr_str("summaryd.tenant"),
            Some("chaos"),
            "{}",
            span.name
        );
        for s in span.strings() {
            assert!(!s.contains(&marker), "{} carries {s:?}", span.name);
        }
    }
    world.assert_exactly_once(&[accepted], &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_with_a_model_retry_is_one_trace_from_the_post_to_the_email() {
    let otlp = OtlpReceiver::start().await;
    // The first call is answered 500 after a while; the retry finds the model healthy.
    let world = World::new(
        "tracing-retry",
        WorldOptions {
            model: ModelBehavior {
                error_rate: 1.0,
                ..ModelBehavior::slow(500)
            },
            // Long enough that the one delivery keeps its claim on a busy machine.
            env: vec![("SUMMARYD_WORKER_CLAIM_IDLE_MS", "20000".into())],
            ..Default::default()
        },
    )
    .await;
    let env = world.env_with(&[
        ("SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint()),
        (
            "OTEL_BSP_SCHEDULE_DELAY",
            TEST_SCHEDULE_DELAY_MS.to_string(),
        ),
    ]);
    let all = world.spawn_with_env("all", "api,worker,relay", &env).await;
    let client = ApiClient::new(all.base_url()).with_webhook(world.webhooks.url());
    let run = crate::run_id();
    let marker = format!("retry-{run}-key-0001");
    let accepted = client.submit(&marker, &marker).await;
    let job_id = accepted.job_id.clone();
    assert!(
        eventually(Duration::from_secs(15), || async {
            world.model.in_flight() == 1
        })
        .await,
        "the model was never called"
    );
    world.model.set_behavior(ModelBehavior::fast());
    let of_job = |s: &crate::shared::otlp::Span| s.attr_str("summaryd.job_id") == Some(&job_id);
    let spans = otlp
        .wait_for(
            |spans| {
                spans
                    .iter()
                    .filter(|s| s.name == "send" && of_job(s))
                    .count()
                    == 2
            },
            Duration::from_secs(30),
        )
        .await;
    let spans: Vec<_> = spans.into_iter().filter(|s| of_job(s)).collect();

    // One trace, one root: the POST.
    let post = spans.one("POST /v1/summaries");
    assert!(post.is_root());
    assert_eq!(spans.trace_ids().len(), 1, "{}", spans.render());
    let enqueue = spans.one("enqueue");
    let deliver = spans.one("deliver");
    assert_eq!(
        enqueue.parent_span_id.as_deref(),
        Some(post.span_id.as_str())
    );
    assert_eq!(
        deliver.parent_span_id.as_deref(),
        Some(enqueue.span_id.as_str())
    );
    assert_eq!(deliver.attr_i64("summaryd.deliveries"), Some(1));
    assert!(deliver.links.is_empty());
    let mut chats: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    chats.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(chats.len(), 2, "{}", spans.render());
    for chat in &chats {
        assert_eq!(
            chat.parent_span_id.as_deref(),
            Some(deliver.span_id.as_str())
        );
        assert_eq!(chat.attr_str("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.attr_str("gen_ai.provider.name"), Some("openai"));
        let model = chat.attr_str("gen_ai.request.model").unwrap();
        assert_eq!(chat.name, format!("chat {model}"));
    }
    assert!(chats[0].is_error(), "{}", spans.render());
    assert_eq!(chats[0].attr_str("error.type"), Some("status_500"));
    assert!(!chats[1].is_error());
    assert_eq!(
        chats[1].attr_str("gen_ai.response.model"),
        chats[1].attr_str("gen_ai.request.model")
    );
    let commit = spans.one("commit");
    assert_eq!(
        commit.parent_span_id.as_deref(),
        Some(deliver.span_id.as_str())
    );
    // The email and the webhook: each row's send continues the commit that wrote it, and
    // the webhook request carries its send span's context.
    let sends = spans.named("send");
    assert_eq!(sends.len(), 2, "{}", spans.render());
    for send in &sends {
        assert_eq!(
            send.parent_span_id.as_deref(),
            Some(commit.span_id.as_str())
        );
    }
    let topics: Vec<_> = sends
        .iter()
        .filter_map(|s| s.attr_str("summaryd.topic"))
        .collect();
    assert!(
        topics.contains(&"email.summary_ready") && topics.contains(&"webhook"),
        "{topics:?}"
    );
    let webhook_send = sends
        .iter()
        .find(|s| s.attr_str("summaryd.topic") == Some("webhook"))
        .unwrap();
    let expected = format!("00-{}-{}-01", webhook_send.trace_id, webhook_send.span_id);
    let received = world.webhooks.received();
    assert!(
        received
            .iter()
            .any(|r| r.request.header("traceparent") == Some(expected.as_str())),
        "no webhook request carries {expected}"
    );
    for span in &spans {
        assert_eq!(
            span.attr_str("summaryd.tenant"),
            Some("chaos"),
            "{}",
            span.name
        );
        for s in span.strings() {
            assert!(!s.contains(&marker), "{} carries {s:?}", span.name);
        }
    }
    world.assert_exactly_once(&[accepted], &client).await;

    // The log lines written inside the delivery lead to its trace.
    let trace_id = format!("\"trace_id\":\"{}\"", post.trace_id);
    assert!(
        all.output()
            .lines()
            .any(|line| line.contains(&trace_id) && line.contains("\"span_id\":\"")),
        "no log line names the trace: {}",
        all.output()
            .lines()
            .filter(|l| l.contains(&job_id))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_content_capture_only_the_model_spans_carry_the_prompt_and_completion() {
    let otlp = OtlpReceiver::start().await;
    let world = World::new("tracing-content", WorldOptions::default()).await;
    let env = world.env_with(&[
        ("SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint()),
        (
            "OTEL_BSP_SCHEDULE_DELAY",
            TEST_SCHEDULE_DELAY_MS.to_string(),
        ),
        ("SUMMARYD_OTEL_CAPTURE_CONTENT", "1".into()),
    ]);
    let all = world.spawn_with_env("all", "api,worker,relay", &env).await;
    let client = ApiClient::new(all.base_url());
    let marker = format!("content-{}-key-0001", crate::run_id());
    let accepted = client.submit(&marker, &marker).await;
    let job_id = accepted.job_id.clone();
    let of_job = |s: &crate::shared::otlp::Span| s.attr_str("summaryd.job_id") == Some(&job_id);
    let spans = otlp
        .wait_for(
            |spans| spans.iter().any(|s| s.name == "send" && of_job(s)),
            Duration::from_secs(30),
        )
        .await;
    let spans: Vec<_> = spans.into_iter().filter(|s| of_job(s)).collect();
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(chats.len(), 1, "{}", spans.render());
    let input = chats[0]
        .attr_str("gen_ai.input.messages")
        .unwrap_or_default();
    let output = chats[0]
        .attr_str("gen_ai.output.messages")
        .unwrap_or_default();
    assert!(input.contains(&marker), "the prompt: {input}");
    assert!(output.contains(&marker), "the completion: {output}");
    for span in spans.iter().filter(|s| !s.name.starts_with("chat ")) {
        for s in span.strings() {
            assert!(!s.contains(&marker), "{} carries {s:?}", span.name);
        }
    }
    world.assert_exactly_once(&[accepted], &client).await;
}
