//! `[llm]` and its `[[llm.fallback]]` tables: the model providers and how they are called
//! (`SUMMARYD_LLM_*`; fallbacks only in the file).

use std::time::Duration;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_with::{As, DurationMilliSeconds};

use super::{ConfigError, Millis, invalid, secret};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    Builtin,
    Openai,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSettings {
    pub provider: LlmProvider,
    /// A proxy in front of the API may take credentials in the URL.
    #[serde(serialize_with = "secret::expose")]
    pub base_url: SecretString,
    pub model: String,
    /// Falls back to `OPENAI_API_KEY`.
    #[serde(serialize_with = "secret::expose_optional")]
    pub api_key: Option<SecretString>,
    #[serde(rename = "call_timeout_ms", with = "Millis")]
    pub call_timeout: Duration,
    pub max_attempts: u32,
    #[serde(rename = "backoff_ms", with = "Millis")]
    pub backoff: Duration,
    #[serde(rename = "max_backoff_ms", with = "Millis")]
    pub max_backoff: Duration,
    /// Longest text (in characters) sent to the model. Longer input would overflow the
    /// model's context and fail the same way on every attempt, so it is refused up front
    /// (413 at the API, `InvalidInput` in the worker) instead of paying for doomed calls.
    pub max_input_chars: usize,
    /// Completion cap sent with every request (`max_tokens`), so one job's cost is bounded.
    pub max_tokens: u32,
    /// Consecutive transient failures of one provider that open its circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before its first probe; doubles while probes fail.
    #[serde(rename = "breaker_cooldown_ms", with = "Millis")]
    pub breaker_cooldown: Duration,
    /// Providers tried in order after this one (`[[llm.fallback]]`; only in the file).
    #[serde(default)]
    pub fallback: Vec<FallbackSettings>,
}

/// One `[[llm.fallback]]` table: a provider tried when the ones before it are unavailable.
/// Attempts, backoff, the input cap, `max_tokens` and the breaker settings are `[llm]`'s.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackSettings {
    pub provider: LlmProvider,
    #[serde(default, serialize_with = "secret::expose")]
    pub base_url: SecretString,
    #[serde(default)]
    pub model: String,
    /// The name of the environment variable holding this provider's API key (the key itself
    /// never sits in the file); none = requests carry no `Authorization`.
    pub api_key_env: Option<String>,
    /// Defaults to `[llm] call_timeout_ms`.
    #[serde(
        rename = "call_timeout_ms",
        default,
        with = "As::<Option<DurationMilliSeconds>>"
    )]
    pub call_timeout: Option<Duration>,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            provider: LlmProvider::Builtin,
            base_url: "https://api.openai.com/v1".into(),
            model: "gpt-4.1-mini".into(),
            api_key: None,
            call_timeout: Duration::from_secs(20),
            max_attempts: 4,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            // ~25k tokens of English: fits every current chat model's context with room
            // for the prompt and the answer.
            max_input_chars: 100_000,
            // A few paragraphs: what a summary for the account team needs.
            max_tokens: 512,
            // Five failures in a row is past what one flaky call or a short blip makes,
            // and early enough that an outage costs only the deliveries in hand.
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(30),
            fallback: Vec::new(),
        }
    }
}

