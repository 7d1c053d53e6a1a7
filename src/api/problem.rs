//! Every error the HTTP API can answer, mapped once to RFC 9457 problem details.
//!
//! Handlers and extractors return `ApiError`; actix calls `error_response`, so no error
//! path can fall back to actix's text/plain bodies or to a 500.

use actix_web::http::StatusCode;
use actix_web::http::header::{ALLOW, CONTENT_TYPE, HeaderName, RETRY_AFTER, WWW_AUTHENTICATE};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use super::idempotency::StoreError;
use crate::stream::Limit;

fn limit_name(limit: Limit) -> &'static str {
    match limit {
        Limit::Rate => "rate",
        Limit::InFlight => "max_in_flight",
        Limit::NotifyRate => "notify_per_hour",
        Limit::Budget => "budget_tokens",
    }
}

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Every problem's `type` is this followed by its slug: a non-resolvable `tag:` URI.
const PROBLEM_TYPE_PREFIX: &str = "tag:summaryd,2025:problems/";
/// A client retrying a 409 sooner than this would only meet the same in-progress marker;
/// the enqueue behind it normally takes milliseconds.
const CONFLICT_RETRY_AFTER_S: u64 = 1;
/// Bodies in flight finish in milliseconds, or are cut off at the request deadline.
const BODY_BUDGET_RETRY_AFTER_S: u64 = 1;
/// Redis and Postgres restarts and failovers take seconds; sooner retries only add load.
const UNAVAILABLE_RETRY_AFTER_S: u64 = 5;
/// A replica that fell behind catches up in well under a second; one that is restarting
/// takes a few, and the retry is a cheap replay either way.
const NOT_REPLICATED_RETRY_AFTER_S: u64 = 2;

/// The RFC 9457 body. `field` / `header` name what the client has to fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// A non-resolvable `tag:` URI identifying the kind of problem (RFC 9457 §3.1.1).
    #[serde(rename = "type")]
    pub(crate) problem_type: String,
    pub(crate) title: String,
    pub(crate) status: u16,
    /// What went wrong and what to change.
    pub(crate) detail: String,
    /// The body field at fault, for 422 validation errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) field: Option<String>,
    /// The request header at fault, for 400 header errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) header: Option<String>,
}

