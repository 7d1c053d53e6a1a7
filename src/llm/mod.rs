//! The model behind one trait; the providers are chosen by configuration: `[llm]` and the
//! `[[llm.fallback]]` chain after it (`chain.rs`), each behind its own circuit breaker
//! (`breaker.rs`).
//!
//! Providers make exactly one attempt per call: `crate::llm::retry` owns timeouts and backoff, so
//! no layer multiplies the other's retries. Whether an error is worth another attempt, and
//! whose fault it is, is decided once, below, by [`LlmError::fault`].

mod breaker;
mod builtin;
mod chain;
mod fit;
mod openai;
pub mod prompts;
pub mod retry;
mod shared;
pub mod split;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;

pub use breaker::{Breaker, BreakerState, Transition};
pub use builtin::BuiltinSummariser;
pub use chain::{ChainError, ModelChain, Provider, ProviderStatus};
pub use fit::Fit;
pub use openai::{OpenAiClient, PROBE_TEXT};
pub use prompts::{Prompt, PromptKind, SYSTEM_PROMPT, document};
pub use shared::{
    Admission, Limits, OpenRecord, ProbeLease, ProviderShare, SharedLimits, WaitReason,
};
pub use tokens::TokenCounter;

use crate::config::{FallbackSettings, LlmProvider, LlmSettings};
use crate::domain::TokenUsage;
use crate::infra::http_client::with_causes;
use crate::resilience::failure::{Classify, Disposition};

/// The built-in summariser's label (logs, `/readyz`, metrics).
pub(crate) const BUILTIN_LABEL: &str = "builtin";

/// The statuses that say the provider is misconfigured (a revoked key, a model that does not
/// exist there): no job can succeed on it, and any job may succeed elsewhere.
const PROVIDER_FAULT_4XX: [u16; 3] = [401, 403, 404];

/// Whose fault a failed call is: what the chain and the breakers act on (a provider's fault
/// opens its breaker, the job's fault ends the delivery). Above the model edge it becomes a
/// [`Disposition`] like every other adapter's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The provider is down, slow or rate-limiting: try again, here or on the next provider.
    Transient { retry_after: Option<Duration> },
    /// The request itself is refused (400, 413, 422, an unusable answer, a prompt over the
    /// context; the last is split smaller by the chain's caller while it can be):
    /// every provider would refuse it, so the job is dead-lettered at once.
    Job,
    /// The provider is misconfigured (401, 403, 404): its breaker opens at once and the job
    /// moves on; it is never dead-lettered for this.
    Provider,
}

/// One successful call: the summary, and the tokens it cost when the provider said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub summary: String,
    pub(crate) usage: Option<TokenUsage>,
}

impl Completion {
    /// A completion of a provider that reports no usage (the built-in summariser).
    pub fn without_usage(summary: String) -> Self {
        Self {
            summary,
            usage: None,
        }
    }

    /// A completion that cost `usage`, as a provider reported it.
    pub fn with_usage(summary: String, usage: TokenUsage) -> Self {
        Self {
            summary,
            usage: Some(usage),
        }
    }
}

/// What went wrong in one model call; [`LlmError::fault`] says what each means.
///
/// The messages stay `String`s: every one of them passes through the provider's redaction
/// (`openai.rs`) before it reaches logs or dead-letter reasons, because providers echo keys
/// and transport errors carry the endpoint URL (which may hold a proxy's password); a kept
/// `#[source]` would carry the unredacted text past it. Owned text also keeps the error
/// `Clone`, which the chain's scripted fakes replay.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    #[error("model call timed out")]
    Timeout,
    #[error("connection to the model API failed: {0}")]
    Connect(String),
    #[error("model API answered {status}: {message}")]
    Status {
        status: u16,
        /// From `Retry-After` / `retry-after-ms`; capped by the retry module.
        retry_after: Option<Duration>,
        message: String,
    },
    #[error("malformed model response: {0}")]
    Malformed(String),
    #[error("input can never be summarised: {0}")]
    InvalidInput(String),
    /// The provider says the prompt is longer than its context ("context length
    /// exceeded" in any provider's wording): the text is split smaller, never retried as is.
    #[error("the prompt is longer than the model's context: {0}")]
    ContextExceeded(String),
    #[error("{0}")]
    Other(String),
}

impl LlmError {
    /// Whose fault the failure is. Unknown errors are the job's: they are bugs until logs
    /// prove otherwise, and would fail the same way every time.
    pub(crate) fn fault(&self) -> Fault {
        match self {
            LlmError::Timeout | LlmError::Connect(_) => Fault::Transient { retry_after: None },
            LlmError::Status {
                status,
                retry_after,
                ..
            } => match Disposition::of_http_status(*status, *retry_after) {
                Disposition::Transient { retry_after } => Fault::Transient { retry_after },
                _ if PROVIDER_FAULT_4XX.contains(status) => Fault::Provider,
                _ => Fault::Job,
            },
            LlmError::Malformed(_)
            | LlmError::InvalidInput(_)
            | LlmError::ContextExceeded(_)
            | LlmError::Other(_) => Fault::Job,
        }
    }
}

