//! A circuit breaker in front of one outside provider: closed while calls pass, open after
//! `threshold` transient failures in a row or at once when the provider refuses us as
//! misconfigured ([`Breaker::trip`]), and closed again only by a probe that passes.
//!
//! An open breaker lets no call through. After a cooldown, taken from a [`Backoff`] by the
//! number of probes failed since it opened, exactly one probe is let through; its result
//! decides. The model providers (`llm/breaker.rs`) and the mail provider
//! (`relay/mail_breaker.rs`) each build one with their own threshold and cooldown.
//!
//! The state is pure: every method takes the current instant, so the tests drive the clock
//! and the owner does the logging and the metrics.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::resilience::backoff::Backoff;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls pass; `failures` transient failures in a row so far.
    Closed { failures: u32 },
    /// No call reaches the provider. The next probe may start at `probe_at`; `probes_failed`
    /// probes have failed since it opened; `probing` while one runs.
    Open {
        since: Instant,
        probe_at: Instant,
        probes_failed: u32,
        probing: bool,
        /// A confirmation probe found the provider down since it opened: the next caller
        /// that asks takes that answer instead of probing again.
        confirmed_down: bool,
        reason: String,
    },
}

/// A change of state the caller should log and export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Opened { reason: String },
    Closed,
}

/// Why [`Breaker::try_probe`] gave no ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoProbe {
    /// Calls pass: there is nothing to probe.
    Closed,
    /// Another probe runs; its result decides.
    Running,
    /// The cooldown is not over: the probe may start in `probe_in`.
    CoolingDown { probe_in: Duration },
}

/// Permission to run the one probe of an open breaker; hand it back with the result.
/// Dropped without a result (the probing task was cancelled, or had nothing to probe with),
/// it frees the slot without changing the wait.
#[derive(Debug)]
pub(crate) struct ProbeTicket<'a> {
    breaker: &'a Breaker,
    done: bool,
}

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Backoff,
    state: Mutex<BreakerState>,
}

