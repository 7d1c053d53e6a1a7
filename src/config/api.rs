//! `[api]`: the HTTP front door's limits (`SUMMARYD_API_*`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Request bodies above this are refused with 413 before parsing.
    pub max_body_bytes: usize,
    /// Longest accepted `text`, in characters (413 above).
    pub max_text_chars: usize,
    /// A `text` longer than this (UTF-8 bytes) is stored in Postgres at intake and the
    /// stream entry carries a reference, so long texts do not fill Redis.
    pub inline_text_bytes: usize,
    /// Deadline for receiving each request's head (from the connection's start or from
    /// the previous response), then again for its body; a client that has not sent it by
    /// then gets 408 and its connection is closed.
    #[serde(rename = "request_timeout_ms", with = "Millis")]
    pub request_timeout: Duration,
    /// How long an idle keep-alive connection stays open.
    #[serde(rename = "keep_alive_ms", with = "Millis")]
    pub(crate) keep_alive: Duration,
    /// Open connections this process serves at once (per listener); a newcomer at the cap
    /// closes one that is only waiting for a head, else waits for room (`api::slots`).
    pub(crate) max_connections: usize,
    /// Request-body bytes all requests of this process may hold at once.
    pub body_budget_bytes: usize,
    /// How long a request waits for room in the body budget before it gets 503.
    #[serde(rename = "body_budget_wait_ms", with = "Millis")]
    pub body_budget_wait: Duration,
    /// After answering a request whose body was not read (an early error), how long the
    /// connection may drain before it is closed.
    #[serde(rename = "disconnect_timeout_ms", with = "Millis")]
    pub(crate) disconnect_timeout: Duration,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            // The longest text (1,000,000 characters) in UTF-8 is up to 4 MB when most of
            // it is outside ASCII; the rest of the body is a few hundred bytes.
            max_body_bytes: 4 * 1024 * 1024,
            // Tens of thousands of tokens, hundreds of pages: summarised in parts (`SUMMARYD_LLM_MAX_PARTS`
            // bounds what one job may cost).
            max_text_chars: 1_000_000,
            // A job entry of a few KiB is the common case and stays inline (one XADD, no
            // Postgres round trip at intake); longer texts would sit in Redis's memory
            // for as long as they are queued.
            inline_text_bytes: 64 * 1024,
            // A head within 10 s; a body gets 10 s per 256 KiB it declares (`api::body`):
            // 256 kbit/s, a slow mobile uplink; anything slower is holding memory on purpose.
            request_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(5),
            // actix reads whatever a client has already sent (up to 128 KiB, in a
            // 256 KiB buffer) before any handler can refuse it, so this bounds the
            // memory of bodies in flight: 128 x ~0.3 MiB. Measured with 1,000 stalled
            // 250 KB bodies: peak RSS stays under 64 MiB (README, "Security: the HTTP front door").
            max_connections: 128,
            // Two bodies at the size limit (one per tenant, see `api::body`), dozens of
            // 100 KB documents, or thousands of ordinary few-KiB requests: long texts are
            // rare, and this bounds what slow uploads can hold.
            body_budget_bytes: 8 * 1024 * 1024,
            // Bodies in flight finish in milliseconds; a longer wait only keeps a
            // refused connection (and actix's buffer for it) alive.
            body_budget_wait: Duration::from_millis(100),
            disconnect_timeout: Duration::from_millis(500),
        }
    }
}

impl ApiSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes == 0 {
            return Err(invalid("SUMMARYD_API_MAX_BODY_BYTES", "must be at least 1"));
        }
        if self.max_text_chars == 0 {
            return Err(invalid("SUMMARYD_API_MAX_TEXT_CHARS", "must be at least 1"));
        }
        if self.body_budget_bytes < self.max_body_bytes {
            return Err(invalid(
                "SUMMARYD_API_BODY_BUDGET_BYTES",
                "must be at least SUMMARYD_API_MAX_BODY_BYTES, or a body at the limit could never be read",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid(
                "SUMMARYD_API_REQUEST_TIMEOUT_MS",
                "must be positive",
            ));
        }
        if self.max_connections == 0 {
            return Err(invalid(
                "SUMMARYD_API_MAX_CONNECTIONS",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    fn refusal(api: &ApiSettings) -> String {
        api.check().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn durations_are_milliseconds_in_the_file_and_the_environment() {
        let s = load(
            "[api]\nrequest_timeout_ms = 1500\nbody_budget_wait_ms = 0\n",
            &[
                ("SUMMARYD_API_KEEP_ALIVE_MS", "250"),
                ("SUMMARYD_API_DISCONNECT_TIMEOUT_MS", "2000"),
            ],
        )
        .unwrap();
        assert_eq!(s.api.request_timeout, Duration::from_millis(1_500));
        assert_eq!(s.api.body_budget_wait, Duration::ZERO);
        assert_eq!(s.api.keep_alive, Duration::from_millis(250));
        assert_eq!(s.api.disconnect_timeout, Duration::from_secs(2));
    }

    #[test]
    fn limits_must_be_usable() {
        assert!(ApiSettings::default().check().is_ok());
        let mut api = ApiSettings {
            max_body_bytes: 0,
            ..ApiSettings::default()
        };
        assert!(refusal(&api).contains("SUMMARYD_API_MAX_BODY_BYTES"));
        api.max_body_bytes = api.body_budget_bytes;
        assert!(
            api.check().is_ok(),
            "a budget of one body at the limit is enough"
        );
        api.max_body_bytes = api.body_budget_bytes + 1;
        assert!(refusal(&api).contains("SUMMARYD_API_BODY_BUDGET_BYTES"));

        let api = ApiSettings {
            request_timeout: Duration::ZERO,
            ..ApiSettings::default()
        };
        assert!(refusal(&api).contains("SUMMARYD_API_REQUEST_TIMEOUT_MS"));
        let api = ApiSettings {
            max_connections: 0,
            ..ApiSettings::default()
        };
        assert!(refusal(&api).contains("SUMMARYD_API_MAX_CONNECTIONS"));
    }
}
