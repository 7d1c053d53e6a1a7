//! The one shutdown signal every long-running task watches.
//!
//! A task that sees it stops taking new work and returns once its current unit is done;
//! the supervisor bounds that with the grace period.

use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Default)]
pub struct Shutdown(CancellationToken);

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Begin shutdown; idempotent.
    pub fn trigger(&self) {
        self.0.cancel();
    }

    pub(crate) fn is_triggered(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once shutdown has begun.
    pub(crate) async fn wait(&self) {
        self.0.cancelled().await
    }
}

/// Resolves on SIGTERM or SIGINT (Kubernetes sends SIGTERM; a terminal sends SIGINT).
///
/// The handlers are installed when this is called, not when the future is first polled:
/// a SIGTERM that arrives between "summaryd started" and the first poll of a spawned
/// watcher would otherwise meet the default disposition and kill the process uncleanly.
pub fn os_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            match (term, int) {
                (Some(mut term), Some(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Some(mut only), None) | (None, Some(mut only)) => {
                    only.recv().await;
                }
                // No handler could be installed: the default disposition ends the process.
                (None, None) => std::future::pending::<()>().await,
            }
        }
    }
    #[cfg(not(unix))]
    {
        async move {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
