//! The single owner of the model retry policy: classification, per-call wall-clock timeouts,
//! full-jitter exponential backoff, `Retry-After`, and the per-delivery deadline.
//!
//! Providers make exactly one attempt; nothing else retries the model, so attempts never
//! multiply across layers. `backoff` (unmaintained) is used only here, to compute the growing
//! cap; swapping it touches this file alone.

use std::time::Duration;

use backoff::backoff::Backoff;
use backoff::{ExponentialBackoff, ExponentialBackoffBuilder};
use tokio::time::Instant;

use crate::config::LlmSettings;
use crate::llm::{Llm, LlmError};
use crate::metrics::Metrics;

/// Statuses a later attempt can fix (the same set the OpenAI SDK retries), plus every 5xx.
const RETRYABLE_STATUS: [u16; 3] = [408, 409, 429];

/// Below this much time, an attempt cannot realistically finish, so we do not start one.
const DEFAULT_MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// Whether a later attempt of the same call can succeed. Unknown errors are not retried:
/// they are bugs until logs prove otherwise, and would fail the same way every time.
pub fn is_retryable(err: &LlmError) -> bool {
    match err {
        LlmError::Timeout | LlmError::Connect(_) => true,
        LlmError::Status { status, .. } => RETRYABLE_STATUS.contains(status) || *status >= 500,
        LlmError::Malformed(_) | LlmError::InvalidInput(_) | LlmError::Other(_) => false,
    }
}

/// A monotonic point in time by which one delivery must be done; clock changes cannot
/// stretch it.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Self(Instant::now() + budget)
    }

    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Wall-clock cap of one call: a server that drips bytes never trips a per-read timeout.
    pub call_timeout: Duration,
    /// In-process attempts per delivery; redelivery (bounded by max_deliveries) does the rest.
    pub max_attempts: u32,
    /// Cap of the first backoff sleep; doubles per retry.
    pub base_backoff: Duration,
    /// Upper bound of any sleep, `Retry-After` included.
    pub max_backoff: Duration,
    /// The least time worth starting an attempt with.
    pub min_attempt: Duration,
}

impl RetryPolicy {
    pub fn from_settings(settings: &LlmSettings) -> Self {
        let call_timeout = Duration::from_millis(settings.call_timeout_ms);
        Self {
            call_timeout,
            max_attempts: settings.max_attempts.max(1),
            base_backoff: Duration::from_millis(settings.backoff_ms),
            max_backoff: Duration::from_millis(settings.max_backoff_ms),
            // A call timeout below the default would otherwise make every attempt "too short".
            min_attempt: DEFAULT_MIN_ATTEMPT.min(call_timeout),
        }
    }

    /// Growing caps for full jitter: base, 2·base, 4·base … up to `max_backoff`.
    fn caps(&self) -> ExponentialBackoff {
        ExponentialBackoffBuilder::new()
            .with_initial_interval(self.base_backoff)
            // Full jitter is applied in `full_jitter`; the crate's symmetric factor is not it.
            .with_randomization_factor(0.0)
            .with_multiplier(2.0)
            .with_max_interval(self.max_backoff)
            // The deadline, not the crate, bounds the total time.
            .with_max_elapsed_time(None)
            .build()
    }

    /// The sleep before the next attempt after `err`: `Retry-After` when the server sent
    /// one (capped), otherwise a full-jitter draw below `cap`.
    fn sleep_after(&self, err: &LlmError, cap: Duration) -> Duration {
        match err {
            LlmError::Status {
                retry_after: Some(after),
                ..
            } => (*after).min(self.max_backoff),
            _ => full_jitter(cap.min(self.max_backoff)),
        }
    }
}

/// Why `complete_with_retries` gave up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RetryError {
    /// The last model error; `is_retryable` says whether redelivery may help.
    #[error(transparent)]
    Llm(LlmError),
    /// Too little of the delivery's budget was left to start an attempt. Deliberately not a
    /// timeout: it is never retried in-process, only by redelivery with a fresh budget.
    #[error("deadline exceeded: {remaining:?} left, an attempt needs {needed:?}")]
    DeadlineExceeded {
        remaining: Duration,
        needed: Duration,
    },
}

impl RetryError {
    /// Whether a later delivery may succeed (the message should stay pending).
    pub fn is_transient(&self) -> bool {
        match self {
            RetryError::Llm(e) => is_retryable(e),
            RetryError::DeadlineExceeded { .. } => true,
        }
    }
}

/// A uniformly random duration in `[0, cap]`, so workers that hit the same 429 together
/// spread out instead of retrying in lockstep.
pub fn full_jitter(cap: Duration) -> Duration {
    let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::random_range(0..=nanos))
}

