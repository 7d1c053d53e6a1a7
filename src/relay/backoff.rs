//! How long to wait after failures: per row after a transient send failure, and for the
//! relay loop after a database error.

use std::time::Duration;

/// Exponential in the number of failures so far, from `base_ms` up to `max_ms`, with
/// "equal jitter": half of the step is fixed, half random.
///
/// Not full jitter (as the model retries use): a row has a limited number of attempts, and
/// full jitter may draw near-zero waits several times in a row, burning them within
/// seconds of a provider outage. Keeping half of each step guarantees the attempts span a
/// real outage, while the random half still spreads rows that failed together.
pub fn jittered_backoff(failures_before: i32, base_ms: u64, max_ms: u64) -> Duration {
    // 2^20 × any sane base is far above any sane max; the shift stays in range.
    let exp = failures_before.clamp(0, 20) as u32;
    let step = base_ms.saturating_mul(1u64 << exp).min(max_ms);
    let half = step / 2;
    Duration::from_millis(half + rand::random_range(0..=step - half))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_within_half_and_whole_step_and_caps() {
        for (attempts, step) in [
            (0, 1_000),
            (1, 2_000),
            (3, 8_000),
            (9, 300_000),
            (50, 300_000),
        ] {
            for _ in 0..50 {
                let d = jittered_backoff(attempts, 1_000, 300_000).as_millis() as u64;
                assert!((step / 2..=step).contains(&d), "attempts {attempts}: {d}");
            }
        }
    }

    #[test]
    fn zero_base_means_no_wait() {
        assert_eq!(jittered_backoff(3, 0, 1_000), Duration::ZERO);
    }
}
