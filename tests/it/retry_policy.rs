//! The model retry policy against scripted model failures: what is retried, how long it
//! waits, and that a hanging model cannot hold a worker past the deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use summaryd::config::Settings;
use summaryd::infra::metrics::Metrics;
use summaryd::llm::retry::{Deadline, RetryError, RetryPolicy, complete_with_retries};
use summaryd::llm::{LlmError, ModelChain};
use summaryd::resilience::failure::Classify;

use crate::shared::FakeLlm;
use crate::shared::fakes::Step;

fn policy() -> RetryPolicy {
    RetryPolicy {
        call_timeout: Duration::from_secs(5),
        max_attempts: 4,
        base_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(10),
        min_attempt: Duration::from_millis(10),
    }
}

fn status(code: u16, retry_after: Option<Duration>) -> LlmError {
    LlmError::Status {
        status: code,
        retry_after,
        message: format!("HTTP {code}"),
    }
}

fn budget() -> Deadline {
    Deadline::after(Duration::from_secs(30))
}

fn gap_between_first_two_calls(llm: &FakeLlm) -> Duration {
    let times = llm.call_times();
    assert!(times.len() >= 2, "expected two calls, got {}", times.len());
    times[1] - times[0]
}

#[tokio::test]
async fn hanging_model_fails_within_the_deadline() {
    let llm = FakeLlm::with(vec![], Step::Hang);
    let policy = RetryPolicy {
        call_timeout: Duration::from_millis(200),
        min_attempt: Duration::from_millis(100),
        ..policy()
    };
    let started = Instant::now();
    let result = complete_with_retries(
        &llm,
        "text",
        Deadline::after(Duration::from_millis(500)),
        &policy,
        None,
    )
    .await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(600), "took {elapsed:?}");
    assert!(
        matches!(
            result,
            Err(RetryError::Llm(LlmError::Timeout) | RetryError::DeadlineExceeded { .. })
        ),
        "{result:?}"
    );
    assert!((1..=3).contains(&llm.calls()), "calls: {}", llm.calls());
}

#[tokio::test]
async fn transient_errors_are_retried_until_success() {
    let llm = Arc::new(FakeLlm::with(
        vec![Step::Fail(status(503, None)), Step::Fail(status(503, None))],
        Step::Ok("the summary".into()),
    ));
    let metrics = Arc::new(Metrics::new().unwrap());
    let mut settings = Settings::default().llm;
    settings.backoff = Duration::from_millis(1);
    settings.max_backoff = Duration::from_millis(10);
    let chain = ModelChain::single(&settings, llm.clone(), Some(metrics.clone()));
    let result = chain.summarise("text", budget()).await;
    assert_eq!(result.unwrap().text, "the summary");
    assert_eq!(llm.calls(), 3);
    let count = |label: &str| metrics.llm_requests.with_label_values(&[label]).get();
    assert_eq!(count("status_503"), 2);
    assert_eq!(count("ok"), 1);
    assert_eq!(metrics.llm_duration.get_sample_count(), 3);
}

#[tokio::test]
async fn unknown_errors_are_not_retried() {
    let llm = FakeLlm::failing(LlmError::Other("bug in our parsing".into()));
    let result = complete_with_retries(&llm, "text", budget(), &policy(), None).await;
    assert!(
        matches!(result, Err(RetryError::Llm(LlmError::Other(_)))),
        "{result:?}"
    );
    assert_eq!(llm.calls(), 1);
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let llm = FakeLlm::failing(status(400, None));
    let result = complete_with_retries(&llm, "text", budget(), &policy(), None).await;
    let err = result.unwrap_err();
    assert!(!err.is_transient(), "{err:?}");
    assert_eq!(llm.calls(), 1);
}

#[tokio::test]
async fn attempts_stop_at_max_attempts_with_the_last_error() {
    let llm = FakeLlm::failing(LlmError::Connect("connection reset".into()));
    let result = complete_with_retries(&llm, "text", budget(), &policy(), None).await;
    let err = result.unwrap_err();
    assert!(
        matches!(err, RetryError::Llm(LlmError::Connect(_))),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(llm.calls(), 4);
}

#[tokio::test]
async fn retry_after_wins_over_jitter() {
    // Jitter alone could sleep at most max_backoff's schedule from a 1 ms base; the server
    // asked for 300 ms and max_backoff allows it.
    let llm = FakeLlm::with(
        vec![Step::Fail(status(429, Some(Duration::from_millis(300))))],
        Step::Ok("ok".into()),
    );
    let policy = RetryPolicy {
        max_backoff: Duration::from_secs(10),
        ..policy()
    };
    let result = complete_with_retries(&llm, "text", budget(), &policy, None).await;
    assert_eq!(result.unwrap().summary, "ok");
    assert_eq!(llm.calls(), 2);
    let gap = gap_between_first_two_calls(&llm);
    assert!(gap >= Duration::from_millis(300), "gap {gap:?}");
}

#[tokio::test]
async fn retry_after_is_capped_at_max_backoff() {
    let llm = FakeLlm::with(
        vec![Step::Fail(status(503, Some(Duration::from_secs(5))))],
        Step::Ok("ok".into()),
    );
    let policy = RetryPolicy {
        max_backoff: Duration::from_millis(200),
        ..policy()
    };
    let result = complete_with_retries(&llm, "text", budget(), &policy, None).await;
    assert_eq!(result.unwrap().summary, "ok");
    assert_eq!(llm.calls(), 2);
    let gap = gap_between_first_two_calls(&llm);
    assert!(gap < Duration::from_secs(1), "gap {gap:?}");
}

#[tokio::test]
async fn no_attempt_starts_without_a_useful_amount_of_time() {
    let llm = FakeLlm::ok();
    let policy = RetryPolicy {
        min_attempt: Duration::from_secs(1),
        ..policy()
    };
    let result = complete_with_retries(
        &llm,
        "text",
        Deadline::after(Duration::from_millis(500)),
        &policy,
        None,
    )
    .await;
    let err = result.unwrap_err();
    assert!(
        matches!(err, RetryError::DeadlineExceeded { .. }),
        "{err:?}"
    );
    assert!(err.is_transient(), "redelivery gets a fresh budget");
    assert_eq!(llm.calls(), 0);
}

#[tokio::test]
async fn retries_stop_when_the_sleep_would_eat_the_remaining_budget() {
    // Retry-After 400 ms inside a 500 ms budget leaves less than one 200 ms attempt.
    let llm = FakeLlm::failing(status(429, Some(Duration::from_millis(400))));
    let policy = RetryPolicy {
        max_backoff: Duration::from_secs(10),
        min_attempt: Duration::from_millis(200),
        ..policy()
    };
    let result = complete_with_retries(
        &llm,
        "text",
        Deadline::after(Duration::from_millis(500)),
        &policy,
        None,
    )
    .await;
    assert!(
        matches!(
            result,
            Err(RetryError::Llm(LlmError::Status { status: 429, .. }))
        ),
        "{result:?}"
    );
    assert_eq!(llm.calls(), 1);
}
