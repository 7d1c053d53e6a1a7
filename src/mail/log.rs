//! The default provider: writes the whole email to the log, so the service runs end to end
//! with no mail server (local runs, demos, tests of the other roles).

use async_trait::async_trait;

use super::{MailError, Mailer, OutgoingEmail};

#[derive(Debug, Default)]
pub struct LogMailer;

#[async_trait]
impl Mailer for LogMailer {
    async fn send(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        // Info, not debug: with this provider the log line *is* the delivery.
        tracing::info!(
            from = %email.from,
            to = %email.to,
            subject = %email.subject,
            dedupe_key,
            text = %email.text,
            "email sent to the log (SUMMARYD_MAIL_PROVIDER=log)"
        );
        Ok(())
    }
}