impl From<Fault> for Disposition {
    fn from(fault: Fault) -> Self {
        match fault {
            Fault::Transient { retry_after } => Disposition::Transient { retry_after },
            Fault::Provider => Disposition::Unavailable,
            Fault::Job => Disposition::Permanent,
        }
    }
}

impl Classify for LlmError {
    /// Whether another attempt on the same provider may pass (only a transient fault), and
    /// whose fault it is otherwise: a misconfigured provider serves no job, this one refuses
    /// the job on every provider.
    fn disposition(&self) -> Disposition {
        self.fault().into()
    }
}

#[async_trait]
pub trait Llm: Send + Sync {
    /// Summarise `text`. One attempt; the caller bounds it with a wall-clock timeout.
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError>;

    /// One request for `prompt` (a whole document, a part, or summaries to combine). A
    /// provider that takes instructions builds its request from the prompt
    /// (`llm::prompts`); the default summarises the prompt's plain text.
    async fn complete(&self, prompt: &Prompt) -> Result<Completion, LlmError> {
        self.summarise(&prompt.plain_text()).await
    }

    /// The smallest request that proves the provider would take a job now: what an open
    /// breaker sends before it lets jobs through again (`chain.rs` says why a probe is a
    /// request of its own and not a job). Any answer the provider accepts is a pass.
    async fn probe(&self) -> Result<Option<TokenUsage>, LlmError> {
        self.summarise(PROBE_TEXT).await.map(|c| c.usage)
    }
}

/// A provider that cannot be built from the settings; names the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum LlmConfigError {
    #[error("{setting}: {reason}")]
    Invalid { setting: String, reason: String },
    #[error("could not build the HTTP client for the model API: {}", with_causes(.0))]
    Client(#[source] reqwest::Error),
}

/// What one provider of the chain is built from: `[llm]` itself, or a `[[llm.fallback]]`
/// table with the rest taken from `[llm]`. `setting` names where each value came from, so
/// errors name what to fix.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub(crate) provider: LlmProvider,
    pub(crate) base_url: SecretString,
    pub(crate) model: String,
    pub(crate) api_key: Option<SecretString>,
    pub(crate) call_timeout: Duration,
    pub(crate) max_tokens: u32,
    /// The model's context window in tokens.
    pub(crate) context_tokens: u32,
    /// `SUMMARYD_LLM` for `[llm]`, `[[llm.fallback]] #n` for a fallback.
    pub(crate) setting: String,
    /// Requests and tokens per minute for every process together; none = no limit.
    pub(crate) rpm: Option<u32>,
    pub(crate) tpm: Option<u32>,
}

impl ProviderConfig {
    /// The primary provider, `[llm]`.
    pub fn primary(settings: &LlmSettings) -> Self {
        Self {
            provider: settings.provider,
            base_url: settings.base_url.clone(),
            model: settings.model.clone(),
            api_key: settings.api_key.clone(),
            call_timeout: settings.call_timeout,
            max_tokens: settings.max_tokens,
            context_tokens: settings.context_tokens,
            setting: "SUMMARYD_LLM".into(),
            rpm: settings.rpm,
            tpm: settings.tpm,
        }
    }

    /// The `number`-th fallback (from 1); its key is read from the variable it names.
    pub(crate) fn fallback(
        settings: &LlmSettings,
        fallback: &FallbackSettings,
        number: usize,
    ) -> Result<Self, LlmConfigError> {
        Self::fallback_with_env(settings, fallback, number, |var| std::env::var(var).ok())
    }

