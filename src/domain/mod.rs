//! Newtypes that parse: once a value of these types exists, it is valid.

mod email;
mod idempotency_key;
mod job_id;
mod summary_request;
mod tenant;

pub use email::Email;
pub use idempotency_key::IdempotencyKey;
pub use job_id::JobId;
pub use summary_request::{SummaryRequest, ValidSummaryRequest};
pub use tenant::TenantId;

/// Input that parsed but does not satisfy the schema; `field` names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    pub field: &'static str,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}
