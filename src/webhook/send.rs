//! One webhook request: signed, under a wall-clock cap, with no redirect followed, and
//! what the receiver's answer means for the row.

use std::time::{Duration, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue, USER_AGENT};
use reqwest::redirect::Policy;

use super::resolve::PublicOnly;
use crate::config::WebhookSettings;
use crate::domain::{
    NonPublicAddress, WebhookEvent, WebhookRules, WebhookSecrets, check_addresses,
};
use crate::infra::http_client::{describe, excerpt};
use crate::infra::retry_after;
use crate::infra::telemetry;
use crate::resilience::failure::{Classify, Disposition};

/// Names summaryd and its version, so a receiver's logs say who called.
const AGENT: &str = concat!("summaryd/", env!("CARGO_PKG_VERSION"), " (webhooks)");

/// The receiver took the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub status: u16,
}

/// Why an attempt did not deliver. The Display is the row's `last_error`: our words and a
/// short excerpt of the receiver's, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Nothing can sign it: the tenant has no `webhook_secrets` (or header mode no
    /// `SUMMARYD_WEBHOOK_SECRETS_FILE`) any more.
    #[error("no webhook secret is configured for tenant {tenant}; nothing can sign the event")]
    NoSecrets { tenant: String },
    /// The target breaks the rules now (it resolves to an internal address, or uses http
    /// where that is no longer allowed).
    #[error("target refused: {0}")]
    Target(String),
    #[error("no answer within {} ms (SUMMARYD_WEBHOOK_TIMEOUT_MS)", after.as_millis())]
    Timeout { after: Duration },
    #[error("request failed: {0}")]
    Connect(String),
    /// 410 Gone: the receiver asks never to be called again.
    #[error("HTTP 410 Gone: the receiver asks for no more events; the endpoint is disabled")]
    Gone,
    /// A redirect is never followed: it could lead anywhere, an internal address included.
    #[error("HTTP {status}: redirects are not followed; point the webhook at the final URL")]
    Redirect { status: u16 },
    #[error("HTTP {status}: {body}")]
    Status {
        status: u16,
        retry_after: Option<Duration>,
        body: String,
    },
}

impl WebhookError {
    /// The HTTP status the receiver answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            WebhookError::Gone => Some(410),
            WebhookError::Redirect { status } | WebhookError::Status { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }

    pub fn is_gone(&self) -> bool {
        matches!(self, WebhookError::Gone)
    }
}

impl Classify for WebhookError {
    /// Everything a receiver can answer is worth another attempt within the give-up
    /// horizon (it may be deploying, overloaded or misconfigured for a while); only what no
    /// attempt can change is permanent. 429/502/503/504 carry their `Retry-After`.
    fn disposition(&self) -> Disposition {
        match self {
            WebhookError::NoSecrets { .. } | WebhookError::Target(_) | WebhookError::Gone => {
                Disposition::Permanent
            }
            WebhookError::Status {
                status: 429 | 502 | 503 | 504,
                retry_after,
                ..
            } => Disposition::Transient {
                retry_after: *retry_after,
            },
            WebhookError::Timeout { .. }
            | WebhookError::Connect(_)
            | WebhookError::Redirect { .. }
            | WebhookError::Status { .. } => Disposition::TRANSIENT,
        }
    }
}

/// The relay's client for every webhook: one connection pool, the public-only resolver,
/// no redirects, no proxy (a proxy would resolve the name itself, past the check).
pub struct WebhookClient {
    http: reqwest::Client,
    rules: WebhookRules,
    timeout: Duration,
}

impl WebhookClient {
    pub fn new(settings: &WebhookSettings) -> Result<Self, reqwest::Error> {
        let rules = settings.rules();
        let http = reqwest::Client::builder()
            .dns_resolver(PublicOnly::shared(rules))
            .redirect(Policy::none())
            .no_proxy()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .build()?;
        Ok(Self {
            http,
            rules,
            timeout: settings.timeout,
        })
    }

