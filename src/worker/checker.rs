//! The pre-check of many deliveries in one query: whether each job already has its summary
//! row (a redelivery of a finished job, or a resend after its idempotency record expired),
//! so that it skips the model call.
//!
//! Why: every job asks before its model call, so with a fast model that question is most
//! of the Postgres round trips a job costs (its commit is shared with its batch). Asked
//! together, the consumers of a process pay one query for all of them.
//!
//! How: up to `CHECKS_IN_FLIGHT` queries of a process run at once. A delivery that finds
//! one of them free asks alone, at once, in its own task: below that load nothing changes.
//! One that finds them all taken queues its job id for the process's checker task, which
//! takes whatever is queued (up to `commit_batch`) as soon as a query is free and asks it
//! in one query; so under load the batches grow by themselves, and a question waits for at
//! most the queries ahead of it. When Postgres fails a batch, each of its jobs asks again
//! alone, so every delivery sees its own typed error (a batch is rare, and rarer still in
//! an outage: the first unavailable error closes the gate).
//!
//! Nothing in the guarantees changes: the pre-check only saves money, the summaries'
//! primary key is what makes a second commit a duplicate (`docs/delivery.md`).

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::batching::{Batching, gather};
use crate::db::DbError;
use crate::db::summaries;
use crate::domain::JobId;

/// Requests that may wait for the checker: enough for every consumer of a large process.
const QUEUE: usize = 1024;
/// Queries of one process running at once. Enough that a draining process with the
/// default 16 consumers nearly always finds one free (fewer made such a drain wait in line
/// and slowed it by up to a seventh); at most half the pool's 32 connections, so the
/// commits always have room, and beyond that the questions share queries.
pub const CHECKS_IN_FLIGHT: usize = 16;

/// The handle consumers ask through; cheap to clone. Without a checker (batches of 1, or
/// no runtime to run one on) each job asks alone.
#[derive(Clone)]
pub struct Checker {
    pg: Pool,
    requests: Option<mpsc::Sender<Request>>,
    /// The queries that may run at once, alone or batched. Tokio's semaphore hands a
    /// freed query to the checker first when it waits for one, so questions in line are
    /// not overtaken by those that ask alone.
    in_flight: Arc<Semaphore>,
}

struct Request {
    job_id: JobId,
    reply: oneshot::Sender<Answer>,
}

enum Answer {
    Finished(bool),
    /// The batch failed: ask alone, for an error of this job's own.
    AskAlone,
}

impl Checker {
    /// Start the checker task of this process (on the current Tokio runtime); `max` jobs
    /// at most per query.
    pub fn start(pg: Pool, max: usize) -> Self {
        let batching = Batching {
            max,
            wait: std::time::Duration::ZERO,
        };
        let in_flight = Arc::new(Semaphore::new(CHECKS_IN_FLIGHT));
        let requests =
            (batching.batches() && tokio::runtime::Handle::try_current().is_ok()).then(|| {
                let (tx, rx) = mpsc::channel(QUEUE);
                tokio::spawn(run(pg.clone(), rx, batching, in_flight.clone()));
                tx
            });
        Self {
            pg,
            requests,
            in_flight,
        }
    }

    /// Whether `job_id` has its summary row. Cancel-safe: a dropped wait leaves only a
    /// query whose answer nobody reads.
    pub async fn finished(&self, job_id: JobId) -> Result<bool, DbError> {
        if let Some(requests) = &self.requests {
            if let Ok(_query) = self.in_flight.clone().try_acquire_owned() {
                return summaries::exists(&self.pg, job_id).await;
            }
            let (reply, answer) = oneshot::channel();
            if requests.send(Request { job_id, reply }).await.is_ok() {
                match answer.await {
                    Ok(Answer::Finished(finished)) => return Ok(finished),
                    // Asked alone below: the batch failed, or the checker stopped.
                    Ok(Answer::AskAlone) | Err(_) => {}
                }
            }
        }
        summaries::exists(&self.pg, job_id).await
    }
}

async fn run(
    pg: Pool,
    mut requests: mpsc::Receiver<Request>,
    batching: Batching,
    in_flight: Arc<Semaphore>,
) {
    loop {
        // A request only comes when every query was taken; it waits for the next free one,
        // and whatever queued meanwhile goes with it. (Waiting for a query before there is
        // a request would keep one from the deliveries that ask alone.)
        let Some(first) = requests.recv().await else {
            return;
        };
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(batching.max);
        batch.push(first);
        gather(&mut requests, &mut batch, batching, None).await;
        let pg = pg.clone();
        tokio::spawn(async move {
            check(&pg, batch).await;
            drop(slot);
        });
    }
}

async fn check(pg: &Pool, batch: Vec<Request>) {
    let ids: Vec<JobId> = batch.iter().map(|request| request.job_id).collect();
    match summaries::existing(pg, &ids).await {
        Ok(finished) => {
            for request in batch {
                let answer = Answer::Finished(finished.contains(&request.job_id));
                // A delivery that stopped waiting (cut short) needs no answer.
                let _ = request.reply.send(answer);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, jobs = batch.len(), "batched pre-check failed; each job asks alone");
            for request in batch {
                let _ = request.reply.send(Answer::AskAlone);
            }
        }
    }
}
