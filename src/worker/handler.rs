//! The summary job: call the model under the retry policy, then commit the summary and its
//! email intent together. Idempotent, because the queue delivers at least once.

use super::WorkerServices;
use super::dead_reason::DeadReason;
use super::gate::{MODEL, POSTGRES};
use crate::db::DbError;
use crate::db::summaries::{self, CommitOutcome};
use crate::domain::{Job, ModelSummary};
use crate::llm::ChainError;
use crate::llm::retry::Deadline;
use crate::resilience::failure::{Classify, Disposition};

/// What became of one delivery that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// This delivery wrote the summary and the outbox row.
    Done,
    /// The job was already finished (redelivery, or a concurrent delivery won the race).
    Duplicate,
}

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
}

impl Classify for JobError {
    fn disposition(&self) -> Disposition {
        match self {
            JobError::Model(e) => e.disposition(),
            JobError::Db(e) => e.disposition(),
        }
    }
}

impl JobError {
    /// The dependency the consumers' gate closes under while this one is unavailable.
    pub(crate) fn dependency(&self) -> &'static str {
        match self {
            JobError::Model(_) => MODEL,
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
        }
    }
}

/// Process one job. Sends nothing itself: the relay sends the email from the outbox row.
/// What a failure means for the job is its [`JobError::disposition`].
pub async fn handle_summary_job(
    services: &WorkerServices,
    job: &Job,
) -> Result<JobOutcome, JobError> {
    handle_summary_job_from(services, job, None)
        .await
        .map_err(|failed| failed.error)
}

/// A delivery that did not finish its job, with the summary the model wrote when it got
/// that far: a retry that is handed it does not pay the model again.
#[derive(Debug)]
pub(crate) struct Unfinished {
    pub(crate) error: JobError,
    pub(crate) summary: Option<ModelSummary>,
}

impl<E: Into<JobError>> From<E> for Unfinished {
    fn from(error: E) -> Self {
        Self {
            error: error.into(),
            summary: None,
        }
    }
}

/// [`handle_summary_job`], starting from `summary` when an earlier delivery got one.
pub(crate) async fn handle_summary_job_from(
    services: &WorkerServices,
    job: &Job,
    summary: Option<ModelSummary>,
) -> Result<JobOutcome, Unfinished> {
    // Cheap pre-check: a redelivered, already finished job skips the model call. The
    // primary key in `commit_with_outbox` is the guarantee; this only saves money.
    if summaries::exists(&services.pg, job.job_id).await? {
        return Ok(JobOutcome::Duplicate);
    }

    let summary = match summary {
        Some(summary) => summary,
        None => {
            let deadline = Deadline::after(services.settings.job_budget);
            services.model.summarise(&job.text, deadline).await?
        }
    };

    // A commit that fails because Postgres went away (or refuses writes) is unavailable too:
    // the job did nothing wrong, and the summary it paid for goes with the held entry, so
    // the retry after recovery commits it without another model call. Data Postgres
    // refuses is permanent.
    match summaries::commit_with_outbox(&services.pg, job, &summary).await {
        Ok(CommitOutcome::Inserted) => Ok(JobOutcome::Done),
        Ok(CommitOutcome::Duplicate) => Ok(JobOutcome::Duplicate),
        Err(error) => Err(Unfinished {
            error: error.into(),
            summary: Some(summary),
        }),
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
