//! Group commit: the finished deliveries of one worker process are committed together,
//! one Postgres transaction for whatever summaries are ready, instead of one each.
//!
//! Why: every transaction pays a round trip per statement and a WAL flush at its commit;
//! at high concurrency those, not the model, bound how many jobs a process finishes per
//! second (one transaction per job cannot beat the single-job commit ceiling). A batch
//! pays them once for all its jobs.
//!
//! How: deliveries hand their job and summary to one committer task per process and wait
//! for their own outcome (in a finisher, while their consumer takes its next job:
//! `finishing.rs`). The committer takes what is queued (up to `commit_batch`), and
//! when that is less than a full batch waits at most `commit_wait` for more, then commits
//! them in one transaction (`db::summaries::commit_batch`), each job keeping its own
//! `ON CONFLICT DO NOTHING` decision. It waits only while some delivery of the process
//! may still send a summary (one that holds a [`Joining`], taken before its model call):
//! a lone job, or the last of a burst, is committed without waiting. Up to
//! `BATCHES_IN_FLIGHT` batches commit side by side, so a burst of finished jobs waits for
//! about one transaction, not for one per batch before its own; while that many commit,
//! requests queue, so under load batches grow by themselves. A job waits at most
//! `commit_wait`, and only for another job in hand.
//!
//! Nothing in the guarantees changes (`docs/delivery.md`, "Group commit"): a delivery is
//! acknowledged only after its own row is committed (the delivery waits for the outcome
//! before it settles), a crash before the commit loses the whole batch's transaction and
//! every job in it is redelivered, and a crash after it finds the rows and acknowledges
//! the jobs as duplicates. A batch Postgres refuses is committed again job by job, so one
//! job whose data is refused fails alone.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::Instrument;

use super::batching::{Batching, Joiners, Joining, gather};
use crate::db::DbError;
use crate::db::summaries::{self, CommitOutcome, Finished};
use crate::domain::{Job, ModelSummary, TraceContext};
use crate::infra::metrics::Metrics;
use crate::infra::telemetry;
use crate::resilience::failure::Classify;

/// Requests that may wait for the committer: enough for every consumer of a large process
/// to queue its summary without waiting for room.
const QUEUE: usize = 1024;
/// Batches of one process committing at once. When many jobs finish together (a burst,
/// or consumers whose model calls end in step), one batch after another would make the
/// last job wait for every transaction before its own; side by side they wait for about
/// one, as Postgres flushes the WAL of commits that arrive together once. Few, so a
/// process holds few of the pool's connections for its commits.
const BATCHES_IN_FLIGHT: usize = 4;

/// What the committer answers a consumer: its summary back (a retry that is handed it
/// does not pay the model again; `None` only when the process is stopping) and what
/// became of its commit.
#[derive(Debug)]
pub struct Committed {
    pub summary: Option<ModelSummary>,
    pub result: Result<CommitOutcome, DbError>,
}

/// The handle consumers commit through; cheap to clone. Without a committer (a batch of 1
/// asked for, or no runtime to run one on) each commit is its own transaction.
#[derive(Clone)]
pub struct Committer {
    pg: Pool,
    requests: Option<mpsc::Sender<Request>>,
    joiners: Arc<Joiners>,
}

struct Request {
    job: Job,
    summary: ModelSummary,
    /// The job's `commit` span's context, for its outbox rows.
    trace: Option<TraceContext>,
    reply: oneshot::Sender<Committed>,
}

impl Request {
    fn finished(&self) -> Finished<'_> {
        Finished {
            job: &self.job,
            summary: &self.summary,
            trace: self.trace.as_ref(),
        }
    }
}

impl Committer {
    /// Start the committer task of this process (on the current Tokio runtime).
    pub fn start(pg: Pool, batching: Batching, metrics: Arc<Metrics>) -> Self {
        let joiners = Arc::new(Joiners::default());
        let requests =
            (batching.batches() && tokio::runtime::Handle::try_current().is_ok()).then(|| {
                let (tx, rx) = mpsc::channel(QUEUE);
                tokio::spawn(run(pg.clone(), rx, batching, joiners.clone(), metrics));
                tx
            });
        Self {
            pg,
            requests,
            joiners,
        }
    }