/// Call the model under the policy: each attempt gets `min(call_timeout, remaining)` of
/// wall clock; only retryable errors are retried; stops on `max_attempts` or when the next
/// sleep would leave less than one useful attempt, returning the last error.
pub async fn complete_with_retries(
    llm: &dyn Llm,
    text: &str,
    deadline: Deadline,
    policy: &RetryPolicy,
    metrics: Option<&Metrics>,
) -> Result<String, RetryError> {
    let mut caps = policy.caps();
    let mut attempt: u32 = 0;
    loop {
        let remaining = deadline.remaining();
        let timeout = policy.call_timeout.min(remaining);
        if timeout < policy.min_attempt {
            return Err(RetryError::DeadlineExceeded {
                remaining,
                needed: policy.min_attempt,
            });
        }
        attempt += 1;
        let err = match call_once(llm, text, timeout, metrics).await {
            Ok(summary) => return Ok(summary),
            Err(err) => err,
        };
        if !is_retryable(&err) || attempt >= policy.max_attempts {
            return Err(RetryError::Llm(err));
        }
        let cap = caps.next_backoff().unwrap_or(policy.max_backoff);
        let sleep = policy.sleep_after(&err, cap);
        if deadline.remaining().saturating_sub(sleep) < policy.min_attempt {
            tracing::warn!(attempt, error = %err, "model call failed; no time left for another attempt");
            return Err(RetryError::Llm(err));
        }
        tracing::warn!(attempt, error = %err, sleep_ms = sleep.as_millis() as u64, "model call failed; retrying");
        tokio::time::sleep(sleep).await;
    }
}

/// One attempt under a hard wall-clock timeout, recorded in the metrics.
async fn call_once(
    llm: &dyn Llm,
    text: &str,
    timeout: Duration,
    metrics: Option<&Metrics>,
) -> Result<String, LlmError> {
    let started = Instant::now();
    let result = match tokio::time::timeout(timeout, llm.summarise(text)).await {
        Ok(result) => result,
        Err(_elapsed) => Err(LlmError::Timeout),
    };
    if let Some(m) = metrics {
        m.llm_duration.observe(started.elapsed().as_secs_f64());
        m.llm_requests
            .with_label_values(&[&result_label(&result)])
            .inc();
    }
    result
}

/// The `result` label of `summaryd_llm_requests_total`.
fn result_label(result: &Result<String, LlmError>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(LlmError::Timeout) => "timeout".into(),
        Err(LlmError::Connect(_)) => "connect".into(),
        Err(LlmError::Status { status, .. }) => format!("status_{status}"),
        Err(LlmError::Malformed(_)) => "malformed".into(),
        Err(LlmError::InvalidInput(_)) => "invalid_input".into(),
        Err(LlmError::Other(_)) => "other".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> LlmError {
        LlmError::Status {
            status: code,
            retry_after: None,
            message: String::new(),
        }
    }

    fn policy(base_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy {
            call_timeout: Duration::from_secs(1),
            max_attempts: 4,
            base_backoff: Duration::from_millis(base_ms),
            max_backoff: Duration::from_millis(max_ms),
            min_attempt: Duration::from_millis(10),
        }
    }

    #[test]
    fn classification_matches_the_design() {
        assert!(is_retryable(&LlmError::Timeout));
        assert!(is_retryable(&LlmError::Connect("reset".into())));
        for code in [408, 409, 429, 500, 502, 503, 504, 599] {
            assert!(is_retryable(&status(code)), "{code} must retry");
        }
        for code in [400, 401, 403, 404, 413, 422] {
            assert!(!is_retryable(&status(code)), "{code} must not retry");
        }
        assert!(!is_retryable(&LlmError::Malformed("x".into())));
        assert!(!is_retryable(&LlmError::InvalidInput("x".into())));
        assert!(!is_retryable(&LlmError::Other("x".into())));
    }

    #[test]
    fn deadline_exceeded_is_transient_but_not_an_llm_timeout() {
        let e = RetryError::DeadlineExceeded {
            remaining: Duration::ZERO,
            needed: Duration::from_secs(1),
        };
        assert!(e.is_transient());
        assert!(!RetryError::Llm(status(400)).is_transient());
        assert!(RetryError::Llm(status(429)).is_transient());
    }

    #[test]
    fn full_jitter_stays_within_zero_and_cap() {
        let cap = Duration::from_millis(100);
        let draws: Vec<Duration> = (0..2_000).map(|_| full_jitter(cap)).collect();
        assert!(draws.iter().all(|d| *d <= cap));
        // Spread over the range, not stuck at the cap (lockstep) or at zero.
        assert!(draws.iter().any(|d| *d < cap / 4));
        assert!(draws.iter().any(|d| *d > cap * 3 / 4));
        assert_eq!(full_jitter(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn caps_double_from_base_up_to_max_backoff() {
        let p = policy(100, 500);
        let mut caps = p.caps();
        let ms: Vec<u128> = (0..5)
            .map(|_| caps.next_backoff().unwrap_or_default().as_millis())
            .collect();
        assert_eq!(ms, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn retry_after_wins_over_jitter_and_is_capped() {
        let p = policy(1, 200);
        let with_after = |ms: u64| LlmError::Status {
            status: 429,
            retry_after: Some(Duration::from_millis(ms)),
            message: String::new(),
        };
        // Jitter with a 1 ms cap could never reach 150 ms, so this is the header's value.
        assert_eq!(
            p.sleep_after(&with_after(150), Duration::from_millis(1)),
            Duration::from_millis(150)
        );
        assert_eq!(
            p.sleep_after(&with_after(5_000), Duration::from_millis(1)),
            Duration::from_millis(200)
        );
        assert!(p.sleep_after(&status(503), Duration::from_millis(1)) <= Duration::from_millis(1));
    }

    #[test]
    fn results_have_stable_metric_labels() {
        assert_eq!(result_label(&Ok(String::new())), "ok");
        assert_eq!(result_label(&Err(status(503))), "status_503");
        assert_eq!(result_label(&Err(LlmError::Timeout)), "timeout");
        assert_eq!(
            result_label(&Err(LlmError::InvalidInput(String::new()))),
            "invalid_input"
        );
    }
}
