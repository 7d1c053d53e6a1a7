//! How long to wait before trying again: a step that doubles per failure from a base up to a
//! cap, with the jitter each caller needs. Every growing wait in summaryd comes from here
//! (model retries, outbox rows, the relay's and the consumers' error loops, task restarts,
//! the startup wait for the database).

use std::time::Duration;

/// How much of each step is left to chance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Jitter {
    /// The whole step, every time: for one task retrying on its own (a restart, a consumer's
    /// or the relay's error loop, the startup wait), where nobody retries in step with it.
    None,
    /// Uniform in `[0, step]`: callers that failed together (workers that hit the same 429)
    /// spread out as far as possible. Fits attempts bounded by a deadline, not a count.
    Full,
    /// Uniform in `[step/2, step]`. For outbox rows: full jitter may draw near-zero waits
    /// several times in a row and crowd a row's attempts into the first seconds of a provider
    /// outage; keeping half of each step spreads them over the outage, while the random half
    /// still spreads rows that failed together.
    Equal,
}

/// Exponential backoff: the step after `n` failures is `base · 2^n`, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
    pub(crate) jitter: Jitter,
}

impl Backoff {
    pub(crate) const fn new(base: Duration, max: Duration, jitter: Jitter) -> Self {
        Self { base, max, jitter }
    }

    /// From `base`, growing to at most `max_factor` times it.
    #[expect(clippy::disallowed_methods, reason = "growth is this module's job")]
    pub(crate) fn growing(base: Duration, max_factor: u32, jitter: Jitter) -> Self {
        Self::new(base, base.saturating_mul(max_factor), jitter)
    }

    /// The step after `failures` earlier failures, before jitter.
    #[expect(clippy::disallowed_methods, reason = "growth is this module's job")]
    pub(crate) fn step(&self, failures: u32) -> Duration {
        // From 32 failures on the factor stops growing; any base reached the cap long before.
        let factor = 1u32.checked_shl(failures).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The wait before the next attempt, after `failures` earlier failures (0 before the first
    /// retry).
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let step = self.step(failures);
        match self.jitter {
            Jitter::None => step,
            Jitter::Full => uniform(Duration::ZERO, step),
            Jitter::Equal => uniform(step / 2, step),
        }
    }
}

/// A uniformly random duration in `[low, high]` (`low <= high`).
#[expect(clippy::disallowed_methods, reason = "jitter is this module's job")]
fn uniform(low: Duration, high: Duration) -> Duration {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::random_range(nanos(low)..=nanos(high)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn draws(backoff: Backoff, failures: u32) -> Vec<Duration> {
        (0..2_000).map(|_| backoff.delay(failures)).collect()
    }

    #[test]
    fn steps_double_from_the_base_up_to_the_cap() {
        let b = Backoff::new(100 * MS, 500 * MS, Jitter::None);
        let steps: Vec<Duration> = (0..5).map(|n| b.step(n)).collect();
        assert_eq!(steps, [100 * MS, 200 * MS, 400 * MS, 500 * MS, 500 * MS]);
    }

    #[test]
    fn growing_caps_at_the_factor() {
        let b = Backoff::growing(100 * MS, 8, Jitter::Equal);
        assert_eq!(b, Backoff::new(100 * MS, 800 * MS, Jitter::Equal));
        assert_eq!(
            Backoff::growing(Duration::MAX, 8, Jitter::None).max,
            Duration::MAX
        );
    }

    #[test]
    fn huge_failure_counts_stay_at_the_cap_without_overflow() {
        let b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(30),
            Jitter::None,
        );
        for failures in [31, 32, 33, 1_000, u32::MAX] {
            assert_eq!(b.step(failures), Duration::from_secs(30), "{failures}");
        }
        // Below the cap, the 31st doubling still counts: 1 ns · 2^31.
        let tiny = Backoff::new(Duration::from_nanos(1), Duration::MAX, Jitter::None);
        assert_eq!(tiny.step(31), Duration::from_nanos(1 << 31));
        assert_eq!(tiny.step(40), Duration::from_nanos(u64::from(u32::MAX)));
    }

    #[test]
    fn no_jitter_waits_the_whole_step() {
        let b = Backoff::new(200 * MS, Duration::from_secs(30), Jitter::None);
        assert_eq!(b.delay(0), 200 * MS);
        assert_eq!(b.delay(3), 1_600 * MS);
        assert_eq!(b.delay(40), Duration::from_secs(30));
    }

    #[test]
    fn full_jitter_spreads_over_zero_to_the_step() {
        let b = Backoff::new(100 * MS, Duration::from_secs(1), Jitter::Full);
        let d = draws(b, 1);
        let step = 200 * MS;
        assert!(d.iter().all(|d| *d <= step));
        // Spread over the range, not stuck at the step (lockstep) or at zero.
        assert!(d.iter().any(|d| *d < step / 4));
        assert!(d.iter().any(|d| *d > step * 3 / 4));
    }

    #[test]
    fn equal_jitter_keeps_half_the_step_and_draws_the_rest() {
        let b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Jitter::Equal,
        );
        for (failures, step) in [(0, 1), (1, 2), (3, 8), (9, 300), (50, 300)] {
            let step = Duration::from_secs(step);
            let d = draws(b, failures);
            assert!(
                d.iter().all(|d| (step / 2..=step).contains(d)),
                "{failures}"
            );
            assert!(
                d.iter().any(|d| *d < step * 5 / 8),
                "{failures}: lower half unused"
            );
            assert!(
                d.iter().any(|d| *d > step * 7 / 8),
                "{failures}: upper end unused"
            );
        }
    }

    #[test]
    fn a_zero_base_never_waits() {
        for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
            let b = Backoff::new(Duration::ZERO, Duration::from_secs(1), jitter);
            assert_eq!(b.delay(5), Duration::ZERO, "{jitter:?}");
        }
    }
}
