//! The summary job: call the model under the retry policy, then commit the summary and its
//! email intent together. Idempotent, because the queue delivers at least once.

use super::WorkerServices;
use super::batching::Joining;
use super::dead_reason::DeadReason;
use super::job_error::JobError;
use super::parts::{PartsFailure, summarise_in_parts};
use crate::db::job_texts;
use crate::db::summaries::CommitOutcome;
use crate::domain::{CallLog, Job, JobText, ModelSummary};
use crate::llm::retry::Deadline;
use crate::llm::{ChainError, Prompt};

/// What became of one delivery that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// This delivery wrote the summary and the outbox row.
    Done,
    /// The job was already finished (redelivery, or a concurrent delivery won the race).
    Duplicate,
}

/// Process one job, as its first delivery. Sends nothing itself: the relay sends the email
/// from the outbox row. What a failure means for the job is its [`JobError::disposition`].
/// The model calls of a delivery that fails are not kept (the consumer keeps them).
pub async fn handle_summary_job(
    services: &WorkerServices,
    job: &Job,
) -> Result<JobOutcome, JobError> {
    let calls = CallLog::new(1);
    handle_summary_job_from(services, job, None, &calls)
        .await
        .map_err(|failed| failed.error)
}

/// A delivery that did not finish its job, with the summary the model wrote when it got
/// that far: a retry that is handed it does not pay the model again.
#[derive(Debug)]
pub(crate) struct Unfinished {
    pub(crate) error: JobError,
    pub(crate) summary: Option<ModelSummary>,
    /// A job in parts: this delivery stored parts no delivery had stored before.
    pub(crate) progressed: bool,
}

impl<E: Into<JobError>> From<E> for Unfinished {
    fn from(error: E) -> Self {
        Self {
            error: error.into(),
            summary: None,
            progressed: false,
        }
    }
}

impl From<PartsFailure> for Unfinished {
    fn from(failure: PartsFailure) -> Self {
        Self {
            error: failure.error,
            summary: None,
            progressed: failure.progressed,
        }
    }
}

/// [`handle_summary_job`], starting from `summary` when an earlier delivery got one. Every
/// model call this delivery makes goes into `calls`; a summary that is committed takes them
/// along (in its transaction), and whatever is left in `calls` afterwards is the caller's
/// to keep.
pub(crate) async fn handle_summary_job_from(
    services: &WorkerServices,
    job: &Job,
    summary: Option<ModelSummary>,
    calls: &CallLog,
) -> Result<JobOutcome, Unfinished> {
    match prepare(services, job, summary, calls).await? {
        Prepared::Duplicate => Ok(JobOutcome::Duplicate),
        Prepared::Ready(summary, joining) => commit(services, joining, job, summary).await,
    }
}

/// A job whose summary is in hand, or that needs none.
pub(crate) enum Prepared {
    /// An earlier delivery committed it.
    Duplicate,
    /// Its summary, to commit, with the delivery's place in the group commit.
    Ready(ModelSummary, Joining),
}

/// The part of a job before its commit: whether an earlier delivery finished it, else its
/// summary (`summary`, when an earlier delivery got one, else the model's).
pub(crate) async fn prepare(
    services: &WorkerServices,
    job: &Job,
    summary: Option<ModelSummary>,
    calls: &CallLog,
) -> Result<Prepared, Unfinished> {
    // From here until its commit (or its end without one), a batch of the group commit
    // may wait for this delivery.
    let joining = services.commits.joining();
    // Cheap pre-check: a redelivered, already finished job skips the model call. The
    // primary key in `summaries::commit_batch` is the guarantee; this only saves money.
    // Under load it shares a query with the process's other deliveries (`checker.rs`).
    if services.checks.finished(job.job_id).await? {
        if job.text == JobText::Stored {
            // A resend enqueued after the idempotency record expired stored the text
            // again; the job is done, so nothing will read it.
            if let Err(e) = job_texts::forget(&services.pg, job.job_id).await {
                tracing::debug!(error = %e, "could not remove the stored text of a finished job; retention removes it");
            }
        }
        return Ok(Prepared::Duplicate);
    }

    let mut summary = match summary {
        Some(summary) => summary,
        None => summarise(services, job, calls).await?,
    };
    summary.calls.extend(calls.take());
    Ok(Prepared::Ready(summary, joining))
}

/// Commit the job's summary (in the process's next group commit; `joining` is the
/// delivery's place in it).
///
/// A commit that fails because Postgres went away (or refuses writes) is unavailable too:
/// the job did nothing wrong, and the summary it paid for goes with the held entry, so
/// the retry after recovery commits it without another model call. Data Postgres
/// refuses is permanent.
pub(crate) async fn commit(
    services: &WorkerServices,
    joining: Joining,
    job: &Job,
    summary: ModelSummary,
) -> Result<JobOutcome, Unfinished> {
    let committed = services.commits.commit(joining, job, summary).await;
    match committed.result {
        Ok(CommitOutcome::Inserted) => {
            let calls = committed.summary.and_then(|s| s.parts).unwrap_or(1);
            services.metrics.job_model_calls.observe(f64::from(calls));
            Ok(JobOutcome::Done)
        }
        Ok(CommitOutcome::Duplicate) => Ok(JobOutcome::Duplicate),
        Err(error) => Err(Unfinished {
            error: error.into(),
            summary: committed.summary,
            progressed: false,
        }),
    }
}

/// The model's summary of the job's text: one call when the text fits the provider about
/// to be called (the common case, exactly one request), in parts otherwise.
async fn summarise(
    services: &WorkerServices,
    job: &Job,
    calls: &CallLog,
) -> Result<ModelSummary, Unfinished> {
    let text = match &job.text {
        JobText::Inline(text) => text.clone(),
        JobText::Stored => match job_texts::load(&services.pg, job.job_id).await? {
            Some(text) => text,
            None => return Err(JobError::Refused(DeadReason::text_missing()).into()),
        },
    };
    let deadline = Deadline::after(services.settings.job_budget);
    let document = Prompt::Document(text);
    match services.model.complete(&document, deadline, calls).await {
        Ok(summary) => Ok(summary),
        Err(too_long @ ChainError::TooLong { .. }) => {
            Ok(summarise_in_parts(services, job, document, too_long, calls).await?)
        }
        Err(e) => Err(e.into()),
    }
}