#[derive(Debug, thiserror::Error)]
// The tests walk every variant (`ApiErrorKind::iter`), so one added without its documented
// answer fails to compile there.
#[cfg_attr(
    test,
    derive(strum::EnumDiscriminants),
    strum_discriminants(name(ApiErrorKind), derive(strum::EnumIter))
)]
pub enum ApiError {
    #[error("{header}: {message}")]
    InvalidHeader {
        header: &'static str,
        message: String,
    },
    #[error("malformed JSON: {0}")]
    MalformedJson(#[source] serde_json::Error),
    #[error("{field}: {message}")]
    Validation { field: String, message: String },
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// Within the byte limit, but longer than `SUMMARYD_API_MAX_TEXT_CHARS`.
    #[error("text longer than {max_chars} characters")]
    TextTooLong { max_chars: usize },
    /// A text that would need more model calls than `SUMMARYD_LLM_MAX_PARTS` on the
    /// configured chain: refused before it costs anything, never accepted and then
    /// dead-lettered.
    #[error("text needs {needed} model calls, more than {max_parts}")]
    TooManyParts { needed: usize, max_parts: usize },
    #[error("unsupported content type {got:?}")]
    UnsupportedMediaType { got: Option<String> },
    #[error("could not read the request body: {0}")]
    UnreadableBody(#[source] actix_web::error::PayloadError),
    /// The body (or, answered by the HTTP layer, the head) did not arrive in time.
    #[error("request not received in time")]
    RequestTimeout,
    /// The HTTP layer could not parse the request line, a header or Content-Length.
    #[error("malformed HTTP request")]
    MalformedRequest,
    /// The request head is larger than the HTTP layer reads.
    #[error("request head too large")]
    HeadTooLarge,
    /// The process holds as many request-body bytes as its budget allows.
    #[error("request-body budget exhausted")]
    BodyBudgetExhausted,
    /// The tenant already holds its share of the room for large bodies.
    #[error("the tenant's share of the request-body budget is exhausted")]
    TenantBodyShareExhausted,
    #[error("a request with this Idempotency-Key is still in progress")]
    InProgress,
    #[error("Idempotency-Key reused with a different body")]
    KeyReused,
    /// Redis's error, or the pool's when no connection could be had.
    #[error("Redis unavailable: {0}")]
    RedisUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("Postgres unavailable: {0}")]
    PostgresUnavailable(#[source] crate::db::DbError),
    /// A dependency answered with something we cannot use (e.g. an unreadable record).
    /// What it was is said in our words, from more than one kind of error.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("not ready: {0}")]
    NotReady(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed { allow: &'static str },
    #[error("unauthenticated: {0}")]
    Unauthorized(&'static str),
    #[error("over its {} limit; retry in {retry_after_s} s", limit_name(*.limit))]
    RateLimited { limit: Limit, retry_after_s: u64 },
    /// The tenant's budget cannot hold the job's worst case in this period.
    #[error(
        "over its budget: the job may cost {cost} tokens, {left} of {budget} are left until {resets_at}"
    )]
    BudgetExhausted {
        /// The job's worst-case tokens.
        cost: u64,
        budget: u64,
        /// Tokens neither reserved nor used in the period (as the API last read them).
        left: u64,
        /// When the period resets (RFC 3339, UTC).
        resets_at: String,
        retry_after_s: u64,
    },
    /// Stored and enqueued on the primary, but fewer replicas than
    /// `SUMMARYD_REDIS_MIN_REPLICAS_ACK` confirmed it in time.
    #[error("accept not confirmed by {replicas} replica(s): {cause}")]
    NotReplicated {
        replicas: u32,
        #[source]
        cause: crate::stream::replicas::NotReplicated,
    },
}

/// Everything one error is answered with. [`ApiError::spec`] is the one table of them,
/// one entry per variant; the response and the body are both made from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProblemSpec {
    pub(crate) status: StatusCode,
    /// The last segment of the problem's type URI.
    pub(crate) slug: &'static str,
    pub(crate) title: &'static str,
    /// What went wrong and what to change; never internal error text for a 5xx.
    pub(crate) detail: String,
    /// The body field at fault.
    pub(crate) field: Option<String>,
    /// The request header at fault.
    pub(crate) header: Option<&'static str>,
    /// `Retry-After` in seconds, where the same request can pass later.
    pub(crate) retry_after_s: Option<u64>,
    /// Another response header the status calls for (`Allow`, `WWW-Authenticate`).
    pub(crate) response_header: Option<(HeaderName, &'static str)>,
    /// Close the connection after answering: the rest of the request was not read, and a
    /// client must not keep it (and its buffers) open.
    pub(crate) close: bool,
    /// Whether the cause goes to the log. Server errors do, except load shedding, which is
    /// counted in the request metrics: a line each would flood the log exactly when the
    /// process is under attack.
    pub(crate) logged: bool,
}

impl ProblemSpec {
    fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            field: None,
            header: None,
            retry_after_s: None,
            response_header: None,
            close: false,
            logged: status.is_server_error(),
        }
    }

    fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    fn header(mut self, header: &'static str) -> Self {
        self.header = Some(header);
        self
    }

    fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    fn response_header(mut self, name: HeaderName, value: &'static str) -> Self {
        self.response_header = Some((name, value));
        self
    }

    fn close(mut self) -> Self {
        self.close = true;
        self
    }

    fn unlogged(mut self) -> Self {
        self.logged = false;
        self
    }

    fn problem(self) -> Problem {
        Problem {
            problem_type: format!("{PROBLEM_TYPE_PREFIX}{}", self.slug),
            title: self.title.into(),
            status: self.status.as_u16(),
            detail: self.detail,
            field: self.field,
            header: self.header.map(str::to_owned),
        }
    }
}

impl ApiError {
    pub(crate) fn validation(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Validation {
            field: field.into(),
            message: message.into(),
        }
    }

