//! Email through a JSON HTTP API (`SUMMARYD_MAIL_HTTP_URL`).
//!
//! `POST {"from","to","subject","text"}` with `Idempotency-Key: <dedupe_key>`: a resend of
//! the same outbox row carries the same key, so a provider that honours it sends one email.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::ExposeSecret;

use super::{MailConfigError, MailError, Mailer, OutgoingEmail};
use crate::config::MailSettings;
use crate::infra::redact;

/// TCP + TLS to an email API takes well under a second; 5 s means it is down, and the row
/// is retried after its backoff rather than holding its lease.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Error bodies are read only for the excerpt; more than this is never useful.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

pub struct HttpMailer {
    http: reqwest::Client,
    url: reqwest::Url,
    /// The URL's password and credential parameters, scrubbed from every error body in
    /// case the API echoes the request.
    credentials: Vec<String>,
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
            .map_err(|e| MailConfigError::Client(e.without_url()))?;
        let credentials = redact::credentials(url.as_str());
        Ok(Self {
            http,
            url,
            credentials,
        })
    }

    /// An error body as operators may read it: an excerpt, without our credentials or
    /// anything shaped like a key.
    fn scrubbed(&self, body: &str) -> String {
        let excerpt = crate::infra::http_client::excerpt(body);
        let mut text = redact::secrets(&excerpt, None);
        for credential in &self.credentials {
            text = redact::secrets(&text, Some(credential));
        }
        text
    }
}

#[async_trait]
impl Mailer for HttpMailer {
    async fn attempt(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        let response = self
            .http
            .post(self.url.clone())
            .header("Idempotency-Key", dedupe_key)
            .json(email)
            .send()
            .await
            .map_err(|e| MailError::Unreachable(e.without_url()))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        Err(MailError::Status {
            status: status.as_u16(),
            message: self.scrubbed(&error_body(response).await),
        })
    }
}

/// The start of an error body; a body that breaks off is quoted as far as it came.
async fn error_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_quoted_without_the_urls_credentials() {
        let mut settings = crate::config::Settings::default().mail;
        settings.http_url = Some("https://mail.example/send?token=tk-0123456789&to=x".into());
        let mailer = HttpMailer::new(&settings).unwrap();
        assert_eq!(
            mailer.scrubbed("bad  token tk-0123456789\n for key-abcdef"),
            "bad token <redacted> for <redacted>"
        );
        assert_eq!(mailer.scrubbed(""), "(empty body)");
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
