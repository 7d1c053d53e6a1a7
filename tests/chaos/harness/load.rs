//! A paced stream of job submissions running beside the faults: `jobs` POSTs spread over
//! `over`, from a few concurrent client tasks, each retrying with its own key until
//! accepted. Every `replay_every`-th job is submitted a second time after acceptance, and
//! must come back with the same job id. [`Load::start_with_long`] makes some of the jobs
//! long texts, summarised in parts, and [`Load::start_shaped`] spreads them over tenants.
//! Jobs ask for the client's webhook when it has one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;

use super::client::{Accepted, ApiClient};

/// Concurrent client tasks: enough that a slow answer never stalls the schedule.
const CLIENTS: usize = 16;

/// Which jobs are long texts: job `i` is one of at least `long(i)` bytes when `Some`.
pub type LongTexts = Arc<dyn Fn(usize) -> Option<usize> + Send + Sync>;

/// Whose job `i` is: that tenant when `Some`, else the client's own.
pub type TenantOf = Arc<dyn Fn(usize) -> Option<&'static str> + Send + Sync>;

pub struct Load {
    tasks: JoinSet<Vec<Accepted>>,
}

impl Load {
    pub fn start(
        client: &ApiClient,
        prefix: &str,
        jobs: usize,
        over: Duration,
        replay_every: usize,
    ) -> Load {
        Self::start_with_long(client, prefix, jobs, over, replay_every, Arc::new(|_| None))
    }

    /// [`Self::start`] where job `i` is a long text of at least `long(i)` bytes when that
    /// is `Some` (its marker and key are made the same way as every other job's).
    pub fn start_with_long(
        client: &ApiClient,
        prefix: &str,
        jobs: usize,
        over: Duration,
        replay_every: usize,
        long: LongTexts,
    ) -> Load {
        Self::start_shaped(
            client,
            prefix,
            jobs,
            over,
            replay_every,
            long,
            Arc::new(|_| None),
        )
    }

    /// [`Self::start_with_long`] where job `i` is posted as tenant `tenant(i)` when that is
    /// `Some`.
    pub fn start_shaped(
        client: &ApiClient,
        prefix: &str,
        jobs: usize,
        over: Duration,
        replay_every: usize,
        long: LongTexts,
        tenant: TenantOf,
    ) -> Load {
        let next = Arc::new(AtomicUsize::new(0));
        let interval = over / u32::try_from(jobs.max(1)).expect("job count");
        let start = tokio::time::Instant::now();
        let mut tasks = JoinSet::new();
        for _ in 0..CLIENTS {
            let (client, next, prefix) = (client.clone(), next.clone(), prefix.to_owned());
            let (long, tenant) = (long.clone(), tenant.clone());
            tasks.spawn(async move {
                let mut accepted = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= jobs {
                        return accepted;
                    }
                    tokio::time::sleep_until(start + interval * u32::try_from(i).unwrap()).await;
                    let key = format!("{prefix}-{i:05}");
                    let client = match tenant(i) {
                        Some(name) => client.as_tenant(name),
                        None => client.clone(),
                    };
                    let body = match long(i) {
                        Some(bytes) => client.long_body_for(&key, bytes),
                        None => client.body_for(&key),
                    };
                    let first = client.submit_body(&key, &body).await;
                    if replay_every > 0 && i % replay_every == 0 {
                        let again = client.submit_body(&key, &body).await;
                        assert_eq!(again.job_id, first.job_id, "replay of {key}");
                        accepted.push(again);
                    }
                    accepted.push(first);
                }
            });
        }
        Load { tasks }
    }

    /// Wait for every submission to be accepted (a panic in a client task fails the test).
    pub async fn finish(mut self) -> Vec<Accepted> {
        let mut all = Vec::new();
        while let Some(result) = self.tasks.join_next().await {
            match result {
                Ok(accepted) => all.extend(accepted),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("client task: {e}"),
            }
        }
        all
    }
}