    /// Post `event` once, signed by every secret in `secrets` (the first first), under the
    /// id `webhook_id`. The timestamp is this attempt's: receivers refuse old ones.
    pub async fn send(
        &self,
        event: &WebhookEvent,
        webhook_id: &str,
        secrets: &WebhookSecrets,
    ) -> Result<Delivered, WebhookError> {
        let url = &event.url;
        if url.url().scheme() == "http" && !self.rules.allow_http {
            return Err(WebhookError::Target(
                "plain http is not allowed (SUMMARYD_WEBHOOK_ALLOW_HTTP)".into(),
            ));
        }
        // An IP literal never reaches the resolver.
        if let Some(ip) = url.ip_literal() {
            check_addresses(&[ip], self.rules).map_err(|e| WebhookError::Target(e.to_string()))?;
        }
        let body = event.body_json();
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let signature = secrets.signature_header(webhook_id, timestamp, &body);
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(USER_AGENT, HeaderValue::from_static(AGENT));
        for (name, value) in [
            ("webhook-id", webhook_id.to_owned()),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", signature),
        ] {
            let value = HeaderValue::from_str(&value)
                .map_err(|e| WebhookError::Target(format!("{name}: {e}")))?;
            headers.insert(name, value);
        }
        // The relay's `send` span: the receiver can join the job's trace.
        if let Some(trace) = telemetry::current() {
            for (name, value) in telemetry::headers(&trace) {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(name, value);
                }
            }
        }
        let request = self
            .http
            .post(url.url().clone())
            .headers(headers)
            .body(body)
            .send();
        let response = match tokio::time::timeout(self.timeout, request).await {
            Err(_) => {
                return Err(WebhookError::Timeout {
                    after: self.timeout,
                });
            }
            Ok(Err(e)) => return Err(request_error(e, self.timeout)),
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(Delivered { status });
        }
        if status == 410 {
            return Err(WebhookError::Gone);
        }
        if response.status().is_redirection() {
            return Err(WebhookError::Redirect { status });
        }
        let retry_after = retry_after::from_headers(response.headers(), SystemTime::now());
        // The body only for the record; a receiver that trickles it is cut by the timeout.
        let text = tokio::time::timeout(self.timeout, response.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        Err(WebhookError::Status {
            status,
            retry_after,
            body: excerpt(&text),
        })
    }
}

/// A refusal by the resolver is the target's fault, not the network's.
fn request_error(e: reqwest::Error, timeout: Duration) -> WebhookError {
    if e.is_timeout() {
        return WebhookError::Timeout { after: timeout };
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<NonPublicAddress>() {
            return WebhookError::Target(refused.to_string());
        }
        source = cause.source();
    }
    WebhookError::Connect(describe(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_no_attempt_can_change_is_permanent() {
        let after = Some(Duration::from_secs(7));
        for status in [429, 502, 503, 504] {
            let e = WebhookError::Status {
                status,
                retry_after: after,
                body: String::new(),
            };
            assert_eq!(
                e.disposition(),
                Disposition::Transient { retry_after: after },
                "{status}"
            );
        }
        for status in [400, 401, 404, 500, 501] {
            let e = WebhookError::Status {
                status,
                retry_after: after,
                body: String::new(),
            };
            assert_eq!(e.disposition(), Disposition::TRANSIENT, "{status}");
            assert_eq!(e.status(), Some(status));
        }
        assert_eq!(
            WebhookError::Redirect { status: 302 }.disposition(),
            Disposition::TRANSIENT
        );
        assert_eq!(
            WebhookError::Timeout {
                after: Duration::from_secs(1)
            }
            .disposition(),
            Disposition::TRANSIENT
        );
        for permanent in [
            WebhookError::Gone,
            WebhookError::Target("x".into()),
            WebhookError::NoSecrets {
                tenant: "acme".into(),
            },
        ] {
            assert_eq!(permanent.disposition(), Disposition::Permanent);
        }
        assert!(WebhookError::Gone.is_gone());
        assert!(!WebhookError::Redirect { status: 301 }.is_gone());
        assert_eq!(WebhookError::Gone.status(), Some(410));
        assert_eq!(WebhookError::Connect("x".into()).status(), None);
    }
}
