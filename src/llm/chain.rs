//! The providers a job may be summarised by, in order (`[llm]`, then each
//! `[[llm.fallback]]`), each behind its own circuit breaker (`breaker.rs`).
//!
//! A delivery tries the providers in order within its one budget (`SUMMARYD_JOB_BUDGET_MS`):
//! a provider whose breaker is open is skipped; one whose attempts for this delivery end in
//! transient errors, or that says it is misconfigured (401, 403, 404: its breaker opens at
//! once), hands the job to the next. A failure that is the job's own (400, 413, 422, an
//! unusable answer) ends the delivery at once: every provider would refuse it. When every
//! breaker is open the chain reports an outage, and the worker stops taking jobs until a
//! probe closes one (`docs/providers.md`).
//!
//! Probes are requests of their own (`Llm::probe`: the prompt around a one-word text, one
//! completion token), not a job's delivery: a job used as the probe would either spend one of
//! its deliveries on an outage, or need its delivery refunded after the fact, and while every
//! breaker is open no job is taken at all, so there would be no job to probe with. A probe
//! costs a few tokens per cooldown during an outage, and nothing otherwise.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::breaker::{self, Breaker, BreakerState, COOLDOWN_GROWTH_CAP, Transition};
use super::shared::{Admission, Limits, OpenRecord, ProbeLease, ProviderShare, SharedLimits};
use super::{
    BUILTIN_LABEL, Completion, Fault, Fit, Llm, LlmConfigError, LlmError, Prompt, PromptKind,
    ProviderConfig, TokenCounter, provider_configs,
};
use crate::config::LlmSettings;
use crate::domain::{CallLog, ModelSummary, TokenUsage};
use crate::infra::metrics::Metrics;
use crate::infra::telemetry::{self, otel_span};
use crate::llm::retry::{self, AttemptObserver, Deadline, RetryError, RetryPolicy};

/// After a provider said a prompt is over its context, the pieces it is split into are a
/// third smaller than the prompt's data as counted here: the counter was off, by about
/// that much at most for the estimate.
const SHRINK_AFTER_REFUSAL: (usize, usize) = (2, 3);
/// Pieces are never cut smaller than this: a provider that refuses a prompt this small
/// for its length is refusing the job.
const MIN_SPLIT_TOKENS: usize = 64;
use crate::resilience::failure::{Classify, Disposition};

/// One provider of the chain: the client, its retry policy (its own call timeout) and its
/// breaker.
pub struct Provider {
    /// `openai:<model>` or `builtin`: logs, `/readyz`, `summaryd_llm_breaker_open{provider}`.
    label: String,
    /// The configured model name summaries and token counts are recorded under.
    model: String,
    /// What fits its context.
    fit: Fit,
    llm: Arc<dyn Llm>,
    policy: RetryPolicy,
    breaker: Breaker,
    metrics: Option<Arc<Metrics>>,
    /// `rpm`/`tpm` as configured for this provider.
    limits: Limits,
    /// The completion cap every request carries: part of what a call may cost.
    max_tokens: u32,
    /// The first cooldown of its breaker: how long the fleet's probe is held at least.
    cooldown: Duration,
    /// Its state shared with every process, once the chain is given Redis
    /// ([`ModelChain::shared`]); without it, limits are not kept and the breaker is this
    /// process's alone.
    share: OnceLock<Arc<ProviderShare>>,
}

/// What `/readyz` says of one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderStatus {
    pub(crate) provider: String,
    /// `None` while its breaker is closed; why it is open otherwise.
    pub(crate) open: Option<String>,
}

/// Why the chain did not produce a summary.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ChainError {
    /// The job's own fault: every provider would refuse it. Dead-letter it.
    #[error(transparent)]
    Job(LlmError),
    /// Every provider's breaker is open: an outage, not the job's fault. The delivery does
    /// not count, and no job is taken until a probe closes a breaker.
    ///
    /// `reason` sums up every open breaker (what each last met), not one error to keep.
    ///
    /// `called`: whether this delivery called a provider before they all opened. Then its
    /// own calls may have opened them (a text a guardrail answers 403, or that crashes the
    /// model), and the worker asks a probe which it was ([`ModelChain::confirm_outage`]).
    #[error("every model provider is unavailable: {reason}")]
    AllOpen { reason: String, called: bool },
    /// Tried and failed in a way a later delivery may not repeat, while some provider is
    /// still usable: the job stays pending.
    #[error(transparent)]
    Transient(RetryError),
    /// The prompt does not fit the provider about to be called (by its count, or by the
    /// provider's own answer): its data is to be split into pieces of at most `room`
    /// tokens as `counter` counts them (`worker::parts`). Nothing was paid for it.
    #[error(
        "the prompt does not fit the context of {provider}: split into pieces of at most {room} tokens"
    )]
    TooLong {
        provider: String,
        room: usize,
        counter: TokenCounter,
        /// Tokens one summary may take when summaries are combined on this provider.
        summary_tokens: usize,
    },
}

impl Classify for ChainError {
    /// What the delivery does next. Only the job's own fault is permanent; with every
    /// breaker open nothing was tried; otherwise the job was tried and the delivery counts,
    /// whatever the last provider said, because another provider is still usable.
    fn disposition(&self) -> Disposition {
        match self {
            // Only when nobody split it: a caller that cannot split refuses the job.
            ChainError::Job(_) | ChainError::TooLong { .. } => Disposition::Permanent,
            ChainError::AllOpen { .. } => Disposition::Unavailable,
            ChainError::Transient(_) => Disposition::TRANSIENT,
        }
    }
}

