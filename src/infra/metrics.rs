//! Prometheus metrics (`docs/reference.md`, Metrics), one registry per app instance so that
//! in-process tests never see each other's counters.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::core::{Atomic, AtomicF64, AtomicI64, GenericGaugeVec};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub(crate) http_requests: IntCounterVec,
    pub idempotency: IntCounterVec,
    pub jobs: IntCounterVec,
    pub llm_requests: IntCounterVec,
    pub llm_duration: Histogram,
    /// `summaryd_llm_tokens_total{model,kind}`: tokens the providers reported.
    pub(crate) llm_tokens: IntCounterVec,
    /// `summaryd_job_parts_total`: parts of long texts summarised and stored (each one a
    /// model call no later delivery of its job pays for again).
    pub(crate) job_parts: IntCounter,
    /// `summaryd_job_model_calls`: model calls each finished job's summary took.
    pub(crate) job_model_calls: Histogram,
    /// `summaryd_worker_commit_batch_jobs`: jobs per group-commit transaction.
    pub(crate) commit_batch_jobs: Histogram,
    /// `summaryd_worker_ack_batch_jobs`: jobs per batched acknowledgement.
    pub(crate) ack_batch_jobs: Histogram,
    /// `summaryd_model_calls_unrecorded_total`: model calls missing from `model_calls`
    /// because Postgres could not take them.
    pub(crate) model_calls_unrecorded: IntCounter,
    /// `summaryd_llm_limit_waits_total{provider,reason}`: model calls that waited for the
    /// provider's shared limits before they were sent.
    pub(crate) llm_limit_waits: IntCounterVec,
    /// `summaryd_llm_breaker_open{provider}`: 1 while a provider's breaker is open.
    pub(crate) llm_breaker_open: IntGaugeVec,
    pub(crate) http_duration: HistogramVec,
    pub(crate) job_latency: HistogramVec,
    /// Cluster-wide gauges: set only by the maintenance task (`src/maintenance/`), read by
    /// scrapes, so a scrape never runs a query. Each is exported only while this process
    /// has measured it (see [`MeasuredGauge`]).
    pub(crate) stream_pending: MeasuredGauge<AtomicI64>,
    pub(crate) stream_lag: MeasuredGauge<AtomicI64>,
    pub(crate) oldest_queued_age: MeasuredGauge<AtomicF64>,
    pub(crate) dead_letters: MeasuredGauge<AtomicI64>,
    /// `summaryd_consumption_paused`: 1 while consumption is paused fleet-wide, else 0.
    pub consumption_paused: MeasuredGauge<AtomicI64>,
    pub outbox_unsent: MeasuredGauge<AtomicI64>,
    /// `summaryd_outbox_unsent` per topic (`email.summary_ready`, `webhook`): every known
    /// topic is set, 0 included, once measured.
    pub outbox_unsent_by_topic: MeasuredGauge<AtomicI64>,
    /// `summaryd_stream_shard_entries{shard,state}`: each shard's queued (lanes and not yet
    /// delivered), pending and dead-lettered entries, so one hot shard shows.
    pub stream_shard_entries: MeasuredGauge<AtomicI64>,
    /// Reserved and used over `budget_tokens` in the current period, per tenant with a
    /// budget (a bounded label set: the tokens file's tenants that have one).
    pub tenant_budget_used_ratio: MeasuredGauge<AtomicF64>,
    /// Each such tenant's `budget_soft_ratio`, for the alert to compare with.
    pub tenant_budget_soft_ratio: MeasuredGauge<AtomicF64>,
    /// `summaryd_webhook_deliveries_total{result}`: delivered, retrying, stuck, skipped.
    pub webhook_deliveries: IntCounterVec,
    pub(crate) gauges_refreshed: MeasuredGauge<AtomicF64>,
    pub outbox_sent: IntCounter,
    /// `summaryd_otel_spans_dropped_total`: spans not exported (queue full, export
    /// failed). The count is the process's (`telemetry::spans_dropped`), copied in at
    /// each scrape.
    otel_spans_dropped: IntCounter,
    /// `summaryd_loop_errors_total{role,kind}`: failed passes of the worker and relay loops.
    pub loop_errors: IntCounterVec,
    /// Per role, the current run of consecutive failed passes and the last reason.
    loop_streaks: Mutex<BTreeMap<&'static str, (u32, String)>>,
    /// `summaryd_mail_breaker_open`: 1 while the relay is paused because the mail provider
    /// refuses us as misconfigured. A vector without labels, so that a process without the
    /// relay role exports nothing rather than a 0 it never measured.
    mail_breaker_open: IntGaugeVec,
    /// Why the mail breaker is open (for `/readyz`); `None` while closed.
    mail_misconfigured: Mutex<Option<String>>,
    pub(crate) maintenance_runs: IntCounterVec,
    pub maintenance_removed: IntCounterVec,
    /// `summaryd_console_actions_total{action}`: what operators changed in the console.
    pub console_actions: IntCounterVec,
    /// `summaryd_redis_replica_ack_timeouts_total{op}`: writes fewer replicas confirmed
    /// than `SUMMARYD_REDIS_MIN_REPLICAS_ACK` asks: `accept` (answered 503), `ack` and
    /// `dead_letter` (the job's finishing writes, kept: logged and counted only).
    pub replica_ack_timeouts: IntCounterVec,
}