    /// [`Self::fallback`] with the environment given as a lookup.
    fn fallback_with_env(
        settings: &LlmSettings,
        fallback: &FallbackSettings,
        number: usize,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, LlmConfigError> {
        let setting = format!("[[llm.fallback]] #{number}");
        let api_key = match &fallback.api_key_env {
            None => None,
            Some(var) => match env(var) {
                Some(key) if !key.trim().is_empty() => Some(SecretString::from(key)),
                // A named key that is missing is a deployment mistake (a Secret not mounted);
                // starting anyway would only turn every call into a 401.
                _ => {
                    return Err(LlmConfigError::Invalid {
                        setting: format!("{setting} api_key_env"),
                        reason: format!("the environment variable {var} is not set or empty"),
                    });
                }
            },
        };
        Ok(Self {
            provider: fallback.provider,
            base_url: fallback.base_url.clone(),
            model: fallback.model.clone(),
            api_key,
            call_timeout: fallback.call_timeout.unwrap_or(settings.call_timeout),
            max_tokens: settings.max_tokens,
            context_tokens: fallback.context_tokens.unwrap_or(settings.context_tokens),
            setting,
            rpm: fallback.rpm,
            tpm: fallback.tpm,
        })
    }

    /// The model name summaries and metrics are labelled with.
    pub(crate) fn model_name(&self) -> &str {
        match self.provider {
            LlmProvider::Builtin => "builtin",
            LlmProvider::Openai => &self.model,
        }
    }

    /// The provider's name in logs, `/readyz` and `summaryd_llm_breaker_open{provider}`:
    /// its kind and model, which an operator recognises from the config.
    pub(crate) fn label(&self) -> String {
        match self.provider {
            LlmProvider::Builtin => BUILTIN_LABEL.into(),
            LlmProvider::Openai => format!("openai:{}", self.model),
        }
    }

    /// What fits this provider: its context, counted by its model's tokenizer (OpenAI's
    /// models) or the estimate (every other model, and the built-in summariser).
    pub fn fit(&self) -> Fit {
        let counter = match self.provider {
            LlmProvider::Builtin => TokenCounter::Estimate,
            LlmProvider::Openai => TokenCounter::for_openai_model(&self.model),
        };
        Fit::new(counter, self.context_tokens, self.max_tokens)
    }

    /// Build the provider.
    pub fn build(&self) -> Result<Arc<dyn Llm>, LlmConfigError> {
        let provider: Arc<dyn Llm> = match self.provider {
            LlmProvider::Builtin => Arc::new(BuiltinSummariser),
            LlmProvider::Openai => {
                let client = OpenAiClient::new(self)?;
                if !client.has_api_key() {
                    // Fine for local OpenAI-compatible servers; a hosted API will answer 401.
                    tracing::info!(
                        provider = %self.label(),
                        "no API key configured: model requests carry no Authorization header"
                    );
                }
                Arc::new(client)
            }
        };
        Ok(provider)
    }
}

/// Every configured provider, in the order they are tried: `[llm]`, then each fallback.
pub(crate) fn provider_configs(
    settings: &LlmSettings,
) -> Result<Vec<ProviderConfig>, LlmConfigError> {
    let mut configs = vec![ProviderConfig::primary(settings)];
    for (i, fallback) in settings.fallback.iter().enumerate() {
        configs.push(ProviderConfig::fallback(settings, fallback, i + 1)?);
    }
    Ok(configs)
}

/// Build the primary provider alone (`[llm]`).
pub fn from_settings(settings: &LlmSettings) -> Result<Arc<dyn Llm>, LlmConfigError> {
    ProviderConfig::primary(settings).build()
}

/// What fits each configured provider, in chain order (no network I/O; a fallback whose
/// key variable is missing is still measured, since only its context matters here).
pub fn fits(settings: &LlmSettings) -> Vec<Fit> {
    let mut fits = vec![ProviderConfig::primary(settings).fit()];
    for fallback in &settings.fallback {
        let config = ProviderConfig {
            provider: fallback.provider,
            model: fallback.model.clone(),
            context_tokens: fallback.context_tokens.unwrap_or(settings.context_tokens),
            ..ProviderConfig::primary(settings)
        };
        fits.push(config.fit());
    }
    fits
}

/// The model calls `text` needs at most on the configured chain: on the provider with the
/// smallest room, since any provider may be the one that takes the job.
pub fn most_calls(fits: &[Fit], text: &str) -> usize {
    fits.iter().map(|f| f.calls_for(text)).max().unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<Duration>) -> LlmError {
        LlmError::Status {
            status: code,
            retry_after,
            message: String::new(),
        }
    }

    #[test]
    fn classification_matches_the_design() {
        assert!(LlmError::Timeout.is_transient());
        assert!(LlmError::Connect("reset".into()).is_transient());
        for code in [408, 409, 429, 500, 502, 503, 504, 599] {
            assert!(status(code, None).is_transient(), "{code} must retry");
        }
        for code in [400, 401, 403, 404, 413, 422] {
            assert!(!status(code, None).is_transient(), "{code} must not retry");
        }
        for code in [400, 402, 405, 410, 413, 415, 422, 451] {
            assert_eq!(
                status(code, None).fault(),
                Fault::Job,
                "{code} is the job's"
            );
        }
        for code in [401, 403, 404] {
            assert_eq!(
                status(code, None).fault(),
                Fault::Provider,
                "{code} is the provider's"
            );
        }
        for code in [408, 409, 429, 500, 503] {
            assert!(
                matches!(status(code, None).fault(), Fault::Transient { .. }),
                "{code} is transient"
            );
        }
        assert_eq!(LlmError::Malformed("x".into()).fault(), Fault::Job);
        assert_eq!(LlmError::InvalidInput("x".into()).fault(), Fault::Job);
        assert_eq!(LlmError::Other("x".into()).fault(), Fault::Job);
        assert_eq!(
            LlmError::Timeout.fault(),
            Fault::Transient { retry_after: None }
        );
        assert!(!LlmError::Malformed("x".into()).is_transient());
        assert!(!LlmError::InvalidInput("x".into()).is_transient());
        assert!(!LlmError::Other("x".into()).is_transient());
    }

