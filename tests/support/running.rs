//! An application serving on its own tokio task, for tests that talk to it over real HTTP:
//! started from a built `Application`, stopped with the shutdown signal and expected to exit
//! cleanly within its grace period.

use std::time::Duration;

use summaryd::app::{Application, StartError};
use summaryd::shutdown::Shutdown;

pub struct Running {
    /// `http://127.0.0.1:<port>` of its listener.
    pub base: String,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), StartError>>,
}

impl Running {
    pub fn start(app: Application) -> Running {
        let base = format!("http://127.0.0.1:{}", app.port());
        let shutdown = Shutdown::new();
        let task = tokio::spawn(app.run(shutdown.clone()));
        Running {
            base,
            shutdown,
            task,
        }
    }

    /// Trigger shutdown and wait for a clean exit.
    pub async fn stop(self) {
        self.shutdown.trigger();
        let result = tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("app stops within the grace period")
            .expect("app task did not panic");
        assert!(result.is_ok(), "clean exit: {result:?}");
    }
}
