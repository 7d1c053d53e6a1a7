//! Client for any OpenAI-compatible `/chat/completions` endpoint (OpenAI, vLLM, llama.cpp
//! server, Ollama, LiteLLM, ...).
//!
//! One HTTP request per call and no retries: `crate::llm::retry` owns the wall-clock cap per call
//! and backoff, [`LlmError`] its classification. This module only turns what happened into
//! an [`LlmError`].

use crate::infra::http_client::{describe, excerpt};
use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::prompts::Prompt;
use super::{Completion, Llm, LlmConfigError, LlmError, ProviderConfig};
use crate::domain::TokenUsage;
use crate::infra::retry_after;

/// The text of a breaker probe: a request like a job's, as small as one can be.
pub const PROBE_TEXT: &str = "ping";
/// A probe asks for one token: it only has to prove the provider answers, and costs
/// nothing worth counting.
const PROBE_MAX_TOKENS: u32 = 1;

/// Reaching a healthy API (TCP + TLS) takes well under a second; a host that has not
/// answered in 5 s is down, and failing as `Connect` lets the retry module move on while
/// the per-call budget still has room for another attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A summary response is a few KiB. The cap stops a broken or hostile server from filling
/// memory before the per-call timeout fires.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// The API key. Its `Debug` never shows the value.
#[derive(Clone)]
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

pub struct OpenAiClient {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    model: String,
    api_key: Option<ApiKey>,
    max_tokens: u32,
}

impl fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiClient")
            .field(
                "endpoint",
                &crate::infra::redact::url(self.endpoint.as_str()),
            )
            .field("model", &self.model)
            .field("api_key", &self.api_key)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// The messages of a request (`llm::prompts`): the instructions, then the data. Whoever
/// submits a text chooses what the recipient reads only as far as a faithful summary of
/// it goes.
fn messages(prompt: &Prompt) -> Value {
    json!([
        {"role": "system", "content": prompt.kind().system()},
        {"role": "user", "content": prompt.user_message()},
    ])
}

