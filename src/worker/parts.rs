//! A text that does not fit the model's context, summarised in parts (map-reduce), where no
//! part is paid for twice.
//!
//! The chain says a prompt does not fit the provider about to be called
//! ([`ChainError::TooLong`], by its count or by the provider's own answer); the prompt's
//! data is then cut into pieces that fit (`llm::split`), each piece is summarised, and
//! their summaries are combined; a combination that does not fit is cut into groups the
//! same way, recursively, until one summary remains. Pieces run concurrently, up to
//! `SUMMARYD_LLM_PARALLEL_PARTS` calls of one job at once.
//!
//! Every finished part is stored in Postgres (`db::parts`) as soon as it is back, before
//! anything needs it, keyed by the hash of its input: a later delivery (after a kill, a
//! timeout, a switch to a provider with another context) reuses every part whose input it
//! shares and calls the model only for the rest. When one part fails, no new call starts;
//! the calls in flight finish and are stored, and the delivery reports whether it stored
//! anything new ([`PartsFailure::progressed`]): one that made progress does not count
//! against the job (`docs/delivery.md`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use futures_util::future::{BoxFuture, FutureExt, join_all};
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::WorkerServices;
use super::dead_reason::DeadReason;
use super::job_error::JobError;
use crate::db::parts::{self, PartPlace, StoredPart};
use crate::domain::{CallLog, Job, JobId, ModelSummary, TenantId, TokenUsage};
use crate::infra::keys::RedisKeys;
use crate::infra::telemetry::{self, otel_span};
use crate::llm::retry::Deadline;
use crate::llm::{ChainError, Prompt, PromptKind, TokenCounter, split};
use crate::resilience::failure::Classify;
use crate::stream::job_state;

/// Splits within splits a job may need: each level shrinks the data at least by half,
/// so a real text needs a handful; more means the parts are not shrinking.
const MAX_DEPTH: u32 = 12;

/// A delivery of a job in parts that did not finish it.
#[derive(Debug)]
pub(crate) struct PartsFailure {
    pub(crate) error: JobError,
    /// Whether this delivery stored at least one part no delivery had stored before.
    pub(crate) progressed: bool,
}

/// How a part's call ended, inside the run.
enum Stop {
    Failed(JobError),
    /// Another part failed first: this one did not start its call.
    Stopped,
}

impl From<JobError> for Stop {
    fn from(e: JobError) -> Self {
        Stop::Failed(e)
    }
}

/// The text cannot be cut into parts that fit, or its plan went past what a job may cost:
/// the job's own fault.
fn unsplittable(why: String) -> Stop {
    Stop::Failed(JobError::Refused(DeadReason::parts(why)))
}

/// One delivery's run of a job in parts.
struct Run<'a> {
    services: &'a WorkerServices,
    job_id: JobId,
    /// The job's tenant, which the part and combine spans name.
    tenant: &'a TenantId,
    /// The shard holding the job's state, where its progress is noted.
    keys: &'a RedisKeys,
    stored: HashMap<[u8; 32], StoredPart>,
    /// One permit per call in flight.
    calls: Semaphore,
    /// Set when a part failed: no new call starts.
    stop: AtomicBool,
    /// Parts this delivery stored.
    new_parts: AtomicU32,
    /// Model calls of the plan finished (stored, reused, or the last combination).
    done: AtomicU32,
    /// The plan's calls, as estimated so far.
    total: AtomicU32,
    /// The usage of every call the summary stands on.
    usage: Mutex<Option<TokenUsage>>,
    /// Most calls the job may need; a plan that grows past it is the job's fault.
    max_calls: u32,
    /// Every model call of the delivery, for the job's history.
    log: &'a CallLog,
}

/// Summarise `document` in parts, the chain having said it does not fit (`too_long`).
pub(crate) async fn summarise_in_parts(
    services: &WorkerServices,
    job: &Job,
    document: Prompt,
    too_long: ChainError,
    log: &CallLog,
) -> Result<ModelSummary, PartsFailure> {
    let job_id = job.job_id;
    let stored = parts::load(&services.pg, job_id)
        .await
        .map_err(|e| PartsFailure {
            error: e.into(),
            progressed: false,
        })?;
    let llm = &services.settings.llm;
    let run = Run {
        services,
        job_id,
        tenant: &job.tenant,
        keys: services.keys.of_tenant(job.tenant.as_str()),
        stored,
        calls: Semaphore::new(llm.parallel_parts.max(1)),
        stop: AtomicBool::new(false),
        new_parts: AtomicU32::new(0),
        done: AtomicU32::new(0),
        total: AtomicU32::new(1),
        usage: Mutex::new(None),
        // The intake refused texts that need more than max_parts on the smallest
        // provider; a plan twice that is a counter far off, and stopped before it costs.
        max_calls: u32::try_from(llm.max_parts.saturating_mul(2)).unwrap_or(u32::MAX),
        log,
    };
    let place = PartPlace { level: 0, part: 0 };
    let result = run
        .split_and_solve(document, too_long, place, true, 0)
        .await;
    let progressed = run.new_parts.load(Ordering::Relaxed) > 0;
    match result {
        Ok(mut summary) => {
            summary.usage = *run.usage.lock().unwrap_or_else(PoisonError::into_inner);
            summary.parts = Some(run.done.load(Ordering::Relaxed));
            Ok(summary)
        }
        Err(Stop::Failed(error)) => Err(PartsFailure { error, progressed }),
        // Only a piece stops for another's failure, and the root waits for all pieces.
        Err(Stop::Stopped) => Err(PartsFailure {
            error: JobError::Refused(DeadReason::parts("stopped without a failure")),
            progressed,
        }),
    }
}

