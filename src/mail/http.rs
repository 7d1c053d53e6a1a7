//! Email through a JSON HTTP API (`SUMMARYD_MAIL_HTTP_URL`).
//!
//! `POST {"from","to","subject","text"}` with `Idempotency-Key: <dedupe_key>`: a resend of
//! the same outbox row carries the same key, so a provider that honours it sends one email.

use crate::infra::http_client::describe;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use secrecy::ExposeSecret;

use super::{MailConfigError, Mailer, OutgoingEmail};
use crate::config::MailSettings;
use crate::resilience::failure::{Disposition, Failure};

/// TCP + TLS to an email API takes well under a second; 5 s means it is down, and the row
/// is retried after its backoff rather than holding its lease.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The 4xx statuses a later send can fix (timeout, rate limit, and 409: an email API answers
/// it to a resend whose idempotency key it is still processing, and the next attempt gets
/// that send's outcome); every 5xx too. Any other 4xx is the request's fault (the table in
/// docs/providers.md).
const TRANSIENT_4XX: [u16; 3] = [408, 409, 429];
/// Error bodies are read only for the excerpt; more than this is never useful.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

pub struct HttpMailer {
    http: reqwest::Client,
    url: reqwest::Url,
}

impl fmt::Debug for HttpMailer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only scheme, host and port: the path or query may carry an API token.
        let origin = self.url.origin().ascii_serialization();
        f.debug_struct("HttpMailer").field("url", &origin).finish()
    }
}

impl HttpMailer {
    /// Validates `mail.http_url` and builds the client. No network I/O.
    pub fn new(settings: &MailSettings) -> Result<Self, MailConfigError> {
        let invalid = |reason: String| MailConfigError::Invalid {
            setting: "SUMMARYD_MAIL_HTTP_URL",
            reason,
        };
        let raw = settings
            .http_url
            .as_ref()
            .map(|url| url.expose_secret().trim())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| invalid("required when SUMMARYD_MAIL_PROVIDER=http".into()))?;
        let url = reqwest::Url::parse(raw).map_err(|e| invalid(format!("not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "scheme must be http or https, not {:?}",
                url.scheme()
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // SUMMARYD_MAIL_TIMEOUT_MS is the wall-clock cap per send: reqwest's total timeout
            // covers connect, headers and body, so a provider that stalls cannot hold a row.
            .timeout(settings.timeout)
            .user_agent(concat!("summaryd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| MailConfigError::Client(describe(e)))?;
        Ok(Self { http, url })
    }
}

#[async_trait]
impl Mailer for HttpMailer {
    async fn send(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), Failure> {
        let response = self
            .http
            .post(self.url.clone())
            .header("Idempotency-Key", dedupe_key)
            .json(email)
            .send()
            .await
            .map_err(|e| Failure::Transient(format!("mail API unreachable: {}", describe(e))))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let message = format!(
            "mail API answered {}: {}",
            status.as_u16(),
            excerpt(response).await
        );
        Err(Failure::new(classify(status), message))
    }
}

fn classify(status: StatusCode) -> Disposition {
    Disposition::of_http_status(status.as_u16(), &TRANSIENT_4XX, None)
}

async fn excerpt(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            break;
        }
    }
    crate::infra::http_client::excerpt(&String::from_utf8_lossy(&body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_statuses_like_the_contract() {
        for s in [408, 409, 429, 500, 502, 503, 504] {
            assert!(
                classify(StatusCode::from_u16(s).unwrap()).is_transient(),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 413, 422] {
            assert!(
                !classify(StatusCode::from_u16(s).unwrap()).is_transient(),
                "{s}"
            );
        }
    }

    #[test]
    fn bad_urls_name_the_setting() {
        let mut settings = crate::config::Settings::default().mail;
        for bad in [None, Some(""), Some("nope"), Some("ftp://x/y")] {
            settings.http_url = bad.map(secrecy::SecretString::from);
            let err = HttpMailer::new(&settings).unwrap_err().to_string();
            assert!(err.contains("SUMMARYD_MAIL_HTTP_URL"), "{bad:?}: {err}");
        }
    }
}
