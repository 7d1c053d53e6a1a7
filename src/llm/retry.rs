//! The single owner of the model retry policy on one provider: per-call wall-clock timeouts,
//! full-jitter exponential backoff, `Retry-After`, and the per-delivery deadline. Which
//! errors are worth another attempt is [`LlmError`]'s classification; whether the provider
//! may be called at all is its breaker's, asked through [`AttemptObserver`]
//! (`llm::ModelChain` moves on to the next provider).
//!
//! Providers make exactly one attempt; nothing else retries the model, so attempts never
//! multiply across layers.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::config::LlmSettings;
use crate::llm::{Completion, Llm, LlmError, Prompt};
use crate::resilience::backoff::{Backoff, Jitter};
use crate::resilience::failure::{Classify, Disposition};

/// Below this much time, an attempt cannot realistically finish, so we do not start one.
const DEFAULT_MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// A monotonic point in time by which one delivery must be done; clock changes cannot
/// stretch it.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Self(Instant::now() + budget)
    }

    pub(crate) fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// This deadline moved `by` later: time spent waiting for the provider's shared limits
    /// is not the delivery's to lose.
    pub(crate) fn extended(self, by: Duration) -> Self {
        Self(self.0 + by)
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
        Self::for_call_timeout(settings, settings.call_timeout)
    }

    /// `[llm]`'s policy with a provider's own call timeout (a fallback may set one).
    pub(crate) fn for_call_timeout(settings: &LlmSettings, call_timeout: Duration) -> Self {
        Self {
            call_timeout,
            max_attempts: settings.max_attempts.max(1),
            base_backoff: settings.backoff,
            max_backoff: settings.max_backoff,
            // A call timeout below the default would otherwise make every attempt "too short".
            min_attempt: DEFAULT_MIN_ATTEMPT.min(call_timeout),
        }
    }

    /// Full jitter: workers that hit the same 429 together spread out instead of retrying in
    /// lockstep, and the deadline, not a count, bounds the attempts.
    fn backoff(&self) -> Backoff {
        Backoff::new(self.base_backoff, self.max_backoff, Jitter::Full)
    }

    /// The sleep before the next attempt after `err`, the `failures`-th failure counting
    /// from 0: `Retry-After` when the server sent one (capped), otherwise the backoff's draw.
    fn sleep_after(&self, err: &LlmError, failures: u32) -> Duration {
        match err.disposition() {
            Disposition::Transient {
                retry_after: Some(after),
            } => after.min(self.max_backoff),
            _ => self.backoff().delay(failures),
        }
    }
}

/// Sees every attempt on one provider: says whether another may start (its breaker is
/// closed), waits for its turn under the provider's shared limits, and records each result
/// (breaker, metrics, a 429's `Retry-After` for every process).
#[async_trait::async_trait]
pub trait AttemptObserver: Send + Sync {
    fn may_attempt(&self) -> bool;
    fn observe(&self, result: &Result<Completion, LlmError>, elapsed: Duration);

    /// Wait until the provider's shared limits let a call of `prompt` through (taking its
    /// slot); how long that took. Not an attempt: nothing was sent.
    async fn wait_turn(&self, _prompt: &Prompt) -> Result<Duration, RetryError> {
        Ok(Duration::ZERO)
    }

    /// The provider answered 429 and asked for `retry_after`.
    async fn rate_limited(&self, _retry_after: Duration) {}

    /// The span one attempt of `prompt` runs in (none unless traces are exported).
    fn call_span(&self, _prompt: &Prompt) -> tracing::Span {
        tracing::Span::none()
    }

    /// What the attempt in `span` came to, recorded on it.
    fn end_span(&self, _span: &tracing::Span, _result: &Result<Completion, LlmError>) {}
}

