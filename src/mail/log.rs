//! The default provider: writes the email to the log, so the service runs end to end with no
//! mail server (local runs, demos, tests of the other roles). Logs are not a place for
//! personal data, so the recipient appears as a hash and the body as its length; the job id
//! in the subject line's dedupe key says which summary it was (`GET /v1/summaries/{id}`).

use async_trait::async_trait;

use super::{MailError, Mailer, OutgoingEmail};

#[derive(Debug, Default)]
pub struct LogMailer;

#[async_trait]
impl Mailer for LogMailer {
    async fn attempt(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        // Info, not debug: with this provider the log line *is* the delivery.
        tracing::info!(
            from = %email.from,
            to_sha256 = %crate::infra::redact::fingerprint(&email.to),
            subject = %email.subject,
            dedupe_key,
            text_chars = email.text.chars().count(),
            "email sent to the log (SUMMARYD_MAIL_PROVIDER=log)"
        );
        Ok(())
    }
}
