//! One answer to "should this be tried again?", shared by every provider kind and stage.
//!
//! Each provider kind decides it once, where its errors are made: the model in
//! `LlmError::disposition`, the mail providers when they return a [`Failure`]. The retry
//! policy, the worker and the relay only act on the answer.

use std::fmt;
use std::time::Duration;

/// Whether a later attempt of the same operation can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The provider is down, slow or rate-limiting: a later attempt may succeed.
    /// `retry_after` is how long the provider asked us to wait, when it said.
    Transient { retry_after: Option<Duration> },
    /// The same attempt fails the same way every time; another one only costs.
    Permanent,
}

impl Disposition {
    pub const TRANSIENT: Self = Self::Transient { retry_after: None };

    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    /// An HTTP error status: every 5xx and the 4xx in `transient_4xx` may pass later; any
    /// other status is the request's fault. Each provider kind names its own 4xx set.
    pub fn of_http_status(
        status: u16,
        transient_4xx: &[u16],
        retry_after: Option<Duration>,
    ) -> Self {
        if status >= 500 || transient_4xx.contains(&status) {
            Self::Transient { retry_after }
        } else {
            Self::Permanent
        }
    }
}

/// An error that knows its disposition.
pub trait Classify {
    fn disposition(&self) -> Disposition;

    fn is_transient(&self) -> bool {
        self.disposition().is_transient()
    }
}

/// A failure reduced to what the caller acts on: try again or not, and what to tell a person
/// (the message ends up in logs, dead-letter reasons and `outbox.last_error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Worth another attempt later (a redelivery, the row's next send).
    #[error("transient: {0}")]
    Transient(String),
    /// Needs a person: dead-letter the job, stop sending the row.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl Failure {
    pub fn new(disposition: Disposition, message: String) -> Self {
        if disposition.is_transient() {
            Self::Transient(message)
        } else {
            Self::Permanent(message)
        }
    }

    /// `err` classified, with its message.
    pub fn of<E: Classify + fmt::Display + ?Sized>(err: &E) -> Self {
        Self::new(err.disposition(), err.to_string())
    }
}

impl Classify for Failure {
    fn disposition(&self) -> Disposition {
        match self {
            Self::Transient(_) => Disposition::TRANSIENT,
            Self::Permanent(_) => Disposition::Permanent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_split_into_5xx_and_named_4xx_versus_the_rest() {
        let after = Some(Duration::from_secs(3));
        for status in [500, 502, 503, 599] {
            assert_eq!(
                Disposition::of_http_status(status, &[], after),
                Disposition::Transient { retry_after: after },
                "{status}"
            );
        }
        assert!(Disposition::of_http_status(429, &[408, 429], None).is_transient());
        for status in [400, 404, 409, 422, 499] {
            assert_eq!(
                Disposition::of_http_status(status, &[408, 429], after),
                Disposition::Permanent,
                "{status}"
            );
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("model answered {0}")]
    struct Status(u16);

    impl Classify for Status {
        fn disposition(&self) -> Disposition {
            Disposition::of_http_status(self.0, &[429], None)
        }
    }

    #[test]
    fn a_classified_error_becomes_a_failure_with_its_message() {
        assert_eq!(
            Failure::of(&Status(429)),
            Failure::Transient("model answered 429".into())
        );
        let permanent = Failure::of(&Status(400));
        assert_eq!(permanent.to_string(), "permanent: model answered 400");
        assert_eq!(permanent.disposition(), Disposition::Permanent);
        assert!(!permanent.is_transient());
        assert!(Failure::Transient(String::new()).is_transient());
    }
}