/// Why `complete_with_retries` gave up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RetryError {
    /// The last model error; its classification says whether redelivery may help.
    #[error(transparent)]
    Llm(LlmError),
    /// The provider's breaker is open (it opened before this attempt, or while this delivery
    /// waited to retry): no attempt was made on it.
    #[error("the provider's circuit breaker is open")]
    BreakerOpen,
    /// Too little of the delivery's budget was left to start an attempt. Deliberately not a
    /// timeout: it is never retried in-process, only by redelivery with a fresh budget.
    #[error("deadline exceeded: {remaining:?} left, an attempt needs {needed:?}")]
    DeadlineExceeded {
        remaining: Duration,
        needed: Duration,
    },
    /// The provider's shared limits could not be asked (Redis): no call was sent, since
    /// one sent unasked could break the limit every other process keeps.
    #[error("the model provider's shared limits could not be checked: {0}")]
    Limiter(String),
}

impl Classify for RetryError {
    /// The last model error's answer; an open breaker is its provider being unavailable, and
    /// a budget too short is worth a later delivery with a fresh one.
    fn disposition(&self) -> Disposition {
        match self {
            RetryError::Llm(e) => e.disposition(),
            RetryError::BreakerOpen => Disposition::Unavailable,
            RetryError::DeadlineExceeded { .. } | RetryError::Limiter(_) => Disposition::TRANSIENT,
        }
    }
}

/// Call the model under the policy: each attempt gets `min(call_timeout, remaining)` of
/// wall clock; only retryable errors are retried; stops on `max_attempts`, when the next
/// sleep would leave less than one useful attempt (returning the last error), or when the
/// observer forbids another attempt (`BreakerOpen`).
pub async fn complete_with_retries(
    llm: &dyn Llm,
    text: &str,
    deadline: Deadline,
    policy: &RetryPolicy,
    observer: Option<&dyn AttemptObserver>,
) -> Result<Completion, RetryError> {
    let prompt = Prompt::Document(text.to_owned());
    complete_prompt_with_retries(llm, &prompt, deadline, policy, observer).await
}

/// [`complete_with_retries`] for any prompt (a part, a combination).
pub async fn complete_prompt_with_retries(
    llm: &dyn Llm,
    prompt: &Prompt,
    deadline: Deadline,
    policy: &RetryPolicy,
    observer: Option<&dyn AttemptObserver>,
) -> Result<Completion, RetryError> {
    let mut attempt: u32 = 0;
    let mut deadline = deadline;
    loop {
        if observer.is_some_and(|o| !o.may_attempt()) {
            return Err(RetryError::BreakerOpen);
        }
        if let Some(o) = observer {
            let waited = o.wait_turn(prompt).await?;
            deadline = deadline.extended(waited);
            // The breaker may have opened while this call waited for its turn.
            if !waited.is_zero() && !o.may_attempt() {
                return Err(RetryError::BreakerOpen);
            }
        }
        let remaining = deadline.remaining();
        let timeout = policy.call_timeout.min(remaining);
        if timeout < policy.min_attempt {
            return Err(RetryError::DeadlineExceeded {
                remaining,
                needed: policy.min_attempt,
            });
        }
        attempt += 1;
        let err = match call_once(llm, prompt, timeout, observer).await {
            Ok(summary) => return Ok(summary),
            Err(err) => err,
        };
        if !err.is_transient() || attempt >= policy.max_attempts {
            return Err(RetryError::Llm(err));
        }
        let sleep = policy.sleep_after(&err, attempt - 1);
        if deadline.remaining().saturating_sub(sleep) < policy.min_attempt {
            tracing::warn!(attempt, error = %err, "model call failed; no time left for another attempt");
            return Err(RetryError::Llm(err));
        }
        tracing::warn!(attempt, error = %err, sleep_ms = sleep.as_millis() as u64, "model call failed; retrying");
        tokio::time::sleep(sleep).await;
    }
}

/// `call` under a hard wall-clock timeout: still running at `timeout`, it is a `Timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, LlmError>>,
) -> Result<T, LlmError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or(Err(LlmError::Timeout))
}