    /// How each error is answered: status, type, title, detail, and the headers it adds.
    pub(crate) fn spec(&self) -> ProblemSpec {
        use ProblemSpec as P;
        use StatusCode as S;
        /// What every 503 for a dependency tells the client.
        const RETRY_LATER: &str = "Nothing was stored or enqueued; retry after the Retry-After \
                                   delay (with the same Idempotency-Key for a POST).";
        match self {
            Self::InvalidHeader { header, message } => P::new(
                S::BAD_REQUEST,
                "invalid-header",
                "Invalid request header",
                format!("{header} header {message}"),
            )
            .header(header),
            Self::MalformedJson(e) => P::new(
                S::BAD_REQUEST,
                "malformed-json",
                "Malformed JSON",
                format!("The body is not valid JSON ({e}); send a JSON object."),
            ),
            Self::Validation { field, message } => P::new(
                S::UNPROCESSABLE_ENTITY,
                "validation",
                "Request body does not match the schema",
                format!("{field}: {message}"),
            )
            .field(field.clone()),
            Self::PayloadTooLarge { limit } => P::new(
                S::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
                format!("The body must be at most {limit} bytes; shorten the text."),
            ),
            Self::TextTooLong { max_chars } => P::new(
                S::PAYLOAD_TOO_LARGE,
                "text-too-long",
                "Text too long",
                format!(
                    "text: at most {max_chars} characters are accepted (SUMMARYD_API_MAX_TEXT_CHARS); shorten or split the text."
                ),
            )
            .field("text"),
            Self::TooManyParts { needed, max_parts } => P::new(
                S::PAYLOAD_TOO_LARGE,
                "text-too-many-parts",
                "Text needs too many model calls",
                format!(
                    "text: summarising it takes {needed} model calls on the configured models, more than the {max_parts} one job may make (SUMMARYD_LLM_MAX_PARTS); shorten or split the text."
                ),
            )
            .field("text"),
            Self::UnsupportedMediaType { got } => P::new(
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                format!(
                    "Send the body as Content-Type: application/json (got {}).",
                    got.as_deref().unwrap_or("no Content-Type")
                ),
            ),
            Self::UnreadableBody(e) => P::new(
                S::BAD_REQUEST,
                "unreadable-body",
                "Request body could not be read",
                format!("The body could not be read ({e}); send it again."),
            ),
            Self::RequestTimeout => P::new(
                S::REQUEST_TIMEOUT,
                "request-timeout",
                "Request not received in time",
                "The request was not received within the server's deadline; send it again at \
                 once and in full.",
            )
            .close(),
            Self::MalformedRequest => P::new(
                S::BAD_REQUEST,
                "malformed-request",
                "Malformed HTTP request",
                "The request line, a header or Content-Length could not be parsed; send a \
                 well-formed HTTP/1.1 request.",
            ),
            Self::HeadTooLarge => P::new(
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "head-too-large",
                "Request header fields too large",
                "The request line and headers must fit in 128 KiB (and at most 96 headers); \
                 send fewer or shorter headers.",
            ),
            Self::BodyBudgetExhausted => P::new(
                S::SERVICE_UNAVAILABLE,
                "busy",
                "Too many request bodies in flight",
                "The server is reading as many request bodies as it can hold; nothing was \
                 read, stored or enqueued. Retry after the Retry-After delay (same \
                 Idempotency-Key).",
            )
            .retry_after(BODY_BUDGET_RETRY_AFTER_S)
            .close()
            .unlogged(),
            Self::TenantBodyShareExhausted => P::new(
                S::SERVICE_UNAVAILABLE,
                "busy",
                "Too many large request bodies in flight for this tenant",
                "This tenant's large request bodies already hold its share (half) of the \
                 room the server keeps for large bodies; nothing was read, stored or \
                 enqueued. Retry after the Retry-After delay (same Idempotency-Key), or \
                 send fewer large bodies at once.",
            )
            .retry_after(BODY_BUDGET_RETRY_AFTER_S)
            .close()
            .unlogged(),
            Self::InProgress => P::new(
                S::CONFLICT,
                "idempotency-in-progress",
                "Request with this key in progress",
                "The first request with this Idempotency-Key has not finished; retry after \
                 the Retry-After delay with the same key and body.",
            )
            .retry_after(CONFLICT_RETRY_AFTER_S),
            Self::KeyReused => P::new(
                S::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key reused with a different body",
                "This Idempotency-Key was already used with a different body; use a new key \
                 for a new request.",
            ),
            Self::RedisUnavailable(_) => P::new(
                S::SERVICE_UNAVAILABLE,
                "redis-unavailable",
                "Job queue unavailable",
                RETRY_LATER,
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_S),
            Self::PostgresUnavailable(_) => P::new(
                S::SERVICE_UNAVAILABLE,
                "postgres-unavailable",
                "Database unavailable",
                RETRY_LATER,
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_S),
            Self::Unavailable(_) => P::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Temporarily unavailable",
                RETRY_LATER,
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_S),
            Self::NotReady(why) => P::new(
                S::SERVICE_UNAVAILABLE,
                "not-ready",
                "Not ready",
                format!("Not ready to serve traffic: {why}."),
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER_S),
            Self::NotFound(what) => P::new(S::NOT_FOUND, "not-found", "Not found", what.clone()),
            Self::MethodNotAllowed { allow } => P::new(
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                format!("Use {allow} on this path."),
            )
            .response_header(ALLOW, allow),
            Self::Unauthorized(why) => P::new(
                S::UNAUTHORIZED,
                "unauthorized",
                "Authentication required",
                format!("{why}: send Authorization: Bearer <your tenant token>."),
            )
            .response_header(WWW_AUTHENTICATE, "Bearer"),
            Self::RateLimited {
                limit,
                retry_after_s,
            } => P::new(
                S::TOO_MANY_REQUESTS,
                "rate-limited",
                "Too many requests",
                match limit {
                    Limit::Rate => format!(
                        "This tenant's job rate (rate_per_s/burst) is exhausted; retry in {retry_after_s} s with the same Idempotency-Key."
                    ),
                    Limit::InFlight => format!(
                        "This tenant has max_in_flight jobs accepted and not yet finished; retry in {retry_after_s} s with the same Idempotency-Key."
                    ),
                    Limit::NotifyRate => format!(
                        "This recipient has had this tenant's notify_per_hour emails in the last hour; retry in {retry_after_s} s with the same Idempotency-Key, or notify another address."
                    ),
                    // The handler answers a budget refusal as `BudgetExhausted`, with the
                    // job's cost; this is only the fallback wording.
                    Limit::Budget => format!(
                        "This tenant's token budget (budget_tokens) cannot hold this job in this period; retry in {retry_after_s} s, when the budget resets, with the same Idempotency-Key."
                    ),
                },
            )
            .retry_after(*retry_after_s),
            Self::BudgetExhausted {
                cost,
                budget,
                left,
                resets_at,
                retry_after_s,
            } => P::new(
                S::TOO_MANY_REQUESTS,
                "budget-exhausted",
                "Token budget exhausted",
                if cost > budget {
                    format!(
                        "This job may cost up to {cost} tokens, more than this tenant's whole budget of {budget} tokens per period: it can never be accepted under this budget. Shorten or split the text, or ask the operator to raise budget_tokens."
                    )
                } else {
                    format!(
                        "This job may cost up to {cost} tokens and this tenant's budget has {left} of {budget} tokens left in this period; the budget resets at {resets_at} (retry in {retry_after_s} s with the same Idempotency-Key), or ask the operator to raise budget_tokens."
                    )
                },
            )
            .retry_after(*retry_after_s),
            Self::NotReplicated { replicas, .. } => P::new(
                S::SERVICE_UNAVAILABLE,
                "not-replicated",
                "Not confirmed by the replicas",
                format!(
                    "The job was recorded, but fewer than {replicas} Redis replica(s) confirmed \
                     it in time (SUMMARYD_REDIS_MIN_REPLICAS_ACK, SUMMARYD_REDIS_ACK_TIMEOUT_MS), \
                     so it could still be lost in a failover. Retry after the Retry-After \
                     delay with the same Idempotency-Key and body: the retry answers for the \
                     same job, which is never enqueued twice."
                ),
            )
            .retry_after(NOT_REPLICATED_RETRY_AFTER_S),
        }
    }

