//! Request latencies of a run, for the figures the front-door tests print and bound.

use std::time::Duration;

/// Latencies, sorted.
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(durations: impl IntoIterator<Item = Duration>) -> Self {
        let mut all: Vec<Duration> = durations.into_iter().collect();
        all.sort();
        Self(all)
    }

    /// The `q` quantile (0.99: the 99th percentile); zero for no latencies.
    pub fn quantile(&self, q: f64) -> Duration {
        let last = self.0.len().saturating_sub(1);
        self.0
            .get(((self.0.len() as f64 * q) as usize).min(last))
            .copied()
            .unwrap_or_default()
    }

    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
}