impl Run<'_> {
    /// The summary of `prompt`: stored already, or one call; split when it does not fit.
    /// `root`: the job's own summary, which is committed with the job, not stored as a part.
    fn solve(
        &self,
        prompt: Prompt,
        place: PartPlace,
        root: bool,
        depth: u32,
    ) -> BoxFuture<'_, Result<ModelSummary, Stop>> {
        let span = self.step_span(&prompt, place);
        let traced = span.clone();
        async move {
            let solved = self.solve_here(prompt, place, root, depth).await;
            if let Err(Stop::Failed(e)) = &solved {
                telemetry::fail(&traced, e.disposition().class());
            }
            solved
        }
        .instrument(span)
        .boxed()
    }

    /// A `part` or `combine` span for `prompt` at `place` (the whole document's first try
    /// has none: it is the delivery's own work).
    fn step_span(&self, prompt: &Prompt, place: PartPlace) -> tracing::Span {
        // i64: the OpenTelemetry layer writes unsigned values as strings.
        let (level, index) = (i64::from(place.level), i64::from(place.part));
        match prompt.kind() {
            PromptKind::Part => otel_span!(
                "part",
                "internal",
                self.job_id,
                self.tenant,
                "summaryd.part.level" = level,
                "summaryd.part.index" = index
            ),
            PromptKind::Combine => otel_span!(
                "combine",
                "internal",
                self.job_id,
                self.tenant,
                "summaryd.part.level" = level,
                "summaryd.part.index" = index
            ),
            PromptKind::Document => tracing::Span::none(),
        }
    }

    fn solve_here(
        &self,
        prompt: Prompt,
        place: PartPlace,
        root: bool,
        depth: u32,
    ) -> BoxFuture<'_, Result<ModelSummary, Stop>> {
        async move {
            let hash = prompt.input_sha256();
            if !root && let Some(part) = self.stored.get(&hash) {
                self.finished(part.usage);
                return Ok(ModelSummary {
                    text: part.summary.clone(),
                    model: part.model.clone(),
                    usage: part.usage,
                    parts: None,
                    calls: Vec::new(),
                });
            }
            let answer = {
                let _call = self.calls.acquire().await.map_err(|_| Stop::Stopped)?;
                if self.stop.load(Ordering::Relaxed) {
                    return Err(Stop::Stopped);
                }
                let deadline = Deadline::after(self.services.settings.job_budget);
                self.services
                    .model
                    .complete(&prompt, deadline, self.log)
                    .await
            };
            match answer {
                Ok(summary) => {
                    if !root {
                        self.store(&hash, place, &summary).await?;
                    }
                    self.finished(summary.usage);
                    if !root {
                        self.note_progress().await;
                    }
                    Ok(summary)
                }
                Err(too_long @ ChainError::TooLong { .. }) => {
                    self.split_and_solve(prompt, too_long, place, root, depth + 1)
                        .await
                }
                Err(e) => {
                    self.stop.store(true, Ordering::Relaxed);
                    Err(JobError::from(e).into())
                }
            }
        }
        .boxed()
    }

    /// `prompt`'s data cut into pieces that fit what `too_long` says, each solved, then
    /// their summaries combined.
    async fn split_and_solve(
        &self,
        prompt: Prompt,
        too_long: ChainError,
        place: PartPlace,
        root: bool,
        depth: u32,
    ) -> Result<ModelSummary, Stop> {
        let ChainError::TooLong {
            room,
            counter,
            summary_tokens,
            ..
        } = too_long
        else {
            return Err(JobError::from(too_long).into());
        };
        if depth > MAX_DEPTH {
            return Err(unsplittable(format!(
                "parts did not shrink within {MAX_DEPTH} splits"
            )));
        }
        let pieces = pieces(&prompt, room, &counter);
        if pieces.len() < 2 {
            return Err(unsplittable(format!(
                "a {:?} prompt of {} tokens cannot be cut into pieces of at most {room} tokens",
                prompt.kind(),
                prompt.data_tokens(&counter)
            )));
        }
        // This node becomes its pieces and their combinations.
        let calls = split::calls_for(pieces.len(), room, summary_tokens) as u32;
        let total = self
            .total
            .fetch_add(calls.saturating_sub(1), Ordering::Relaxed)
            + calls
            - 1;
        if total > self.max_calls {
            return Err(unsplittable(format!(
                "the plan needs at least {total} model calls, more than twice SUMMARYD_LLM_MAX_PARTS"
            )));
        }
        self.note_progress().await;
        let solved = join_all(pieces.into_iter().enumerate().map(|(i, piece)| {
            let place = PartPlace {
                level: place.level,
                part: u32::try_from(i).unwrap_or(u32::MAX),
            };
            self.solve(piece, place, false, depth)
        }))
        .await;
        let mut summaries = Vec::with_capacity(solved.len());
        let mut stopped = false;
        for result in solved {
            match result {
                Ok(summary) => summaries.push(summary.text),
                Err(Stop::Failed(e)) => return Err(Stop::Failed(e)),
                Err(Stop::Stopped) => stopped = true,
            }
        }
        if stopped {
            return Err(Stop::Stopped);
        }
        let combine = PartPlace {
            level: place.level + 1,
            part: place.part,
        };
        self.solve(Prompt::Combine(summaries), combine, root, depth)
            .await
    }

    /// Keep a finished part before anything needs it.
    async fn store(
        &self,
        hash: &[u8; 32],
        place: PartPlace,
        summary: &ModelSummary,
    ) -> Result<(), Stop> {
        let part = StoredPart {
            summary: summary.text.clone(),
            model: summary.model.clone(),
            usage: summary.usage,
        };
        if let Err(e) = parts::store(&self.services.pg, self.job_id, hash, place, &part).await {
            self.stop.store(true, Ordering::Relaxed);
            return Err(JobError::from(e).into());
        }
        self.new_parts.fetch_add(1, Ordering::Relaxed);
        self.services.metrics.job_parts.inc();
        Ok(())
    }

    /// One call of the plan is done (or found done).
    fn finished(&self, usage: Option<TokenUsage>) {
        self.done.fetch_add(1, Ordering::Relaxed);
        let mut sum = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        *sum = TokenUsage::sum(*sum, usage);
    }

    /// Tell GET how far the job is. Best effort: progress is a view, the parts are the
    /// truth, and a Redis that fails here fails the acknowledgement later anyway.
    async fn note_progress(&self) {
        let done = self.done.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let Ok(mut conn) = self.services.redis.get().await else {
            return;
        };
        if let Err(e) =
            job_state::note_progress(&mut conn, self.keys, self.job_id, done, total).await
        {
            tracing::debug!(error = %e, "could not note the job's progress");
        }
    }
}