    pub(crate) fn problem(&self) -> Problem {
        self.spec().problem()
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.spec().status
    }

    fn error_response(&self) -> HttpResponse {
        let spec = self.spec();
        if spec.logged {
            // The cause stays in the log; the client gets what to do about it.
            tracing::warn!(error = %self, status = spec.status.as_u16(), "request failed");
        }
        let mut builder = HttpResponse::build(spec.status);
        builder.insert_header((CONTENT_TYPE, PROBLEM_JSON));
        if let Some(seconds) = spec.retry_after_s {
            builder.insert_header((RETRY_AFTER, seconds.to_string()));
        }
        if let Some(header) = spec.response_header.clone() {
            builder.insert_header(header);
        }
        if spec.close {
            builder.force_close();
        }
        // Serialising a struct of strings cannot fail; an empty body still carries the status.
        builder.body(serde_json::to_string(&spec.problem()).unwrap_or_default())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InProgress => Self::InProgress,
            StoreError::KeyReused => Self::KeyReused,
            StoreError::Unavailable(cause) => Self::RedisUnavailable(Box::new(cause)),
            StoreError::Corrupt(cause) => Self::Unavailable(cause.to_string()),
            StoreError::OverLimit(over) => Self::RateLimited {
                limit: over.limit,
                // Whole seconds, rounded up: a client retrying sooner is refused again.
                retry_after_s: over.retry_after.as_millis().div_ceil(1000).max(1) as u64,
            },
            StoreError::NotReplicated(cause) => Self::NotReplicated {
                replicas: cause.wanted(),
                cause,
            },
        }
    }
}

