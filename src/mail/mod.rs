//! Sending the "summary ready" email, behind one trait; the provider is chosen by configuration.

mod compose;
mod error;
mod http;
mod log;
mod smtp;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use self::compose::{SUMMARY_READY_SUBJECT, summary_ready_email};
pub use self::error::{MailConfigError, MailError};
pub use self::http::HttpMailer;
pub use self::log::LogMailer;
pub use self::smtp::{SmtpMailer, build_message, message_id};

use crate::config::{MailProvider, MailSettings};
use crate::infra::log_key::DeploymentKey;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingEmail {
    pub from: String,
    pub to: String,
    pub subject: String,
    pub text: String,
}

/// A mail provider. Providers implement [`Mailer::attempt`]; everyone else calls
/// [`Mailer::send`], which is where a failure loses the recipient, once for all providers.
#[async_trait]
pub trait Mailer: Send + Sync {
    /// The provider's own send, once. `dedupe_key` is the provider's idempotency key, so a
    /// resend after a crash between send and commit is recognisable as the same message.
    /// What a failure means for the row (resent after its backoff, or left for a person) is
    /// the error's [`Classify`](crate::resilience::failure::Classify) answer.
    async fn attempt(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError>;

    /// [`Mailer::attempt`], with the recipient scrubbed from any failure's text: servers
    /// quote it in rejections, and the error goes on to logs and `outbox.last_error`. Not
    /// meant to be overridden.
    async fn send(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        self.attempt(email, dedupe_key)
            .await
            .map_err(|e| e.without_recipient(&email.to))
    }
}

/// Build the configured provider. No network I/O: a down mail server shows up as transient
/// send failures on outbox rows, not as a process that refuses to start. `log_key` is the
/// deployment's key the `log` provider hashes recipients with (read on first use).
pub fn from_settings(
    settings: &MailSettings,
    log_key: Arc<DeploymentKey>,
) -> Result<Arc<dyn Mailer>, MailConfigError> {
    Ok(match settings.provider {
        MailProvider::Log => Arc::new(LogMailer::new(log_key)),
        MailProvider::Smtp => Arc::new(SmtpMailer::new(settings)?),
        MailProvider::Http => Arc::new(HttpMailer::new(settings)?),
    })
}
