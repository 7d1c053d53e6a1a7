//! The summary job: call the model under the retry policy, then commit the summary and its
//! email intent together. Idempotent, because the queue delivers at least once.

use std::time::Duration;

use crate::context::Services;
use crate::db::summaries::{self, CommitOutcome};
use crate::domain::Job;
use crate::retry::{self, Deadline, RetryPolicy};

/// What became of one delivery that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// This delivery wrote the summary and the outbox row.
    Done,
    /// The job was already finished (redelivery, or a concurrent delivery won the race).
    Duplicate,
}

/// Decided once, here, from the classifier; the consumer only acts on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// A later delivery may succeed: leave the message pending.
    #[error("transient: {0}")]
    Transient(String),
    /// Will fail the same way every time: dead-letter it now.
    #[error("permanent: {0}")]
    Permanent(String),
}

/// Process one job. Sends nothing itself: the relay sends the email from the outbox row.
pub async fn handle_summary_job(services: &Services, job: &Job) -> Result<JobOutcome, JobError> {
    // Cheap pre-check: a redelivered, already finished job skips the model call. The
    // primary key in `commit_with_outbox` is the guarantee; this only saves money.
    if summaries::exists(&services.pg, job.job_id)
        .await
        .map_err(|e| JobError::Transient(e.to_string()))?
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
    .map_err(|e| {
        if e.is_transient() {
            JobError::Transient(e.to_string())
        } else {
            JobError::Permanent(e.to_string())
        }
    })?;

    match summaries::commit_with_outbox(&services.pg, job, &summary).await {
        Ok(CommitOutcome::Inserted) => Ok(JobOutcome::Done),
        Ok(CommitOutcome::Duplicate) => Ok(JobOutcome::Duplicate),
        Err(e) => Err(JobError::Transient(e.to_string())),
    }
}
