//! Sending the "summary ready" email, behind one trait; the provider is chosen by configuration.

mod compose;
mod log;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use self::compose::{ComposeError, SUMMARY_READY_SUBJECT, summary_ready_email};
pub use self::log::LogMailer;

use crate::config::{MailProvider, MailSettings};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingEmail {
    pub from: String,
    pub to: String,
    pub subject: String,
    pub text: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum MailError {
    /// Worth trying again later (network, timeout, 408/429/5xx).
    #[error("transient mail failure: {0}")]
    Transient(String),
    /// Will fail the same way every time; the outbox row needs a person.
    #[error("permanent mail failure: {0}")]
    Permanent(String),
}

#[async_trait]
pub trait Mailer: Send + Sync {
    /// Send once. `dedupe_key` is the provider's idempotency key, so a resend after a crash
    /// between send and commit is recognisable as the same message.
    async fn send(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError>;
}

#[derive(Debug, thiserror::Error)]
pub enum MailConfigError {
    #[error("SUMMARYD_MAIL_PROVIDER={0:?} is not available in this build yet")]
    ProviderUnavailable(MailProvider),
}

pub fn from_settings(settings: &MailSettings) -> Result<Arc<dyn Mailer>, MailConfigError> {
    match settings.provider {
        MailProvider::Log => Ok(Arc::new(LogMailer)),
        other => Err(MailConfigError::ProviderUnavailable(other)),
    }
}
