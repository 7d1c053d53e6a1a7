//! The real providers against real servers on loopback: an OpenAI-compatible model stub, an
//! email API stub and an SMTP sink, each started inside the test.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use secrecy::SecretString;
use serde_json::json;
use summaryd::config::{LlmProvider, LlmSettings, MailProvider, MailSettings, Settings};
use summaryd::llm::{self, Llm, LlmError, OpenAiClient, ProviderConfig};
use summaryd::mail::{self, HttpMailer, MailError, Mailer, OutgoingEmail, SmtpMailer};
use summaryd::resilience::failure::{Classify, Disposition};

use crate::shared::http_stub::{HttpStub, Reply, closed_port_url};
use crate::shared::log_capture::Captured;
use crate::shared::smtp_sink::SmtpSink;

const KEY: &str = "sk-test-4f1c9a7e2b";

fn llm_settings(base_url: &str, api_key: Option<&str>) -> LlmSettings {
    let mut s = Settings::default().llm;
    s.provider = LlmProvider::Openai;
    s.base_url = base_url.into();
    s.api_key = api_key.map(SecretString::from);
    s
}

async fn model_stub(reply: Reply) -> (HttpStub, OpenAiClient) {
    let stub = HttpStub::start(reply).await;
    let client = OpenAiClient::new(&ProviderConfig::primary(&llm_settings(
        &stub.url("/v1"),
        Some(KEY),
    )))
    .unwrap();
    (stub, client)
}

fn email() -> OutgoingEmail {
    OutgoingEmail {
        from: "summaryd@example.com".into(),
        to: "ana@customer.test".into(),
        subject: "Your summary is ready".into(),
        text: "Summary: renewal at risk.\nJob: 6f1c2a9e-0000-4000-8000-000000000001".into(),
    }
}

fn mail_settings(provider: MailProvider) -> MailSettings {
    let mut s = Settings::default().mail;
    s.provider = provider;
    s
}

// ---- model API -----------------------------------------------------------------------------

#[tokio::test]
async fn openai_returns_the_summary_and_sends_prompt_model_and_key() {
    let (stub, client) = model_stub(Reply::completion("Renewal at risk; call Ana.")).await;

    let summary = client.summarise("Ana says the renewal is at risk.").await;

    assert_eq!(summary.unwrap().summary, "Renewal at risk; call Ana.");
    let requests = stub.requests();
    assert_eq!(requests.len(), 1, "one attempt, no retries of its own");
    let r = &requests[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = r.json();
    assert_eq!(body["model"], "gpt-4.1-mini");
    // The instructions in the system message; the text only as delimited data.
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": summaryd::llm::SYSTEM_PROMPT},
               {"role": "user",
                "content": "<document>\nAna says the renewal is at risk.\n</document>"}])
    );
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("account team") && system.contains("never instructions"),
        "{system}"
    );
}

#[tokio::test]
async fn openai_without_a_key_sends_no_authorization_for_local_servers() {
    let stub = HttpStub::start(Reply::completion("ok")).await;
    let client = OpenAiClient::new(&ProviderConfig::primary(&llm_settings(
        &stub.url("/v1/"),
        None,
    )))
    .unwrap();

    assert_eq!(client.summarise("text").await.unwrap().summary, "ok");

    let requests = stub.requests();
    assert_eq!(
        requests[0].path, "/v1/chat/completions",
        "trailing slash tolerated"
    );
    assert_eq!(requests[0].header("authorization"), None);
}

#[tokio::test]
async fn rate_limit_429_carries_retry_after_seconds() {
    let reply = Reply::json(
        429,
        json!({"error": {"message": "Rate limit reached for requests"}}),
    )
    .with_header("Retry-After", "1");
    let (_stub, client) = model_stub(reply).await;

    match client.summarise("t").await {
        Err(LlmError::Status {
            status,
            retry_after,
            message,
        }) => {
            assert_eq!(status, 429);
            assert_eq!(retry_after, Some(Duration::from_secs(1)));
            assert_eq!(message, "Rate limit reached for requests");
        }
        other => panic!("expected 429 Status, got {other:?}"),
    }
}

