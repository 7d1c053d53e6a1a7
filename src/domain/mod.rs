//! Newtypes that parse (once a value of these types exists, it is valid), and the types
//! that cross the seams between stages: `Job` (api → stream → worker → db), `ModelSummary`
//! and the `ModelCall`s it took (worker → db), the events the relay delivers: `SummaryReady`
//! (db → relay → mail) and `WebhookEvent` (db → relay → a client's endpoint), and `Pause`
//! (an operator → every worker), and the `TraceContext` that goes along with a job and its
//! outbox rows. Every module may import these; they import nothing of
//! the service.

mod budget;
mod duration;
mod email;
mod idempotency_key;
mod job;
mod job_id;
mod model_call;
mod model_summary;
mod notify_domains;
mod pause;
mod reason_class;
mod summary_ready;
mod summary_request;
mod tenant;
mod trace_context;
mod webhook;
mod webhook_event;

pub use budget::{Budget, BudgetPeriod, BudgetUse, DEFAULT_SOFT_RATIO};
pub use duration::parse_duration;
pub use email::Email;
pub use idempotency_key::IdempotencyKey;
pub use job::{Job, JobText};
pub use job_id::JobId;
pub use model_call::{CallLog, ModelCall};
pub use model_summary::{ModelSummary, TokenUsage};
pub use notify_domains::NotifyDomains;
pub use pause::Pause;
pub use reason_class::ReasonClass;
pub use summary_ready::{InvalidEvent, SummaryReady};
pub use summary_request::{SummaryRequest, ValidSummaryRequest};
pub use tenant::TenantId;
pub use trace_context::{InvalidTraceContext, TraceContext};
pub use webhook::{
    NonPublicAddress, WebhookRules, WebhookSecret, WebhookSecrets, WebhookUrl, check_addresses,
    is_public,
};
pub use webhook_event::{EventData, EventStatus, EventType, WebhookBody, WebhookEvent};

/// Input that parsed but does not satisfy the schema; `field` names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    pub field: &'static str,
    pub(crate) message: String,
}

impl ValidationError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}
