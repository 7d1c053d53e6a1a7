//! Why a delivery did not finish its job, and what that means: the one error type every
//! step of a delivery (the model chain, Postgres, a job in parts) reports in.

use super::dead_reason::DeadReason;
use super::gate::{MODEL, POSTGRES};
use crate::db::DbError;
use crate::llm::ChainError;
use crate::resilience::failure::{Classify, Disposition};

/// Why a delivery did not finish its job: the model chain's or the database's error, each
/// of which says what the consumer does next ([`Classify`]): a transient failure leaves the
/// job pending for a counted redelivery; an unavailable dependency (Postgres, or every model
/// provider's breaker open) means the job was not tried to the end, so the consumer asks the
/// dependency directly and, if it is down, the delivery does not count (`docs/delivery.md`);
/// a permanent one dead-letters the job with its [`DeadReason`].
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Model(#[from] ChainError),
    #[error(transparent)]
    Db(#[from] DbError),
    /// The job itself cannot be done, whatever is tried: a long text that cannot be cut
    /// into parts that fit, a stored text that is gone.
    #[error("{}", .0.operator)]
    Refused(DeadReason),
}

impl Classify for JobError {
    fn disposition(&self) -> Disposition {
        match self {
            JobError::Model(e) => e.disposition(),
            JobError::Db(e) => e.disposition(),
            JobError::Refused(_) => Disposition::Permanent,
        }
    }
}

impl JobError {
    /// The dependency the consumers' gate closes under while this one is unavailable.
    pub(crate) fn dependency(&self) -> &'static str {
        match self {
            JobError::Model(_) | JobError::Refused(_) => MODEL,
            JobError::Db(_) => POSTGRES,
        }
    }

    /// Whether this delivery called a model provider before every breaker was open.
    pub(crate) fn called_model(&self) -> bool {
        matches!(
            self,
            JobError::Model(ChainError::AllOpen { called: true, .. })
        )
    }

    /// What the tenant and operators are told when this error dead-letters the job.
    pub(crate) fn dead_reason(&self) -> DeadReason {
        match self {
            JobError::Model(e) => DeadReason::model_chain(e),
            JobError::Db(e) => DeadReason::unstorable(e),
            JobError::Refused(reason) => reason.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::LlmError;
    use crate::llm::retry::RetryError;

    #[test]
    fn each_error_says_what_next_and_which_dependency_it_waits_for() {
        let refused = JobError::from(ChainError::Job(LlmError::Status {
            status: 422,
            retry_after: None,
            message: "too long".into(),
        }));
        assert_eq!(refused.disposition(), Disposition::Permanent);
        assert_eq!(
            refused.dead_reason().tenant,
            "the model rejected the request (HTTP 422)"
        );
        let outage = JobError::from(ChainError::AllOpen {
            reason: "openai:a: 401".into(),
            called: false,
        });
        assert_eq!(outage.disposition(), Disposition::Unavailable);
        assert_eq!(outage.dependency(), MODEL);
        let slow = JobError::from(ChainError::Transient(RetryError::BreakerOpen));
        assert_eq!(slow.disposition(), Disposition::TRANSIENT);
        let down = JobError::from(DbError::Pool(deadpool_postgres::PoolError::Closed));
        assert_eq!(down.disposition(), Disposition::Unavailable);
        assert_eq!(down.dependency(), POSTGRES);
        assert!(
            down.dead_reason()
                .tenant
                .starts_with("the summary could not be stored")
        );
    }
}