impl From<crate::domain::ValidationError> for ApiError {
    fn from(e: crate::domain::ValidationError) -> Self {
        Self::validation(e.field, e.message)
    }
}

impl From<deadpool_redis::PoolError> for ApiError {
    fn from(e: deadpool_redis::PoolError) -> Self {
        Self::RedisUnavailable(Box::new(e))
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        Self::RedisUnavailable(Box::new(e))
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> Self {
        Self::PostgresUnavailable(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_http::ConnectionType;
    use strum::IntoEnumIterator;

    /// What the API reference documents for one error: its status, type, the headers it
    /// adds, whether the connection closes, a piece of the detail, and the body's
    /// `field` / `header` when it names one.
    struct Documented {
        error: ApiError,
        status: u16,
        slug: &'static str,
        headers: &'static [(&'static str, &'static str)],
        close: bool,
        detail: &'static str,
        names: Option<(&'static str, &'static str)>,
    }

    fn doc(error: ApiError, status: u16, slug: &'static str, detail: &'static str) -> Documented {
        Documented {
            error,
            status,
            slug,
            headers: &[],
            close: false,
            detail,
            names: None,
        }
    }

    const RETRY_IN_5: &[(&str, &str)] = &[("retry-after", "5")];

    /// One error of each kind, with its documented answer. The match has no wildcard: a new
    /// variant does not compile until it is listed here.
    fn documented(kind: ApiErrorKind) -> Documented {
        use ApiErrorKind as K;
        match kind {
            K::InvalidHeader => Documented {
                names: Some(("header", "Idempotency-Key")),
                ..doc(
                    ApiError::InvalidHeader {
                        header: "Idempotency-Key",
                        message: "is required".into(),
                    },
                    400,
                    "invalid-header",
                    "Idempotency-Key header is required",
                )
            },
            K::MalformedJson => doc(
                ApiError::MalformedJson(
                    serde_json::from_str::<serde_json::Value>("{").unwrap_err(),
                ),
                400,
                "malformed-json",
                "not valid JSON (EOF while parsing an object",
            ),
            K::Validation => Documented {
                names: Some(("field", "notify")),
                ..doc(
                    ApiError::validation("notify", "is required"),
                    422,
                    "validation",
                    "notify: is required",
                )
            },
            K::PayloadTooLarge => doc(
                ApiError::PayloadTooLarge { limit: 10 },
                413,
                "payload-too-large",
                "at most 10 bytes",
            ),
            K::TextTooLong => Documented {
                names: Some(("field", "text")),
                ..doc(
                    ApiError::TextTooLong { max_chars: 7 },
                    413,
                    "text-too-long",
                    "text: at most 7 characters",
                )
            },
            K::TooManyParts => Documented {
                names: Some(("field", "text")),
                ..doc(
                    ApiError::TooManyParts {
                        needed: 300,
                        max_parts: 256,
                    },
                    413,
                    "text-too-many-parts",
                    "takes 300 model calls",
                )
            },
            K::UnsupportedMediaType => doc(
                ApiError::UnsupportedMediaType {
                    got: Some("text/plain".into()),
                },
                415,
                "unsupported-media-type",
                "(got text/plain)",
            ),
            K::UnreadableBody => doc(
                ApiError::UnreadableBody(actix_web::error::PayloadError::Incomplete(None)),
                400,
                "unreadable-body",
                "could not be read (",
            ),
            K::RequestTimeout => Documented {
                close: true,
                ..doc(
                    ApiError::RequestTimeout,
                    408,
                    "request-timeout",
                    "send it again at once and in full",
                )
            },
            K::MalformedRequest => doc(
                ApiError::MalformedRequest,
                400,
                "malformed-request",
                "well-formed HTTP/1.1",
            ),
            K::HeadTooLarge => doc(ApiError::HeadTooLarge, 431, "head-too-large", "128 KiB"),
            K::BodyBudgetExhausted => Documented {
                headers: &[("retry-after", "1")],
                close: true,
                ..doc(
                    ApiError::BodyBudgetExhausted,
                    503,
                    "busy",
                    "nothing was read, stored or enqueued",
                )
            },
            K::TenantBodyShareExhausted => Documented {
                headers: &[("retry-after", "1")],
                close: true,
                ..doc(
                    ApiError::TenantBodyShareExhausted,
                    503,
                    "busy",
                    "its share (half) of the room",
                )
            },
            K::InProgress => Documented {
                headers: &[("retry-after", "1")],
                ..doc(
                    ApiError::InProgress,
                    409,
                    "idempotency-in-progress",
                    "has not finished",
                )
            },
            K::KeyReused => doc(
                ApiError::KeyReused,
                422,
                "idempotency-key-reused",
                "use a new key",
            ),
            K::RedisUnavailable => Documented {
                headers: RETRY_IN_5,
                ..doc(
                    ApiError::RedisUnavailable("connection refused 10.0.0.7:6379".into()),
                    503,
                    "redis-unavailable",
                    "Nothing was stored or enqueued",
                )
            },
            K::PostgresUnavailable => Documented {
                headers: RETRY_IN_5,
                ..doc(
                    ApiError::PostgresUnavailable(crate::db::DbError::Pool(
                        deadpool_postgres::PoolError::Closed,
                    )),
                    503,
                    "postgres-unavailable",
                    "Nothing was stored or enqueued",
                )
            },
            K::Unavailable => Documented {
                headers: RETRY_IN_5,
                ..doc(
                    ApiError::Unavailable("bad record".into()),
                    503,
                    "unavailable",
                    "Nothing was stored or enqueued",
                )
            },
            K::NotReady => Documented {
                headers: RETRY_IN_5,
                ..doc(
                    ApiError::NotReady("redis".into()),
                    503,
                    "not-ready",
                    "Not ready to serve traffic: redis.",
                )
            },
            K::NotFound => doc(
                ApiError::NotFound("no such job".into()),
                404,
                "not-found",
                "no such job",
            ),
            K::MethodNotAllowed => Documented {
                headers: &[("allow", "POST")],
                ..doc(
                    ApiError::MethodNotAllowed { allow: "POST" },
                    405,
                    "method-not-allowed",
                    "Use POST on this path.",
                )
            },
            K::Unauthorized => Documented {
                headers: &[("www-authenticate", "Bearer")],
                ..doc(
                    ApiError::Unauthorized("no token"),
                    401,
                    "unauthorized",
                    "no token: send Authorization: Bearer",
                )
            },
            K::RateLimited => Documented {
                headers: &[("retry-after", "3")],
                ..doc(
                    ApiError::RateLimited {
                        limit: Limit::Rate,
                        retry_after_s: 3,
                    },
                    429,
                    "rate-limited",
                    "job rate (rate_per_s/burst) is exhausted; retry in 3 s",
                )
            },
            K::BudgetExhausted => Documented {
                headers: &[("retry-after", "3600")],
                ..doc(
                    ApiError::BudgetExhausted {
                        cost: 900,
                        budget: 10_000,
                        left: 500,
                        resets_at: "2026-12-03T00:00:00Z".into(),
                        retry_after_s: 3600,
                    },
                    429,
                    "budget-exhausted",
                    "has 500 of 10000 tokens left in this period; the budget resets at 2026-12-03T00:00:00Z",
                )
            },
            K::NotReplicated => Documented {
                headers: &[("retry-after", "2")],
                ..doc(
                    ApiError::NotReplicated {
                        replicas: 1,
                        cause: crate::stream::replicas::NotReplicated::TimedOut {
                            acked: 0,
                            wanted: 1,
                            timeout_ms: 100,
                        },
                    },
                    503,
                    "not-replicated",
                    "fewer than 1 Redis replica(s) confirmed it in time (SUMMARYD_REDIS_MIN_REPLICAS_ACK",
                )
            },
        }
    }

    #[tokio::test]
    async fn every_variant_is_problem_json_with_its_documented_status_type_and_headers() {
        for kind in ApiErrorKind::iter() {
            let doc = documented(kind);
            let res = doc.error.error_response();
            assert_eq!(res.status().as_u16(), doc.status, "{kind:?}");
            assert_eq!(doc.error.status_code(), res.status(), "{kind:?}");
            assert_ne!(res.status(), StatusCode::INTERNAL_SERVER_ERROR, "{kind:?}");
            assert_eq!(res.headers().get(CONTENT_TYPE).unwrap(), PROBLEM_JSON);
            let mut headers: Vec<(String, String)> = res
                .headers()
                .iter()
                .filter(|(name, _)| **name != CONTENT_TYPE)
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                .collect();
            headers.sort();
            let expected: Vec<(String, String)> = doc
                .headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(headers, expected, "{kind:?}");
            if doc.status == 503 {
                assert!(res.headers().contains_key(RETRY_AFTER), "{kind:?}");
            }
            assert_eq!(
                res.head().connection_type() == ConnectionType::Close,
                doc.close,
                "{kind:?}"
            );

            let body = actix_web::body::to_bytes(res.into_body()).await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body, serde_json::to_value(doc.error.problem()).unwrap());
            assert_eq!(
                body["type"],
                format!("tag:summaryd,2025:problems/{}", doc.slug),
                "{kind:?}"
            );
            assert_eq!(body["status"], doc.status, "{kind:?}");
            assert!(!body["title"].as_str().unwrap().is_empty(), "{kind:?}");
            let detail = body["detail"].as_str().unwrap();
            assert!(detail.contains(doc.detail), "{kind:?}: {detail}");
            let mut keys: Vec<&str> = body
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            keys.sort_unstable();
            let mut expected = vec!["detail", "status", "title", "type"];
            if let Some((key, value)) = doc.names {
                assert_eq!(body[key], value, "{kind:?}");
                expected.push(key);
                expected.sort_unstable();
            }
            assert_eq!(keys, expected, "{kind:?}");
        }
    }

    #[test]
    fn each_limit_is_named_in_the_log_line_and_the_detail() {
        let limited = |limit| ApiError::RateLimited {
            limit,
            retry_after_s: 2,
        };
        let in_flight = limited(Limit::InFlight);
        assert_eq!(
            in_flight.to_string(),
            "over its max_in_flight limit; retry in 2 s"
        );
        let p = in_flight.problem();
        assert!(p.detail.contains("max_in_flight") && p.detail.contains("retry in 2 s"));
        assert_eq!(
            limited(Limit::Rate).to_string(),
            "over its rate limit; retry in 2 s"
        );
        let notify = limited(Limit::NotifyRate);
        assert_eq!(
            notify.to_string(),
            "over its notify_per_hour limit; retry in 2 s"
        );
        let p = notify.problem();
        assert!(p.detail.contains("notify_per_hour") && p.detail.contains("retry in 2 s"));
        assert_eq!(p.status, 429);
    }

    #[test]
    fn store_errors_become_their_answers_with_whole_seconds_rounded_up() {
        let over = |ms| {
            ApiError::from(StoreError::OverLimit(crate::stream::OverLimit {
                limit: Limit::Rate,
                retry_after: std::time::Duration::from_millis(ms),
            }))
        };
        for (ms, seconds) in [(0, 1), (1, 1), (1_000, 1), (1_001, 2), (2_500, 3)] {
            assert!(
                matches!(over(ms), ApiError::RateLimited { retry_after_s, .. } if retry_after_s == seconds),
                "{ms} ms"
            );
        }
        assert!(matches!(
            ApiError::from(StoreError::InProgress),
            ApiError::InProgress
        ));
        assert!(matches!(
            ApiError::from(StoreError::KeyReused),
            ApiError::KeyReused
        ));
        let corrupt = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let unavailable = ApiError::from(StoreError::Corrupt(corrupt));
        assert!(
            matches!(&unavailable, ApiError::Unavailable(why) if why.starts_with("EOF while parsing")),
            "{unavailable:?}"
        );
    }

    #[test]
    fn a_job_larger_than_the_whole_budget_is_told_it_can_never_fit() {
        let p = ApiError::BudgetExhausted {
            cost: 20_000,
            budget: 10_000,
            left: 10_000,
            resets_at: "2026-12-03T00:00:00Z".into(),
            retry_after_s: 60,
        }
        .problem();
        assert!(
            p.detail.contains("more than this tenant's whole budget"),
            "{}",
            p.detail
        );
        assert!(p.detail.contains("can never be accepted"), "{}", p.detail);
        assert!(p.problem_type.ends_with("/budget-exhausted"));
    }

    #[test]
    fn server_errors_do_not_leak_causes() {
        let p = ApiError::RedisUnavailable("connection refused 10.0.0.7:6379".into()).problem();
        assert!(!p.detail.contains("10.0.0.7"));
    }

    #[test]
    fn server_errors_are_logged_except_load_shedding() {
        for kind in ApiErrorKind::iter() {
            let spec = documented(kind).error.spec();
            let shed = matches!(
                kind,
                ApiErrorKind::BodyBudgetExhausted | ApiErrorKind::TenantBodyShareExhausted
            );
            assert_eq!(
                spec.logged,
                spec.status.is_server_error() && !shed,
                "{kind:?}"
            );
        }
    }
}
