//! Prometheus metrics (`docs/reference.md`, Metrics), one registry per app instance so that
//! in-process tests never see each other's counters.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub idempotency: IntCounterVec,
    pub jobs: IntCounterVec,
    pub llm_requests: IntCounterVec,
    pub llm_duration: Histogram,
    pub stream_pending: IntGauge,
    pub dead_letters: IntGauge,
    pub outbox_unsent: IntGauge,
    pub outbox_sent: IntCounter,
    /// `summaryd_loop_errors_total{role,kind}`: failed passes of the worker and relay loops.
    pub loop_errors: IntCounterVec,
    /// Per role, the current run of consecutive failed passes and the last reason.
    loop_streaks: Mutex<BTreeMap<&'static str, (u32, String)>>,
}

/// A role whose last this many passes all failed is reported not ready (with the reason),
/// so a permanently broken loop (a missing table, a key of the wrong type) shows up in
/// `/readyz` instead of only in warnings. Passes back off (1–10 s), and every consumer and
/// relay task of the process counts towards its role, so this is seconds, not minutes, of
/// failing; a single failed pass between good ones never trips it.
pub const FAILED_PASSES_NOT_READY: u32 = 5;

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter_vec =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let http_requests = counter_vec(
            "summaryd_http_requests_total",
            "HTTP requests by route template and status code",
            &["route", "status"],
        )?;
        let idempotency = counter_vec(
            "summaryd_idempotency_total",
            "Idempotency-Key outcomes: new, replayed, conflict, mismatch",
            &["outcome"],
        )?;
        let jobs = counter_vec(
            "summaryd_jobs_total",
            "Job deliveries by outcome: done, duplicate, retry, dead_lettered",
            &["outcome"],
        )?;
        let llm_requests = counter_vec(
            "summaryd_llm_requests_total",
            "Model calls by result: ok, timeout, connect, status_<code>, malformed, invalid_input, other",
            &["result"],
        )?;
        // Buckets span the builtin summariser (sub-ms) to a slow hosted model (tens of seconds).
        let llm_duration = Histogram::with_opts(
            HistogramOpts::new(
                "summaryd_llm_request_duration_seconds",
                "Wall-clock duration of single model calls",
            )
            .buckets(vec![
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0,
            ]),
        )?;
        registry.register(Box::new(llm_duration.clone()))?;
        let stream_pending = gauge(
            "summaryd_stream_pending",
            "Messages delivered to a consumer and not yet acknowledged",
        )?;
        let dead_letters = gauge("summaryd_dead_letters", "Entries in the dead-letter stream")?;
        let outbox_unsent = gauge("summaryd_outbox_unsent", "Outbox rows not yet sent")?;
        let outbox_sent = IntCounter::new("summaryd_outbox_sent_total", "Outbox rows sent")?;
        registry.register(Box::new(outbox_sent.clone()))?;
        let loop_errors = counter_vec(
            "summaryd_loop_errors_total",
            "Failed passes of the worker and relay loops, by role and kind of failure",
            &["role", "kind"],
        )?;
        Ok(Self {
            registry,
            http_requests,
            idempotency,
            jobs,
            llm_requests,
            llm_duration,
            stream_pending,
            dead_letters,
            outbox_unsent,
            outbox_sent,
            loop_errors,
            loop_streaks: Mutex::new(BTreeMap::new()),
        })
    }

    /// A pass of `role`'s loop failed: count it under `kind` (a short, fixed word such as
    /// `redis` or `postgres_unavailable`) and extend the role's run of failures.
    pub fn loop_failed(&self, role: &'static str, kind: &str, reason: &str) {
        self.loop_errors.with_label_values(&[role, kind]).inc();
        let mut streaks = self.streaks();
        let streak = streaks.entry(role).or_insert((0, String::new()));
        streak.0 = streak.0.saturating_add(1);
        streak.1 = format!("{kind}: {reason}");
    }

    /// A pass of `role`'s loop succeeded: its run of failures is over.
    pub fn loop_succeeded(&self, role: &'static str) {
        self.streaks().remove(role);
    }

    /// Roles whose last [`FAILED_PASSES_NOT_READY`] passes or more all failed, with why.
    pub fn failing_loops(&self) -> Vec<(&'static str, u32, String)> {
        self.streaks()
            .iter()
            .filter(|(_, (n, _))| *n >= FAILED_PASSES_NOT_READY)
            .map(|(role, (n, reason))| (*role, *n, reason.clone()))
            .collect()
    }

    fn streaks(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, (u32, String)>> {
        // Every update is one call on the map; a panicking holder cannot leave it torn.
        self.loop_streaks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec only fails on a metric with invalid names, which `new` rules out.
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
