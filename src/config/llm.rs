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
    /// Replaced by `SUMMARYD_API_MAX_TEXT_CHARS` (texts longer than a model's context are
    /// summarised in parts); still accepted so configurations stay valid, and has no effect.
    pub max_input_chars: usize,
    /// The model's context window in tokens: a prompt that does not fit is summarised in
    /// parts that do.
    pub context_tokens: u32,
    /// Parts of one job summarised at once.
    pub parallel_parts: usize,
    /// Most model calls one job may need (parts and combinations); a text that would need
    /// more is refused at intake (413).
    pub max_parts: usize,
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
    /// The provider's requests per minute, for every process together (`SUMMARYD_LLM_RPM`):
    /// each call waits for its slot in the shared limiter (`llm/shared.rs`); none = no limit.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// The provider's tokens per minute, for every process together (`SUMMARYD_LLM_TPM`):
    /// each call reserves its estimated prompt plus `max_tokens`; none = no limit.
    #[serde(default)]
    pub tpm: Option<u32>,
    /// What this provider charges per million prompt tokens (any currency, the same for
    /// every provider), so `summaryd usage` and the console show money; none = tokens only.
    #[serde(default)]
    pub price_per_mtok_input: Option<f64>,
    /// Per million completion tokens, as `price_per_mtok_input`.
    #[serde(default)]
    pub price_per_mtok_output: Option<f64>,
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
    /// This provider's context window in tokens; defaults to `[llm] context_tokens`.
    #[serde(default)]
    pub context_tokens: Option<u32>,
    /// This provider's requests per minute, shared by every process; none = no limit.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// This provider's tokens per minute, shared by every process; none = no limit.
    #[serde(default)]
    pub tpm: Option<u32>,
    /// This provider's prices, as `[llm]`'s (not inherited: another provider, another price).
    #[serde(default)]
    pub price_per_mtok_input: Option<f64>,
    #[serde(default)]
    pub price_per_mtok_output: Option<f64>,
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
            max_input_chars: 100_000,
            // What current hosted models take at least; a local server is often smaller
            // and says so with `context_tokens` in its `[[llm.fallback]]` table.
            context_tokens: 32_768,
            // Four calls at once finish a long job about four times sooner, while one
            // job holds no more than four of a provider's concurrent requests.
            parallel_parts: 4,
            // 256 calls: a 1,000,000-character text on a 4,096-token model, with room.
            max_parts: 256,
            // A few paragraphs: what a summary for the account team needs.
            max_tokens: 512,
            // Five failures in a row is past what one flaky call or a short blip makes,
            // and early enough that an outage costs only the deliveries in hand.
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(30),
            fallback: Vec::new(),
            // The provider's own limits are the operator's to state: unknown, none.
            rpm: None,
            tpm: None,
            price_per_mtok_input: None,
            price_per_mtok_output: None,
        }
    }
}

/// The smallest context a provider may be configured with: room for the instructions
/// (about 200 tokens), the answer (`max_tokens`) and, to combine, the summaries of at least
/// two parts (each up to `max_tokens`), so every combination step shrinks the job.
pub(crate) fn min_context_tokens(max_tokens: u32) -> u32 {
    max_tokens.saturating_mul(4).saturating_add(512)
}

impl LlmSettings {
    /// The prices of the provider whose configured model is `model`, as summaries store it
    /// (`builtin` for the built-in summariser): per million prompt and completion tokens,
    /// a price left out as 0. `None` when that provider has no price, or no provider has
    /// that model; the first provider with the model decides.
    pub fn prices_of(&self, model: &str) -> Option<(f64, f64)> {
        let name = |provider: LlmProvider, model: &str| match provider {
            LlmProvider::Builtin => "builtin".to_owned(),
            LlmProvider::Openai => model.to_owned(),
        };
        let primary = (
            name(self.provider, &self.model),
            self.price_per_mtok_input,
            self.price_per_mtok_output,
        );
        let fallbacks = self.fallback.iter().map(|f| {
            (
                name(f.provider, &f.model),
                f.price_per_mtok_input,
                f.price_per_mtok_output,
            )
        });
        std::iter::once(primary)
            .chain(fallbacks)
            .find(|(name, _, _)| name == model)
            .and_then(|(_, input, output)| match (input, output) {
                (None, None) => None,
                (i, o) => Some((i.unwrap_or(0.0), o.unwrap_or(0.0))),
            })
    }

