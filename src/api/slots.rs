//! The connections one listener serves at once: at most `SUMMARYD_API_MAX_CONNECTIONS`,
//! because each costs actix's read buffer (see `config::api`). A connection that holds a
//! slot without using it must not keep a newcomer out, so a newcomer at the cap makes room:
//! it closes the connection stalled longest in a partial head, else the one idle longest
//! between requests; only when every slot is inside a request (or idle for less than
//! [`IDLE_GRACE`]) does it wait, holding nothing but its socket.
//!
//! Each connection publishes its state in one atomic word that its own IO wrapper writes
//! (a couple of stores per request, no lock); the registry's lock is taken only when a
//! connection arrives, leaves or is chosen to leave.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;
use tokio::time::Instant;

/// An idle connection (a new one before its first byte, or one between requests) is not
/// closed for a newcomer before it has been idle this long: a client's head follows its
/// connect or its previous response within a round trip, so closing a younger one would
/// race with a request already on its way.
pub(crate) const IDLE_GRACE: Duration = Duration::from_millis(250);
/// How often a newcomer at the cap looks again for a connection to close while none
/// qualifies (every slot inside a request or idle within the grace).
const RECHECK: Duration = Duration::from_millis(50);
/// Tries to mark a victim whose state keeps changing under the chooser, before waiting.
const MARK_TRIES: usize = 4;

/// A connection's phase, as the chooser sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Its head is complete and its response not begun: never closed for a newcomer.
    InRequest,
    /// Waiting for a head of which nothing has arrived.
    Idle,
    /// Waiting for the rest of a head that has begun.
    Stalled,
}

/// What one connection's word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub phase: Phase,
    /// Milliseconds since the registry's start at which it began waiting for its head.
    pub since_ms: u64,
    /// Already chosen to make room.
    pub evicted: bool,
}

const PHASE_BITS: u64 = 0b11;
const EVICTED: u64 = 0b100;
const SINCE_SHIFT: u32 = 3;

impl Seen {
    fn word(self) -> u64 {
        let phase = match self.phase {
            Phase::InRequest => 0,
            Phase::Idle => 1,
            Phase::Stalled => 2,
        };
        (self.since_ms << SINCE_SHIFT) | phase | if self.evicted { EVICTED } else { 0 }
    }

    fn of(word: u64) -> Self {
        Self {
            phase: match word & PHASE_BITS {
                1 => Phase::Idle,
                2 => Phase::Stalled,
                _ => Phase::InRequest,
            },
            since_ms: word >> SINCE_SHIFT,
            evicted: word & EVICTED != 0,
        }
    }
}

/// The connection to close for a newcomer among `(index, state)`: the one stalled longest
/// in a partial head; else the one idle longest, if for at least `grace_ms`; never one
/// inside a request or already chosen.
pub(crate) fn choose_victim(
    now_ms: u64,
    grace_ms: u64,
    conns: impl IntoIterator<Item = (usize, Seen)>,
) -> Option<usize> {
    conns
        .into_iter()
        .filter(|(_, s)| !s.evicted)
        .filter_map(|(i, s)| {
            let class = match s.phase {
                Phase::InRequest => return None,
                Phase::Stalled => 0,
                Phase::Idle if now_ms.saturating_sub(s.since_ms) >= grace_ms => 1,
                Phase::Idle => return None,
            };
            Some(((class, s.since_ms), i))
        })
        .min()
        .map(|(_, i)| i)
}

/// One connection's published state, and how to wake it when it is chosen.
#[derive(Debug, Default)]
struct Slot {
    word: AtomicU64,
    waker: AtomicWaker,
}

#[derive(Debug, Default)]
struct Inner {
    conns: Vec<Option<Arc<Slot>>>,
    free: Vec<usize>,
    live: usize,
    /// A chosen connection has not left yet: newcomers wait for it rather than choose
    /// another, so one arrival closes at most one connection.
    evicting: bool,
}

/// The slots of one listener; shared by its worker threads.
#[derive(Debug)]
pub(crate) struct Slots {
    cap: usize,
    epoch: Instant,
    inner: Mutex<Inner>,
    /// A slot was freed, or a chosen connection declined to leave.
    changed: Notify,
}

