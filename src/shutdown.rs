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
pub async fn os_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
