//! Whether the consumers of this process may take work: closed while a dependency a
//! delivery needs is down, so an outage of any length spends no job's deliveries
//! (`docs/delivery.md`), and while an operator has paused consumption fleet-wide
//! (`worker/pause.rs` closes it under [`PAUSED`]).
//!
//! Anything that learns a dependency is down closes the gate under the dependency's name,
//! and whatever can tell it is back opens it again: the consumer probes Postgres itself, and
//! asks the model chain whether any provider's breaker is closed (starting the probes that
//! close them). Consumers
//! check the gate before every XREADGROUP and XAUTOCLAIM, and a closed gate makes them wait
//! instead.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::Notify;

/// The dependency name under which the consumers close the gate for Postgres.
pub(crate) const POSTGRES: &str = "postgres";
/// The dependency name under which the consumers close the gate while every model
/// provider's circuit breaker is open.
pub(crate) const MODEL: &str = "model";
/// The name under which the gate is closed while consumption is paused fleet-wide
/// (`summaryd pause`): no dependency is down, an operator asked the workers to stop.
pub(crate) const PAUSED: &str = "paused";

#[derive(Debug, Default)]
pub struct DependencyGate {
    /// Dependencies that are down, with the last reason. Empty = open.
    down: Mutex<BTreeMap<&'static str, String>>,
    /// Woken whenever a dependency comes back, so waiting consumers resume at once.
    reopened: Notify,
}

impl DependencyGate {
    pub fn new() -> Self {
        Self::default()
    }

    /// `dependency` is down (or, under [`PAUSED`], consumption is paused): consumers stop
    /// taking work until it is opened again.
    pub(crate) fn close(&self, dependency: &'static str, reason: impl Into<String>) {
        let reason = reason.into();
        let newly = self.lock().insert(dependency, reason.clone()).is_none();
        if newly {
            if dependency == PAUSED {
                // An operator's decision, not an outage.
                tracing::info!(%reason, "consumption paused; consumers stop taking work (deliveries in progress finish)");
            } else {
                tracing::warn!(dependency, %reason, "dependency down; consumers stop taking work");
            }
        }
    }

    /// `dependency` answers again. Returns whether it had been down.
    pub(crate) fn open(&self, dependency: &'static str) -> bool {
        let was_down = self.lock().remove(dependency).is_some();
        if was_down {
            if dependency == PAUSED {
                tracing::info!("consumption resumed; consumers take work again");
            } else {
                tracing::info!(dependency, "dependency back; consumers resume");
            }
            self.reopened.notify_waiters();
        }
        was_down
    }

    pub(crate) fn is_down(&self, dependency: &str) -> bool {
        self.lock().contains_key(dependency)
    }

    /// The dependencies that are down, with why; empty when work may be taken.
    pub fn down(&self) -> Vec<(&'static str, String)> {
        self.lock()
            .iter()
            .map(|(name, reason)| (*name, reason.clone()))
            .collect()
    }

    /// Resolves when any dependency is opened again.
    pub(crate) async fn reopened(&self) {
        self.reopened.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, String>> {
        // The map stays consistent even if a holder panicked: every update is one call.
        self.down
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_until_every_dependency_is_back() {
        let gate = DependencyGate::new();
        assert!(gate.down().is_empty());
        gate.close(POSTGRES, "connection refused");
        gate.close(MODEL, "every provider's breaker is open");
        assert!(!gate.open("redis"), "was never down");
        assert!(gate.open(POSTGRES));
        assert_eq!(gate.down().len(), 1);
        assert!(gate.is_down(MODEL));
        assert!(gate.open(MODEL));
        assert!(gate.down().is_empty());
    }

    #[test]
    fn a_pause_is_one_more_reason_to_stay_closed() {
        let gate = DependencyGate::new();
        gate.close(PAUSED, "paused by cli:ops@host");
        gate.close(MODEL, "every provider's breaker is open");
        assert!(
            gate.open(MODEL),
            "the model coming back does not end the pause"
        );
        assert_eq!(gate.down(), [(PAUSED, "paused by cli:ops@host".to_owned())]);
        assert!(gate.open(PAUSED));
        assert!(gate.down().is_empty());
    }
}