/// The labels of `summaryd_maintenance_removed_total`.
pub(crate) const REMOVED_KINDS: [&str; 6] = [
    "stream_entries",
    "dead_letters",
    "outbox_sent",
    "summaries",
    "consumers",
    "in_flight",
];

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
        let console_actions = counter_vec(
            "summaryd_console_actions_total",
            "Operator actions taken in the console: replay, purge, outbox_retry, pause, resume",
            &["action"],
        )?;
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
            "Model calls by result: ok, timeout, connect, status_<code>, malformed, invalid_input, context_exceeded, other",
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
        let histogram_vec = |name: &str,
                             help: &str,
                             label: &str,
                             buckets: Vec<f64>|
         -> Result<HistogramVec, prometheus::Error> {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), &[label])?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        // From a cached replay (well under a millisecond) to a POST waiting on a slow Redis.
        let http_duration = histogram_vec(
            "summaryd_http_request_duration_seconds",
            "Time from receiving a request to its response, by route template",
            "route",
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ],
        )?;
        // From the builtin model with an empty queue (milliseconds) to a backlog drained
        // after an outage (an hour and more).
        let job_latency = histogram_vec(
            "summaryd_job_latency_seconds",
            "Time from acceptance (202) to the summary's commit (stage=summarised) and to the email's acceptance by the provider (stage=emailed)",
            "stage",
            vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                3600.0, 7200.0,
            ],
        )?;
        let stream_lag = MeasuredGauge::register(
            &registry,
            "summaryd_stream_lag",
            "Job stream entries not yet delivered to any consumer (cluster-wide; only from processes with Redis, absent while the read fails)",
        )?;
        let oldest_queued_age = MeasuredGauge::register(
            &registry,
            "summaryd_oldest_queued_age_seconds",
            "Age of the oldest unfinished job stream entry, pending or not yet delivered; 0 when none (cluster-wide; only from processes with Redis, absent while the read fails)",
        )?;
        let gauges_refreshed = MeasuredGauge::register(
            &registry,
            "summaryd_gauges_refreshed_timestamp_seconds",
            "Unix time every cluster-wide gauge this process can measure was last refreshed; absent until the first full refresh",
        )?;
        let maintenance_runs = counter_vec(
            "summaryd_maintenance_runs_total",
            "Maintenance passes by outcome: done (this process applied retention), skipped (another replica held the lock; gauges still refreshed), error (a step failed; see the log)",
            &["outcome"],
        )?;
        let maintenance_removed = counter_vec(
            "summaryd_maintenance_removed_total",
            "What maintenance removed: stream_entries, dead_letters, outbox_sent, summaries, consumers, in_flight (tenant in-flight set members whose job had finished or was gone)",
            &["what"],
        )?;
        let stream_pending = MeasuredGauge::register(
            &registry,
            "summaryd_stream_pending",
            "Job stream entries delivered to a consumer and not yet acknowledged (cluster-wide; only from processes with Redis, absent while the read fails)",
        )?;
        let dead_letters = MeasuredGauge::register(
            &registry,
            "summaryd_dead_letters",
            "Entries in the dead-letter stream (cluster-wide; only from processes with Redis, absent while the read fails)",
        )?;
        let consumption_paused = MeasuredGauge::register(
            &registry,
            "summaryd_consumption_paused",
            "1 while consumption is paused fleet-wide (summaryd pause), else 0 (cluster-wide; only from processes with Redis, absent while the read fails)",
        )?;
        let outbox_unsent = MeasuredGauge::register(
            &registry,
            "summaryd_outbox_unsent",
            "Outbox rows not yet sent, stuck ones included (cluster-wide; absent while the read fails)",
        )?;
        let outbox_unsent_by_topic = MeasuredGauge::register_with(
            &registry,
            "summaryd_outbox_unsent_by_topic",
            "Outbox rows not yet sent (stuck ones included, skipped webhooks not), per topic",
            &["topic"],
        )?;
        let stream_shard_entries = MeasuredGauge::register_with(
            &registry,
            "summaryd_stream_shard_entries",
            "Entries of each stream shard (SUMMARYD_STREAM_SHARDS) by state: queued (in the tenants' lanes or not yet delivered), pending (delivered, not yet acknowledged), dead (dead letters)",
            &["shard", "state"],
        )?;
        let tenant_budget_used_ratio = MeasuredGauge::register_with(
            &registry,
            "summaryd_tenant_budget_used_ratio",
            "Tokens reserved (accepted jobs not yet finished) and used (finished jobs, as the provider reported) over budget_tokens in the current period, per tenant with a budget (from processes with the tokens file and Redis; absent while the read fails)",
            &["tenant"],
        )?;
        let tenant_budget_soft_ratio = MeasuredGauge::register_with(
            &registry,
            "summaryd_tenant_budget_soft_ratio",
            "The tokens file's budget_soft_ratio per tenant with a budget: summaryd_tenant_budget_used_ratio at or above it warns",
            &["tenant"],
        )?;
        let webhook_deliveries = counter_vec(
            "summaryd_webhook_deliveries_total",
            "Webhook attempts by result: delivered, retrying (will be sent again), stuck (needs a person: past the give-up horizon, or refused), skipped (endpoint disabled, 410 Gone included)",
            &["result"],
        )?;
        let outbox_sent = IntCounter::new("summaryd_outbox_sent_total", "Outbox rows sent")?;
        registry.register(Box::new(outbox_sent.clone()))?;
        let otel_spans_dropped = IntCounter::new(
            "summaryd_otel_spans_dropped_total",
            "Trace spans dropped instead of exported: the bounded export queue was full (collector slow or down) or their export failed",
        )?;
        registry.register(Box::new(otel_spans_dropped.clone()))?;
        let llm_tokens = counter_vec(
            "summaryd_llm_tokens_total",
            "Tokens the model providers reported, by configured model name and kind (prompt, completion); probes included",
            &["model", "kind"],
        )?;
        let job_parts = IntCounter::new(
            "summaryd_job_parts_total",
            "Parts of long texts (pieces of the text and combinations of their summaries) summarised and stored",
        )?;
        registry.register(Box::new(job_parts.clone()))?;
        let model_calls_unrecorded = IntCounter::new(
            "summaryd_model_calls_unrecorded_total",
            "Model calls of jobs not recorded in model_calls because Postgres could not take them",
        )?;
        registry.register(Box::new(model_calls_unrecorded.clone()))?;
        // One call for most jobs; up to SUMMARYD_LLM_MAX_PARTS (256 by default) for the longest.
        let job_model_calls = Histogram::with_opts(
            HistogramOpts::new(
                "summaryd_job_model_calls",
                "Model calls each finished job's summary took (parts, reused or new, and combinations)",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]),
        )?;
        registry.register(Box::new(job_model_calls.clone()))?;
        // Up to SUMMARYD_WORKER_COMMIT_BATCH (64 by default).
        let commit_batch_jobs = Histogram::with_opts(
            HistogramOpts::new(
                "summaryd_worker_commit_batch_jobs",
                "Finished jobs committed together in one Postgres transaction by the worker's group commit",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
        )?;
        registry.register(Box::new(commit_batch_jobs.clone()))?;
        let ack_batch_jobs = Histogram::with_opts(
            HistogramOpts::new(
                "summaryd_worker_ack_batch_jobs",
                "Finished jobs acknowledged together in one Redis round trip by the worker's batched acknowledgements",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
        )?;
        registry.register(Box::new(ack_batch_jobs.clone()))?;
        let llm_breaker_open = IntGaugeVec::new(
            Opts::new(
                "summaryd_llm_breaker_open",
                "1 while a model provider's circuit breaker is open (no job calls it), else 0; per provider of this process",
            ),
            &["provider"],
        )?;
        registry.register(Box::new(llm_breaker_open.clone()))?;
        let llm_limit_waits = counter_vec(
            "summaryd_llm_limit_waits_total",
            "Model calls that waited for their provider's shared limits before being sent, by provider and reason: requests (rpm), tokens (tpm), cool (a 429's Retry-After)",
            &["provider", "reason"],
        )?;
        let mail_breaker_open = IntGaugeVec::new(
            Opts::new(
                "summaryd_mail_breaker_open",
                "1 while the mail provider refuses this process's relay as misconfigured (401/403/404, SMTP 530/535) and the relay is paused, else 0; only on processes with the relay role",
            ),
            &[],
        )?;
        registry.register(Box::new(mail_breaker_open.clone()))?;
        let loop_errors = counter_vec(
            "summaryd_loop_errors_total",
            "Failed passes of the worker and relay loops, by role and kind of failure",
            &["role", "kind"],
        )?;
        let replica_ack_timeouts = counter_vec(
            "summaryd_redis_replica_ack_timeouts_total",
            "Writes fewer Redis replicas confirmed in time than SUMMARYD_REDIS_MIN_REPLICAS_ACK asks, by op: accept (the POST answered 503; its retry is a replay), ack and dead_letter (a finished job's acknowledgement; kept, only counted)",
            &["op"],
        )?;
        Ok(Self {
            registry,
            http_requests,
            idempotency,
            jobs,
            llm_requests,
            llm_duration,
            llm_tokens,
            job_parts,
            job_model_calls,
            commit_batch_jobs,
            ack_batch_jobs,
            model_calls_unrecorded,
            llm_breaker_open,
            llm_limit_waits,
            http_duration,
            job_latency,
            stream_pending,
            stream_lag,
            oldest_queued_age,
            dead_letters,
            consumption_paused,
            outbox_unsent,
            outbox_unsent_by_topic,
            stream_shard_entries,
            tenant_budget_used_ratio,
            tenant_budget_soft_ratio,
            webhook_deliveries,
            gauges_refreshed,
            outbox_sent,
            otel_spans_dropped,
            loop_errors,
            loop_streaks: Mutex::new(BTreeMap::new()),
            mail_breaker_open,
            mail_misconfigured: Mutex::new(None),
            maintenance_runs,
            maintenance_removed,
            console_actions,
            replica_ack_timeouts,
        })
    }

    /// Each model provider's breaker as this process sees it: `(provider, open)`. Empty in a
    /// process without the worker role (it calls no model).
    pub fn breakers(&self) -> Vec<(String, bool)> {
        first_label_values(&self.llm_breaker_open)
            .into_iter()
            .map(|(provider, value)| (provider, value > 0.0))
            .collect()
    }

    /// A pass of `role`'s loop failed: count it under `kind` (a short, fixed word such as
    /// `redis` or `postgres_unavailable`) and extend the role's run of failures.
    pub(crate) fn loop_failed(&self, role: &'static str, kind: &str, reason: &str) {
        self.loop_errors.with_label_values(&[role, kind]).inc();
        let mut streaks = self.streaks();
        let streak = streaks.entry(role).or_insert((0, String::new()));
        streak.0 = streak.0.saturating_add(1);
        streak.1 = format!("{kind}: {reason}");
    }

    /// A pass of `role`'s loop succeeded: its run of failures is over.
    pub(crate) fn loop_succeeded(&self, role: &'static str) {
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

    /// The relay's mail breaker: `Some(why)` while it is open, `None` while it is closed.
    /// `why` must already be free of credentials (it is shown by `/readyz`).
    pub(crate) fn set_mail_breaker(&self, open: Option<&str>) {
        self.mail_breaker_open
            .with_label_values(&[] as &[&str])
            .set(i64::from(open.is_some()));
        *self
            .mail_misconfigured
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = open.map(str::to_owned);
    }

    /// Why the mail provider is taken to be misconfigured (the relay paused), if it is.
    pub fn mail_misconfigured(&self) -> Option<String> {
        self.mail_misconfigured
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn streaks(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, (u32, String)>> {
        // Every update is one call on the map; a panicking holder cannot leave it torn.
        self.loop_streaks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let dropped = super::telemetry::spans_dropped();
        let shown = self.otel_spans_dropped.get();
        if dropped > shown {
            self.otel_spans_dropped.inc_by(dropped - shown);
        }
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

/// A gauge of a value this process reads from elsewhere (Redis, Postgres), exported only
/// while it holds a measurement: absent until the first read succeeds, and removed again
/// when a read fails or the process cannot make it at all (a relay-only process has no
/// Redis, so it never exports the stream gauges).
///
/// Absent rather than 0 or the last value: when the only replicas scraped are ones that
/// cannot measure the queue (every worker down), an unmeasured 0 is all the alerts' `max`
/// sees and the queue looks empty; a value kept from before a failed read looks current
/// while the queue grows. A missing series is what Prometheus means by "not measured".
///
/// A plain `Gauge` is exported as 0 from registration, so this is a vector with no labels:
/// its one series exists only between a `set` and a `clear`. (Registering per role would
/// need the roles before the registry exists, and unregistering a collector on a failed
/// read would race scrapes and re-registration.)
pub struct MeasuredGauge<P: Atomic + 'static>(GenericGaugeVec<P>);

impl<P: Atomic + 'static> MeasuredGauge<P> {
    fn register(registry: &Registry, name: &str, help: &str) -> Result<Self, prometheus::Error> {
        Self::register_with(registry, name, help, &[])
    }

    /// With labels: each label set is a series of its own, set by [`Self::set_for`].
    fn register_with(
        registry: &Registry,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Self, prometheus::Error> {
        let vec = GenericGaugeVec::<P>::new(Opts::new(name, help), labels)?;
        registry.register(Box::new(vec.clone()))?;
        Ok(Self(vec))
    }

    /// A fresh measurement of one label set.
    pub(crate) fn set_for(&self, labels: &[&str], value: P::T) {
        if let Ok(gauge) = self.0.get_metric_with_label_values(labels) {
            gauge.set(value);
        }
    }

    /// No current measurement of any label set.
    pub(crate) fn clear_all(&self) {
        self.0.reset();
    }

    /// A fresh measurement: exported from now on.
    pub(crate) fn set(&self, value: P::T) {
        // The only error is a label count other than the vector's (none), ruled out here.
        if let Ok(gauge) = self.0.get_metric_with_label_values::<&str>(&[]) {
            gauge.set(value);
        }
    }

    /// No current measurement: the series disappears from `/metrics`.
    pub(crate) fn clear(&self) {
        // Removing a series that is not there is the only error, and means the same.
        let _ = self.0.remove_label_values::<&str>(&[]);
    }

    /// Every exported series of a labelled gauge: its first label's value and the gauge's.
    pub fn by_label(&self) -> Vec<(String, f64)> {
        first_label_values(&self.0)
    }

    /// The exported value, `None` while absent. Reads what a scrape would, so it never
    /// creates the series.
    pub fn get(&self) -> Option<f64> {
        use prometheus::core::Collector;
        self.0
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|metric| metric.get_gauge().get_value())
            .next()
    }
}

/// Every series of a labelled gauge as (its first label's value, the gauge's value).
fn first_label_values(gauges: &impl prometheus::core::Collector) -> Vec<(String, f64)> {
    gauges
        .collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|metric| {
            let label = metric
                .get_label()
                .first()
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            (label, metric.get_gauge().get_value())
        })
        .collect()
}

/// Seconds from `since` to now, for the latency histograms; 0 when the clock went back.
pub(crate) fn seconds_since(since: chrono::DateTime<chrono::Utc>) -> f64 {
    let elapsed = chrono::Utc::now() - since;
    elapsed
        .num_microseconds()
        .map_or(0.0, |us| us.max(0) as f64 / 1e6)
}
