//! How long an HTTP peer (a model API, a webhook receiver) asks us to wait: `retry-after-ms`
//! or `Retry-After`.
//!
//! Parsing only; capping the wait at the max backoff is the caller's job.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// OpenAI's millisecond-precision variant; preferred because it is more precise.
const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The server's requested wait, if it sent a parseable one. A date in the past means "now".
pub(crate) fn from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(wait) = header(headers, RETRY_AFTER_MS).and_then(|v| non_negative(v, 1e-3)) {
        return Some(wait);
    }
    let value = header(headers, RETRY_AFTER.as_str())?;
    non_negative(value, 1.0).or_else(|| until_http_date(value, now))
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

/// A number of `unit` seconds; fractions allowed (some servers send `0.5`).
fn non_negative(value: &str, unit: f64) -> Option<Duration> {
    let n: f64 = value.parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(n * unit).ok()
}

fn until_http_date(value: &str, now: SystemTime) -> Option<Duration> {
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn milliseconds_win_over_seconds() {
        let h = headers(&[("retry-after-ms", "250"), ("retry-after", "7")]);
        assert_eq!(
            from_headers(&h, SystemTime::now()),
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn seconds_dates_and_garbage() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let h = headers(&[("retry-after", "2")]);
        assert_eq!(from_headers(&h, now), Some(Duration::from_secs(2)));
        let h = headers(&[("retry-after", "0.5")]);
        assert_eq!(from_headers(&h, now), Some(Duration::from_millis(500)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        let h = headers(&[("retry-after", &later)]);
        assert_eq!(from_headers(&h, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        let h = headers(&[("retry-after", &past)]);
        assert_eq!(from_headers(&h, now), Some(Duration::ZERO));
        for junk in ["soon", "-1", "NaN", "inf"] {
            let h = headers(&[("retry-after", junk)]);
            assert_eq!(from_headers(&h, now), None, "{junk}");
        }
        let h = headers(&[("retry-after-ms", "soon"), ("retry-after", "3")]);
        assert_eq!(
            from_headers(&h, now),
            Some(Duration::from_secs(3)),
            "bad ms header falls back"
        );
        assert_eq!(from_headers(&HeaderMap::new(), now), None);
    }
}
