//! The OTLP receiver of the tracing tests (tests/support/otlp.rs) can fail as well as pass:
//! a hand-built export (the receiver's `--print-sample`, built with the `opentelemetry-proto`
//! classes) comes back with its names, kinds, parents, links, attributes and status as
//! sent; a refusing or slow receiver answers as told; the closed-port endpoint refuses.

use std::time::{Duration, Instant};

use crate::shared::otlp::{
    OtlpReceiver, ReceiverOptions, Spans, closed_port_endpoint, sample_export,
};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const POST_SPAN: &str = "b7ad6b7169203331";
const ENQUEUE_SPAN: &str = "00f067aa0ba902b7";
const REDELIVERY_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const DELIVER_SPAN: &str = "53995c3f42cd8ad8";

async fn post(endpoint: &str, body: Vec<u8>, gzip: bool) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{endpoint}/v1/traces"))
        .header("Content-Type", "application/x-protobuf")
        .body(body);
    if gzip {
        request = request.header("Content-Encoding", "gzip");
    }
    request.send().await.expect("POST /v1/traces")
}

#[tokio::test]
async fn receiver_decodes_names_parents_links_and_attributes_of_an_export() {
    let otlp = OtlpReceiver::start().await;
    let response = post(&otlp.endpoint(), sample_export(true).await, true).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-protobuf");
    // An empty ExportTraceServiceResponse serialises to no bytes.
    assert!(response.bytes().await.expect("body").is_empty());

    let spans = otlp.spans().await;
    assert_eq!(spans.len(), 3, "{}", spans.render());
    assert_eq!(spans.trace_ids().len(), 2);

    let post_span = spans.one("POST /v1/summaries");
    assert_eq!(post_span.trace_id, TRACE);
    assert_eq!(post_span.span_id, POST_SPAN);
    assert!(post_span.is_root());
    assert_eq!(post_span.trace_state, "vendor=1");
    assert_eq!(post_span.kind, "SPAN_KIND_SERVER");
    assert_eq!(post_span.attr_i64("http.response.status_code"), Some(202));
    assert_eq!(post_span.attr_str("http.response.status_code"), None);
    assert_eq!(post_span.attr_str("summaryd.job_id"), Some("job-1"));
    assert_eq!(post_span.resource["service.name"], "summaryd");
    assert_eq!(post_span.scope, "summaryd");
    assert_eq!(post_span.status.code, "STATUS_CODE_UNSET");
    assert!(post_span.end_time_unix_nano - post_span.start_time_unix_nano == 2_000_000);

    let enqueue = spans.one("enqueue");
    assert_eq!(enqueue.span_id, ENQUEUE_SPAN);
    assert_eq!(enqueue.kind, "SPAN_KIND_CLIENT");
    assert_eq!(spans.parent_of(enqueue), Some(post_span));
    assert_eq!(spans.children_of(post_span), vec![enqueue]);
    assert_eq!(spans.ancestors_of(enqueue), vec![enqueue, post_span]);
    assert_eq!(spans.trace(TRACE).len(), 2);

    let deliver = spans.one("deliver");
    assert_eq!(deliver.trace_id, REDELIVERY_TRACE);
    assert_eq!(deliver.span_id, DELIVER_SPAN);
    assert!(deliver.is_root());
    assert_eq!(deliver.kind, "SPAN_KIND_CONSUMER");
    assert_eq!(deliver.attr_i64("summaryd.deliveries"), Some(2));
    assert_eq!(deliver.attr_bool("summaryd.redelivered"), Some(true));
    assert_eq!(
        deliver.attr("summaryd.models"),
        Some(&serde_json::json!(["primary", "fallback"]))
    );
    assert_eq!(deliver.links.len(), 1);
    assert_eq!(deliver.links[0].trace_id, TRACE);
    assert_eq!(deliver.links[0].span_id, POST_SPAN);
    assert_eq!(
        deliver.links[0].attributes["summaryd.link"],
        "stored context"
    );
    assert!(post_span.is_linked_from(deliver));
    assert!(!enqueue.is_linked_from(deliver));
    assert!(deliver.is_error());
    assert_eq!(deliver.status.message, "timeout");
    assert_eq!(deliver.events[0].name, "exception");
    assert_eq!(deliver.events[0].attributes["exception.type"], "timeout");
    for span in &spans {
        assert_eq!(
            span.attr_str("summaryd.tenant"),
            Some("acme"),
            "{}",
            span.name
        );
    }
    assert!(deliver.strings().iter().any(|s| s == "primary"));
    assert!(
        spans
            .render()
            .contains("link -> 0af7651916cd43dd8448eb211c80319c/b7ad6b7169203331")
    );

    // Uncompressed too; spans accumulate until cleared.
    let response = post(&otlp.endpoint(), sample_export(false).await, false).await;
    assert_eq!(response.status(), 200);
    assert_eq!(otlp.spans().await.len(), 6);
    let stats = otlp.stats().await;
    assert_eq!((stats.exports, stats.rejected, stats.spans), (2, 0, 6));
    otlp.clear().await;
    assert!(otlp.spans().await.is_empty());
}

#[tokio::test]
async fn receiver_refuses_as_told_and_what_is_not_protobuf() {
    let refusing = OtlpReceiver::start_with(ReceiverOptions {
        status: Some(503),
        ..ReceiverOptions::default()
    })
    .await;
    let response = post(&refusing.endpoint(), sample_export(true).await, true).await;
    assert_eq!(response.status(), 503);
    assert!(refusing.spans().await.is_empty());
    assert_eq!(refusing.stats().await.rejected, 1);

    let otlp = OtlpReceiver::start().await;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/traces", otlp.endpoint()))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 415);
    let response = post(&otlp.endpoint(), b"not protobuf".to_vec(), true).await;
    assert_eq!(response.status(), 400);
    assert_eq!(otlp.stats().await.rejected, 2);
    assert!(otlp.spans().await.is_empty());
}

#[tokio::test]
async fn a_slow_receiver_holds_each_answer_and_keeps_the_spans_once_answered() {
    let delay = Duration::from_millis(800);
    let slow = OtlpReceiver::start_with(ReceiverOptions {
        delay,
        ..ReceiverOptions::default()
    })
    .await;
    let body = sample_export(true).await;
    let started = Instant::now();
    let response = post(&slow.endpoint(), body, true).await;
    // A lower bound the receiver's own sleep sets, so it cannot flake: this checks the
    // option works, not how fast anything is.
    assert!(
        started.elapsed() >= delay,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(response.status(), 200);
    assert_eq!(slow.spans().await.len(), 3);
}

#[tokio::test]
async fn the_closed_port_endpoint_refuses_connections() {
    let endpoint = closed_port_endpoint();
    assert!(endpoint.starts_with("http://127.0.0.1:"));
    let error = reqwest::Client::new()
        .post(format!("{endpoint}/v1/traces"))
        .body("x")
        .send()
        .await
        .expect_err("nothing listens there");
    assert!(error.is_connect(), "{error}");
}