/// `prompt`'s data cut into pieces of at most `room` tokens: a text into parts, a
/// combination into groups of consecutive summaries (fewer groups than summaries, or the
/// combination cannot shrink).
fn pieces(prompt: &Prompt, room: usize, counter: &TokenCounter) -> Vec<Prompt> {
    match prompt {
        Prompt::Document(text) | Prompt::Part(text) => split::split_text(text, room, counter)
            .into_iter()
            .map(Prompt::Part)
            .collect(),
        Prompt::Combine(summaries) => {
            let tokens: Vec<usize> = summaries
                .iter()
                .map(|s| Prompt::Combine(vec![s.clone()]).data_tokens(counter))
                .collect();
            let groups = split::group(&tokens, room);
            if groups.len() >= summaries.len() {
                return Vec::new();
            }
            groups
                .into_iter()
                .map(|r| Prompt::Combine(summaries[r].to_vec()))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_becomes_parts_and_a_combination_groups_that_shrink() {
        let counter = TokenCounter::Estimate;
        let text = "Revenue grew. ".repeat(400);
        let parts = pieces(&Prompt::Document(text), 100, &counter);
        assert!(parts.len() > 2);
        assert!(parts.iter().all(|p| matches!(p, Prompt::Part(_))));
        assert!(parts.iter().all(|p| p.data_tokens(&counter) <= 100));

        let summaries = vec!["a summary of ten words or so, give or take".to_owned(); 6];
        let groups = pieces(&Prompt::Combine(summaries.clone()), 60, &counter);
        assert_eq!(groups.len(), 3, "{groups:?}");
        assert!(
            groups
                .iter()
                .all(|g| matches!(g, Prompt::Combine(s) if s.len() == 2))
        );
        // A room that takes one summary per group cannot shrink the combination.
        assert!(pieces(&Prompt::Combine(summaries), 30, &counter).is_empty());
    }
}
