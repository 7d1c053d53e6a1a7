//! The summary job: call the model under the retry policy, then commit the summary and its
//! email intent together. Idempotent, because the queue delivers at least once.

use std::time::Duration;

use super::WorkerServices;
use super::gate::POSTGRES;
use crate::db::DbError;
use crate::db::summaries::{self, CommitOutcome};
use crate::domain::Job;
use crate::failure::Failure;
use crate::retry::{self, Deadline, RetryPolicy};

/// What became of one delivery that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// This delivery wrote the summary and the outbox row.
    Done,
    /// The job was already finished (redelivery, or a concurrent delivery won the race).
    Duplicate,
}

/// Why a delivery did not finish the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The job was tried and failed; the classification says whether a later delivery may
    /// succeed (leave it pending) or not (dead-letter it).
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A dependency the delivery needs did not answer, so the job itself was not tried to
    /// the end. The consumer asks the dependency directly; if it is down, the delivery does
    /// not count and the consumers wait for it (`docs/delivery.md`).
    #[error("{dependency} unavailable: {reason}")]
    Unavailable {
        dependency: &'static str,
        reason: String,
    },
}

impl From<DbError> for JobError {
    fn from(e: DbError) -> Self {
        if e.is_unavailable() {
            JobError::Unavailable {
                dependency: POSTGRES,
                reason: e.to_string(),
            }
        } else {
            JobError::Failed(Failure::Transient(e.to_string()))
        }
    }
}

/// Process one job. Sends nothing itself: the relay sends the email from the outbox row.
///
/// A transient [`Failure`] leaves the message pending for a later delivery; a permanent one
/// (decided by the model error's classification) dead-letters it. A database that cannot
/// serve us is [`JobError::Unavailable`]; a database refusing this job's data is transient.
pub async fn handle_summary_job(
    services: &WorkerServices,
    job: &Job,
) -> Result<JobOutcome, JobError> {
    // Cheap pre-check: a redelivered, already finished job skips the model call. The
    // primary key in `commit_with_outbox` is the guarantee; this only saves money.
    if summaries::exists(&services.pg, job.job_id).await? {
        return Ok(JobOutcome::Duplicate);
    }

    let policy = RetryPolicy::from_settings(&services.settings.llm);
    let deadline = Deadline::after(Duration::from_millis(services.settings.job_budget_ms));
    let summary = retry::complete_with_retries(
        services.llm.as_ref(),
        &job.text,
        deadline,
        &policy,
        Some(&services.metrics),
    )
    .await
    .map_err(|e| JobError::Failed(Failure::of(&e)))?;

    // A commit that fails because Postgres went away is `Unavailable` too: the model was
    // paid, but the job did nothing wrong, and the retry after recovery pays it once more
    // rather than spending a delivery on the outage.
    match summaries::commit_with_outbox(&services.pg, job, &summary).await? {
        CommitOutcome::Inserted => Ok(JobOutcome::Done),
        CommitOutcome::Duplicate => Ok(JobOutcome::Duplicate),
    }
}
