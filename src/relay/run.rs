//! The relay task: pass after pass until shutdown.

use std::time::Duration;

use tracing::{Instrument, info, info_span, warn};

use super::relay_pass;
use super::{RelayError, RelayServices};
use crate::resilience::backoff::{Backoff, Jitter};
use crate::shutdown::Shutdown;

/// Ceiling for the wait after database errors: Postgres restarting or failing over takes
/// seconds to a minute; polling it faster helps nobody, and 30 s bounds how late the relay
/// notices it is back.
const DB_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Drain the outbox until `shutdown`. `name` identifies this task in logs.
///
/// A full batch with no transient failures means more rows are probably due, so the next
/// pass starts at once; otherwise the task waits `relay.poll_ms`, or less while the mail
/// breaker is open and its next probe is due sooner. Database errors back off
/// exponentially instead of spinning. On shutdown no new batch is claimed; the sends of the
/// current pass finish (each is capped by the mail timeout, well inside the drain grace).
pub async fn run(
    services: RelayServices,
    name: String,
    shutdown: Shutdown,
) -> Result<(), RelayError> {
    let span = info_span!("relay", relay = %name);
    drive(services, shutdown).instrument(span).await
}

async fn drive(services: RelayServices, shutdown: Shutdown) -> Result<(), RelayError> {
    let relay = services.settings.relay.clone();
    let poll = relay.poll;
    // Equal jitter, from the poll interval: the relay tasks of every process saw the same
    // database go away, and should not all come back in the same instant.
    let db_backoff = Backoff::new(poll, DB_BACKOFF_MAX, Jitter::Equal);
    let mut db_failures: u32 = 0;
    // A process with the relay role exports the breaker's state from its start.
    let open = services.mail_breaker.open_reason();
    services.metrics.set_mail_breaker(open.as_deref());
    info!("outbox relay started");
    while !shutdown.is_triggered() {
        let wait = match relay_pass(&services).await {
            Ok(report) => {
                services.metrics.loop_succeeded("relay");
                if db_failures > 0 {
                    info!("outbox relay reconnected to the database");
                }
                db_failures = 0;
                if report.paused {
                    // A paused pass touches nothing; polling until the probe is due costs
                    // only a look at the breaker.
                    report.probe_in.map_or(poll, |due| due.min(poll))
                } else {
                    let full = i64::try_from(report.claimed).unwrap_or(i64::MAX) >= relay.batch;
                    if full && report.retrying == 0 && report.waiting == 0 {
                        continue;
                    }
                    poll
                }
            }
            Err(e) => {
                services
                    .metrics
                    .loop_failed("relay", e.kind(), &e.to_string());
                let wait = db_backoff.delay(db_failures);
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
