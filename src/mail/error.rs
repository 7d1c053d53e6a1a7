//! What can go wrong sending one email, and what each cause means for the outbox row
//! (decided here, once, for every provider; the relay only acts on the [`Disposition`]).

use std::time::Duration;

use crate::infra::http_client::with_causes;
use crate::infra::redact;
use crate::resilience::failure::{Classify, Disposition};

/// SMTP replies from here up (5yz, a permanent negative completion) will be refused again;
/// 4yz replies (greylisting, a busy mailbox) may pass later.
const SMTP_PERMANENT: u16 = 500;

/// HTTP statuses that say the mail API refuses *us*, whatever we send: a revoked or expired
/// token (401), an account without the right to send (403), a wrong URL or a gateway with
/// no route during a deploy (404). No row is at fault, so none is parked for them.
const HTTP_MISCONFIGURED: [u16; 3] = [401, 403, 404];

/// SMTP replies that say the same of the server: authentication required (530) or refused
/// (535, wrong or expired credentials).
const SMTP_MISCONFIGURED: [u16; 2] = [530, 535];

/// One failed send. The Display of each variant is what `outbox.last_error`, `outbox stuck`
/// and the relay's log lines say.
///
/// Text that a server wrote (an error body, an SMTP reply) is kept as a `String` that has
/// been scrubbed of the provider's credentials where it is made (`http.rs`, `smtp.rs`), and
/// of the recipient by [`Mailer::send`](super::Mailer::send) for every provider: servers
/// echo what they were sent, and a kept source would carry the unscrubbed text on.
#[derive(Debug, thiserror::Error)]
pub enum MailError {
    /// The mail API could not be reached or broke off (refused, reset, DNS, TLS, its own
    /// timeout). The error is kept without its URL, whose query may hold a token.
    #[error("mail API unreachable: {}", with_causes(.0))]
    Unreachable(#[source] reqwest::Error),
    /// The mail API answered with an error status; `message` is an excerpt of its body.
    #[error("mail API answered {status}: {message}")]
    Status { status: u16, message: String },
    /// The SMTP server refused a command; `message` is lettre's account of the reply.
    #[error("SMTP {server}: {message}")]
    SmtpReply {
        server: String,
        code: u16,
        message: String,
    },
    /// The SMTP conversation broke off without a reply: connection refused, TLS, network.
    #[error("SMTP {server}: {message}")]
    SmtpConnection { server: String, message: String },
    /// The SMTP send did not complete within `SUMMARYD_MAIL_TIMEOUT_MS`.
    #[error("SMTP send to {server} timed out after {after:?}")]
    SmtpTimeout { server: String, after: Duration },
    /// The provider did not answer within `SUMMARYD_MAIL_TIMEOUT_MS` (the relay's cap).
    #[error("mail provider did not answer within {} ms", .after.as_millis())]
    Timeout { after: Duration },
    /// An address no server would accept (the recipient or the sender), refused before
    /// anything was sent.
    #[error("invalid {field} address {value:?}: {source}")]
    InvalidAddress {
        field: &'static str,
        value: String,
        #[source]
        source: lettre::address::AddressError,
    },
    /// The message itself could not be put together.
    #[error("cannot build the message: {0}")]
    Message(#[source] lettre::error::Error),
    /// The `log` provider could not read the deployment's key to hash the recipient with.
    #[error("{0}")]
    LogKey(#[source] crate::infra::log_key::LogKeyError),
}

impl MailError {
    /// This error with the recipient `to` replaced by `<recipient>` in every text a server
    /// wrote or that quotes the address, so neither logs nor `outbox.last_error` hold it.
    /// The codes and statuses stay: they are what operators act on.
    pub(crate) fn without_recipient(self, to: &str) -> Self {
        let scrub = |text: String| redact::recipient(&text, to);
        match self {
            MailError::Status { status, message } => MailError::Status {
                status,
                message: scrub(message),
            },
            MailError::SmtpReply {
                server,
                code,
                message,
            } => MailError::SmtpReply {
                server,
                code,
                message: scrub(message),
            },
            MailError::SmtpConnection { server, message } => MailError::SmtpConnection {
                server,
                message: scrub(message),
            },
            MailError::InvalidAddress {
                field,
                value,
                source,
            } => MailError::InvalidAddress {
                field,
                value: scrub(value),
                source,
            },
            // No server text: reqwest's error without its URL, lettre's own wording, a time.
            e @ (MailError::Unreachable(_)
            | MailError::SmtpTimeout { .. }
            | MailError::Timeout { .. }
            | MailError::Message(_)
            | MailError::LogKey(_)) => e,
        }
    }
}

impl Classify for MailError {
    /// The tables in `docs/providers.md`: what the network, a timeout or a busy server did
    /// may pass on a later send; a provider that refuses our credentials or our URL is
    /// misconfigured (`Unavailable`: every row waits for the fix, none is parked); what the
    /// provider refused otherwise, and an address or message that cannot be sent, fail the
    /// same way every time.
    fn disposition(&self) -> Disposition {
        match self {
            MailError::Unreachable(_)
            | MailError::SmtpConnection { .. }
            | MailError::SmtpTimeout { .. }
            | MailError::Timeout { .. }
            | MailError::LogKey(_) => Disposition::TRANSIENT,
            MailError::Status { status, .. } if HTTP_MISCONFIGURED.contains(status) => {
                Disposition::Unavailable
            }
            MailError::Status { status, .. } => Disposition::of_http_status(*status, None),
            MailError::SmtpReply { code, .. } if SMTP_MISCONFIGURED.contains(code) => {
                Disposition::Unavailable
            }
            MailError::SmtpReply { code, .. } if *code >= SMTP_PERMANENT => Disposition::Permanent,
            MailError::SmtpReply { .. } => Disposition::TRANSIENT,
            MailError::InvalidAddress { .. } | MailError::Message(_) => Disposition::Permanent,
        }
    }
}

/// A provider that cannot be built from the settings; names the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum MailConfigError {
    /// `reason` may quote the configured URL, which may hold a password, so it is text that
    /// was scrubbed where it was made rather than the parser's error.
    #[error("{setting}: {reason}")]
    Invalid {
        setting: &'static str,
        reason: String,
    },
    #[error("could not build the HTTP client for the mail API: {}", with_causes(.0))]
    Client(#[source] reqwest::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16) -> MailError {
        MailError::Status {
            status,
            message: "m".into(),
        }
    }

    fn reply(code: u16) -> MailError {
        MailError::SmtpReply {
            server: "mx:25".into(),
            code,
            message: format!("permanent error ({code}): no"),
        }
    }

    #[test]
    fn http_statuses_are_classified_like_the_contract() {
        for s in [408, 409, 429, 500, 502, 503, 504] {
            assert_eq!(status(s).disposition(), Disposition::TRANSIENT, "{s}");
        }
        for s in [401, 403, 404] {
            assert_eq!(status(s).disposition(), Disposition::Unavailable, "{s}");
        }
        for s in [400, 405, 410, 413, 422] {
            assert_eq!(status(s).disposition(), Disposition::Permanent, "{s}");
        }
    }

    #[test]
    fn smtp_4xx_replies_pass_later_and_5xx_replies_never() {
        for code in [421, 450, 451, 452, 499] {
            assert_eq!(reply(code).disposition(), Disposition::TRANSIENT, "{code}");
        }
        for code in [500, 534, 550, 554] {
            assert_eq!(reply(code).disposition(), Disposition::Permanent, "{code}");
        }
    }

    #[test]
    fn smtp_authentication_refused_is_a_misconfigured_provider_not_a_bad_row() {
        for code in [530, 535] {
            assert_eq!(
                reply(code).disposition(),
                Disposition::Unavailable,
                "{code}"
            );
        }
    }

    #[test]
    fn trouble_on_the_way_is_transient_and_a_bad_address_is_permanent() {
        let after = Duration::from_millis(50);
        let server = || "mx:25".to_owned();
        for e in [
            MailError::SmtpConnection {
                server: server(),
                message: "Connection error: refused".into(),
            },
            MailError::SmtpTimeout {
                server: server(),
                after,
            },
            MailError::Timeout { after },
        ] {
            assert_eq!(e.disposition(), Disposition::TRANSIENT, "{e}");
        }
        let source = "not an address"
            .parse::<lettre::message::Mailbox>()
            .unwrap_err();
        let bad = MailError::InvalidAddress {
            field: "to",
            value: "not an address".into(),
            source,
        };
        assert_eq!(bad.disposition(), Disposition::Permanent);
        assert!(
            bad.to_string()
                .starts_with(r#"invalid to address "not an address": "#),
            "{bad}"
        );
    }

    #[test]
    fn messages_are_what_operators_read_in_last_error() {
        assert_eq!(status(503).to_string(), "mail API answered 503: m");
        assert_eq!(
            reply(550).to_string(),
            "SMTP mx:25: permanent error (550): no"
        );
        assert_eq!(
            MailError::Timeout {
                after: Duration::from_millis(50)
            }
            .to_string(),
            "mail provider did not answer within 50 ms"
        );
        assert_eq!(
            MailError::SmtpTimeout {
                server: "mx:25".into(),
                after: Duration::from_millis(300)
            }
            .to_string(),
            "SMTP send to mx:25 timed out after 300ms"
        );
    }

    #[test]
    fn the_recipient_leaves_every_server_text_and_the_codes_stay() {
        let to = "Bob@Acme.com";
        let echo = "5.1.1 <bob@acme.com>: Recipient address rejected: user bob unknown";
        let source = "x".parse::<lettre::message::Mailbox>().unwrap_err();
        for e in [
            MailError::Status {
                status: 422,
                message: echo.into(),
            },
            MailError::SmtpReply {
                server: "mx:25".into(),
                code: 550,
                message: echo.into(),
            },
            MailError::SmtpConnection {
                server: "mx:25".into(),
                message: echo.into(),
            },
            MailError::InvalidAddress {
                field: "to",
                value: to.into(),
                source,
            },
        ] {
            let before = e.disposition();
            let e = e.without_recipient(to);
            let shown = e.to_string();
            assert!(!shown.to_ascii_lowercase().contains("bob"), "{shown}");
            assert!(shown.contains("<recipient>"), "{shown}");
            assert_eq!(e.disposition(), before, "{shown}");
        }
        let kept = MailError::Timeout {
            after: Duration::from_millis(5),
        }
        .without_recipient(to);
        assert!(matches!(kept, MailError::Timeout { .. }), "{kept}");
        let status = MailError::Status {
            status: 422,
            message: echo.into(),
        }
        .without_recipient(to);
        assert!(
            status.to_string().starts_with("mail API answered 422: "),
            "{status}"
        );
    }
}
