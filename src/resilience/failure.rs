//! One answer to "what next?" after a failure, shared by every adapter and acted on by the
//! roles.
//!
//! Each adapter decides it once, where its errors are made, by implementing [`Classify`]:
//! the model (`LlmError`, and `RetryError` / `ChainError` above it), Postgres (`DbError`),
//! the mail providers (`MailError`). The retry policy, the worker and the relay only act on
//! the [`Disposition`] they are given; none of them looks inside another module's errors.

use std::time::Duration;

/// The 4xx statuses a later attempt of the same request can pass: 408 (the server gave up
/// waiting for us), 429 (rate limited) and 409 (the set the OpenAI SDK retries; an email API
/// answers it to a resend whose idempotency key it is still processing, and the next attempt
/// gets that send's outcome). Every 5xx may pass later too; any other 4xx is the request's
/// fault (the tables in `docs/providers.md`).
pub(crate) const TRANSIENT_4XX: [u16; 3] = [408, 409, 429];

/// What the caller does next with the work that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The provider is down, slow or rate-limiting: a later attempt may succeed, and this
    /// one counted (a retry in-process, the job's next delivery, the row's next send).
    /// `retry_after` is how long the provider asked us to wait, when it said.
    Transient { retry_after: Option<Duration> },
    /// A dependency cannot serve anyone right now (down, or misconfigured), so the work was
    /// not really tried: it waits for the dependency and the attempt does not count against
    /// it (`docs/delivery.md`).
    Unavailable,
    /// The work itself is refused, the same way every time; another attempt only costs.
    /// Dead-letter the job, stop sending the row.
    Permanent,
}

impl Disposition {
    pub(crate) const TRANSIENT: Self = Self::Transient { retry_after: None };

    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable)
    }

    /// The failure class a span's `error.type` names (`docs/tracing.md`).
    pub fn class(&self) -> &'static str {
        match self {
            Self::Transient { .. } => "transient",
            Self::Unavailable => "unavailable",
            Self::Permanent => "permanent",
        }
    }

    /// An HTTP error status: every 5xx and the [`TRANSIENT_4XX`] may pass later; any other
    /// status is the request's fault.
    pub(crate) fn of_http_status(status: u16, retry_after: Option<Duration>) -> Self {
        if status >= 500 || TRANSIENT_4XX.contains(&status) {
            Self::Transient { retry_after }
        } else {
            Self::Permanent
        }
    }
}

/// An error that knows what its caller should do next.
pub trait Classify {
    fn disposition(&self) -> Disposition;

    fn is_transient(&self) -> bool {
        self.disposition().is_transient()
    }

    fn is_unavailable(&self) -> bool {
        self.disposition().is_unavailable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_split_into_5xx_and_named_4xx_versus_the_rest() {
        let after = Some(Duration::from_secs(3));
        for status in [408, 409, 429, 500, 502, 503, 599] {
            assert_eq!(
                Disposition::of_http_status(status, after),
                Disposition::Transient { retry_after: after },
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 407, 410, 413, 422, 428, 430, 499] {
            assert_eq!(
                Disposition::of_http_status(status, after),
                Disposition::Permanent,
                "{status}"
            );
        }
    }

    struct Answers(Disposition);

    impl Classify for Answers {
        fn disposition(&self) -> Disposition {
            self.0
        }
    }

    #[test]
    fn each_disposition_answers_exactly_one_question_yes() {
        let transient = Answers(Disposition::Transient {
            retry_after: Some(Duration::from_secs(1)),
        });
        assert!(transient.is_transient() && !transient.is_unavailable());
        let unavailable = Answers(Disposition::Unavailable);
        assert!(unavailable.is_unavailable() && !unavailable.is_transient());
        let permanent = Answers(Disposition::Permanent);
        assert!(!permanent.is_transient() && !permanent.is_unavailable());
        assert!(Disposition::TRANSIENT.is_transient());
        assert_eq!(
            Disposition::TRANSIENT,
            Disposition::Transient { retry_after: None }
        );
    }
}