    #[test]
    fn a_transient_status_carries_the_servers_retry_after() {
        let after = Some(Duration::from_millis(1_500));
        assert_eq!(
            status(429, after).disposition(),
            Disposition::Transient { retry_after: after }
        );
        assert_eq!(status(400, after).disposition(), Disposition::Permanent);
        assert_eq!(status(401, after).disposition(), Disposition::Unavailable);
        assert_eq!(LlmError::Timeout.disposition(), Disposition::TRANSIENT);
    }

    #[tokio::test]
    async fn the_default_probe_is_a_summary_of_the_probe_text() {
        assert!(matches!(BuiltinSummariser.probe().await, Ok(None)));
        struct Refuses;
        #[async_trait]
        impl Llm for Refuses {
            async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
                assert_eq!(text, PROBE_TEXT);
                Err(LlmError::Connect("refused".into()))
            }
        }
        assert!(matches!(Refuses.probe().await, Err(LlmError::Connect(_))));
        struct Counts;
        #[async_trait]
        impl Llm for Counts {
            async fn summarise(&self, _text: &str) -> Result<Completion, LlmError> {
                Ok(Completion {
                    summary: "pong".into(),
                    usage: Some(TokenUsage {
                        prompt: 3,
                        completion: 1,
                    }),
                })
            }
        }
        assert!(matches!(
            Counts.probe().await,
            Ok(Some(TokenUsage {
                prompt: 3,
                completion: 1
            }))
        ));
    }

    fn fallback(api_key_env: Option<&str>) -> FallbackSettings {
        FallbackSettings {
            provider: LlmProvider::Openai,
            base_url: "http://local:8000/v1".into(),
            model: "local".into(),
            api_key_env: api_key_env.map(str::to_owned),
            call_timeout: None,
            context_tokens: None,
            rpm: None,
            tpm: None,
            price_per_mtok_input: None,
            price_per_mtok_output: None,
        }
    }

    #[test]
    fn every_provider_is_configured_in_order_and_numbered_from_one() {
        let mut settings = crate::config::Settings::default().llm;
        settings.call_timeout = Duration::from_millis(1_234);
        settings.fallback = vec![fallback(None), fallback(None)];
        settings.fallback[1].call_timeout = Some(Duration::from_secs(9));
        let configs = provider_configs(&settings).unwrap();
        let names: Vec<&str> = configs.iter().map(|c| c.setting.as_str()).collect();
        assert_eq!(
            names,
            ["SUMMARYD_LLM", "[[llm.fallback]] #1", "[[llm.fallback]] #2"]
        );
        assert_eq!(
            configs[1].call_timeout,
            Duration::from_millis(1_234),
            "[llm]'s by default"
        );
        assert_eq!(configs[2].call_timeout, Duration::from_secs(9));
        assert_eq!(configs[1].label(), "openai:local");
        assert_eq!(configs[0].label(), "builtin");
        assert_eq!(configs[0].model_name(), "builtin");
        assert_eq!(configs[1].max_tokens, settings.max_tokens);
    }

    #[test]
    fn a_fallback_key_comes_from_the_variable_it_names() {
        let settings = crate::config::Settings::default().llm;
        let env = |var: &str| match var {
            "LOCAL_KEY" => Some("sk-local".to_owned()),
            "BLANK_KEY" => Some(" ".to_owned()),
            _ => None,
        };
        let with = |var: Option<&str>, number| {
            ProviderConfig::fallback_with_env(&settings, &fallback(var), number, env)
        };
        assert_eq!(
            with(Some("LOCAL_KEY"), 1)
                .unwrap()
                .api_key
                .as_ref()
                .map(secrecy::ExposeSecret::expose_secret),
            Some("sk-local")
        );
        assert!(with(None, 1).unwrap().api_key.is_none());
        for var in ["BLANK_KEY", "NEVER_SET"] {
            let err = with(Some(var), 2).unwrap_err().to_string();
            assert!(err.contains("[[llm.fallback]] #2 api_key_env"), "{err}");
            assert!(err.contains(var), "{err}");
        }
    }
}