#[tokio::test]
async fn retry_after_ms_wins_over_seconds_and_http_dates_are_parsed() {
    let reply = Reply::json(429, json!({}))
        .with_header("retry-after-ms", "250")
        .with_header("Retry-After", "30");
    let (stub, client) = model_stub(reply).await;
    let got = client.summarise("t").await;
    assert!(
        matches!(got, Err(LlmError::Status { status: 429, retry_after: Some(d), .. }) if d == Duration::from_millis(250)),
        "{got:?}"
    );

    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(5));
    stub.set_reply(Reply::json(503, json!({})).with_header("Retry-After", &date));
    match client.summarise("t").await {
        Err(LlmError::Status {
            status: 503,
            retry_after: Some(d),
            ..
        }) => {
            // HTTP dates have one-second resolution.
            assert!(
                d > Duration::from_secs(3) && d <= Duration::from_secs(5),
                "{d:?}"
            );
        }
        other => panic!("expected 503 with a date, got {other:?}"),
    }
}

#[tokio::test]
async fn error_statuses_map_to_status_with_a_short_excerpt() {
    let (stub, client) = model_stub(Reply::text(503, "upstream overloaded")).await;
    for (status, body) in [
        (503, "upstream overloaded"),
        (400, "Invalid value for 'temperature'"),
        (401, "Invalid authentication"),
        (500, ""),
    ] {
        stub.set_reply(Reply::text(status, body));
        match client.summarise("t").await {
            Err(LlmError::Status {
                status: got,
                retry_after,
                message,
            }) => {
                assert_eq!(got, status);
                assert_eq!(retry_after, None);
                let expected = if body.is_empty() {
                    "(empty body)"
                } else {
                    body
                };
                assert_eq!(message, expected);
            }
            other => panic!("{status}: expected Status, got {other:?}"),
        }
    }
    assert_eq!(stub.requests().len(), 4, "exactly one request per call");

    // A context refusal is its own error, whatever the status it comes with, so the text
    // is split smaller instead of dead-lettered.
    for status in [400, 500] {
        stub.set_reply(Reply::text(
            status,
            "This model's maximum context length is 128000 tokens",
        ));
        match client.summarise("t").await {
            Err(LlmError::ContextExceeded(message)) => {
                assert!(message.contains("maximum context length"), "{message}");
            }
            other => panic!("{status}: expected ContextExceeded, got {other:?}"),
        }
    }
    stub.set_reply(Reply::text(
        503,
        "This model's maximum context length is 128000 tokens",
    ));
    assert!(
        matches!(
            client.summarise("t").await,
            Err(LlmError::Status { status: 503, .. })
        ),
        "a 503 is an outage whatever its body says"
    );

    stub.set_reply(Reply::text(502, &"x".repeat(10_000)));
    let Err(LlmError::Status { message, .. }) = client.summarise("t").await else {
        panic!("expected Status");
    };
    assert!(
        message.chars().count() <= 301,
        "excerpt stays short: {}",
        message.len()
    );
}

