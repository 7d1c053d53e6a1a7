//! One model call a job made (worker → db): every attempt against a provider, retried
//! attempts and failures included, kept so an operator sees a job's whole history (which
//! delivery called which provider, what it cost, how it failed). The `model_calls` rows
//! store them (`db::model_calls`).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{JobId, TenantId, TokenUsage};

/// One attempt against a provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCall {
    /// The delivery of the job that made it (the stream's delivery count, from 1). A
    /// delivery that did not count (a dependency was down) shares its number with the next.
    pub delivery: u32,
    /// Its place among its delivery's calls, in the order they started.
    pub seq: u32,
    /// The provider's label: `openai:<model>` or `builtin`.
    pub provider: String,
    /// The configured model name.
    pub model: String,
    /// What the provider reported; `None` when it reported nothing, and for failed calls.
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    pub duration_ms: u32,
    /// `None` when the call succeeded; otherwise the `result` label of
    /// `summaryd_llm_requests_total` (`timeout`, `connect`, `status_503`, `malformed`, …).
    pub error_class: Option<String>,
    /// When the call started.
    pub at: DateTime<Utc>,
}

/// The model calls of one delivery, written by the model chain as each attempt ends (parts
/// of a long text run concurrently, hence the lock; it is held only to push).
#[derive(Debug)]
pub struct CallLog {
    delivery: u32,
    calls: Mutex<Vec<ModelCall>>,
    /// The job the calls are for, which the calls' spans name.
    job: Option<(JobId, TenantId)>,
}

impl CallLog {
    /// The log of delivery number `delivery` (from the stream's count; past `u32` it
    /// saturates, a count no job reaches).
    pub fn new(delivery: u64) -> Self {
        Self {
            delivery: u32::try_from(delivery).unwrap_or(u32::MAX),
            calls: Mutex::new(Vec::new()),
            job: None,
        }
    }

    /// The log of the calls made for `job_id` of `tenant`.
    pub fn for_job(mut self, job_id: JobId, tenant: TenantId) -> Self {
        self.job = Some((job_id, tenant));
        self
    }

    /// The job the calls are for, when the log was made [`for_job`](Self::for_job).
    pub fn job(&self) -> Option<(&JobId, &TenantId)> {
        self.job.as_ref().map(|(id, tenant)| (id, tenant))
    }

    /// One attempt that just ended, after `elapsed`: `usage` when it succeeded and the
    /// provider reported it, `error_class` when it failed.
    pub fn record(
        &self,
        provider: &str,
        model: &str,
        usage: Option<TokenUsage>,
        elapsed: Duration,
        error_class: Option<String>,
    ) {
        let at = chrono::Duration::from_std(elapsed)
            .ok()
            .and_then(|d| Utc::now().checked_sub_signed(d))
            .unwrap_or_else(Utc::now);
        let call = ModelCall {
            delivery: self.delivery,
            seq: 0,
            provider: provider.to_owned(),
            model: model.to_owned(),
            prompt_tokens: usage.map(|u| u.prompt),
            completion_tokens: usage.map(|u| u.completion),
            duration_ms: u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX),
            error_class,
            at,
        };
        self.lock().push(call);
    }

    /// The calls recorded so far, in the order they started and numbered so (`seq`); the
    /// log is empty afterwards, so no call is handed on twice.
    pub fn take(&self) -> Vec<ModelCall> {
        let mut calls = std::mem::take(&mut *self.lock());
        // Stable: calls that started at the same instant keep the order they ended in.
        calls.sort_by_key(|c| c.at);
        for (seq, call) in calls.iter_mut().enumerate() {
            call.seq = u32::try_from(seq).unwrap_or(u32::MAX);
        }
        calls
    }

    /// A push cannot leave the vector half-written, so a poisoned lock's data is whole.
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ModelCall>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_numbered_in_the_order_they_started_and_taken_once() {
        let log = CallLog::new(3);
        // Ends first, started last.
        log.record(
            "builtin",
            "builtin",
            Some(TokenUsage {
                prompt: 10,
                completion: 2,
            }),
            Duration::from_millis(5),
            None,
        );
        log.record(
            "openai:m",
            "m",
            None,
            Duration::from_secs(60),
            Some("timeout".into()),
        );
        let calls = log.take();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].provider, "openai:m");
        assert_eq!(calls[0].error_class.as_deref(), Some("timeout"));
        assert_eq!(calls[0].duration_ms, 60_000);
        assert_eq!(
            (calls[0].prompt_tokens, calls[0].completion_tokens),
            (None, None)
        );
        assert_eq!(calls[1].prompt_tokens, Some(10));
        assert_eq!(calls[1].completion_tokens, Some(2));
        assert_eq!(calls[1].error_class, None);
        assert_eq!(
            calls
                .iter()
                .map(|c| (c.delivery, c.seq))
                .collect::<Vec<_>>(),
            [(3, 0), (3, 1)]
        );
        assert!(calls[0].at < calls[1].at);
        assert!(log.take().is_empty(), "taken once");
    }

    #[test]
    fn a_delivery_count_past_u32_saturates() {
        let log = CallLog::new(u64::MAX);
        log.record("builtin", "builtin", None, Duration::ZERO, None);
        assert_eq!(log.take()[0].delivery, u32::MAX);
    }
}