    /// A delivery that may commit a summary, from before its model call: until it commits
    /// through [`Committer::commit`] or drops this, a batch that is not full waits for it
    /// (at most the batch's wait).
    pub fn joining(&self) -> Joining {
        self.joiners.join()
    }

    /// Commit `summary` of `job` (in the next batch), and answer once it is committed, or
    /// not; `joining` is the delivery's own, given up as it sends. Cancel-safe for the job:
    /// a request already queued is committed even if this future is dropped (a delivery
    /// cut short), which a later delivery then finds.
    pub async fn commit(&self, joining: Joining, job: &Job, summary: ModelSummary) -> Committed {
        // Before the send: a batch that closes in between only misses this request, which
        // the next batch takes; after it, the batch could wait for a request already in.
        drop(joining);
        let Some(requests) = &self.requests else {
            let result = summaries::commit_with_outbox(&self.pg, job, &summary).await;
            return Committed {
                summary: Some(summary),
                result,
            };
        };
        // The job's `commit` span covers its wait for the batch and the batch's
        // transaction; its outbox rows carry this span's context, so the relay's send
        // joins the job's own trace whatever batch it was committed in.
        let span = summaries::commit_span(job);
        let (reply, answer) = oneshot::channel();
        let request = Request {
            job: job.clone(),
            summary,
            trace: span.in_scope(telemetry::current),
            reply,
        };
        let committed = async {
            if let Err(mpsc::error::SendError(request)) = requests.send(request).await {
                return Committed {
                    summary: Some(request.summary),
                    result: Err(stopped()),
                };
            }
            match answer.await {
                Ok(committed) => committed,
                // The committer ended with the request unanswered: only when the process
                // stops, and then the request's summary is lost with it; the next delivery
                // pays again.
                Err(_) => Committed {
                    summary: None,
                    result: Err(stopped()),
                },
            }
        }
        .instrument(span.clone())
        .await;
        if let Err(e) = &committed.result {
            telemetry::fail(&span, e.disposition().class());
        }
        committed
    }
}

/// The committer stops only with its process; to a delivery that is as if the pool had
/// closed: Postgres unavailable, so the delivery does not count.
fn stopped() -> DbError {
    DbError::Pool(deadpool_postgres::PoolError::Closed)
}

async fn run(
    pg: Pool,
    mut requests: mpsc::Receiver<Request>,
    batching: Batching,
    joiners: Arc<Joiners>,
    metrics: Arc<Metrics>,
) {
    let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    loop {
        // A free slot first: while every slot commits, requests queue, and the next batch
        // takes them all at once.
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = requests.recv().await else {
            return;
        };
        let mut batch = Vec::with_capacity(batching.max);
        batch.push(first);
        gather(&mut requests, &mut batch, batching, Some(&joiners)).await;
        metrics.commit_batch_jobs.observe(batch.len() as f64);
        let pg = pg.clone();
        tokio::spawn(async move {
            commit(&pg, &mut batch).await;
            drop(slot);
        });
    }
}

/// Commit `batch` in one transaction and answer each request; if Postgres refuses the
/// batch, commit its jobs one by one, so the refusal reaches only the job it is about.
async fn commit(pg: &Pool, batch: &mut Vec<Request>) {
    let finished: Vec<Finished<'_>> = batch.iter().map(Request::finished).collect();
    let together = summaries::commit_batch(pg, &finished).await;
    drop(finished);
    match together {
        Ok(outcomes) => {
            for (request, outcome) in batch.drain(..).zip(outcomes) {
                answer(request, Ok(outcome));
            }
        }
        Err(e) if batch.len() == 1 => {
            if let Some(request) = batch.pop() {
                answer(request, Err(e));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, jobs = batch.len(), "group commit refused; committing its jobs one by one");
            for request in batch.drain(..) {
                let result = summaries::commit_alone(pg, request.finished()).await;
                answer(request, result);
            }
        }
    }
}

fn answer(request: Request, result: Result<CommitOutcome, DbError>) {
    // A consumer that stopped waiting (its delivery cut short at shutdown) is not told;
    // its job's row, if committed, makes the next delivery a duplicate.
    let _ = request.reply.send(Committed {
        summary: Some(request.summary),
        result,
    });
}