impl Breaker {
    /// Opens on the `threshold`-th transient failure in a row (0 counts as 1); a breaker
    /// only [`trip`](Self::trip) opens takes 1. The wait before the probe after `n` failed
    /// probes is `cooldown.delay(n)`.
    pub(crate) fn new(threshold: u32, cooldown: Backoff) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            state: Mutex::new(BreakerState::Closed { failures: 0 }),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.lock().clone()
    }

    pub(crate) fn is_open(&self) -> bool {
        matches!(*self.lock(), BreakerState::Open { .. })
    }

    /// Why the breaker is open, or `None` while it is closed.
    pub(crate) fn open_reason(&self) -> Option<String> {
        match &*self.lock() {
            BreakerState::Closed { .. } => None,
            BreakerState::Open { reason, .. } => Some(reason.clone()),
        }
    }

    /// A call passed: the run of failures is over.
    pub(crate) fn record_success(&self) -> Option<Transition> {
        let mut state = self.lock();
        let was_open = matches!(*state, BreakerState::Open { .. });
        *state = BreakerState::Closed { failures: 0 };
        was_open.then_some(Transition::Closed)
    }

    /// A call failed in a way a later call may not (the provider is down, slow or
    /// rate-limiting). Opens the breaker on the `threshold`-th failure in a row.
    pub(crate) fn record_transient_failure(
        &self,
        now: Instant,
        reason: &str,
    ) -> Option<Transition> {
        let mut state = self.lock();
        match &mut *state {
            BreakerState::Closed { failures } => {
                *failures = failures.saturating_add(1);
                if *failures >= self.threshold {
                    let reason = format!(
                        "{} consecutive transient failures; last: {reason}",
                        *failures
                    );
                    *state = self.opened(now, 0, reason.clone());
                    return Some(Transition::Opened { reason });
                }
                None
            }
            // Calls that started before it opened may still fail; they change nothing.
            BreakerState::Open { .. } => None,
        }
    }

    /// The provider refused a call as misconfigured: open at once, with `reason` as given.
    /// Calls that were under way when it opened change nothing.
    pub(crate) fn trip(&self, now: Instant, reason: &str) -> Option<Transition> {
        let mut state = self.lock();
        if matches!(*state, BreakerState::Open { .. }) {
            return None;
        }
        *state = self.opened(now, 0, reason.to_owned());
        Some(Transition::Opened {
            reason: reason.to_owned(),
        })
    }

    /// Whether an open breaker's cooldown has passed and no probe runs: a probe may start.
    pub(crate) fn probe_is_due(&self, now: Instant) -> bool {
        matches!(&*self.lock(), BreakerState::Open { probe_at, probing, .. } if !*probing && now >= *probe_at)
    }

    /// The one probe of an open breaker whose cooldown has passed, if none runs yet.
    pub(crate) fn begin_probe(&self, now: Instant) -> Option<ProbeTicket<'_>> {
        self.try_probe(now).ok()
    }

    /// [`begin_probe`](Self::begin_probe), saying why there is no ticket: one look at the
    /// state, so a caller that waits when it gets none waits for what was true then.
    pub(crate) fn try_probe(&self, now: Instant) -> Result<ProbeTicket<'_>, NoProbe> {
        let mut state = self.lock();
        match &mut *state {
            BreakerState::Closed { .. } => Err(NoProbe::Closed),
            BreakerState::Open { probing: true, .. } => Err(NoProbe::Running),
            BreakerState::Open { probe_at, .. } if now < *probe_at => Err(NoProbe::CoolingDown {
                probe_in: probe_at.saturating_duration_since(now),
            }),
            BreakerState::Open { probing, .. } => {
                *probing = true;
                Ok(self.ticket())
            }
        }
    }

    /// Permission to probe an open breaker now, cooldown or not, if no probe runs: a caller's
    /// own calls just opened it, and whether that was the provider or the caller only a probe
    /// can tell. Its failure keeps the schedule ([`ProbeTicket::failed`] would grow it).
    /// `None` while a probe runs, and once a confirmation found the provider down since it
    /// opened (one confirmation per opening, however many callers ask).
    pub(crate) fn begin_confirmation(&self) -> Option<ProbeTicket<'_>> {
        let mut state = self.lock();
        match &mut *state {
            BreakerState::Open {
                probing,
                confirmed_down,
                ..
            } if !*probing && !*confirmed_down => {
                *probing = true;
                Some(self.ticket())
            }
            _ => None,
        }
    }

    /// Take the state another process published for the same provider (open since
    /// `since`, next probe at `probe_at`, `probes_failed` so far): a closed breaker opens
    /// (`Some(Opened)`), an open one follows that schedule. A probe running here is left
    /// to finish; its answer decides.
    pub(crate) fn adopt_open(
        &self,
        since: Instant,
        probe_at: Instant,
        probes_failed: u32,
        reason: &str,
    ) -> Option<Transition> {
        let mut state = self.lock();
        match &mut *state {
            BreakerState::Closed { .. } => {
                *state = BreakerState::Open {
                    since,
                    probe_at,
                    probes_failed,
                    probing: false,
                    confirmed_down: false,
                    reason: reason.to_owned(),
                };
                Some(Transition::Opened {
                    reason: reason.to_owned(),
                })
            }
            BreakerState::Open { probing: true, .. } => None,
            BreakerState::Open {
                probe_at: at,
                probes_failed: failed,
                ..
            } => {
                *at = probe_at;
                *failed = probes_failed;
                None
            }
        }
    }

    /// Whether a probe of the open breaker runs right now.
    pub(crate) fn is_probing(&self) -> bool {
        matches!(&*self.lock(), BreakerState::Open { probing: true, .. })
    }

    fn ticket(&self) -> ProbeTicket<'_> {
        ProbeTicket {
            breaker: self,
            done: false,
        }
    }

    fn probe_failed(&self, now: Instant, reason: &str) {
        let mut state = self.lock();
        if let BreakerState::Open {
            since,
            probes_failed,
            confirmed_down,
            ..
        } = &*state
        {
            let (since, failed) = (*since, probes_failed.saturating_add(1));
            let confirmed = *confirmed_down;
            let mut next = self.opened(now, failed, reason.to_owned());
            if let BreakerState::Open {
                since: s,
                confirmed_down: c,
                ..
            } = &mut next
            {
                *s = since;
                *c = confirmed;
            }
            *state = next;
        }
    }

    fn probe_abandoned(&self) {
        if let BreakerState::Open { probing, .. } = &mut *self.lock() {
            *probing = false;
        }
    }

    /// Open since `now` (or earlier), probing after the cooldown for `probes_failed`.
    fn opened(&self, now: Instant, probes_failed: u32, reason: String) -> BreakerState {
        BreakerState::Open {
            since: now,
            probe_at: now + self.cooldown.delay(probes_failed),
            probes_failed,
            probing: false,
            confirmed_down: false,
            reason,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BreakerState> {
        // Every update is one assignment under the lock: a panicking holder cannot tear it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ProbeTicket<'_> {
    /// The probe passed: the breaker closes.
    pub(crate) fn passed(mut self) -> Option<Transition> {
        self.done = true;
        self.breaker.record_success()
    }

    /// The probe failed: the breaker stays open, and the next probe waits longer.
    pub(crate) fn failed(mut self, now: Instant, reason: &str) {
        self.done = true;
        self.breaker.probe_failed(now, reason);
    }

    /// Someone else makes this probe (another process holds the fleet's probe): the breaker
    /// stays open, asks again at `probe_at`, and its cooldown does not grow.
    pub(crate) fn postpone(mut self, probe_at: Instant) {
        self.done = true;
        if let BreakerState::Open {
            probing,
            probe_at: at,
            ..
        } = &mut *self.breaker.lock()
        {
            *probing = false;
            *at = probe_at;
        }
    }

    /// A confirmation failed: the breaker stays open on the schedule it opened with.
    pub(crate) fn still_down(mut self) {
        self.done = true;
        if let BreakerState::Open {
            probing,
            confirmed_down,
            ..
        } = &mut *self.breaker.lock()
        {
            *probing = false;
            *confirmed_down = true;
        }
    }
}

impl Drop for ProbeTicket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.probe_abandoned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resilience::backoff::Jitter;

    const S: Duration = Duration::from_secs(1);

    /// A cooldown of `S` that doubles up to 8 `S`.
    fn breaker(threshold: u32) -> Breaker {
        Breaker::new(threshold, Backoff::growing(S, 8, Jitter::None))
    }

    fn probe_at(b: &Breaker) -> Instant {
        match b.state() {
            BreakerState::Open { probe_at, .. } => probe_at,
            other => panic!("not open: {other:?}"),
        }
    }

    /// Another process's published state opens a closed breaker and reschedules an open
    /// one, but never interrupts a probe running here; a postponed probe keeps the cooldown.
    #[test]
    fn an_adopted_state_opens_or_reschedules_and_a_postponed_probe_keeps_the_cooldown() {
        let t0 = Instant::now();
        let b = breaker(5);
        let opened = b.adopt_open(t0, t0 + 4 * S, 2, "503 elsewhere");
        assert_eq!(
            opened,
            Some(Transition::Opened {
                reason: "503 elsewhere".into()
            })
        );
        assert_eq!(probe_at(&b), t0 + 4 * S);
        assert_eq!(b.adopt_open(t0, t0 + 8 * S, 3, "again"), None);
        assert_eq!(probe_at(&b), t0 + 8 * S, "follows the newer schedule");
        let ticket = b.begin_probe(t0 + 8 * S).expect("due");
        assert_eq!(b.adopt_open(t0, t0 + 20 * S, 4, "x"), None);
        assert!(b.is_probing(), "a running probe is left alone");
        ticket.postpone(t0 + 9 * S);
        assert!(!b.is_probing());
        assert_eq!(probe_at(&b), t0 + 9 * S);
        // The cooldown after the next failed probe grows from the adopted count (3 → 8 S).
        let now = t0 + 9 * S;
        b.begin_probe(now).expect("due").failed(now, "503");
        assert_eq!(probe_at(&b), now + 8 * S);
    }

    #[test]
    fn opens_on_the_threshold_th_failure_in_a_row_only() {
        let t0 = Instant::now();
        let b = breaker(3);
        assert_eq!(b.record_transient_failure(t0, "503"), None);
        assert_eq!(b.record_transient_failure(t0, "503"), None);
        assert_eq!(
            b.record_success(),
            None,
            "a success while closed is no transition"
        );
        assert_eq!(b.record_transient_failure(t0, "503"), None);
        assert_eq!(b.record_transient_failure(t0, "503"), None);
        assert!(!b.is_open(), "the success reset the run");
        let opened = b.record_transient_failure(t0, "503 busy");
        match opened {
            Some(Transition::Opened { reason }) => {
                assert!(reason.contains("3 consecutive"), "{reason}");
                assert!(reason.contains("503 busy"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(b.is_open());
        assert_eq!(probe_at(&b), t0 + S);
        assert_eq!(
            b.record_transient_failure(t0, "503"),
            None,
            "late failures change nothing"
        );
        assert_eq!(probe_at(&b), t0 + S);
    }

    #[test]
    fn a_threshold_of_zero_means_one() {
        let b = breaker(0);
        assert!(b.record_transient_failure(Instant::now(), "x").is_some());
    }

    #[test]
    fn trip_opens_at_once_and_only_once() {
        let t0 = Instant::now();
        let b = breaker(5);
        assert_eq!(b.open_reason(), None);
        assert_eq!(
            b.trip(t0, "401 expired"),
            Some(Transition::Opened {
                reason: "401 expired".into()
            })
        );
        assert_eq!(b.trip(t0, "401 again"), None);
        assert_eq!(probe_at(&b), t0 + S);
        assert_eq!(b.open_reason().as_deref(), Some("401 expired"));
    }

    #[test]
    fn one_probe_after_the_cooldown_decides() {
        let t0 = Instant::now();
        let b = breaker(1);
        b.record_transient_failure(t0, "503");
        assert!(b.begin_probe(t0).is_none(), "cooldown not over");
        assert!(!b.probe_is_due(t0 + S / 2));
        assert!(b.probe_is_due(t0 + S));
        assert!(b.begin_probe(t0 + S / 2).is_none());
        let ticket = b.begin_probe(t0 + S).expect("due");
        assert!(b.begin_probe(t0 + S).is_none(), "one probe at a time");
        assert!(!b.probe_is_due(t0 + S), "one probe at a time");
        assert_eq!(ticket.passed(), Some(Transition::Closed));
        assert!(!b.is_open());
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
    }

    #[test]
    fn try_probe_says_why_there_is_no_ticket() {
        let t0 = Instant::now();
        let b = breaker(1);
        assert_eq!(b.try_probe(t0).err(), Some(NoProbe::Closed));
        b.trip(t0, "401");
        assert_eq!(
            b.try_probe(t0 + S / 4).err(),
            Some(NoProbe::CoolingDown {
                probe_in: S * 3 / 4
            })
        );
        let ticket = b.try_probe(t0 + S).expect("due");
        assert_eq!(b.try_probe(t0 + S).err(), Some(NoProbe::Running));
        drop(ticket);
        assert!(b.try_probe(t0 + S).is_ok(), "free again");
    }

    #[test]
    fn failed_probes_double_the_cooldown_up_to_the_cap() {
        let t0 = Instant::now();
        let b = breaker(1);
        b.record_transient_failure(t0, "503");
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            let at = probe_at(&b);
            waits.push(at - now);
            now = at;
            b.begin_probe(now).expect("due").failed(now, "still 503");
        }
        assert_eq!(waits, [S, 2 * S, 4 * S, 8 * S, 8 * S, 8 * S]);
        match b.state() {
            BreakerState::Open {
                since,
                probes_failed,
                reason,
                ..
            } => {
                assert_eq!(since, t0, "open since the first opening");
                assert_eq!(probes_failed, 6);
                assert_eq!(reason, "still 503");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_abandoned_probe_frees_the_slot_without_changing_the_wait() {
        let t0 = Instant::now();
        let b = breaker(1);
        b.record_transient_failure(t0, "503");
        drop(b.begin_probe(t0 + S).expect("due"));
        assert!(b.is_open());
        assert_eq!(probe_at(&b), t0 + S);
        assert!(b.begin_probe(t0 + S).is_some(), "free again");
    }

    #[test]
    fn one_confirmation_per_opening_and_it_keeps_the_schedule() {
        let t0 = Instant::now();
        let b = breaker(1);
        assert!(
            b.begin_confirmation().is_none(),
            "nothing to confirm while closed"
        );
        b.trip(t0, "403");
        let scheduled = probe_at(&b);
        let ticket = b.begin_confirmation().expect("the first confirmation");
        assert!(b.begin_confirmation().is_none(), "one at a time");
        assert!(b.is_probing());
        ticket.still_down();
        assert!(!b.is_probing());
        assert_eq!(
            probe_at(&b),
            scheduled,
            "a failed confirmation keeps the schedule"
        );
        assert!(b.begin_confirmation().is_none(), "its answer stands");
        // The scheduled probe fails: the answer still stands.
        b.begin_probe(scheduled)
            .expect("due")
            .failed(scheduled, "503");
        assert!(b.begin_confirmation().is_none());
        // Closed and opened again: a new opening gets its confirmation.
        b.record_success();
        b.trip(scheduled, "403");
        let ticket = b.begin_confirmation().expect("a new opening");
        assert_eq!(ticket.passed(), Some(Transition::Closed));
        assert!(!b.is_open());
    }

    #[test]
    fn no_probe_while_closed() {
        let b = breaker(2);
        assert!(b.begin_probe(Instant::now() + 10 * S).is_none());
    }
}
