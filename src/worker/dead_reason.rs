//! Why a job was dead-lettered, said twice: to the tenant (GET's `error`), in summaryd's own
//! stable wording that names the class of failure and never quotes a provider; and to
//! operators (`summaryd dlq list`, the logs), with the full detail. Provider messages are
//! scrubbed of credentials where they are made (`llm::openai`), so neither carries a secret.

use crate::db::DbError;
use crate::domain::ReasonClass;
use crate::llm::retry::RetryError;
use crate::llm::{ChainError, LlmError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadReason {
    /// What the tenant is told; fixed wording per class (`docs/reference.md`, GET).
    pub(crate) tenant: String,
    /// What operators see: the class and the full detail.
    pub(crate) operator: String,
    /// What operators filter by, stored with the dead letter.
    pub(crate) class: ReasonClass,
}

impl DeadReason {
    fn new(class: ReasonClass, tenant: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        let tenant = tenant.into();
        Self {
            operator: format!("{tenant}: {detail}"),
            tenant,
            class,
        }
    }

    /// A model failure that is the job's own (`llm::Fault::Job`).
    pub(crate) fn model(err: &LlmError) -> Self {
        let (class, tenant) = match err {
            LlmError::Status { status, .. } => (
                ReasonClass::ModelRefused,
                format!("the model rejected the request (HTTP {status})"),
            ),
            LlmError::Malformed(_) => (
                ReasonClass::ModelFailed,
                "the model returned a response that could not be used".into(),
            ),
            LlmError::InvalidInput(_) => (
                ReasonClass::ModelRefused,
                "the text cannot be summarised".into(),
            ),
            LlmError::ContextExceeded(_) => (
                ReasonClass::TooLong,
                "the model refused even a small part of the text as too long".into(),
            ),
            LlmError::Timeout | LlmError::Connect(_) => (
                ReasonClass::ModelUnreachable,
                "the model could not be reached in time".into(),
            ),
            LlmError::Other(_) => (ReasonClass::ModelFailed, "the model call failed".into()),
        };
        Self::new(class, tenant, err)
    }

    /// The model chain gave up on the job. Only the job's own fault (`ChainError::Job`)
    /// dead-letters it; the other cases are worded for an operator who asks anyway.
    pub(crate) fn model_chain(err: &ChainError) -> Self {
        match err {
            ChainError::Job(e) | ChainError::Transient(RetryError::Llm(e)) => Self::model(e),
            ChainError::AllOpen { .. } | ChainError::Transient(_) => Self::new(
                ReasonClass::ModelUnreachable,
                "the model could not be reached in time",
                err,
            ),
            ChainError::TooLong { .. } => Self::parts(err),
        }
    }

    /// A long text whose parts cannot be made to fit, or that would cost more calls than
    /// the job may make.
    pub(crate) fn parts(detail: impl std::fmt::Display) -> Self {
        Self::new(
            ReasonClass::TooLong,
            "the text could not be summarised in parts that fit the model",
            detail,
        )
    }

    /// A text stored at intake that is no longer there (removed by hand, or by retention
    /// of a job queued for longer than it keeps texts).
    pub(crate) fn text_missing() -> Self {
        Self::new(
            ReasonClass::InvalidJob,
            "the queued job could not be read",
            "its text, stored in Postgres at intake, is gone (table job_texts)",
        )
    }

    /// Postgres refused the summary's data (the permanent `DbError`s).
    pub(crate) fn unstorable(err: &DbError) -> Self {
        let code = err.sqlstate().unwrap_or("unknown");
        let cause = match err {
            DbError::Query(e) => e
                .as_db_error()
                .map_or_else(|| e.to_string(), |db| db.message().to_owned()),
            other => other.to_string(),
        };
        Self::new(
            ReasonClass::Unstorable,
            "the summary could not be stored: the text or summary holds data the database refuses",
            format!("Postgres refused the commit (SQLSTATE {code}): {cause}"),
        )
    }

    /// The stream entry is not a job (written by something other than the API).
    pub(crate) fn malformed(detail: impl std::fmt::Display) -> Self {
        Self::new(
            ReasonClass::InvalidJob,
            "the queued job could not be read",
            detail,
        )
    }

    /// Every delivery failed transiently.
    /// Out of deliveries; `last`: why the last counted one failed, when it was noted.
    pub(crate) fn exhausted(max_deliveries: u64, last: Option<&str>) -> Self {
        let detail = match last {
            Some(last) => format!("exceeded {max_deliveries} deliveries; the last failed: {last}"),
            None => format!(
                "exceeded {max_deliveries} deliveries; each one's error is in the worker logs"
            ),
        };
        Self::new(
            ReasonClass::MaxDeliveries,
            format!("processing failed on each of {max_deliveries} attempts"),
            detail,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_get_the_class_and_operators_the_detail() {
        let err = LlmError::Status {
            status: 400,
            retry_after: None,
            message: "Invalid request from key <redacted>. Organisation acme-corp".into(),
        };
        let reason = DeadReason::model(&err);
        assert_eq!(reason.tenant, "the model rejected the request (HTTP 400)");
        assert_eq!(
            DeadReason::model_chain(&ChainError::Job(err.clone())),
            reason
        );
        assert_eq!(
            DeadReason::model_chain(&ChainError::Transient(RetryError::Llm(LlmError::Timeout)))
                .tenant,
            "the model could not be reached in time"
        );
        let outage = DeadReason::model_chain(&ChainError::AllOpen {
            reason: "openai:a: 401".into(),
            called: false,
        });
        assert_eq!(outage.tenant, "the model could not be reached in time");
        assert!(
            outage.operator.ends_with("openai:a: 401"),
            "{}",
            outage.operator
        );
        assert!(reason.operator.starts_with(&reason.tenant));
        assert!(reason.operator.contains("Organisation acme-corp"));
        assert_eq!(
            DeadReason::model(&LlmError::Malformed("no choices".into())).tenant,
            "the model returned a response that could not be used"
        );
    }

    #[test]
    fn each_failure_is_stored_under_its_class() {
        let status = |status| LlmError::Status {
            status,
            retry_after: None,
            message: String::new(),
        };
        let cases = [
            (DeadReason::model(&status(400)), ReasonClass::ModelRefused),
            (
                DeadReason::model(&LlmError::InvalidInput("empty".into())),
                ReasonClass::ModelRefused,
            ),
            (
                DeadReason::model(&LlmError::Malformed("no choices".into())),
                ReasonClass::ModelFailed,
            ),
            (
                DeadReason::model(&LlmError::Other("bug".into())),
                ReasonClass::ModelFailed,
            ),
            (
                DeadReason::model(&LlmError::ContextExceeded("8192".into())),
                ReasonClass::TooLong,
            ),
            (
                DeadReason::model(&LlmError::Connect("refused".into())),
                ReasonClass::ModelUnreachable,
            ),
            (
                DeadReason::model_chain(&ChainError::AllOpen {
                    reason: "openai:a: 401".into(),
                    called: false,
                }),
                ReasonClass::ModelUnreachable,
            ),
            (DeadReason::parts("too many calls"), ReasonClass::TooLong),
            (DeadReason::text_missing(), ReasonClass::InvalidJob),
            (DeadReason::malformed("no job_id"), ReasonClass::InvalidJob),
            (
                DeadReason::unstorable(&DbError::Pool(deadpool_postgres::PoolError::Closed)),
                ReasonClass::Unstorable,
            ),
            (DeadReason::exhausted(5, None), ReasonClass::MaxDeliveries),
        ];
        for (reason, class) in cases {
            assert_eq!(reason.class, class, "{}", reason.operator);
        }
    }
}