    /// What `prompt` and `completion` tokens of `model` cost at its provider's prices.
    pub fn cost_of(&self, model: &str, prompt: i64, completion: i64) -> Option<f64> {
        self.prices_of(model).map(|(input, output)| {
            (prompt.max(0) as f64 * input + completion.max(0) as f64 * output) / 1e6
        })
    }

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
        if self.parallel_parts == 0 {
            return Err(invalid("SUMMARYD_LLM_PARALLEL_PARTS", "must be at least 1"));
        }
        if self.max_parts == 0 {
            return Err(invalid("SUMMARYD_LLM_MAX_PARTS", "must be at least 1"));
        }
        let need = min_context_tokens(self.max_tokens);
        if self.context_tokens < need {
            return Err(invalid(
                "SUMMARYD_LLM_CONTEXT_TOKENS",
                &format!(
                    "must be at least {need} with SUMMARYD_LLM_MAX_TOKENS = {}: the prompt, the answer and the summaries of two parts must fit",
                    self.max_tokens
                ),
            ));
        }
        for (i, fallback) in self.fallback.iter().enumerate() {
            if fallback.context_tokens.is_some_and(|c| c < need) {
                return Err(invalid(
                    &format!("[[llm.fallback]] #{} context_tokens", i + 1),
                    &format!(
                        "must be at least {need} with SUMMARYD_LLM_MAX_TOKENS = {}: the prompt, the answer and the summaries of two parts must fit",
                        self.max_tokens
                    ),
                ));
            }
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
        let limits = [
            ("SUMMARYD_LLM_RPM".to_owned(), self.rpm),
            ("SUMMARYD_LLM_TPM".to_owned(), self.tpm),
        ];
        let fallback_limits = self.fallback.iter().enumerate().flat_map(|(i, f)| {
            [
                (format!("[[llm.fallback]] #{} rpm", i + 1), f.rpm),
                (format!("[[llm.fallback]] #{} tpm", i + 1), f.tpm),
            ]
        });
        for (setting, limit) in limits.into_iter().chain(fallback_limits) {
            if limit == Some(0) {
                return Err(invalid(
                    &setting,
                    "must be positive (leave it out for no limit)",
                ));
            }
        }
        let price = |setting: &str, value: Option<f64>| match value {
            Some(p) if !p.is_finite() || p < 0.0 => Err(invalid(
                setting,
                "must be a non-negative finite number (remove it for no price)",
            )),
            _ => Ok(()),
        };
        price(
            "SUMMARYD_LLM_PRICE_PER_MTOK_INPUT",
            self.price_per_mtok_input,
        )?;
        price(
            "SUMMARYD_LLM_PRICE_PER_MTOK_OUTPUT",
            self.price_per_mtok_output,
        )?;
        for (i, fallback) in self.fallback.iter().enumerate() {
            price(
                &format!("[[llm.fallback]] #{} price_per_mtok_input", i + 1),
                fallback.price_per_mtok_input,
            )?;
            price(
                &format!("[[llm.fallback]] #{} price_per_mtok_output", i + 1),
                fallback.price_per_mtok_output,
            )?;
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
    fn provider_limits_load_from_the_file_and_the_environment() {
        let s = load(
            "[llm]\nrpm = 500\n[[llm.fallback]]\nprovider = \"builtin\"\nrpm = 60\ntpm = 90000\n",
            &[("SUMMARYD_LLM_TPM", "200000")],
        )
        .unwrap();
        assert_eq!((s.llm.rpm, s.llm.tpm), (Some(500), Some(200_000)));
        assert_eq!(
            (s.llm.fallback[0].rpm, s.llm.fallback[0].tpm),
            (Some(60), Some(90_000))
        );
        let mut zero = s.llm.clone();
        zero.fallback[0].tpm = Some(0);
        assert!(refusal(&zero).contains("[[llm.fallback]] #1 tpm"));
        let none = load("", &[]).unwrap();
        assert_eq!((none.llm.rpm, none.llm.tpm), (None, None));
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
        let llm = LlmSettings {
            rpm: Some(0),
            ..LlmSettings::default()
        };
        assert!(refusal(&llm).contains("SUMMARYD_LLM_RPM"));
        let llm = LlmSettings {
            rpm: Some(60),
            tpm: Some(0),
            ..LlmSettings::default()
        };
        assert!(refusal(&llm).contains("SUMMARYD_LLM_TPM"));
        let mut llm = LlmSettings::default();
        llm.backoff = llm.max_backoff;
        assert!(llm.check().is_ok(), "a backoff at its cap");
        llm.backoff = llm.max_backoff + Duration::from_millis(1);
        assert!(refusal(&llm).contains("SUMMARYD_LLM_BACKOFF_MS"));
    }

    #[test]
    fn prices_are_optional_non_negative_finite_numbers_from_the_file_or_the_environment() {
        let s = load(
            "[llm]\nprice_per_mtok_input = 0.4\n\n[[llm.fallback]]\nprovider = \"builtin\"\nprice_per_mtok_output = 0\n",
            &[("SUMMARYD_LLM_PRICE_PER_MTOK_OUTPUT", "1.6")],
        )
        .unwrap();
        assert_eq!(s.llm.price_per_mtok_input, Some(0.4));
        assert_eq!(s.llm.price_per_mtok_output, Some(1.6));
        assert_eq!(s.llm.fallback[0].price_per_mtok_output, Some(0.0));
        assert_eq!(s.llm.fallback[0].price_per_mtok_input, None);
        assert_eq!(LlmSettings::default().price_per_mtok_input, None);
        let rows: [(&str, Adjust); 4] = [
            ("SUMMARYD_LLM_PRICE_PER_MTOK_INPUT", |s| {
                s.price_per_mtok_input = Some(-0.1)
            }),
            ("SUMMARYD_LLM_PRICE_PER_MTOK_OUTPUT", |s| {
                s.price_per_mtok_output = Some(f64::NAN)
            }),
            ("SUMMARYD_LLM_PRICE_PER_MTOK_INPUT", |s| {
                s.price_per_mtok_input = Some(f64::INFINITY)
            }),
            ("[[llm.fallback]] #1 price_per_mtok_output", |s| {
                s.fallback.push(FallbackSettings {
                    provider: LlmProvider::Builtin,
                    base_url: String::new().into(),
                    model: String::new(),
                    api_key_env: None,
                    call_timeout: None,
                    context_tokens: None,
                    price_per_mtok_input: None,
                    price_per_mtok_output: Some(-1.0),
                    rpm: None,
                    tpm: None,
                })
            }),
        ];
        for (setting, adjust) in rows {
            let mut llm = LlmSettings::default();
            adjust(&mut llm);
            assert!(
                refusal(&llm).contains(setting),
                "{setting}: {}",
                refusal(&llm)
            );
        }
    }

    #[test]
    fn money_is_matched_by_the_model_summaries_store() {
        let mut llm = LlmSettings {
            provider: LlmProvider::Openai,
            model: "gpt-4.1-mini".into(),
            price_per_mtok_input: Some(0.4),
            price_per_mtok_output: Some(1.6),
            ..LlmSettings::default()
        };
        llm.fallback.push(FallbackSettings {
            provider: LlmProvider::Builtin,
            base_url: String::new().into(),
            model: String::new(),
            api_key_env: None,
            call_timeout: None,
            context_tokens: None,
            price_per_mtok_input: None,
            price_per_mtok_output: Some(0.0),
            rpm: None,
            tpm: None,
        });
        let rows = [
            // (model, prompt, completion, cost)
            ("gpt-4.1-mini", 1_000_000, 500_000, Some(0.4 + 0.8)),
            ("gpt-4.1-mini", 0, 0, Some(0.0)),
            ("builtin", 5_000, 5_000, Some(0.0)),
            ("llama", 1_000, 1_000, None),
            ("unknown", 1_000, 1_000, None),
        ];
        for (model, prompt, completion, cost) in rows {
            let got = llm.cost_of(model, prompt, completion);
            match (got, cost) {
                (Some(g), Some(c)) => assert!((g - c).abs() < 1e-9, "{model}: {g} vs {c}"),
                (g, c) => assert_eq!(g, c, "{model}"),
            }
        }
        assert_eq!(LlmSettings::default().prices_of("builtin"), None);
    }
}