impl OpenAiClient {
    /// Validates `base_url` (http or https) and builds the HTTP client. No network I/O.
    pub fn new(settings: &ProviderConfig) -> Result<Self, LlmConfigError> {
        let endpoint = endpoint(settings.base_url.expose_secret(), &settings.setting)?;
        if settings.model.trim().is_empty() {
            return Err(LlmConfigError::Invalid {
                setting: setting_name(&settings.setting, "model"),
                reason: "must not be empty".into(),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // Backstop only: the retry module's tokio timeout (never longer than this) is
            // what normally cuts a call; this covers callers that forget to wrap.
            .timeout(settings.call_timeout)
            .user_agent(concat!("summaryd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmConfigError::Client(e.without_url()))?;
        let api_key = settings
            .api_key
            .as_ref()
            .map(|key| key.expose_secret().trim())
            .filter(|k| !k.is_empty())
            .map(|k| ApiKey(k.to_owned()));
        Ok(Self {
            http,
            endpoint,
            model: settings.model.clone(),
            api_key,
            max_tokens: settings.max_tokens,
        })
    }

    /// Whether requests carry `Authorization` (local servers often need none).
    pub(crate) fn has_api_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// One request; the summary and the usage it reported, or what went wrong. A probe
    /// (`max_tokens` = 1) takes any 2xx as a pass: a one-token answer need not be a summary.
    async fn call(&self, prompt: &Prompt, max_tokens: u32) -> Result<Completion, LlmError> {
        let body = json!({
            "model": self.model,
            "messages": messages(prompt),
            "max_tokens": max_tokens,
        });
        let mut request = self.http.post(self.endpoint.clone()).json(&body);
        if let Some(key) = &self.api_key {
            // bearer_auth marks the header sensitive, so hyper never prints it.
            request = request.bearer_auth(&key.0);
        }
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        if status.is_success() {
            let (body, complete) = read_capped(response).await.map_err(transport_error)?;
            if !complete {
                return Err(LlmError::Malformed(format!(
                    "response body is larger than {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            if max_tokens == PROBE_MAX_TOKENS {
                return Ok(Completion {
                    summary: String::new(),
                    usage: parse_usage(&body),
                });
            }
            return Ok(Completion {
                summary: parse_summary(&body)?,
                usage: parse_usage(&body),
            });
        }
        let retry_after = retry_after::from_headers(response.headers(), SystemTime::now());
        // The status is what classifies the failure; an unreadable error body must not turn
        // a 400 into a retryable connection error.
        let (message, exceeded) = match read_capped(response).await {
            Ok((body, _)) => (error_excerpt(&body), says_context_exceeded(&body)),
            Err(e) => (format!("(error body unreadable: {})", describe(e)), false),
        };
        if exceeded && CONTEXT_STATUSES.contains(&status.as_u16()) {
            return Err(LlmError::ContextExceeded(message));
        }
        Err(LlmError::Status {
            status: status.as_u16(),
            retry_after,
            message,
        })
    }

    /// Some APIs echo the key, or a masked part of it, in auth errors; make sure no message
    /// carries any of it (these messages reach logs and dead-letter reasons).
    fn redact(&self, err: LlmError) -> LlmError {
        let key = self.api_key.as_ref().map(|k| k.0.as_str());
        let scrub = |s: String| crate::infra::redact::secrets(&s, key);
        match err {
            LlmError::Connect(m) => LlmError::Connect(scrub(m)),
            LlmError::Status {
                status,
                retry_after,
                message,
            } => LlmError::Status {
                status,
                retry_after,
                message: scrub(message),
            },
            LlmError::Malformed(m) => LlmError::Malformed(scrub(m)),
            LlmError::InvalidInput(m) => LlmError::InvalidInput(scrub(m)),
            LlmError::Other(m) => LlmError::Other(scrub(m)),
            LlmError::ContextExceeded(m) => LlmError::ContextExceeded(scrub(m)),
            LlmError::Timeout => LlmError::Timeout,
        }
    }
}

#[async_trait]
impl Llm for OpenAiClient {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        self.complete(&Prompt::Document(text.to_owned())).await
    }

    async fn complete(&self, prompt: &Prompt) -> Result<Completion, LlmError> {
        self.logged(self.call(prompt, self.max_tokens).await)
    }

    async fn probe(&self) -> Result<Option<TokenUsage>, LlmError> {
        let probe = Prompt::Document(PROBE_TEXT.to_owned());
        self.logged(self.call(&probe, PROBE_MAX_TOKENS).await)
            .map(|c| c.usage)
    }
}

impl OpenAiClient {
    fn logged(&self, result: Result<Completion, LlmError>) -> Result<Completion, LlmError> {
        let result = result.map_err(|e| self.redact(e));
        if let Err(e) = &result {
            // The endpoint may carry a password (a proxy's); never log it whole.
            let endpoint = crate::infra::redact::url(self.endpoint.as_str());
            tracing::debug!(%endpoint, model = %self.model, error = %e, "model call failed");
        }
        result
    }
}

/// The setting a provider's `key` comes from: `SUMMARYD_LLM_BASE_URL` for `[llm]`,
/// `[[llm.fallback]] #2 base_url` for a fallback.
fn setting_name(provider_setting: &str, key: &str) -> String {
    if provider_setting.starts_with("SUMMARYD_") {
        format!("{provider_setting}_{}", key.to_ascii_uppercase())
    } else {
        format!("{provider_setting} {key}")
    }
}

fn endpoint(base_url: &str, provider_setting: &str) -> Result<reqwest::Url, LlmConfigError> {
    let invalid = |reason: String| LlmConfigError::Invalid {
        setting: setting_name(provider_setting, "base_url"),
        reason,
    };
    let base = base_url.trim().trim_end_matches('/');
    if base.is_empty() {
        return Err(invalid("required for the openai provider".into()));
    }
    let url = reqwest::Url::parse(&format!("{base}/chat/completions"))
        .map_err(|e| invalid(format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme must be http or https, not {:?}",
            url.scheme()
        )));
    }
    Ok(url)
}

/// Timeouts stay `Timeout`; refused, reset or half-read connections are `Connect`. Both retry.
fn transport_error(err: reqwest::Error) -> LlmError {
    if err.is_timeout() {
        LlmError::Timeout
    } else if err.is_builder() {
        LlmError::Other(describe(err))
    } else {
        LlmError::Connect(describe(err))
    }
}

/// Read up to `MAX_RESPONSE_BYTES`; `complete` is false when the body was longer.
async fn read_capped(mut response: reqwest::Response) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

/// `error.message` of an OpenAI-style error body, else the body text; whitespace collapsed
/// and cut to `http_client::ERROR_EXCERPT_CHARS`.
fn error_excerpt(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let from_json = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let text = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    excerpt(&text)
}

/// The statuses a "context length exceeded" answer comes with: OpenAI and vLLM answer
/// 400, llama.cpp 400 or (in some versions) 500, proxies 413 or 422.
const CONTEXT_STATUSES: [u16; 4] = [400, 413, 422, 500];

/// How providers say a prompt is longer than the model's context: OpenAI's error code,
/// llama.cpp's error type and wordings, vLLM's and Ollama's wordings.
const CONTEXT_EXCEEDED: [&str; 7] = [
    "context_length_exceeded",
    "exceed_context_size_error",
    "exceeds the available context size",
    "context size has been exceeded",
    "maximum context length",
    "exceeds the context length",
    "input length exceeds",
];

/// Whether an error body says the prompt did not fit the model's context.
fn says_context_exceeded(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_lowercase();
    CONTEXT_EXCEEDED.iter().any(|phrase| text.contains(phrase))
}

/// `usage.prompt_tokens` and `usage.completion_tokens`, when the response has both (some
/// local servers send no usage; then the job's cost is unknown, not zero).
fn parse_usage(body: &[u8]) -> Option<TokenUsage> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let count = |name: &str| {
        value
            .pointer(&format!("/usage/{name}"))
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    Some(TokenUsage {
        prompt: count("prompt_tokens")?,
        completion: count("completion_tokens")?,
    })
}

/// `choices[0].message.content`, or `Malformed` saying exactly what is missing.
fn parse_summary(body: &[u8]) -> Result<String, LlmError> {
    let malformed = |what: String| LlmError::Malformed(what);
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| malformed(format!("response body is not JSON ({e})")))?;
    let choices = value
        .get("choices")
        .ok_or_else(|| malformed("response has no `choices`".into()))?
        .as_array()
        .ok_or_else(|| malformed("`choices` is not an array".into()))?;
    let first = choices
        .first()
        .ok_or_else(|| malformed("`choices` is empty".into()))?;
    // finish_reason explains most empty answers ("length", "content_filter").
    let reason = first
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(|r| format!(" (finish_reason: {r})"))
        .unwrap_or_default();
    match first.pointer("/message/content") {
        None | Some(Value::Null) => Err(malformed(format!(
            "`choices[0].message.content` is missing{reason}"
        ))),
        Some(Value::String(s)) if s.trim().is_empty() => Err(malformed(format!(
            "`choices[0].message.content` is empty{reason}"
        ))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(malformed(
            "`choices[0].message.content` is not a string".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_providers_context_answer_is_recognised() {
        for body in [
            r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":14429,"n_ctx":8192}}"#,
            r#"{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}"#,
            r#"{"error":{"message":"the input length exceeds the context length","type":"api_error"}}"#,
        ] {
            assert!(says_context_exceeded(body.as_bytes()), "{body}");
        }
        for body in [
            r#"{"error":{"message":"Invalid value for 'model'","code":"model_not_found"}}"#,
            "internal error",
            "",
        ] {
            assert!(!says_context_exceeded(body.as_bytes()), "{body}");
        }
    }

    #[test]
    fn endpoint_appends_path_once_and_names_the_setting() {
        let url = endpoint("http://127.0.0.1:8000/v1/", "SUMMARYD_LLM").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:8000/v1/chat/completions");
        for bad in ["", "not a url", "ftp://host/v1"] {
            let err = endpoint(bad, "SUMMARYD_LLM").unwrap_err().to_string();
            assert!(err.contains("SUMMARYD_LLM_BASE_URL"), "{bad}: {err}");
            let err = endpoint(bad, "[[llm.fallback]] #2")
                .unwrap_err()
                .to_string();
            assert!(err.contains("[[llm.fallback]] #2 base_url"), "{bad}: {err}");
        }
    }

    #[test]
    fn usage_needs_both_counts() {
        let body = br#"{"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
        assert_eq!(
            parse_usage(body),
            Some(TokenUsage {
                prompt: 12,
                completion: 3
            })
        );
        for body in [
            &br#"{}"#[..],
            br#"{"usage":{"prompt_tokens":12}}"#,
            br#"{"usage":{"prompt_tokens":-1,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":"12","completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":5000000000,"completion_tokens":3}}"#,
            b"not json",
        ] {
            assert_eq!(parse_usage(body), None, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn error_excerpt_prefers_the_api_message_and_is_short() {
        let body = br#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
        assert_eq!(error_excerpt(body), "Rate limit reached");
        let long = "x".repeat(1000);
        let excerpt = error_excerpt(long.as_bytes());
        assert_eq!(
            excerpt.chars().count(),
            crate::infra::http_client::ERROR_EXCERPT_CHARS + 1
        );
        assert_eq!(error_excerpt(b"  "), "(empty body)");
    }

    #[test]
    fn parse_summary_names_what_is_wrong() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":"Short."}}]}"#;
        assert_eq!(parse_summary(ok).unwrap(), "Short.");
        let cases: [(&[u8], &str); 6] = [
            (b"<html>", "not JSON"),
            (b"{}", "no `choices`"),
            (br#"{"choices":{}}"#, "not an array"),
            (br#"{"choices":[]}"#, "`choices` is empty"),
            (
                br#"{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}"#,
                "missing (finish_reason: content_filter)",
            ),
            (
                br#"{"choices":[{"message":{"content":" "}}]}"#,
                "content` is empty",
            ),
        ];
        for (body, expected) in cases {
            match parse_summary(body) {
                Err(LlmError::Malformed(m)) => assert!(m.contains(expected), "{m}"),
                other => panic!("{expected}: {other:?}"),
            }
        }
    }
}