#[tokio::test]
async fn malformed_success_bodies_are_malformed_and_name_the_problem() {
    let (stub, client) = model_stub(Reply::completion("x")).await;
    let cases = [
        (
            Reply::json(200, json!({"id": "x", "choices": []})),
            "`choices` is empty",
        ),
        (Reply::json(200, json!({"id": "x"})), "no `choices`"),
        (
            Reply::completion(""),
            "`choices[0].message.content` is empty",
        ),
        (
            Reply::json(
                200,
                json!({"choices": [{"message": {"role": "assistant"}}]}),
            ),
            "`choices[0].message.content` is missing",
        ),
        (Reply::text(200, "<html>gateway</html>"), "not JSON"),
    ];
    for (reply, expected) in cases {
        stub.set_reply(reply);
        match client.summarise("t").await {
            Err(LlmError::Malformed(message)) => {
                assert!(
                    message.contains(expected),
                    "{message:?} should say {expected:?}"
                )
            }
            other => panic!("{expected}: expected Malformed, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn connection_refused_is_a_connect_error() {
    let client = OpenAiClient::new(&ProviderConfig::primary(&llm_settings(
        &closed_port_url("/v1"),
        Some(KEY),
    )))
    .unwrap();

    match client.summarise("t").await {
        Err(LlmError::Connect(message)) => {
            assert!(message.to_lowercase().contains("refused"), "{message}")
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[tokio::test]
async fn connection_reset_after_accept_is_a_connect_error() {
    let (stub, client) = model_stub(Reply::Reset).await;

    let got = client.summarise("t").await;

    assert!(matches!(got, Err(LlmError::Connect(_))), "{got:?}");
    assert_eq!(
        stub.requests().len(),
        1,
        "the server did receive the request"
    );
}

#[tokio::test]
async fn dripping_response_is_cut_by_the_callers_timeout_and_the_connection_is_released() {
    let (stub, client) = model_stub(Reply::Drip {
        every: Duration::from_secs(1),
    })
    .await;
    let budget = Duration::from_millis(500);

    // The way crate::llm::retry bounds every attempt: a wall-clock cap around the whole call.
    let started = Instant::now();
    let outcome = tokio::time::timeout(budget, client.summarise("t")).await;
    let elapsed = started.elapsed();

    assert!(outcome.is_err(), "the call must be cut, got {outcome:?}");
    assert!(
        elapsed < Duration::from_millis(900),
        "cut within the budget: {elapsed:?}"
    );
    assert_eq!(stub.requests().len(), 1);
    // Dropping the call future must close the socket; nothing keeps reading in the background.
    assert!(
        stub.wait_all_closed(Duration::from_secs(3)).await,
        "the dripping connection is still open after the call was cut"
    );
}

#[tokio::test]
async fn api_key_never_appears_in_debug_errors_or_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // tracing-core caches each callsite's interest. While only ONE dispatcher exists, a
    // callsite first hit on another test's thread asks that thread's default (none) and is
    // cached as "never", hiding our log lines. A second live dispatcher makes registration
    // consult every registered dispatcher, ours included.
    let _second_dispatcher = tracing::Dispatch::new(tracing_subscriber::registry());
    // Current-thread test runtime: every task of this test logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    // A server that echoes the key back, as some APIs do in their 401 message.
    let echo = Reply::json(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {KEY}")}}),
    );
    let stub = HttpStub::start(echo).await;
    let mut settings = llm_settings(&stub.url("/v1"), Some(KEY));
    let client = OpenAiClient::new(&ProviderConfig::primary(&settings)).unwrap();
    let err = client.summarise("t").await.unwrap_err();
    settings.base_url = closed_port_url("/v1").into();
    let connect_err = OpenAiClient::new(&ProviderConfig::primary(&settings))
        .unwrap()
        .summarise("t")
        .await
        .unwrap_err();
    let via_factory = llm::from_settings(&settings)
        .unwrap()
        .summarise("t")
        .await
        .unwrap_err();

    assert_eq!(
        stub.requests()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let logged = logs.text();
    assert!(
        logged.contains("model call failed"),
        "the capture works: {logged}"
    );
    for (what, text) in [
        ("client Debug", format!("{client:?}")),
        ("client pretty Debug", format!("{client:#?}")),
        ("error Display", err.to_string()),
        ("error Debug", format!("{err:?}")),
        ("connect error", format!("{connect_err} {connect_err:?}")),
        ("factory error", format!("{via_factory} {via_factory:?}")),
        ("logs", logged),
    ] {
        assert!(!text.contains(KEY), "{what} leaks the key: {text}");
    }
    assert!(
        err.to_string()
            .contains("Incorrect API key provided: <redacted>"),
        "{err}"
    );
}

// ---- context guard -------------------------------------------------------------------------

/// A prompt that does not fit the provider's context is never sent: the chain says how
/// small to split it. One the provider refuses as over its context (OpenAI's answer) comes
/// back the same way, with a smaller room, and opens no breaker.
#[tokio::test]
async fn a_prompt_over_the_context_is_split_not_sent_and_a_context_refusal_splits_smaller() {
    let stub = HttpStub::start(Reply::completion("fine")).await;
    let mut settings = llm_settings(&stub.url("/v1"), Some(KEY));
    settings.model = "local-model".into();
    settings.max_tokens = 64;
    settings.context_tokens = 1_000;
    let chain = llm::ModelChain::from_settings(&settings, None).unwrap();
    let deadline = || llm::retry::Deadline::after(Duration::from_secs(5));
    let fit = llm::fits(&settings)[0];
    let room = fit.room(llm::PromptKind::Document);

    let too_long = "word ".repeat(room);
    match chain.summarise(&too_long, deadline()).await {
        // Cut into parts: the room of a part, whose instructions are longer.
        Err(llm::ChainError::TooLong { room: r, .. }) => {
            assert_eq!(r, fit.room(llm::PromptKind::Part));
            assert!(r < room);
        }
        other => panic!("{other:?}"),
    }
    assert!(stub.requests().is_empty(), "the model never sees it");

    let fits = "word ".repeat(room * 5 / 2 / 5 - 2);
    assert_eq!(
        chain.summarise(&fits, deadline()).await.unwrap().text,
        "fine"
    );
    assert_eq!(stub.requests().len(), 1);

    stub.set_reply(Reply::json(
        400,
        json!({"error": {"message": "This model's maximum context length is 1000 tokens.",
                         "type": "invalid_request_error", "code": "context_length_exceeded"}}),
    ));
    let tokens = fit.counter().count(&fits);
    match chain.summarise(&fits, deadline()).await {
        Err(llm::ChainError::TooLong { room: r, .. }) => assert_eq!(r, tokens / 3 * 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(stub.requests().len(), 2, "refused once, not retried");
    assert!(
        !chain.all_open(),
        "the provider is fine: its breaker stays closed"
    );
}

#[tokio::test]
async fn openai_provider_needs_a_usable_base_url() {
    for bad in ["", "localhost:8000/v1", "ftp://models/v1"] {
        let err = llm::from_settings(&llm_settings(bad, None))
            .err()
            .map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.contains("SUMMARYD_LLM_BASE_URL"), "{bad:?}: {err}");
    }
}

// ---- HTTP mail -----------------------------------------------------------------------------

#[tokio::test]
async fn http_mail_posts_json_with_the_dedupe_key_as_idempotency_key() {
    let sink = HttpStub::start(Reply::json(202, json!({"id": "msg_1"}))).await;
    let mut settings = mail_settings(MailProvider::Http);
    settings.http_url = Some(sink.url("/v1/emails").into());
    let mailer = mail::from_settings(&settings, crate::shared::log_key()).unwrap();

    mailer
        .send(&email(), "outbox:6f1c2a9e:summary-ready")
        .await
        .unwrap();

    let requests = sink.requests();
    assert_eq!(requests.len(), 1, "exactly one message");
    let r = &requests[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/emails"));
    assert_eq!(
        r.header("idempotency-key"),
        Some("outbox:6f1c2a9e:summary-ready")
    );
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
    );
    let e = email();
    assert_eq!(
        r.json(),
        json!({"from": e.from, "to": e.to, "subject": e.subject, "text": e.text})
    );
}

#[tokio::test]
async fn http_mail_classifies_provider_answers() {
    let sink = HttpStub::start(Reply::text(503, "down")).await;
    let mut settings = mail_settings(MailProvider::Http);
    settings.http_url = Some(sink.url("/send").into());
    let mailer = HttpMailer::new(&settings).unwrap();

    for status in [503, 500, 429, 408] {
        sink.set_reply(Reply::text(status, "try later"));
        let got = mailer.send(&email(), "k1").await;
        assert!(
            matches!(&got, Err(e @ MailError::Status { .. }) if e.is_transient()),
            "{status}: {got:?}"
        );
    }
    // The provider refuses us, not the email: the relay waits for a fix, parks nothing.
    for status in [401, 403, 404] {
        sink.set_reply(Reply::json(status, json!({"message": "invalid api key"})));
        let got = mailer.send(&email(), "k1").await;
        assert!(
            matches!(&got, Err(e @ MailError::Status { .. })
                if e.disposition() == Disposition::Unavailable && e.to_string().contains("invalid api key")),
            "{status}: {got:?}"
        );
    }
    for status in [400, 422] {
        sink.set_reply(Reply::json(
            status,
            json!({"message": "recipient domain blocked"}),
        ));
        match mailer.send(&email(), "k1").await {
            Err(e) if e.disposition() == Disposition::Permanent => {
                let m = e.to_string();
                assert!(
                    m.contains(&status.to_string()) && m.contains("recipient domain blocked"),
                    "{m}"
                )
            }
            other => panic!("{status}: expected Permanent, got {other:?}"),
        }
    }
    sink.set_reply(Reply::text(200, "ok"));
    assert!(mailer.send(&email(), "k1").await.is_ok());
    assert_eq!(
        sink.requests().len(),
        10,
        "one request per send, no hidden retries"
    );
}

#[tokio::test]
async fn http_mail_unreachable_or_stalled_provider_is_transient() {
    let mut settings = mail_settings(MailProvider::Http);
    settings.http_url = Some(closed_port_url("/send").into());
    let got = HttpMailer::new(&settings)
        .unwrap()
        .send(&email(), "k")
        .await;
    assert!(
        matches!(&got, Err(e @ MailError::Unreachable(_)) if e.is_transient()),
        "{got:?}"
    );

    let stalled = HttpStub::start(Reply::Hang).await;
    settings.http_url = Some(stalled.url("/send").into());
    settings.timeout = Duration::from_millis(300);
    let mailer = HttpMailer::new(&settings).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), mailer.send(&email(), "k"))
        .await
        .expect("SUMMARYD_MAIL_TIMEOUT_MS must bound a send to a provider that never answers");
    assert!(matches!(&got, Err(e) if e.is_transient()), "{got:?}");
}

// ---- SMTP ----------------------------------------------------------------------------------

fn smtp_mailer(sink: &SmtpSink) -> Arc<dyn Mailer> {
    let mut settings = mail_settings(MailProvider::Smtp);
    settings.smtp_url = Some(sink.url().into());
    mail::from_settings(&settings, crate::shared::log_key()).unwrap()
}

#[tokio::test]
async fn smtp_sends_one_message_with_a_dedupe_derived_message_id() {
    let sink = SmtpSink::start().await;
    let mailer = smtp_mailer(&sink);

    mailer.send(&email(), "outbox:job-1").await.unwrap();

    let messages = sink.messages();
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!(m.mail_from, "summaryd@example.com");
    assert_eq!(m.rcpt_to, vec!["ana@customer.test".to_owned()]);
    assert_eq!(
        m.header("Subject").as_deref(),
        Some("Your summary is ready")
    );
    assert_eq!(m.header("To").as_deref(), Some("ana@customer.test"));
    assert_eq!(
        m.header("Message-ID"),
        Some(mail::message_id("outbox:job-1", "example.com"))
    );
    assert!(m.body().contains("renewal at risk"), "{}", m.body());
}

#[tokio::test]
async fn smtp_resend_with_the_same_dedupe_key_carries_the_same_message_id() {
    let sink = SmtpSink::start().await;
    let mailer = smtp_mailer(&sink);

    // A relay that sent and crashed before committing sends the row again.
    mailer.send(&email(), "outbox:job-2").await.unwrap();
    mailer.send(&email(), "outbox:job-2").await.unwrap();
    mailer.send(&email(), "outbox:job-3").await.unwrap();

    let ids: Vec<Option<String>> = sink
        .messages()
        .iter()
        .map(|m| m.header("Message-ID"))
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids[0].is_some());
    assert_eq!(ids[0], ids[1], "same row, same Message-ID");
    assert_ne!(ids[1], ids[2], "another row gets its own Message-ID");
}

#[tokio::test]
async fn smtp_replies_are_classified_transient_or_permanent() {
    let sink = SmtpSink::start().await;
    let mailer = smtp_mailer(&sink);

    sink.reject_rcpt_with("451 4.3.0 mailbox temporarily unavailable");
    let got = mailer.send(&email(), "k").await;
    assert!(
        matches!(&got, Err(e @ MailError::SmtpReply { code: 451, .. })
            if e.is_transient() && e.to_string().contains("451")),
        "{got:?}"
    );

    sink.reject_rcpt_with("550 5.1.1 no such user");
    let got = mailer.send(&email(), "k").await;
    assert!(
        matches!(&got, Err(e @ MailError::SmtpReply { code: 550, .. })
            if e.disposition() == Disposition::Permanent && e.to_string().contains("550")),
        "{got:?}"
    );
    assert!(sink.messages().is_empty(), "nothing was accepted");

    let mut bad_to = email();
    bad_to.to = "not an address".into();
    let got = mailer.send(&bad_to, "k").await;
    assert!(
        matches!(&got, Err(e @ MailError::InvalidAddress { field: "to", .. })
            if e.disposition() == Disposition::Permanent),
        "{got:?}"
    );

    let mut settings = mail_settings(MailProvider::Smtp);
    settings.smtp_url = Some(closed_port_url("").replace("http://", "smtp://").into());
    let got = SmtpMailer::new(&settings)
        .unwrap()
        .send(&email(), "k")
        .await;
    assert!(
        matches!(&got, Err(e @ MailError::SmtpConnection { .. }) if e.is_transient()),
        "{got:?}"
    );
}

#[tokio::test]
async fn smtp_server_that_never_greets_is_cut_by_the_mail_timeout() {
    let silent = HttpStub::start(Reply::Hang).await;
    let mut settings = mail_settings(MailProvider::Smtp);
    settings.smtp_url = Some(format!("smtp://{}", silent.addr).into());
    settings.timeout = Duration::from_millis(300);
    let mailer = SmtpMailer::new(&settings).unwrap();

    let got = tokio::time::timeout(Duration::from_secs(5), mailer.send(&email(), "k"))
        .await
        .expect("SUMMARYD_MAIL_TIMEOUT_MS must bound a send to a silent SMTP server");

    assert!(matches!(&got, Err(e) if e.is_transient()), "{got:?}");
}

#[tokio::test]
async fn mail_from_settings_builds_each_provider_and_names_missing_urls() {
    assert!(
        mail::from_settings(&mail_settings(MailProvider::Log), crate::shared::log_key()).is_ok()
    );
    for (provider, setting) in [
        (MailProvider::Http, "SUMMARYD_MAIL_HTTP_URL"),
        (MailProvider::Smtp, "SUMMARYD_MAIL_SMTP_URL"),
    ] {
        let err = mail::from_settings(&mail_settings(provider), crate::shared::log_key())
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().unwrap_or_default().contains(setting),
            "{err:?}"
        );
    }
    let mut settings = mail_settings(MailProvider::Smtp);
    settings.smtp_url = Some("smtp://u:p@mail.example.com:587?tls=required".into());
    assert!(mail::from_settings(&settings, crate::shared::log_key()).is_ok());
    settings.from = "not an address".into();
    let err = mail::from_settings(&settings, crate::shared::log_key())
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .unwrap_or_default()
            .contains("SUMMARYD_MAIL_FROM"),
        "{err:?}"
    );
}

// ---- what a tenant and an operator are told about a failed job -------------------------

/// Providers quote a masked key and the organisation in their errors (OpenAI's 401 does; a
/// gateway may in a 400). A job refused as its own fault (400) is dead-lettered; the tenant's
/// GET shows summaryd's wording of the class only, and the operator's `dlq list` keeps the
/// provider's text, without any fragment of the key. (A 401 is the provider's fault: it
/// opens the provider's breaker instead, `tests/it/model_chain.rs`.)
#[actix_web::test]
async fn a_provider_rejection_reaches_the_tenant_as_our_wording_and_no_one_sees_the_key() {
    use actix_web::test as web;
    use summaryd::config::roles::Roles;
    use summaryd::shutdown::Shutdown;

    const LONG_KEY: &str = "sk-proj-Zq81mVbXw2LpKd77RtY0aa4Hc9Qe";
    let masked = "Incorrect API key provided: sk-proj-********************4Hc9Qe. \
                  You can find your API key at https://platform.openai.com/account/api-keys. \
                  Organization org-Ab12Cd34Ef56.";
    let stub = HttpStub::start(Reply::json(
        400,
        json!({"error": {"message": masked, "code": "invalid_api_key"}}),
    ))
    .await;
    let env = crate::shared::TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.llm = llm_settings(&stub.url("/v1"), Some(LONG_KEY));
    let model = llm::from_settings(&settings.llm).unwrap();
    let services = env.services().settings(settings).llm(model).build();
    summaryd::stream::consumer_group::ensure_group(&mut env.redis().await, services.keys.get(0))
        .await
        .unwrap();
    let app = web::init_service(summaryd::api::app(
        services.api(),
        Roles::all(),
        Shutdown::new(),
    ))
    .await;
    let res = web::call_service(
        &app,
        crate::shared::api_requests::post(
            "acme",
            "provider-401-key-0001",
            crate::shared::api_requests::BODY,
        )
        .to_request(),
    )
    .await;
    assert_eq!(res.status(), 202);
    let job_id = crate::shared::api_requests::json_body(res).await["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut worker = summaryd::worker::Consumer::new(services.worker(), "w-401");
    assert_eq!(worker.run_once().await.unwrap(), 1);

    let res = web::call_service(
        &app,
        crate::shared::api_requests::get("acme", &job_id).to_request(),
    )
    .await;
    let view = crate::shared::api_requests::json_body(res).await;
    assert_eq!(view["status"], "failed");
    assert_eq!(view["error"], "the model rejected the request (HTTP 400)");

    // What `summaryd dlq list --json` prints.
    let mut out = Vec::new();
    summaryd::ops::dlq::list(&services.redis, &services.keys, 10, true, &mut out)
        .await
        .unwrap();
    let reason = String::from_utf8(out).unwrap();
    assert_eq!(reason.matches(&job_id).count(), 1, "{reason}");
    assert!(
        reason.contains("model API answered 400: Incorrect API key provided"),
        "{reason}"
    );
    for fragment in ["4Hc9Qe", "sk-proj", "Ab12Cd34Ef56", LONG_KEY] {
        assert!(!reason.contains(fragment), "{fragment} in {reason}");
        assert!(!view.to_string().contains(fragment), "{fragment} in {view}");
    }
}