impl Slots {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            epoch: Instant::now(),
            inner: Mutex::new(Inner::default()),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The lock guards plain bookkeeping that a panic cannot leave half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Milliseconds from the registry's start to `at`.
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// A slot for a new connection, once there is room; `None` if there is none by
    /// `deadline` (the connection's first head deadline).
    pub(crate) async fn admit(self: &Arc<Self>, deadline: Instant) -> Option<Ticket> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(ticket) = self.try_admit() {
                return Some(ticket);
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(RECHECK) => {}
                () = tokio::time::sleep_until(deadline) => return None,
            }
        }
    }

    fn try_admit(self: &Arc<Self>) -> Option<Ticket> {
        let mut inner = self.lock();
        if inner.live < self.cap {
            let slot = Arc::new(Slot {
                word: AtomicU64::new(
                    Seen {
                        phase: Phase::Idle,
                        // Idle from now, not from its accept: a connection that waited for
                        // its slot must not be the first one closed once it has it.
                        since_ms: self.ms(Instant::now()),
                        evicted: false,
                    }
                    .word(),
                ),
                waker: AtomicWaker::new(),
            });
            let index = match inner.free.pop() {
                Some(i) => {
                    inner.conns[i] = Some(slot.clone());
                    i
                }
                None => {
                    inner.conns.push(Some(slot.clone()));
                    inner.conns.len() - 1
                }
            };
            inner.live += 1;
            return Some(Ticket {
                slots: self.clone(),
                slot,
                index,
            });
        }
        if !inner.evicting {
            inner.evicting = self.mark_victim(&inner);
        }
        None
    }

    /// Choose a connection to close and wake it; whether one was marked.
    fn mark_victim(&self, inner: &Inner) -> bool {
        let now = self.ms(Instant::now());
        let grace = u64::try_from(IDLE_GRACE.as_millis()).unwrap_or(u64::MAX);
        for _ in 0..MARK_TRIES {
            let words: Vec<(usize, u64)> = inner
                .conns
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.as_ref()?.word.load(Ordering::SeqCst))))
                .collect();
            let seen = words.iter().map(|&(i, w)| (i, Seen::of(w)));
            let Some(victim) = choose_victim(now, grace, seen) else {
                return false;
            };
            let Some(slot) = inner.conns[victim].as_ref() else {
                return false;
            };
            let Some(&(_, word)) = words.iter().find(|(i, _)| *i == victim) else {
                return false;
            };
            // Only if it has not moved on (into a request) since it was looked at.
            if slot
                .word
                .compare_exchange(word, word | EVICTED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                slot.waker.wake();
                return true;
            }
        }
        false
    }

    fn release(&self, index: usize, slot: &Slot) {
        let mut inner = self.lock();
        if inner.conns.get(index).is_some_and(Option::is_some) {
            inner.conns[index] = None;
            inner.free.push(index);
            inner.live -= 1;
        }
        if Seen::of(slot.word.load(Ordering::SeqCst)).evicted {
            inner.evicting = false;
        }
        drop(inner);
        self.changed.notify_waiters();
    }

    /// A chosen connection received a whole head before it could leave: it stays, and
    /// the newcomer chooses again.
    fn declined(&self) {
        self.lock().evicting = false;
        self.changed.notify_waiters();
    }

    /// Connections holding a slot.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.lock().live
    }
}

/// A connection's slot: it publishes the connection's state, and frees the slot when
/// dropped (when the connection is).
#[derive(Debug)]
pub(crate) struct Ticket {
    slots: Arc<Slots>,
    slot: Arc<Slot>,
    index: usize,
}