impl LlmSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(invalid("SUMMARYD_LLM_MAX_ATTEMPTS", "must be at least 1"));
        }
        if self.call_timeout.is_zero() {
            return Err(invalid("SUMMARYD_LLM_CALL_TIMEOUT_MS", "must be positive"));
        }
        if self.max_input_chars == 0 {
            return Err(invalid(
                "SUMMARYD_LLM_MAX_INPUT_CHARS",
                "must be at least 1",
            ));
        }
        if self.max_tokens == 0 {
            return Err(invalid("SUMMARYD_LLM_MAX_TOKENS", "must be at least 1"));
        }
        if self.breaker_failures == 0 {
            return Err(invalid(
                "SUMMARYD_LLM_BREAKER_FAILURES",
                "must be at least 1",
            ));
        }
        if self.breaker_cooldown.is_zero() {
            return Err(invalid(
                "SUMMARYD_LLM_BREAKER_COOLDOWN_MS",
                "must be positive",
            ));
        }
        if self.backoff > self.max_backoff {
            return Err(invalid(
                "SUMMARYD_LLM_BACKOFF_MS",
                "must not exceed SUMMARYD_LLM_MAX_BACKOFF_MS",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::super::testing::load;
    use super::*;

    /// A change that breaks one setting.
    type Adjust = fn(&mut LlmSettings);

    fn refusal(llm: &LlmSettings) -> String {
        llm.check().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn durations_are_milliseconds_in_the_file_and_the_environment() {
        let s = load(
            "[llm]\ncall_timeout_ms = 1500\nbackoff_ms = 20\n\
             [[llm.fallback]]\nprovider = \"builtin\"\ncall_timeout_ms = 40000\n",
            &[
                ("SUMMARYD_LLM_MAX_BACKOFF_MS", "40"),
                ("SUMMARYD_LLM_BREAKER_COOLDOWN_MS", "30000"),
            ],
        )
        .unwrap();
        assert_eq!(s.llm.call_timeout, Duration::from_millis(1_500));
        assert_eq!(s.llm.backoff, Duration::from_millis(20));
        assert_eq!(s.llm.max_backoff, Duration::from_millis(40));
        assert_eq!(s.llm.breaker_cooldown, Duration::from_secs(30));
        assert_eq!(
            s.llm.fallback[0].call_timeout,
            Some(Duration::from_secs(40))
        );
    }

    #[test]
    fn the_key_and_url_are_secrets() {
        let s = load(
            "[llm]\nbase_url = \"https://user:url-pass@proxy/v1\"\n",
            &[("SUMMARYD_LLM_API_KEY", "sk-key")],
        )
        .unwrap();
        let shown = format!("{:?}", s.llm);
        assert!(
            !shown.contains("sk-key") && !shown.contains("url-pass"),
            "{shown}"
        );
        assert_eq!(
            s.llm.base_url.expose_secret(),
            "https://user:url-pass@proxy/v1"
        );
        assert_eq!(
            s.llm.api_key.as_ref().map(|k| k.expose_secret()),
            Some("sk-key")
        );
    }

    #[test]
    fn counts_and_waits_must_be_positive_and_backoff_within_its_cap() {
        assert!(LlmSettings::default().check().is_ok());
        let cases: [(&str, Adjust); 6] = [
            ("SUMMARYD_LLM_MAX_ATTEMPTS", |s| s.max_attempts = 0),
            ("SUMMARYD_LLM_CALL_TIMEOUT_MS", |s| {
                s.call_timeout = Duration::ZERO
            }),
            ("SUMMARYD_LLM_MAX_INPUT_CHARS", |s| s.max_input_chars = 0),
            ("SUMMARYD_LLM_MAX_TOKENS", |s| s.max_tokens = 0),
            ("SUMMARYD_LLM_BREAKER_FAILURES", |s| s.breaker_failures = 0),
            ("SUMMARYD_LLM_BREAKER_COOLDOWN_MS", |s| {
                s.breaker_cooldown = Duration::ZERO
            }),
        ];
        for (setting, adjust) in cases {
            let mut llm = LlmSettings::default();
            adjust(&mut llm);
            assert!(refusal(&llm).contains(setting), "{setting}");
        }
        let mut llm = LlmSettings::default();
        llm.backoff = llm.max_backoff;
        assert!(llm.check().is_ok(), "a backoff at its cap");
        llm.backoff = llm.max_backoff + Duration::from_millis(1);
        assert!(refusal(&llm).contains("SUMMARYD_LLM_BACKOFF_MS"));
    }
}
