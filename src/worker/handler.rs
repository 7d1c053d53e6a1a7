//! The summary job: call the model under the retry policy, then commit the summary and its
//! email intent together. Idempotent, because the queue delivers at least once.

use super::WorkerServices;
use super::dead_reason::DeadReason;
use super::gate::{MODEL, POSTGRES};
use crate::db::DbError;
use crate::db::summaries::{self, CommitOutcome};
use crate::domain::Job;
use crate::llm::ChainError;
use crate::llm::retry::Deadline;

/// What became of one delivery that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// This delivery wrote the summary and the outbox row.
    Done,
    /// The job was already finished (redelivery, or a concurrent delivery won the race).
    Duplicate,
}

/// Why a delivery did not finish its job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The job was tried and failed in a way a later delivery may not repeat (the model is
    /// slow or rate-limiting): leave it pending.
    #[error("transient: {0}")]
    Retry(String),
    /// Fails the same way every time (the model refused the request, Postgres refused the
    /// data itself): dead-letter the job now.
    #[error("permanent: {}", .0.operator)]
    Dead(DeadReason),
    /// A dependency the delivery needs did not answer (Postgres, or every model provider's
    /// breaker is open), so the job itself was not tried to the end. The consumer asks the
    /// dependency directly; if it is down, the delivery does not count and the consumers
    /// wait for it (`docs/delivery.md`).
    #[error("{dependency} unavailable: {reason}")]
    Unavailable {
        dependency: &'static str,
        reason: String,
    },
}

impl From<DbError> for JobError {
    /// One classification (`DbError::is_data_error`, of which `is_unavailable` is the
    /// complement for refused statements): data the database refuses is the job's own and
    /// permanent; a database that cannot serve us is an outage, not the job's fault.
    fn from(e: DbError) -> Self {
        if e.is_data_error() {
            JobError::Dead(DeadReason::unstorable(&e))
        } else if e.is_unavailable() {
            JobError::Unavailable {
                dependency: POSTGRES,
                reason: e.to_string(),
            }
        } else {
            JobError::Retry(e.to_string())
        }
    }
}

/// Process one job. Sends nothing itself: the relay sends the email from the outbox row.
///
/// [`JobError::Retry`] leaves the message pending for a later delivery; [`JobError::Dead`]
/// (decided by the model error's classification, or Postgres refusing the data itself)
/// dead-letters it. A database that cannot serve us is [`JobError::Unavailable`].
pub async fn handle_summary_job(
    services: &WorkerServices,
    job: &Job,
) -> Result<JobOutcome, JobError> {
    // Cheap pre-check: a redelivered, already finished job skips the model call. The
    // primary key in `commit_with_outbox` is the guarantee; this only saves money.
    if summaries::exists(&services.pg, job.job_id).await? {
        return Ok(JobOutcome::Duplicate);
    }

    let deadline = Deadline::after(services.settings.job_budget);
    let summary = services
        .model
        .summarise(&job.text, deadline)
        .await
        .map_err(|e| match e {
            ChainError::Job(e) => JobError::Dead(DeadReason::model(&e)),
            ChainError::AllOpen { reason } => JobError::Unavailable {
                dependency: MODEL,
                reason,
            },
            ChainError::Transient(e) => JobError::Retry(e.to_string()),
        })?;

    // A commit that fails because Postgres went away is `Unavailable` too: the model was
    // paid, but the job did nothing wrong, and the retry after recovery pays it once more
    // rather than spending a delivery on the outage. Data Postgres refuses is `Dead`.
    match summaries::commit_with_outbox(&services.pg, job, &summary).await? {
        CommitOutcome::Inserted => Ok(JobOutcome::Done),
        CommitOutcome::Duplicate => Ok(JobOutcome::Duplicate),
    }
}
