//! The fleet-wide pause, as each worker process follows it: one task per process (not per
//! consumer) reads the pause from Redis every [`POLL`] and closes the process's gate under
//! [`PAUSED`] while it is set, opening it again on resume (which wakes the waiting
//! consumers at once). Consumers check the gate before every read or claim, so paused work
//! spends no deliveries, and a delivery already running finishes as usual.

use std::time::Duration;

use super::WorkerServices;
use super::consumer::WorkerError;
use super::gate::{DependencyGate, PAUSED};
use crate::domain::Pause;
use crate::shutdown::Shutdown;
use crate::stream::pause as stored;

/// How often each worker process reads the pause: a pause stops the whole fleet within
/// about this long, for one GET per process per interval, which Redis does not notice even
/// with hundreds of processes. Consumers read nothing themselves.
const POLL: Duration = Duration::from_secs(1);

/// Read the pause once and set the gate from it. Run before the consumers start, so a
/// process starting into a paused fleet takes no work. When Redis cannot say, the gate
/// closes until a read succeeds: a consumer could not take work without Redis anyway, and
/// it must not take any in a fleet that may be paused.
pub(crate) async fn sync_pause(services: &WorkerServices) {
    if let Err(e) = refresh(services).await {
        services.gate.close(
            PAUSED,
            format!("whether consumption is paused is not known yet (cannot read it: {e})"),
        );
    }
}

/// Follow the pause until shutdown. A failed read keeps the last known state: a Redis
/// outage neither resumes a paused fleet nor pauses a running one (its consumers stop on
/// their own Redis errors meanwhile). Logged once per run of failed reads.
pub(crate) async fn watch_pause(
    services: WorkerServices,
    shutdown: Shutdown,
) -> Result<(), WorkerError> {
    let mut failing = false;
    while !shutdown.is_triggered() {
        match refresh(&services).await {
            Ok(()) => {
                if failing {
                    tracing::info!("reading whether consumption is paused again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read whether consumption is paused; keeping the last known state");
                }
                failing = true;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.wait() => {}
        }
    }
    Ok(())
}

async fn refresh(services: &WorkerServices) -> Result<(), WorkerError> {
    let mut conn = services.redis.get().await?;
    let pause = stored::current(&mut conn, services.keys.global()).await?;
    apply(&services.gate, pause.as_ref());
    Ok(())
}

/// The gate's state for `pause`; the gate logs the change (once, at pause and at resume).
fn apply(gate: &DependencyGate, pause: Option<&Pause>) {
    match pause {
        Some(pause) => gate.close(PAUSED, pause.to_string()),
        None => {
            gate.open(PAUSED);
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn the_gate_follows_the_pause_and_names_who_paused() {
        let gate = DependencyGate::new();
        let pause = Pause::new("cli:ops@host", Some("incident".into()), Utc::now());
        apply(&gate, Some(&pause));
        let down = gate.down();
        assert_eq!(down.len(), 1);
        assert_eq!(down[0].0, PAUSED);
        assert!(down[0].1.contains("cli:ops@host"), "{down:?}");
        assert!(down[0].1.contains("incident"), "{down:?}");
        apply(&gate, None);
        assert!(gate.down().is_empty());
    }
}
