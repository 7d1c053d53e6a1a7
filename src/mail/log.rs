use async_trait::async_trait;

use super::{MailError, Mailer, OutgoingEmail};

#[derive(Debug, Default)]
pub struct LogMailer;

#[async_trait]
impl Mailer for LogMailer {
    async fn send(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        tracing::info!(to = %email.to, subject = %email.subject, dedupe_key, text = %email.text, "email");
        Ok(())
    }
}