pub struct ModelChain {
    providers: Vec<Arc<Provider>>,
    /// When the shared breakers were last read: at most once per [`SYNC_EVERY`] however
    /// many consumers ask.
    synced: Mutex<Option<Instant>>,
}

/// How stale this process's view of the fleet's breakers may be: a worker started during
/// an outage reads it before its first job, and one of a running fleet learns of a probe
/// that passed elsewhere within this long.
const SYNC_EVERY: Duration = Duration::from_secs(1);

impl std::fmt::Debug for ModelChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.providers.iter().map(|p| p.label.as_str()).collect();
        f.debug_struct("ModelChain")
            .field("providers", &labels)
            .finish()
    }
}

impl ModelChain {
    /// Every configured provider, built (no network I/O).
    pub fn from_settings(
        settings: &LlmSettings,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Self, LlmConfigError> {
        let mut providers = Vec::new();
        for config in provider_configs(settings)? {
            let llm = config.build()?;
            providers.push((config, llm));
        }
        Ok(Self::new(settings, providers, metrics))
    }

    /// One provider, `llm`, named as `[llm]` is (tests and embedders bring their own model).
    pub fn single(
        settings: &LlmSettings,
        llm: Arc<dyn Llm>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self::new(
            settings,
            vec![(ProviderConfig::primary(settings), llm)],
            metrics,
        )
    }

    /// The given providers, in order, with the retry and breaker settings of `[llm]`.
    pub fn new(
        settings: &LlmSettings,
        providers: Vec<(ProviderConfig, Arc<dyn Llm>)>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        let cooldown = settings.breaker_cooldown;
        let providers = providers
            .into_iter()
            .map(|(config, llm)| {
                let label = config.label();
                if let Some(m) = &metrics {
                    // Every provider's series exists from the start, so "closed" is a 0 and
                    // not a missing series an alert cannot tell from a missing target.
                    m.llm_breaker_open.with_label_values(&[&label]).set(0);
                }
                Arc::new(Provider {
                    limits: Limits::new(config.rpm, config.tpm),
                    max_tokens: config.max_tokens,
                    cooldown,
                    share: OnceLock::new(),
                    model: config.model_name().to_owned(),
                    fit: config.fit(),
                    policy: RetryPolicy::for_call_timeout(settings, config.call_timeout),
                    breaker: breaker::for_provider(settings.breaker_failures, cooldown),
                    label,
                    llm,
                    metrics: metrics.clone(),
                })
            })
            .collect();
        Self {
            providers,
            synced: Mutex::new(None),
        }
    }

    /// The same chain with every provider's limits, cool-until and breaker shared through
    /// Redis with every other process of the deployment (`docs/tenants.md`).
    pub fn shared(self, shared: &SharedLimits) -> Self {
        // The built-in summariser is never down, rate-limited or metered: nothing to share.
        for provider in self.providers.iter().filter(|p| p.label != BUILTIN_LABEL) {
            let _ = provider
                .share
                .set(Arc::new(shared.provider(&provider.label, provider.limits)));
        }
        self
    }

    /// Read the breakers the fleet published, at most once per [`SYNC_EVERY`]: a breaker
    /// open elsewhere opens here with its schedule, and one a probe elsewhere closed closes
    /// here. A Redis that does not answer leaves this process's view as it was.
    pub(crate) async fn sync_shared(&self) {
        {
            let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            if synced.is_some_and(|at| now.saturating_duration_since(at) < SYNC_EVERY) {
                return;
            }
            *synced = Some(now);
        }
        for provider in &self.providers {
            provider.sync().await;
        }
    }

    /// Summarise `text` with the first provider that can, within `deadline`, keeping no
    /// record of the calls.
    pub async fn summarise(
        &self,
        text: &str,
        deadline: Deadline,
    ) -> Result<ModelSummary, ChainError> {
        self.attempt(&Prompt::Document(text.to_owned()), deadline, None)
            .await
    }

    /// Answer `prompt` with the first provider that can, within `deadline`. A prompt that
    /// does not fit the provider about to be called is not sent: [`ChainError::TooLong`]
    /// says how small to split it for that provider. Every attempt against a provider,
    /// failed or not, goes into `calls`.
    pub async fn complete(
        &self,
        prompt: &Prompt,
        deadline: Deadline,
        calls: &CallLog,
    ) -> Result<ModelSummary, ChainError> {
        self.attempt(prompt, deadline, Some(calls)).await
    }

    async fn attempt(
        &self,
        prompt: &Prompt,
        deadline: Deadline,
        log: Option<&CallLog>,
    ) -> Result<ModelSummary, ChainError> {
        let mut last = None;
        let mut called = false;
        for (i, provider) in self.providers.iter().enumerate() {
            if provider.breaker.is_open() {
                continue;
            }
            // The pieces of a prompt that does not fit are parts (or, of a combination,
            // smaller combinations): cut to the room of their own kind.
            let room = provider.fit.room(prompt.kind().pieces());
            if !provider.fit.fits(prompt) {
                return Err(provider.too_long(room));
            }
            let observer = Counted {
                provider,
                calls: AtomicU32::new(0),
                log,
            };
            let attempted = retry::complete_prompt_with_retries(
                provider.llm.as_ref(),
                prompt,
                deadline,
                &provider.policy,
                Some(&observer),
            )
            .await;
            called |= observer.calls.load(Ordering::Relaxed) > 0;
            let err = match attempted {
                Ok(completion) => return Ok(provider.summary(completion)),
                Err(RetryError::Llm(LlmError::ContextExceeded(message))) => {
                    let tokens = prompt.data_tokens(provider.fit.counter());
                    let smaller =
                        (tokens / SHRINK_AFTER_REFUSAL.1 * SHRINK_AFTER_REFUSAL.0).min(room);
                    if smaller < MIN_SPLIT_TOKENS {
                        return Err(ChainError::Job(LlmError::ContextExceeded(message)));
                    }
                    tracing::warn!(provider = %provider.label, tokens, room, %message, "the model refused a prompt that was counted as fitting; splitting it smaller");
                    return Err(provider.too_long(smaller));
                }
                Err(RetryError::Llm(e)) if e.fault() == Fault::Job => {
                    return Err(ChainError::Job(e));
                }
                // No time left for this provider is no time left for the next one either.
                Err(e @ RetryError::DeadlineExceeded { .. }) => {
                    return Err(ChainError::Transient(e));
                }
                // Redis does not answer: no provider's limits can be asked.
                Err(e @ RetryError::Limiter(_)) => {
                    return Err(ChainError::Transient(e));
                }
                Err(e) => e,
            };
            if let Some(next) = self.providers.get(i + 1) {
                tracing::warn!(provider = %provider.label, next = %next.label, error = %err, "model provider failed this delivery; trying the next one");
            }
            last = Some(err);
        }
        if self.all_open() {
            return Err(ChainError::AllOpen {
                reason: self.outage_reason(),
                called,
            });
        }
        Err(ChainError::Transient(
            last.unwrap_or(RetryError::BreakerOpen),
        ))
    }

    /// Whether every provider's breaker is open: no job can be summarised now.
    pub fn all_open(&self) -> bool {
        self.providers.iter().all(|p| p.breaker.is_open())
    }

    /// Why the open breakers are open, provider by provider.
    pub(crate) fn outage_reason(&self) -> String {
        self.statuses()
            .into_iter()
            .filter_map(|s| s.open.map(|why| format!("{}: {why}", s.provider)))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(crate) fn statuses(&self) -> Vec<ProviderStatus> {
        self.providers
            .iter()
            .map(|p| ProviderStatus {
                provider: p.label.clone(),
                open: match p.breaker.state() {
                    BreakerState::Closed { .. } => None,
                    BreakerState::Open {
                        since,
                        probe_at,
                        reason,
                        ..
                    } => Some(format!(
                        "breaker open for {} s ({reason}); next probe in {} s",
                        since.elapsed().as_secs(),
                        probe_at.saturating_duration_since(Instant::now()).as_secs()
                    )),
                },
            })
            .collect()
    }

    /// Whether every provider is down, asked right after a delivery's own calls opened the
    /// last breaker: probe each open one now, cooldown or not (one probe per breaker at a
    /// time; a probe already running is waited for). `Ok` when some provider answers, so its
    /// breaker is closed again and the job, not the provider, is at fault; `Err` with the
    /// outage when none does. A failed confirmation leaves each breaker's schedule as it was,
    /// so a burst of deliveries meeting one outage does not stretch the cooldown.
    pub(crate) async fn confirm_outage(&self) -> Result<(), String> {
        for provider in &self.providers {
            if provider.confirm().await {
                return Ok(());
            }
        }
        Err(self.outage_reason())
    }

    /// Start the probe of every open breaker whose cooldown is over, each in its own task
    /// (bounded by the provider's call timeout), so no consumer waits for one. A breaker runs
    /// one probe at a time however many consumers ask.
    pub(crate) fn probe_due(&self) {
        let now = Instant::now();
        for provider in &self.providers {
            if provider.breaker.probe_is_due(now) {
                let provider = provider.clone();
                tokio::spawn(async move { provider.probe().await });
            }
        }
    }
}

impl Provider {
    fn too_long(&self, room: usize) -> ChainError {
        ChainError::TooLong {
            provider: self.label.clone(),
            room,
            counter: *self.fit.counter(),
            summary_tokens: self.fit.summary_tokens(),
        }
    }

    fn summary(&self, completion: Completion) -> ModelSummary {
        ModelSummary {
            text: completion.summary,
            model: self.model.clone(),
            usage: completion.usage,
            parts: None,
            calls: Vec::new(),
        }
    }

    /// The one probe of an open breaker, if it is still due and nobody else runs it. A
    /// provider that answers at all (even refusing the tiny request as the job's fault) is
    /// up: only a transient failure or a misconfiguration keeps the breaker open.
    ///
    /// With shared state, the probe is the fleet's: taken in Redis first (one probe per
    /// cooldown whatever the number of processes); a process that does not get it asks
    /// again when it is free, and meanwhile follows the schedule the prober publishes.
    async fn probe(&self) {
        let Some(ticket) = self.breaker.begin_probe(Instant::now()) else {
            return;
        };
        if let Some(share) = self.share.get() {
            match share
                .take_probe(self.policy.call_timeout + PROBE_LEASE_MARGIN)
                .await
            {
                Ok(ProbeLease::Won) => {}
                Ok(ProbeLease::Held(left)) => {
                    ticket.postpone(Instant::now() + left);
                    return;
                }
                // Probing without the fleet's lease costs one request per process per
                // cooldown, what a lone process always spent.
                Err(e) => {
                    tracing::warn!(provider = %self.label, error = %e, "could not take the fleet's probe in Redis; probing from this process")
                }
            }
        }
        self.wait_turn_unchecked().await;
        let started = Instant::now();
        let result = retry::bounded(self.policy.call_timeout, self.llm.probe()).await;
        self.record_call(result.as_ref().map(|usage| *usage), started.elapsed());
        self.after_call(&result).await;
        match result {
            Err(e) if e.fault() != Fault::Job => {
                tracing::warn!(provider = %self.label, error = %e, "model provider probe failed; its breaker stays open");
                ticket.failed(Instant::now(), &e.to_string());
                self.publish_open(false).await;
            }
            _ => {
                let transition = ticket.passed();
                self.clear_open().await;
                self.apply(transition);
            }
        }
    }

    /// Take this call's turn under the provider's shared limits (and its cool-until),
    /// sleeping as long as the limiter says; how long it waited. Without shared state,
    /// at once.
    async fn wait_turn(&self, cost: u64) -> Result<Duration, RetryError> {
        let Some(share) = self.share.get() else {
            return Ok(Duration::ZERO);
        };
        let started = Instant::now();
        let mut counted = false;
        loop {
            match share.admit(cost).await {
                Ok(Admission::Go) => return Ok(started.elapsed()),
                Ok(Admission::Wait { after, reason }) => {
                    if !counted {
                        counted = true;
                        if let Some(m) = &self.metrics {
                            m.llm_limit_waits
                                .with_label_values(&[&self.label, reason.label()])
                                .inc();
                        }
                        tracing::debug!(provider = %self.label, reason = reason.label(), wait_ms = after.as_millis() as u64, "model call waits for the provider's shared limits");
                    }
                    tokio::time::sleep(after).await;
                }
                // Without rpm/tpm only the cool-until was to be read: a call sent without it
                // breaks no limit, and the provider's own 429 still answers it.
                Err(e) if self.limits.is_unlimited() => {
                    tracing::debug!(provider = %self.label, error = %e, "could not read the shared cool-until; calling anyway");
                    return Ok(started.elapsed());
                }
                Err(e) => return Err(RetryError::Limiter(e.to_string())),
            }
        }
    }

    /// A probe's turn: it waits like any call, and goes without the limiter when Redis does
    /// not answer (one tiny request per cooldown).
    async fn wait_turn_unchecked(&self) {
        let cost = (PromptKind::Document.overhead() + 1) as u64;
        if let Err(e) = self.wait_turn(cost).await {
            tracing::warn!(provider = %self.label, error = %e, "probing without the shared limits");
        }
    }

    /// What one call of `prompt` may cost at most: its tokens as counted, the instructions,
    /// and the whole completion cap.
    fn cost_of(&self, prompt: &Prompt) -> u64 {
        let tokens = prompt.data_tokens(self.fit.counter()) + prompt.kind().overhead();
        tokens as u64 + u64::from(self.max_tokens)
    }

    /// A 429 that said how long to wait sets the fleet's cool-until.
    async fn after_call<T>(&self, result: &Result<T, LlmError>) {
        if let Some(after) = retry::rate_limited_for(result) {
            self.rate_limited(after).await;
        }
    }

    async fn rate_limited(&self, after: Duration) {
        let Some(share) = self.share.get() else {
            return;
        };
        match share.cool_for(after).await {
            Ok(()) => {
                tracing::warn!(provider = %self.label, wait_ms = after.as_millis() as u64, "model provider answered 429: no process calls it before its Retry-After")
            }
            Err(e) => {
                tracing::warn!(provider = %self.label, error = %e, "could not share the provider's Retry-After in Redis")
            }
        }
    }

    /// Publish this breaker's open state for the fleet (`first`: it just opened here).
    async fn publish_open(&self, first: bool) {
        let (Some(share), Some((record, ttl))) = (self.share.get(), self.open_record()) else {
            return;
        };
        publish(share, &self.label, &record, first, ttl).await;
    }

    /// The breaker's open state as the fleet is told it, and how long that record lives.
    fn open_record(&self) -> Option<(OpenRecord, Duration)> {
        let BreakerState::Open {
            since,
            probe_at,
            probes_failed,
            reason,
            ..
        } = self.breaker.state()
        else {
            return None;
        };
        let now = (Instant::now(), SystemTime::now());
        let record = OpenRecord::at(now, since, probe_at, probes_failed, &reason);
        // Outlives the longest cooldown twice, so a fleet that is gone leaves no open
        // breaker behind for long, and a live one refreshes it with every failed probe.
        let ttl = self.cooldown * COOLDOWN_GROWTH_CAP * 2 + self.policy.call_timeout;
        Some((record, ttl))
    }

    async fn clear_open(&self) {
        if let Some(share) = self.share.get() {
            clear(share, &self.label).await;
        }
    }

    /// Take the fleet's view of this provider's breaker.
    async fn sync(&self) {
        let Some(share) = self.share.get() else {
            return;
        };
        match share.read_open().await {
            Ok(Some(record)) => {
                share.saw_open();
                let (since, probe_at) = record.instants((Instant::now(), SystemTime::now()));
                let opened =
                    self.breaker
                        .adopt_open(since, probe_at, record.probes_failed, &record.reason);
                if opened.is_some() {
                    tracing::warn!(provider = %self.label, "model provider's breaker is open in another process: this one makes no job call either");
                }
                self.apply(opened);
            }
            Ok(None) => {
                if share.closed_elsewhere() && !self.breaker.is_probing() {
                    let closed = self.breaker.record_success();
                    if closed.is_some() {
                        tracing::info!(provider = %self.label, "model provider's breaker was closed by another process's probe");
                    }
                    self.apply(closed);
                }
            }
            Err(e) => {
                tracing::debug!(provider = %self.label, error = %e, "could not read the shared breaker; keeping this process's view")
            }
        }
    }

    /// Whether this provider answers now: closed already, or an immediate probe passes (then
    /// it is closed). A probe someone else runs is waited for (within the call timeout) and
    /// its answer taken; after a confirmation found it down, that answer stands until the
    /// breaker's own probe decides.
    async fn confirm(&self) -> bool {
        let waited_until = Instant::now() + self.policy.call_timeout;
        // Someone else's probe is waited for and its answer taken.
        while self.breaker.is_probing() && Instant::now() < waited_until {
            tokio::time::sleep(CONFIRM_POLL).await;
        }
        let Some(ticket) = self.breaker.begin_confirmation() else {
            return !self.breaker.is_open();
        };
        self.wait_turn_unchecked().await;
        let started = Instant::now();
        let result = retry::bounded(self.policy.call_timeout, self.llm.probe()).await;
        self.record_call(result.as_ref().map(|usage| *usage), started.elapsed());
        self.after_call(&result).await;
        match result {
            Err(e) if e.fault() != Fault::Job => {
                tracing::warn!(provider = %self.label, error = %e, "model provider is down: the probe after a delivery opened its breaker failed too");
                ticket.still_down();
                false
            }
            _ => {
                tracing::warn!(provider = %self.label, "model provider answers: the delivery that opened its breaker is at fault itself; its delivery counts");
                let transition = ticket.passed();
                self.clear_open().await;
                self.apply(transition);
                true
            }
        }
    }

    /// Log and export a change of the breaker's state.
    fn apply(&self, transition: Option<Transition>) {
        let gauge = |open: i64| {
            if let Some(m) = &self.metrics {
                m.llm_breaker_open
                    .with_label_values(&[&self.label])
                    .set(open);
            }
        };
        match transition {
            Some(Transition::Opened { reason }) => {
                tracing::error!(provider = %self.label, %reason, "model provider's circuit breaker opened: no job calls it until a probe passes");
                gauge(1);
            }
            Some(Transition::Closed) => {
                tracing::info!(provider = %self.label, "model provider's circuit breaker closed: jobs call it again");
                gauge(0);
            }
            None => {}
        }
    }

    /// Metrics of one call: duration, result, tokens.
    fn record_call(&self, result: Result<Option<TokenUsage>, &LlmError>, elapsed: Duration) {
        let Some(m) = &self.metrics else { return };
        m.llm_duration.observe(elapsed.as_secs_f64());
        m.llm_requests
            .with_label_values(&[&result_label(&result)])
            .inc();
        if let Ok(Some(usage)) = result {
            for (kind, n) in [("prompt", usage.prompt), ("completion", usage.completion)] {
                m.llm_tokens
                    .with_label_values(&[&self.model, kind])
                    .inc_by(u64::from(n));
            }
        }
    }
}

impl AttemptObserver for Provider {
    fn may_attempt(&self) -> bool {
        !self.breaker.is_open()
    }

    fn observe(&self, result: &Result<Completion, LlmError>, elapsed: Duration) {
        self.record_call(result.as_ref().map(|c| c.usage), elapsed);
        let transition = match result {
            Ok(_) => self.breaker.record_success(),
            Err(e) => match e.fault() {
                Fault::Transient { .. } => self
                    .breaker
                    .record_transient_failure(Instant::now(), &e.to_string()),
                Fault::Provider => self.breaker.trip(
                    Instant::now(),
                    &format!("provider refused the request as misconfigured: {e}"),
                ),
                // The provider answered; the request was the problem.
                Fault::Job => None,
            },
        };
        self.share_transition(&transition);
        self.apply(transition);
    }
}

impl Provider {
    /// Tell the fleet of a change a call made here, in its own task: the call's result is
    /// not held up by Redis.
    fn share_transition(&self, transition: &Option<Transition>) {
        let Some(share) = self.share.get().cloned() else {
            return;
        };
        let label = self.label.clone();
        match transition {
            Some(Transition::Opened { .. }) => {
                let Some((record, ttl)) = self.open_record() else {
                    return;
                };
                tokio::spawn(async move { publish(&share, &label, &record, true, ttl).await });
            }
            Some(Transition::Closed) => {
                tokio::spawn(async move { clear(&share, &label).await });
            }
            None => {}
        }
    }
}

async fn publish(
    share: &ProviderShare,
    label: &str,
    record: &OpenRecord,
    first: bool,
    ttl: Duration,
) {
    if let Err(e) = share.publish_open(record, first, ttl).await {
        tracing::warn!(provider = %label, error = %e, "could not publish the open breaker in Redis");
    }
}

async fn clear(share: &ProviderShare, label: &str) {
    if let Err(e) = share.clear_open().await {
        tracing::warn!(provider = %label, error = %e, "could not clear the open breaker in Redis");
    }
}

/// How often a confirmation looks whether a probe someone else runs has ended.
const CONFIRM_POLL: Duration = Duration::from_millis(20);
/// The fleet's probe is held this much longer than the probe's call timeout, so it cannot
/// lapse while the probe still runs.
const PROBE_LEASE_MARGIN: Duration = Duration::from_secs(1);

/// A provider's observer for one delivery that also counts the calls it let through, and
/// logs each one for the job's history.
struct Counted<'a> {
    provider: &'a Provider,
    calls: AtomicU32,
    log: Option<&'a CallLog>,
}

#[async_trait::async_trait]
impl AttemptObserver for Counted<'_> {
    fn may_attempt(&self) -> bool {
        self.provider.may_attempt()
    }

