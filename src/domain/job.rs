use chrono::{DateTime, Utc};

use super::{Email, JobId, TenantId, WebhookUrl};

/// One accepted summary request, as every stage after the API sees it: the API builds it,
/// the stream carries it (`stream::job_entry` owns only its wire format), the worker
/// processes it and the database stores it. Every field was parsed at the API, so no later
/// stage validates again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub job_id: JobId,
    pub tenant: TenantId,
    /// The text to summarise, or where it is.
    pub text: JobText,
    /// Who gets the "summary ready" email, if anyone.
    pub notify: Option<Email>,
    /// Where the signed webhooks go, if anywhere: the request's `webhook.url`, else the
    /// tenant's default `webhook_url` when the job was accepted. A job has at least one of
    /// the two.
    pub webhook: Option<WebhookUrl>,
    /// When the API accepted the job; GET reports it as `created_at`.
    pub created_at: DateTime<Utc>,
}

/// A job's text: in the job itself, or stored in Postgres under the job's id (a text longer
/// than `SUMMARYD_API_INLINE_TEXT_BYTES`, which would otherwise sit in Redis's memory for
/// as long as it is queued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobText {
    Inline(String),
    Stored,
}

impl From<String> for JobText {
    fn from(text: String) -> Self {
        JobText::Inline(text)
    }
}

impl From<&str> for JobText {
    fn from(text: &str) -> Self {
        JobText::Inline(text.to_owned())
    }
}
