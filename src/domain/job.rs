use chrono::{DateTime, Utc};

use super::{Email, JobId, TenantId};

/// One accepted summary request, as every stage after the API sees it: the API builds it,
/// the stream carries it (`stream::job_entry` owns only its wire format), the worker
/// processes it and the database stores it. Every field was parsed at the API, so no later
/// stage validates again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub job_id: JobId,
    pub tenant: TenantId,
    /// The text to summarise.
    pub text: String,
    /// Who gets the "summary ready" email.
    pub notify: Email,
    /// When the API accepted the job; GET reports it as `created_at`.
    pub created_at: DateTime<Utc>,
}