/// One attempt under a hard wall-clock timeout (a server that sends headers and then drips
/// its body is cut off by it too), shown to the observer.
async fn call_once(
    llm: &dyn Llm,
    prompt: &Prompt,
    timeout: Duration,
    observer: Option<&dyn AttemptObserver>,
) -> Result<Completion, LlmError> {
    let started = Instant::now();
    let span = observer.map_or_else(tracing::Span::none, |o| o.call_span(prompt));
    let result = bounded(timeout, llm.complete(prompt))
        .instrument(span.clone())
        .await;
    if let Some(o) = observer {
        o.end_span(&span, &result);
        o.observe(&result, started.elapsed());
        if let Some(after) = rate_limited_for(&result) {
            o.rate_limited(after).await;
        }
    }
    result
}

/// The wait a 429 asked for, when it said one (`Retry-After` or `retry-after-ms`).
pub(crate) fn rate_limited_for<T>(result: &Result<T, LlmError>) -> Option<Duration> {
    match result {
        Err(LlmError::Status {
            status: 429,
            retry_after,
            ..
        }) => *retry_after,
        _ => None,
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
    fn deadline_exceeded_is_transient_but_not_an_llm_timeout() {
        let e = RetryError::DeadlineExceeded {
            remaining: Duration::ZERO,
            needed: Duration::from_secs(1),
        };
        assert!(e.is_transient());
        assert_eq!(
            RetryError::Llm(status(400)).disposition(),
            Disposition::Permanent
        );
        assert!(RetryError::Llm(status(429)).is_transient());
        assert!(RetryError::Llm(status(403)).is_unavailable());
    }

    /// Fails with `error` the first `failures` calls, then answers.
    struct FailsFirst {
        failures: usize,
        error: LlmError,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl FailsFirst {
        fn new(failures: usize, error: LlmError) -> Self {
            Self {
                failures,
                error,
                calls: Default::default(),
            }
        }
    }

    #[async_trait::async_trait]
    impl Llm for FailsFirst {
        async fn summarise(&self, _text: &str) -> Result<Completion, LlmError> {
            let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if call < self.failures {
                Err(self.error.clone())
            } else {
                Ok(Completion::without_usage("summary".into()))
            }
        }
    }

    /// The n-th retry waits at most `base · 2^(n-1)`: the first at most `base`, however many
    /// deliveries run it (each draw is checked, so one long sleep fails the test).
    #[tokio::test(start_paused = true)]
    async fn the_first_retry_waits_at_most_the_base_and_the_second_twice_that() {
        let p = policy(100, 10_000);
        for (failures, cap_ms) in [(1, 100), (2, 300)] {
            for _ in 0..200 {
                let llm = FailsFirst::new(failures, status(503));
                let started = Instant::now();
                let deadline = Deadline::after(Duration::from_secs(60));
                let summary = complete_with_retries(&llm, "text", deadline, &p, None).await;
                assert_eq!(summary.unwrap().summary, "summary");
                let slept = started.elapsed();
                assert!(
                    slept <= Duration::from_millis(cap_ms),
                    "{failures}: {slept:?}"
                );
            }
        }
    }

    /// A sleep that leaves exactly one minimal attempt is still taken: the budget is for
    /// using, down to the last useful attempt.
    #[tokio::test(start_paused = true)]
    async fn a_retry_that_leaves_exactly_the_minimum_attempt_time_is_made() {
        let p = policy(1, 1_000);
        let after = Duration::from_millis(100);
        let llm = FailsFirst::new(
            1,
            LlmError::Status {
                status: 429,
                retry_after: Some(after),
                message: String::new(),
            },
        );
        let deadline = Deadline::after(after + p.min_attempt);
        let summary = complete_with_retries(&llm, "text", deadline, &p, None).await;
        assert_eq!(summary.unwrap().summary, "summary");
        // One minimal attempt less and the call gives up instead of sleeping.
        let llm = FailsFirst::new(1, llm.error.clone());
        let deadline = Deadline::after(after + p.min_attempt - Duration::from_millis(1));
        let given_up = complete_with_retries(&llm, "text", deadline, &p, None).await;
        assert!(matches!(given_up, Err(RetryError::Llm(_))), "{given_up:?}");
    }

    #[test]
    fn only_a_429_with_a_wait_asks_every_process_to_wait() {
        let with = |code: u16, after: Option<u64>| -> Result<(), LlmError> {
            Err(LlmError::Status {
                status: code,
                retry_after: after.map(Duration::from_millis),
                message: String::new(),
            })
        };
        let cases = [
            (with(429, Some(5_000)), Some(Duration::from_secs(5))),
            (with(429, None), None),
            (with(503, Some(5_000)), None),
            (Err(LlmError::Timeout), None),
            (Ok(()), None),
        ];
        for (result, want) in cases {
            assert_eq!(rate_limited_for(&result), want, "{result:?}");
        }
    }

    #[test]
    fn sleeps_grow_from_base_to_max_backoff_under_full_jitter() {
        let p = policy(100, 500);
        for (failures, cap) in [(0, 100), (1, 200), (2, 400), (3, 500), (9, 500)] {
            let cap = Duration::from_millis(cap);
            let sleeps: Vec<Duration> = (0..500)
                .map(|_| p.sleep_after(&status(503), failures))
                .collect();
            assert!(sleeps.iter().all(|d| *d <= cap), "{failures}");
            assert!(
                sleeps.iter().any(|d| *d > cap / 2),
                "{failures}: never near the cap"
            );
        }
    }

    #[test]
    fn retry_after_wins_over_jitter_and_is_capped() {
        let p = policy(1, 200);
        let with_after = |ms: u64| LlmError::Status {
            status: 429,
            retry_after: Some(Duration::from_millis(ms)),
            message: String::new(),
        };
        // Jitter from a 1 ms base could never reach 150 ms, so this is the header's value.
        assert_eq!(
            p.sleep_after(&with_after(150), 0),
            Duration::from_millis(150)
        );
        assert_eq!(
            p.sleep_after(&with_after(5_000), 0),
            Duration::from_millis(200)
        );
        assert!(p.sleep_after(&status(503), 0) <= Duration::from_millis(1));
        // A Retry-After on a status that is not retried is not a reason to wait.
        let permanent = LlmError::Status {
            status: 400,
            retry_after: Some(Duration::from_millis(150)),
            message: String::new(),
        };
        assert!(p.sleep_after(&permanent, 0) <= Duration::from_millis(1));
    }

    /// Allows `allowed` attempts, then reports the breaker open; counts what it saw.
    struct OpensAfter {
        allowed: usize,
        seen: std::sync::Mutex<Vec<bool>>,
    }

    impl AttemptObserver for OpensAfter {
        fn may_attempt(&self) -> bool {
            self.seen.lock().unwrap().len() < self.allowed
        }
        fn observe(&self, result: &Result<Completion, LlmError>, _elapsed: Duration) {
            self.seen.lock().unwrap().push(result.is_ok());
        }
    }

    /// A breaker that opens between attempts stops the retries at once, without a call.
    #[tokio::test(start_paused = true)]
    async fn an_observer_that_forbids_attempts_stops_the_retries() {
        let p = policy(1, 10);
        let llm = FailsFirst::new(10, status(503));
        let observer = OpensAfter {
            allowed: 2,
            seen: Default::default(),
        };
        let deadline = Deadline::after(Duration::from_secs(60));
        let got = complete_with_retries(&llm, "t", deadline, &p, Some(&observer)).await;
        assert!(matches!(got, Err(RetryError::BreakerOpen)), "{got:?}");
        assert_eq!(
            RetryError::BreakerOpen.disposition(),
            Disposition::Unavailable
        );
        assert_eq!(*observer.seen.lock().unwrap(), [false, false]);
        assert_eq!(llm.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
        let closed = OpensAfter {
            allowed: 0,
            seen: Default::default(),
        };
        let got = complete_with_retries(&llm, "t", deadline, &p, Some(&closed)).await;
        assert!(matches!(got, Err(RetryError::BreakerOpen)), "{got:?}");
        assert_eq!(
            llm.calls.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "no call"
        );
    }
}