impl Ticket {
    /// The connection waits for a head since `since`: `started` once part of it arrived.
    /// A choice to close it stands.
    pub(crate) fn awaiting(&self, since: Instant, started: bool) {
        let next = Seen {
            phase: if started { Phase::Stalled } else { Phase::Idle },
            since_ms: self.slots.ms(since),
            evicted: false,
        }
        .word();
        let _ = self
            .slot
            .word
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                Some(next | (w & EVICTED))
            });
    }

    /// The connection is inside a request. If it had been chosen to make room, the choice
    /// is withdrawn: a request in progress is never cut for a newcomer.
    pub(crate) fn in_request(&self) {
        let before = self.slot.word.swap(
            Seen {
                phase: Phase::InRequest,
                since_ms: 0,
                evicted: false,
            }
            .word(),
            Ordering::SeqCst,
        );
        if Seen::of(before).evicted {
            self.slots.declined();
        }
    }

    /// Chosen to make room; `waker` is woken when that happens later.
    pub(crate) fn evicted(&self, waker: &Waker) -> bool {
        self.slot.waker.register(waker);
        Seen::of(self.slot.word.load(Ordering::SeqCst)).evicted
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.slots.release(self.index, &self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(phase: Phase, since_ms: u64) -> Seen {
        Seen {
            phase,
            since_ms,
            evicted: false,
        }
    }

    #[test]
    fn the_word_holds_phase_time_and_choice() {
        for phase in [Phase::InRequest, Phase::Idle, Phase::Stalled] {
            for since_ms in [0, 1, 7, 1 << 40] {
                for evicted in [false, true] {
                    let s = Seen {
                        phase,
                        since_ms,
                        evicted,
                    };
                    assert_eq!(Seen::of(s.word()), s);
                }
            }
        }
    }

    #[test]
    fn a_stalled_head_goes_first_then_the_longest_idle_never_a_request() {
        let now = 10_000;
        let grace = 250;
        let conns = [
            (0, seen(Phase::InRequest, 0)),
            (1, seen(Phase::Idle, 1_000)),
            (2, seen(Phase::Stalled, 9_000)),
            (3, seen(Phase::Stalled, 8_000)),
            (4, seen(Phase::Idle, 500)),
        ];
        // The stalled head waiting longest, though idle ones wait longer.
        assert_eq!(choose_victim(now, grace, conns), Some(3));
        // Without stalled heads: the longest idle.
        assert_eq!(
            choose_victim(now, grace, [conns[0], conns[1], conns[4]]),
            Some(4)
        );
        assert_eq!(choose_victim(now, grace, [conns[1], conns[0]]), Some(1));
        // A stalled head of any age beats an old idle connection.
        assert_eq!(
            choose_victim(now, grace, [conns[4], (5, seen(Phase::Stalled, now))]),
            Some(5)
        );
        // Requests in progress are never chosen.
        assert_eq!(choose_victim(now, grace, [conns[0]]), None);
        assert_eq!(choose_victim(now, grace, []), None);
    }

    #[test]
    fn idle_connections_within_the_grace_and_chosen_ones_are_spared() {
        let grace = 250;
        let idle = |i, since| (i, seen(Phase::Idle, since));
        assert_eq!(choose_victim(1_000, grace, [idle(0, 751)]), None);
        assert_eq!(choose_victim(1_000, grace, [idle(0, 750)]), Some(0));
        // A clock read before the connection's own (another thread) is not an underflow.
        assert_eq!(choose_victim(1_000, grace, [idle(0, 1_200)]), None);
        let chosen = Seen {
            evicted: true,
            ..seen(Phase::Stalled, 0)
        };
        assert_eq!(choose_victim(1_000, grace, [(0, chosen)]), None);
        assert_eq!(
            choose_victim(1_000, grace, [(0, chosen), idle(1, 0)]),
            Some(1)
        );
    }

    #[tokio::test]
    async fn a_newcomer_at_the_cap_closes_the_stalled_connection_and_waits_for_a_request() {
        let slots = Slots::new(2);
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        let a = slots.admit(deadline).await.unwrap();
        let b = slots.admit(deadline).await.unwrap();
        a.in_request();
        b.awaiting(now, true);
        assert_eq!(slots.live(), 2);

        let waker = futures_util::task::noop_waker();
        let newcomer = tokio::spawn({
            let slots = slots.clone();
            async move { slots.admit(deadline).await }
        });
        // The stalled one is chosen; the one inside a request is not.
        while !b.evicted(&waker) {
            tokio::task::yield_now().await;
        }
        assert!(!a.evicted(&waker));
        assert_eq!(slots.live(), 2, "the cap holds until the chosen one leaves");
        drop(b);
        let c = newcomer.await.unwrap().unwrap();
        assert_eq!(slots.live(), 2);

        // Now nothing can be closed (a request and a new idle one within the grace): the
        // next newcomer waits, and gives up at its deadline.
        let t = Instant::now();
        let late = slots.admit(t + Duration::from_millis(100)).await;
        assert!(late.is_none());
        assert!(!a.evicted(&waker) && !c.evicted(&waker));
        drop((a, c));
        assert_eq!(slots.live(), 0);
    }

    #[tokio::test]
    async fn a_chosen_connection_that_completes_its_head_stays_and_another_is_chosen() {
        let slots = Slots::new(2);
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        let a = slots.admit(deadline).await.unwrap();
        let b = slots.admit(deadline).await.unwrap();
        a.awaiting(now, true);
        b.awaiting(now + Duration::from_millis(1), true);
        let waker = futures_util::task::noop_waker();
        let newcomer = tokio::spawn({
            let slots = slots.clone();
            async move { slots.admit(deadline).await }
        });
        while !a.evicted(&waker) {
            tokio::task::yield_now().await;
        }
        // Its head completes before it could leave: the choice is withdrawn, b goes.
        a.in_request();
        assert!(!a.evicted(&waker));
        while !b.evicted(&waker) {
            tokio::task::yield_now().await;
        }
        // More of b's response does not clear the choice.
        b.awaiting(Instant::now(), false);
        assert!(b.evicted(&waker));
        drop(b);
        let _c = newcomer.await.unwrap().unwrap();
        assert!(!a.evicted(&waker));
    }
}
