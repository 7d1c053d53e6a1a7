//! Each model provider's circuit breaker: the shared one (`resilience/breaker.rs`), open after
//! `SUMMARYD_LLM_BREAKER_FAILURES` transient failures in a row (or at once when the provider
//! is misconfigured), with a cooldown of `SUMMARYD_LLM_BREAKER_COOLDOWN_MS` doubling while
//! probes fail, up to [`COOLDOWN_GROWTH_CAP`] times the first. The chain (`chain.rs`) runs
//! the probes and does the logging and the metrics.

use std::time::Duration;

use crate::resilience::backoff::{Backoff, Jitter};
pub use crate::resilience::breaker::{Breaker, BreakerState, Transition};

/// The cooldown grows to at most this many times the first one (30 s → 4 min by default):
/// long enough that a provider down for hours costs a probe every few minutes, short enough
/// that its recovery is noticed within minutes.
pub(crate) const COOLDOWN_GROWTH_CAP: u32 = 8;

/// One provider's breaker, from `[llm]`'s breaker settings.
pub(crate) fn for_provider(threshold: u32, cooldown: Duration) -> Breaker {
    Breaker::new(
        threshold,
        Backoff::growing(cooldown, COOLDOWN_GROWTH_CAP, Jitter::None),
    )
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_cooldown_stops_growing_at_the_cap() {
        let t0 = Instant::now();
        let b = for_provider(1, S);
        b.trip(t0, "401");
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..5 {
            let BreakerState::Open { probe_at, .. } = b.state() else {
                panic!("closed")
            };
            waits.push(probe_at - now);
            now = probe_at;
            b.begin_probe(now).expect("due").failed(now, "401");
        }
        assert_eq!(waits, [S, 2 * S, 4 * S, 8 * S, 8 * S]);
    }
}