    async fn wait_turn(&self, prompt: &Prompt) -> Result<Duration, RetryError> {
        self.provider.wait_turn(self.provider.cost_of(prompt)).await
    }

    async fn rate_limited(&self, retry_after: Duration) {
        self.provider.rate_limited(retry_after).await;
    }

    fn call_span(&self, prompt: &Prompt) -> tracing::Span {
        // Calls for a job only: a probe is nobody's job, and its span would name none.
        let Some((job_id, tenant)) = self.log.and_then(CallLog::job) else {
            return tracing::Span::none();
        };
        let model = &self.provider.model;
        let span = otel_span!(
            "chat",
            "client",
            job_id,
            tenant,
            "otel.name" = %format!("chat {model}"),
            "gen_ai.operation.name" = "chat",
            "gen_ai.provider.name" = gen_ai_provider(&self.provider.label),
            "gen_ai.request.model" = %model,
            "gen_ai.response.model" = tracing::field::Empty,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "gen_ai.input.messages" = tracing::field::Empty,
            "gen_ai.output.messages" = tracing::field::Empty
        );
        if telemetry::capture_content() && !span.is_none() {
            let messages = serde_json::json!([
                {"role": "system", "parts": [{"type": "text", "content": prompt.kind().system()}]},
                {"role": "user", "parts": [{"type": "text", "content": prompt.user_message()}]},
            ]);
            span.record("gen_ai.input.messages", messages.to_string());
        }
        span
    }

