//! The default provider: writes the email to the log, so the service runs end to end with no
//! mail server (local runs, demos, tests of the other roles). Logs are not a place for
//! personal data, so the recipient appears as a keyed hash (`to_hmac`, with the deployment's
//! key: see `infra/log_key.rs`) and the body as its length; the job id in the subject line's
//! dedupe key says which summary it was (`GET /v1/summaries/{id}`).

use std::sync::Arc;

use async_trait::async_trait;

use super::{MailError, Mailer, OutgoingEmail};
use crate::infra::log_key::DeploymentKey;

pub struct LogMailer {
    key: Arc<DeploymentKey>,
}

impl std::fmt::Debug for LogMailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMailer").finish_non_exhaustive()
    }
}

impl LogMailer {
    /// Recipients are logged as HMACs under `key`.
    pub fn new(key: Arc<DeploymentKey>) -> Self {
        Self { key }
    }
}

#[async_trait]
impl Mailer for LogMailer {
    async fn attempt(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        // Without the key the line could only name the address or an unkeyed hash of it;
        // the row waits for Postgres like every other write the relay makes.
        let key = self.key.get().await.map_err(MailError::LogKey)?;
        // Info, not debug: with this provider the log line *is* the delivery.
        tracing::info!(
            from = %email.from,
            to_hmac = %key.recipient_tag(&email.to),
            subject = %email.subject,
            dedupe_key,
            text_chars = email.text.chars().count(),
            "email sent to the log (SUMMARYD_MAIL_PROVIDER=log)"
        );
        Ok(())
    }
}
