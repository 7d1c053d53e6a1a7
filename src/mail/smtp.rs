//! Email over SMTP (`SUMMARYD_MAIL_SMTP_URL`, lettre URL syntax).
//!
//! SMTP has no idempotency key, so the outbox row's dedupe key becomes the `Message-ID`: a
//! resend after a crash between send and commit carries the same Message-ID, which lets
//! receiving systems (and people) recognise it as the same message.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use super::{MailConfigError, MailError, Mailer, OutgoingEmail};
use crate::config::{MailSettings, SmtpSecurity, smtp_url_has_credentials};

pub struct SmtpMailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    /// `host:port` for Debug and errors; never the credentials.
    server: String,
    /// Scrubbed from every error message, in case a server echoes it.
    password: Option<String>,
    /// SUMMARYD_MAIL_TIMEOUT_MS: wall-clock cap per send (lettre's own timeout is per socket
    /// operation, so a server that answers slowly line by line could exceed it many times over).
    timeout: Duration,
}

impl fmt::Debug for SmtpMailer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpMailer")
            .field("server", &self.server)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// `<sha256(dedupe_key)@domain>`: the same outbox row always yields the same Message-ID, and
/// hashing keeps it valid whatever characters the key holds.
pub fn message_id(dedupe_key: &str, domain: &str) -> String {
    let digest = hex::encode(Sha256::digest(dedupe_key.as_bytes()));
    format!("<{digest}@{domain}>")
}

impl SmtpMailer {
    /// Parses `mail.smtp_url` (no network I/O). Errors never include the URL, which may hold
    /// a password.
    pub fn new(settings: &MailSettings) -> Result<Self, MailConfigError> {
        let invalid = |reason: String| MailConfigError::Invalid {
            setting: "SUMMARYD_MAIL_SMTP_URL",
            reason,
        };
        let raw = settings
            .smtp_url
            .as_ref()
            .map(|url| url.expose_secret().trim())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| invalid("required when SUMMARYD_MAIL_PROVIDER=smtp".into()))?;
        let url = reqwest::Url::parse(raw).map_err(|e| invalid(format!("not a URL: {e}")))?;
        let password = url.password().map(str::to_owned);
        let scrub = |text: String| match &password {
            Some(p) if !p.is_empty() => text.replace(p.as_str(), "[redacted]"),
            _ => text,
        };
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(raw)
            .map_err(|e| invalid(scrub(e.to_string())))?
            // Per socket operation; the wall-clock cap is applied around the whole send.
            .timeout(Some(settings.timeout))
            .build();
        let host = url.host_str().unwrap_or_default();
        let server = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        // The settings check refused this URL unless SUMMARYD_MAIL_ALLOW_CLEARTEXT=1 said
        // the path is trusted; say so once at startup, since the password now goes in clear.
        let exposed = SmtpSecurity::of(&url).is_ok_and(|s| !s.protects_credentials());
        if exposed && smtp_url_has_credentials(&url) {
            tracing::warn!(
                server = %server,
                "SUMMARYD_MAIL_SMTP_URL sends its password without (guaranteed) TLS, as \
                 SUMMARYD_MAIL_ALLOW_CLEARTEXT=1 allows; use smtps:// or ?tls=required unless \
                 the path to the server is trusted"
            );
        }
        settings
            .from
            .parse::<Mailbox>()
            .map_err(|e| MailConfigError::Invalid {
                setting: "SUMMARYD_MAIL_FROM",
                reason: format!("not a valid address: {e}"),
            })?;
        Ok(Self {
            transport,
            server,
            password,
            timeout: settings.timeout,
        })
    }

    fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if !p.is_empty() => text.replace(p.as_str(), "[redacted]"),
            _ => text,
        }
    }
}

/// Build the RFC 5322 message; a bad address fails the same way every time, so it is permanent.
pub fn build_message(email: &OutgoingEmail, dedupe_key: &str) -> Result<Message, MailError> {
    let parse = |field: &'static str, value: &str| {
        value
            .parse::<Mailbox>()
            .map_err(|source| MailError::InvalidAddress {
                field,
                value: value.to_owned(),
                source,
            })
    };
    let from = parse("from", &email.from)?;
    let to = parse("to", &email.to)?;
    let domain = from.email.domain().to_owned();
    Message::builder()
        .from(from)
        .to(to)
        .subject(email.subject.as_str())
        .message_id(Some(message_id(dedupe_key, &domain)))
        .header(ContentType::TEXT_PLAIN)
        .body(email.text.clone())
        .map_err(MailError::Message)
}

#[async_trait]
impl Mailer for SmtpMailer {
    async fn attempt(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        let message = build_message(email, dedupe_key)?;
        match tokio::time::timeout(self.timeout, self.transport.send(message)).await {
            Err(_) => Err(MailError::SmtpTimeout {
                server: self.server.clone(),
                after: self.timeout,
            }),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.failed(&e)),
        }
    }
}

impl SmtpMailer {
    /// lettre's error as text, scrubbed: the server's reply is quoted in it, and lettre's
    /// error would carry it unscrubbed if it were kept as the source.
    fn failed(&self, err: &lettre::transport::smtp::Error) -> MailError {
        let server = self.server.clone();
        let message = self.scrub(err.to_string());
        match err.status() {
            Some(code) => MailError::SmtpReply {
                server,
                code: code.into(),
                message,
            },
            None => MailError::SmtpConnection { server, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> MailSettings {
        let mut s = crate::config::Settings::default().mail;
        s.smtp_url = Some(url.into());
        s
    }

    #[test]
    fn message_id_is_deterministic_and_well_formed() {
        let a = message_id("outbox:1", "example.com");
        assert_eq!(a, message_id("outbox:1", "example.com"));
        assert_ne!(a, message_id("outbox:2", "example.com"));
        assert!(a.starts_with('<') && a.ends_with("@example.com>"), "{a}");
        assert_eq!(a.len(), 1 + 64 + "@example.com>".len());
    }

    #[test]
    fn bad_addresses_are_permanent() {
        let email = OutgoingEmail {
            from: "summaryd@example.com".into(),
            to: "not an address".into(),
            subject: "s".into(),
            text: "t".into(),
        };
        assert!(matches!(
            build_message(&email, "k"),
            Err(MailError::InvalidAddress { field: "to", .. })
        ));
    }

    #[test]
    fn config_errors_name_the_setting_and_hide_the_password() {
        let err = SmtpMailer::new(&settings("bogus://user:hunter2@host:25"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("SUMMARYD_MAIL_SMTP_URL"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let ok = SmtpMailer::new(&settings("smtp://user:hunter2@mail.example.com:587")).unwrap();
        let debug = format!("{ok:?}");
        assert!(debug.contains("mail.example.com:587"), "{debug}");
        assert!(!debug.contains("hunter2"), "{debug}");
    }
}
