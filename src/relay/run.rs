//! The relay task: pass after pass until shutdown.

use std::time::Duration;

use tracing::{Instrument, info, info_span, warn};

use super::RelayError;
use super::backoff::jittered_backoff;
use super::pass::relay_pass;
use crate::context::Services;
use crate::shutdown::Shutdown;

/// Ceiling for the wait after database errors: Postgres restarting or failing over takes
/// seconds to a minute; polling it faster helps nobody, and 30 s bounds how late the relay
/// notices it is back.
const DB_BACKOFF_MAX_MS: u64 = 30_000;

/// Drain the outbox until `shutdown`. `name` identifies this task in logs.
///
/// A full batch with no transient failures means more rows are probably due, so the next
/// pass starts at once; otherwise the task waits `relay.poll_ms`. Database errors back off
/// exponentially instead of spinning. On shutdown no new batch is claimed; the sends of the
/// current pass finish (each is capped by the mail timeout, well inside the drain grace).
pub async fn run(services: Services, name: String, shutdown: Shutdown) -> Result<(), RelayError> {
    let span = info_span!("relay", relay = %name);
    drive(services, shutdown).instrument(span).await
}

async fn drive(services: Services, shutdown: Shutdown) -> Result<(), RelayError> {
    let relay = services.settings.relay.clone();
    let poll = Duration::from_millis(relay.poll_ms);
    let mut db_failures: i32 = 0;
    info!("outbox relay started");
    while !shutdown.is_triggered() {
        let wait = match relay_pass(&services).await {
            Ok(report) => {
                if db_failures > 0 {
                    info!("outbox relay reconnected to the database");
                }
                db_failures = 0;
                let full = i64::try_from(report.claimed).unwrap_or(i64::MAX) >= relay.batch;
                if full && report.retrying == 0 {
                    continue;
                }
                poll
            }
            Err(e) => {
                let wait = jittered_backoff(db_failures, relay.poll_ms, DB_BACKOFF_MAX_MS);
                db_failures = db_failures.saturating_add(1);
                warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "outbox relay pass failed");
                wait
            }
        };
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    info!("outbox relay stopped");
    Ok(())
}
