//! The summary job: call the model under the retry policy, then commit the summary and its
//! email intent together. Idempotent, because the queue delivers at least once.

use std::time::Duration;

use super::WorkerServices;
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

/// Process one job. Sends nothing itself: the relay sends the email from the outbox row.
///
/// A transient [`Failure`] leaves the message pending for a later delivery; a permanent one
/// (decided by the model error's classification) dead-letters it. Database errors are
/// transient: Postgres comes back.
pub async fn handle_summary_job(
    services: &WorkerServices,
    job: &Job,
) -> Result<JobOutcome, Failure> {
    // Cheap pre-check: a redelivered, already finished job skips the model call. The
    // primary key in `commit_with_outbox` is the guarantee; this only saves money.
    if summaries::exists(&services.pg, job.job_id)
        .await
        .map_err(|e| Failure::Transient(e.to_string()))?
    {
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
    .map_err(|e| Failure::of(&e))?;

    match summaries::commit_with_outbox(&services.pg, job, &summary).await {
        Ok(CommitOutcome::Inserted) => Ok(JobOutcome::Done),
        Ok(CommitOutcome::Duplicate) => Ok(JobOutcome::Duplicate),
        Err(e) => Err(Failure::Transient(e.to_string())),
    }
}
