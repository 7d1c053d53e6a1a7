//! The mail provider's breaker: one per process, shared by its relay tasks.
//!
//! A provider that refuses our credentials or our URL (HTTP 401/403/404, SMTP 530/535)
//! refuses every row alike, so sending the rest of the outbox would only repeat the refusal
//! once per row per backoff. The first such answer opens the breaker: the relay tasks stop
//! claiming rows, and after a cooldown one pass sends one due row as the probe (a mail API
//! has no standard health endpoint; a real row is a request the provider must answer the
//! way it will answer the rest). The probe's outcome decides; while probes keep being
//! refused, the cooldown grows from `SUMMARYD_RELAY_BACKOFF_MS` to at most
//! `SUMMARYD_RELAY_MAX_BACKOFF_MS`, like a row's backoff: a token expired overnight costs a
//! probe every few minutes, and its renewal is noticed within one such wait.
//!
//! The state machine is the shared breaker's (`resilience/breaker.rs`); this gives the relay
//! its view of it. Every method takes the current instant, so the tests drive the clock, and
//! the pass (`pass.rs`) does the logging and the metrics.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::RelaySettings;
use crate::resilience::backoff::{Backoff, Jitter};
pub(crate) use crate::resilience::breaker::ProbeTicket;
use crate::resilience::breaker::{Breaker, NoProbe};

/// What one relay pass may do now.
#[derive(Debug)]
pub(crate) enum Admission<'a> {
    /// The provider is not known to be misconfigured: claim a full batch.
    Claim,
    /// Send one row as the probe, and hand its outcome to the ticket. Dropped without a
    /// verdict (no due row to probe with, the pass failed or was cancelled, the probe row
    /// said nothing about the provider), it frees the slot without changing the wait.
    Probe(ProbeTicket<'a>),
    /// Claim nothing; the next probe may start in `probe_in` (`None` while another task's
    /// probe runs).
    Paused { probe_in: Option<Duration> },
}

/// Only a misconfiguration answer opens it ([`MailBreaker::trip`]): a row's transient
/// failures are that row's backoff, not a pause of the relay.
#[derive(Debug)]
pub struct MailBreaker {
    breaker: Breaker,
}

impl MailBreaker {
    pub fn new(relay: &RelaySettings) -> Self {
        // Equal jitter: the relays of every process saw the same refusal at the same time,
        // and should not all probe in the same instant.
        Self::with_cooldown(Backoff::new(
            relay.backoff,
            relay.max_backoff,
            Jitter::Equal,
        ))
    }

    fn with_cooldown(cooldown: Backoff) -> Self {
        Self {
            breaker: Breaker::new(1, cooldown),
        }
    }

    pub(crate) fn admit(&self, now: Instant) -> Admission<'_> {
        match self.breaker.try_probe(now) {
            Ok(ticket) => Admission::Probe(ticket),
            Err(NoProbe::Closed) => Admission::Claim,
            Err(NoProbe::Running) => Admission::Paused { probe_in: None },
            Err(NoProbe::CoolingDown { probe_in }) => Admission::Paused {
                probe_in: Some(probe_in),
            },
        }
    }

    /// A send outside a probe was refused as misconfigured. Returns whether this opened the
    /// breaker (sends that were under way when it opened change nothing).
    pub(crate) fn trip(&self, now: Instant, reason: &str) -> bool {
        self.breaker.trip(now, reason).is_some()
    }

    /// Why the breaker is open, or `None` while it is closed.
    pub fn open_reason(&self) -> Option<String> {
        self.breaker.open_reason()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn breaker() -> MailBreaker {
        MailBreaker::with_cooldown(Backoff::new(S, 4 * S, Jitter::None))
    }

    fn paused_for(b: &MailBreaker, now: Instant) -> Option<Duration> {
        match b.admit(now) {
            Admission::Paused { probe_in } => probe_in,
            other => panic!("not paused: {other:?}"),
        }
    }

    #[test]
    fn closed_claims_and_one_refusal_pauses_until_the_cooldown() {
        let t0 = Instant::now();
        let b = breaker();
        assert!(matches!(b.admit(t0), Admission::Claim));
        assert_eq!(b.open_reason(), None);
        assert!(b.trip(t0, "mail API answered 401: expired"));
        assert!(!b.trip(t0, "a send under way"), "already open");
        assert_eq!(
            b.open_reason().as_deref(),
            Some("mail API answered 401: expired")
        );
        assert_eq!(paused_for(&b, t0), Some(S));
        assert_eq!(paused_for(&b, t0 + S / 2), Some(S / 2));
    }

    #[test]
    fn one_probe_at_a_time_and_a_passed_probe_closes() {
        let t0 = Instant::now();
        let b = breaker();
        b.trip(t0, "401");
        let Admission::Probe(ticket) = b.admit(t0 + S) else {
            panic!("the probe is due")
        };
        assert_eq!(
            paused_for(&b, t0 + S),
            None,
            "the other tasks wait for the running probe"
        );
        ticket.passed();
        assert!(matches!(b.admit(t0 + S), Admission::Claim));
        assert_eq!(b.open_reason(), None);
    }

    #[test]
    fn refused_probes_grow_the_cooldown_up_to_the_cap() {
        let t0 = Instant::now();
        let b = breaker();
        b.trip(t0, "401");
        let mut now = t0;
        let mut waits = Vec::new();
        for n in 0..5 {
            let wait = paused_for(&b, now).expect("no probe runs");
            waits.push(wait);
            now += wait;
            let Admission::Probe(ticket) = b.admit(now) else {
                panic!("probe {n} is due")
            };
            ticket.failed(now, &format!("401 #{n}"));
        }
        assert_eq!(waits, [S, 2 * S, 4 * S, 4 * S, 4 * S]);
        assert_eq!(
            b.open_reason().as_deref(),
            Some("401 #4"),
            "the latest refusal"
        );
    }

    #[test]
    fn a_probe_without_a_verdict_frees_the_slot_without_changing_the_wait() {
        let t0 = Instant::now();
        let b = breaker();
        b.trip(t0, "401");
        drop(b.admit(t0 + S));
        assert!(
            matches!(b.admit(t0 + S), Admission::Probe(_)),
            "free again, and still due"
        );
        assert!(b.open_reason().is_some());
    }
}
