//! Runs long-lived role tasks: a task that fails or panics is logged and restarted with
//! backoff; on shutdown each gets the grace period to finish, then is aborted.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::resilience::backoff::{Backoff, Jitter};
use crate::shutdown::Shutdown;

/// From 200 ms, doubling per consecutive failure, up to 30 s, so a dependency that comes back
/// is used again within half a minute. No jitter: each task restarts on its own schedule.
const RESTART: Backoff = Backoff::new(
    Duration::from_millis(200),
    Duration::from_secs(30),
    Jitter::None,
);
/// A task that ran this long before failing is considered to have been healthy:
/// its next failure starts the backoff from the beginning.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

pub(crate) struct Supervisor {
    tasks: JoinSet<()>,
    shutdown: Shutdown,
}

impl Supervisor {
    pub fn new(shutdown: Shutdown) -> Self {
        Self {
            tasks: JoinSet::new(),
            shutdown,
        }
    }

    /// Supervise `make()`: start it, and start it again whenever it fails, panics or
    /// returns before shutdown.
    pub(crate) fn spawn<F, Fut, E>(&mut self, name: String, make: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let mut failures: u32 = 0;
            loop {
                let started = Instant::now();
                // A nested task turns a panic into a JoinError instead of killing the loop;
                // the guard aborts it if this loop is itself aborted at the end of `drain`.
                let mut inner = AbortOnDrop(tokio::spawn(make()));
                let outcome = (&mut inner.0).await;
                if shutdown.is_triggered() {
                    if let Ok(Err(e)) = outcome {
                        warn!(task = %name, error = %e, "task failed during shutdown");
                    }
                    return;
                }
                match outcome {
                    Ok(Ok(())) => warn!(task = %name, "task returned before shutdown; restarting"),
                    Ok(Err(e)) => error!(task = %name, error = %e, "task failed; restarting"),
                    Err(e) => error!(task = %name, error = %e, "task panicked; restarting"),
                }
                if started.elapsed() >= HEALTHY_RUN {
                    failures = 0;
                }
                let delay = RESTART.delay(failures);
                failures = failures.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait() => return,
                }
            }
        });
    }

    /// Wait for every task to finish after shutdown was triggered; abort what is still
    /// running after `grace`. Work a task abandons stays pending (stream) or leased
    /// (outbox) and is picked up again: nothing is lost, at worst done twice, idempotently.
    pub(crate) async fn drain(mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(_)) => continue,
                Ok(None) => {
                    info!("all tasks stopped");
                    return;
                }
                Err(_) => {
                    warn!(
                        remaining = self.tasks.len(),
                        "grace period over; aborting tasks"
                    );
                    self.tasks.shutdown().await;
                    return;
                }
            }
        }
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_until_shutdown() {
        let shutdown = Shutdown::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut sup = Supervisor::new(shutdown.clone());
        let counter = runs.clone();
        sup.spawn("flaky".into(), move || {
            let counter = counter.clone();
            async move {
                if counter.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("boom");
                }
                std::future::pending::<()>().await;
                Ok::<(), String>(())
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a healthy run"
        );
        shutdown.trigger();
        // The healthy run never returns by itself: drain must abort it after the grace period.
        sup.drain(Duration::from_secs(1)).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "no restart after drain");
    }
}