    fn end_span(&self, span: &tracing::Span, result: &Result<Completion, LlmError>) {
        if span.is_none() {
            return;
        }
        match result {
            Ok(completion) => {
                span.record("gen_ai.response.model", self.provider.model.as_str());
                if let Some(usage) = completion.usage {
                    span.record("gen_ai.usage.input_tokens", i64::from(usage.prompt));
                    span.record("gen_ai.usage.output_tokens", i64::from(usage.completion));
                }
                if telemetry::capture_content() {
                    let messages = serde_json::json!([
                        {"role": "assistant", "parts": [{"type": "text", "content": completion.summary}]},
                    ]);
                    span.record("gen_ai.output.messages", messages.to_string());
                }
            }
            Err(e) => telemetry::fail(span, &error_class(e)),
        }
    }

    fn observe(&self, result: &Result<Completion, LlmError>, elapsed: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.provider.observe(result, elapsed);
        if let Some(log) = self.log {
            let (usage, error_class) = match result {
                Ok(completion) => (completion.usage, None),
                Err(e) => (None, Some(error_class(e))),
            };
            log.record(
                &self.provider.label,
                &self.provider.model,
                usage,
                elapsed,
                error_class,
            );
        }
    }
}

/// `gen_ai.provider.name` of a provider labelled `openai:<model>` or `builtin`: the
/// well-known name where the GenAI conventions have one, else ours, namespaced.
fn gen_ai_provider(label: &str) -> &'static str {
    match label.split(':').next() {
        Some("openai") => "openai",
        _ => "summaryd.builtin",
    }
}

/// The `result` label of `summaryd_llm_requests_total`.
fn result_label(result: &Result<Option<TokenUsage>, &LlmError>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => error_class(e),
    }
}

/// What kind of failure `e` is, in a word: the `result` label of a failed call, and the
/// error class of its `model_calls` row.
fn error_class(e: &LlmError) -> String {
    match e {
        LlmError::Timeout => "timeout".into(),
        LlmError::Connect(_) => "connect".into(),
        LlmError::Status { status, .. } => format!("status_{status}"),
        LlmError::Malformed(_) => "malformed".into(),
        LlmError::InvalidInput(_) => "invalid_input".into(),
        LlmError::ContextExceeded(_) => "context_exceeded".into(),
        LlmError::Other(_) => "other".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Plays its answers in order, then repeats the last one; counts calls and probes.
    struct Scripted {
        answers: Mutex<Vec<Result<Completion, LlmError>>>,
        calls: AtomicUsize,
        probes: AtomicUsize,
    }

    impl Scripted {
        fn new(answers: Vec<Result<Completion, LlmError>>) -> Arc<Self> {
            Arc::new(Self {
                answers: Mutex::new(answers),
                calls: AtomicUsize::new(0),
                probes: AtomicUsize::new(0),
            })
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl Llm for Scripted {
        async fn summarise(&self, _text: &str) -> Result<Completion, LlmError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut answers = self.answers.lock().unwrap();
            if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            }
        }
        async fn probe(&self) -> Result<Option<TokenUsage>, LlmError> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            self.summarise("probe").await.map(|c| c.usage)
        }
    }

    fn ok(text: &str, prompt: u32, completion: u32) -> Result<Completion, LlmError> {
        Ok(Completion {
            summary: text.into(),
            usage: Some(TokenUsage { prompt, completion }),
        })
    }

    fn status(code: u16) -> Result<Completion, LlmError> {
        Err(LlmError::Status {
            status: code,
            retry_after: None,
            message: format!("answered {code}"),
        })
    }

    fn settings() -> LlmSettings {
        let mut s = Settings::default().llm;
        s.max_attempts = 2;
        s.backoff = Duration::from_millis(1);
        s.max_backoff = Duration::from_millis(1);
        s.breaker_failures = 3;
        s.breaker_cooldown = Duration::from_secs(1);
        s.call_timeout = Duration::from_secs(2);
        s
    }

    fn config(model: &str) -> ProviderConfig {
        let mut c = ProviderConfig::primary(&settings());
        c.provider = crate::config::LlmProvider::Openai;
        c.model = model.into();
        c
    }

    fn chain(providers: &[(&str, &Arc<Scripted>)], metrics: Option<Arc<Metrics>>) -> ModelChain {
        let list = providers
            .iter()
            .map(|(model, llm)| (config(model), (*llm).clone() as Arc<dyn Llm>))
            .collect();
        ModelChain::new(&settings(), list, metrics)
    }

    fn deadline() -> Deadline {
        Deadline::after(Duration::from_secs(60))
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_provider_that_answers_writes_the_summary() {
        let primary = Scripted::new(vec![status(503)]);
        let fallback = Scripted::new(vec![ok("from fallback", 7, 2)]);
        let metrics = Arc::new(Metrics::new().unwrap());
        let chain = chain(
            &[("big", &primary), ("small", &fallback)],
            Some(metrics.clone()),
        );
        let summary = chain.summarise("t", deadline()).await.unwrap();
        assert_eq!(summary.text, "from fallback");
        assert_eq!(summary.model, "small");
        assert_eq!(
            summary.usage,
            Some(TokenUsage {
                prompt: 7,
                completion: 2
            })
        );
        assert_eq!(primary.calls(), 2, "max_attempts on the primary first");
        assert_eq!(fallback.calls(), 1);
        let text = metrics.render();
        assert!(
            text.contains(r#"summaryd_llm_tokens_total{kind="prompt",model="small"} 7"#),
            "{text}"
        );
        assert!(
            text.contains(r#"summaryd_llm_tokens_total{kind="completion",model="small"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"summaryd_llm_breaker_open{provider="openai:big"} 0"#),
            "{text}"
        );
        // Every call is counted under its result.
        for line in [
            r#"summaryd_llm_requests_total{result="status_503"} 2"#,
            r#"summaryd_llm_requests_total{result="ok"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    /// Every attempt of a delivery is in its log, on whichever provider, retries and
    /// failures included; a call refused before it is sent (an open breaker) is not.
    #[tokio::test(start_paused = true)]
    async fn every_attempt_is_logged_with_its_provider_cost_and_error_class() {
        let primary = Scripted::new(vec![status(503), Err(LlmError::Timeout)]);
        let fallback = Scripted::new(vec![ok("from fallback", 7, 2)]);
        let chain = chain(&[("big", &primary), ("small", &fallback)], None);
        let log = CallLog::new(2);
        let prompt = Prompt::Document("t".into());
        let summary = chain.complete(&prompt, deadline(), &log).await.unwrap();
        assert_eq!(summary.text, "from fallback");
        assert!(
            summary.calls.is_empty(),
            "the log holds them, not the summary"
        );
        let calls = log.take();
        let seen: Vec<_> = calls
            .iter()
            .map(|c| {
                (
                    c.delivery,
                    c.seq,
                    c.provider.as_str(),
                    c.model.as_str(),
                    c.prompt_tokens,
                    c.completion_tokens,
                    c.error_class.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (2, 0, "openai:big", "big", None, None, Some("status_503")),
                (2, 1, "openai:big", "big", None, None, Some("timeout")),
                (2, 2, "openai:small", "small", Some(7), Some(2), None),
            ]
        );
        // The primary's breaker opens after three failures; this delivery's third attempt
        // on it is never made, so never logged.
        let log = CallLog::new(3);
        chain.complete(&prompt, deadline(), &log).await.unwrap();
        let providers: Vec<_> = log.take().into_iter().map(|c| c.provider).collect();
        assert_eq!(providers, ["openai:big", "openai:small"]);
        assert_eq!(primary.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_jobs_own_fault_ends_the_delivery_without_the_fallback() {
        for code in [400, 413, 422] {
            let primary = Scripted::new(vec![status(code)]);
            let fallback = Scripted::new(vec![ok("never", 1, 1)]);
            let chain = chain(&[("a", &primary), ("b", &fallback)], None);
            let err = chain.summarise("t", deadline()).await.unwrap_err();
            assert!(
                matches!(err, ChainError::Job(LlmError::Status { status, .. }) if status == code),
                "{err:?}"
            );
            assert_eq!(err.disposition(), Disposition::Permanent);
            assert_eq!(primary.calls(), 1, "{code}: one call");
            assert_eq!(fallback.calls(), 0, "{code}: never tried elsewhere");
            assert!(!chain.all_open());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_misconfigured_provider_opens_at_once_and_the_job_moves_on() {
        for code in [401, 403, 404] {
            let primary = Scripted::new(vec![status(code)]);
            let fallback = Scripted::new(vec![ok("fine", 1, 1)]);
            let chain = chain(&[("a", &primary), ("b", &fallback)], None);
            let summary = chain.summarise("t", deadline()).await.unwrap();
            assert_eq!(summary.model, "b");
            assert_eq!(primary.calls(), 1, "{code}: not retried");
            assert!(chain.statuses()[0].open.is_some(), "{code}");
            // The next job goes straight to the fallback.
            chain.summarise("t", deadline()).await.unwrap();
            assert_eq!(primary.calls(), 1, "{code}: skipped while open");
            assert_eq!(fallback.calls(), 2);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_breaker_open_the_chain_reports_an_outage_without_calling() {
        let only = Scripted::new(vec![status(401)]);
        let chain = chain(&[("a", &only)], None);
        let err = chain.summarise("t", deadline()).await.unwrap_err();
        assert!(
            matches!(&err, ChainError::AllOpen { reason, .. } if reason.contains("openai:a") && reason.contains("401")),
            "{err:?}"
        );
        assert!(chain.all_open());
        assert_eq!(err.disposition(), Disposition::Unavailable);
        let err = chain.summarise("t", deadline()).await.unwrap_err();
        assert!(matches!(err, ChainError::AllOpen { .. }));
        assert_eq!(only.calls(), 1, "no call while open");
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_open_the_breaker_after_the_threshold() {
        // Threshold 3, two attempts per delivery: the second delivery's first attempt opens it,
        // and its second attempt is not made.
        let only = Scripted::new(vec![status(503)]);
        let chain = chain(&[("a", &only)], None);
        let first = chain.summarise("t", deadline()).await.unwrap_err();
        assert!(
            matches!(first, ChainError::Transient(RetryError::Llm(_))),
            "{first:?}"
        );
        assert_eq!(first.disposition(), Disposition::TRANSIENT);
        assert!(!chain.all_open());
        let second = chain.summarise("t", deadline()).await.unwrap_err();
        assert!(matches!(second, ChainError::AllOpen { .. }), "{second:?}");
        assert_eq!(only.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_after_the_cooldown_closes_the_breaker() {
        let only = Scripted::new(vec![status(401), status(503), ok("back", 1, 1)]);
        let metrics = Arc::new(Metrics::new().unwrap());
        let chain = chain(&[("a", &only)], Some(metrics.clone()));
        chain.summarise("t", deadline()).await.unwrap_err();
        let open = r#"summaryd_llm_breaker_open{provider="openai:a"} 1"#;
        assert!(metrics.render().contains(open));
        chain.probe_due();
        tokio::task::yield_now().await;
        assert_eq!(only.probes.load(Ordering::SeqCst), 0, "cooldown not over");
        tokio::time::advance(Duration::from_millis(1_000)).await;
        chain.probe_due();
        chain.probe_due();
        settle().await;
        assert_eq!(
            only.probes.load(Ordering::SeqCst),
            1,
            "one probe, however many ask"
        );
        assert!(chain.all_open(), "the probe met a 503");
        // The next probe waits twice as long.
        tokio::time::advance(Duration::from_millis(1_999)).await;
        chain.probe_due();
        settle().await;
        assert_eq!(only.probes.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        chain.probe_due();
        settle().await;
        assert_eq!(only.probes.load(Ordering::SeqCst), 2);
        assert!(!chain.all_open(), "the probe passed");
        assert!(
            metrics
                .render()
                .contains(r#"summaryd_llm_breaker_open{provider="openai:a"} 0"#)
        );
        assert!(
            metrics
                .render()
                .contains(r#"summaryd_llm_tokens_total{kind="prompt",model="a"} 1"#)
        );
        assert_eq!(chain.summarise("t", deadline()).await.unwrap().text, "back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_refused_as_the_jobs_fault_still_proves_the_provider_is_up() {
        let only = Scripted::new(vec![status(403), status(400)]);
        let chain = chain(&[("a", &only)], None);
        chain.summarise("t", deadline()).await.unwrap_err();
        tokio::time::advance(Duration::from_millis(1_000)).await;
        chain.probe_due();
        settle().await;
        assert!(!chain.all_open());
    }

    #[test]
    fn every_error_has_its_own_result_label() {
        let cases: [(Result<Option<TokenUsage>, LlmError>, &str); 7] = [
            (Ok(None), "ok"),
            (Err(LlmError::Timeout), "timeout"),
            (Err(LlmError::Connect("refused".into())), "connect"),
            (status(429).map(|c| c.usage), "status_429"),
            (Err(LlmError::Malformed("no choices".into())), "malformed"),
            (
                Err(LlmError::InvalidInput("too long".into())),
                "invalid_input",
            ),
            (Err(LlmError::Other("bug".into())), "other"),
        ];
        for (result, label) in cases {
            assert_eq!(result_label(&result.as_ref().copied()), label, "{result:?}");
        }
    }

    #[test]
    fn debug_output_names_the_providers_in_order_and_nothing_else() {
        let a = Scripted::new(vec![ok("a", 1, 1)]);
        let b = Scripted::new(vec![ok("b", 1, 1)]);
        let shown = format!("{:?}", chain(&[("big", &a), ("small", &b)], None));
        assert_eq!(
            shown,
            r#"ModelChain { providers: ["openai:big", "openai:small"] }"#
        );
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
}
