//! Every error the HTTP API can answer, mapped once to RFC 9457 problem details.
//!
//! Handlers and extractors return `ApiError`; actix calls `error_response`, so no error
//! path can fall back to actix's text/plain bodies or to a 500.

use actix_web::http::StatusCode;
use actix_web::http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use super::idempotency::StoreError;
use crate::stream::Limit;

fn limit_name(limit: Limit) -> &'static str {
    match limit {
        Limit::Rate => "rate",
        Limit::InFlight => "max_in_flight",
    }
}

pub const PROBLEM_JSON: &str = "application/problem+json";

/// A client retrying a 409 sooner than this would only meet the same in-progress marker;
/// the enqueue behind it normally takes milliseconds.
const CONFLICT_RETRY_AFTER_S: &str = "1";
/// Bodies in flight finish in milliseconds, or are cut off at the request deadline.
const BODY_BUDGET_RETRY_AFTER_S: &str = "1";
/// Redis and Postgres restarts and failovers take seconds; sooner retries only add load.
const UNAVAILABLE_RETRY_AFTER_S: &str = "5";

/// The RFC 9457 body. `field` / `header` name what the client has to fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// A non-resolvable `tag:` URI identifying the kind of problem (RFC 9457 §3.1.1).
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    /// What went wrong and what to change.
    pub detail: String,
    /// The body field at fault, for 422 validation errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The request header at fault, for 400 header errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{header}: {message}")]
    InvalidHeader {
        header: &'static str,
        message: String,
    },
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    #[error("{field}: {message}")]
    Validation { field: String, message: String },
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// Within the byte limit, but longer than the model's context budget: it could never
    /// be summarised, so it must not reach the queue.
    #[error("text longer than {max_chars} characters")]
    TextTooLong { max_chars: usize },
    #[error("unsupported content type {got:?}")]
    UnsupportedMediaType { got: Option<String> },
    #[error("could not read the request body: {0}")]
    UnreadableBody(String),
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
    #[error("a request with this Idempotency-Key is still in progress")]
    InProgress,
    #[error("Idempotency-Key reused with a different body")]
    KeyReused,
    #[error("Redis unavailable: {0}")]
    RedisUnavailable(String),
    #[error("Postgres unavailable: {0}")]
    PostgresUnavailable(String),
    /// A dependency answered with something we cannot use (e.g. an unreadable record).
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
}

impl ApiError {
    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Validation {
            field: field.into(),
            message: message.into(),
        }
    }

    /// (slug of the type URI, title).
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Self::InvalidHeader { .. } => ("invalid-header", "Invalid request header"),
            Self::MalformedJson(_) => ("malformed-json", "Malformed JSON"),
            Self::Validation { .. } => ("validation", "Request body does not match the schema"),
            Self::PayloadTooLarge { .. } => ("payload-too-large", "Request body too large"),
            Self::TextTooLong { .. } => ("text-too-long", "Text too long for the model"),
            Self::UnsupportedMediaType { .. } => {
                ("unsupported-media-type", "Unsupported media type")
            }
            Self::UnreadableBody(_) => ("unreadable-body", "Request body could not be read"),
            Self::RequestTimeout => ("request-timeout", "Request not received in time"),
            Self::MalformedRequest => ("malformed-request", "Malformed HTTP request"),
            Self::HeadTooLarge => ("head-too-large", "Request header fields too large"),
            Self::BodyBudgetExhausted => ("busy", "Too many request bodies in flight"),
            Self::InProgress => (
                "idempotency-in-progress",
                "Request with this key in progress",
            ),
            Self::KeyReused => (
                "idempotency-key-reused",
                "Idempotency-Key reused with a different body",
            ),
            Self::RedisUnavailable(_) => ("redis-unavailable", "Job queue unavailable"),
            Self::PostgresUnavailable(_) => ("postgres-unavailable", "Database unavailable"),
            Self::Unavailable(_) => ("unavailable", "Temporarily unavailable"),
            Self::NotReady(_) => ("not-ready", "Not ready"),
            Self::NotFound(_) => ("not-found", "Not found"),
            Self::MethodNotAllowed { .. } => ("method-not-allowed", "Method not allowed"),
            Self::Unauthorized(_) => ("unauthorized", "Authentication required"),
            Self::RateLimited { .. } => ("rate-limited", "Too many requests"),
        }
    }

    /// What the client should do; never echoes internal error text for 5xx.
    fn detail(&self) -> String {
        match self {
            Self::InvalidHeader { header, message } => format!("{header} header {message}"),
            Self::MalformedJson(e) => {
                format!("The body is not valid JSON ({e}); send a JSON object.")
            }
            Self::Validation { field, message } => format!("{field}: {message}"),
            Self::PayloadTooLarge { limit } => {
                format!("The body must be at most {limit} bytes; shorten the text.")
            }
            Self::TextTooLong { max_chars } => format!(
                "text: at most {max_chars} characters fit the model's context; shorten or split the text."
            ),
            Self::UnsupportedMediaType { got } => format!(
                "Send the body as Content-Type: application/json (got {}).",
                got.as_deref().unwrap_or("no Content-Type")
            ),
            Self::UnreadableBody(e) => format!("The body could not be read ({e}); send it again."),
            Self::RequestTimeout => "The request was not received within the server's deadline; \
                                     send it again at once and in full."
                .into(),
            Self::MalformedRequest => "The request line, a header or Content-Length could not be \
                                       parsed; send a well-formed HTTP/1.1 request."
                .into(),
            Self::HeadTooLarge => "The request line and headers must fit in 128 KiB (and at \
                                   most 96 headers); send fewer or shorter headers."
                .into(),
            Self::BodyBudgetExhausted => "The server is reading as many request bodies as it \
                                          can hold; nothing was read, stored or enqueued. Retry \
                                          after the Retry-After delay (same Idempotency-Key)."
                .into(),
            Self::InProgress => "The first request with this Idempotency-Key has not finished; \
                                 retry after the Retry-After delay with the same key and body."
                .into(),
            Self::KeyReused => "This Idempotency-Key was already used with a different body; \
                                use a new key for a new request."
                .into(),
            Self::RedisUnavailable(_) | Self::PostgresUnavailable(_) | Self::Unavailable(_) => {
                "Nothing was stored or enqueued; retry after the Retry-After delay \
                 (with the same Idempotency-Key for a POST)."
                    .into()
            }
            Self::NotReady(why) => format!("Not ready to serve traffic: {why}."),
            Self::NotFound(what) => what.clone(),
            Self::MethodNotAllowed { allow } => format!("Use {allow} on this path."),
            Self::Unauthorized(why) => {
                format!("{why}: send Authorization: Bearer <your tenant token>.")
            }
            Self::RateLimited {
                limit: Limit::Rate,
                retry_after_s,
            } => format!(
                "This tenant's job rate (rate_per_s/burst) is exhausted; retry in {retry_after_s} s with the same Idempotency-Key."
            ),
            Self::RateLimited {
                limit: Limit::InFlight,
                retry_after_s,
            } => format!(
                "This tenant has max_in_flight jobs accepted and not yet finished; retry in {retry_after_s} s with the same Idempotency-Key."
            ),
        }
    }

    pub fn problem(&self) -> Problem {
        let (slug, title) = self.kind();
        Problem {
            problem_type: format!("tag:summaryd,2025:problems/{slug}"),
            title: title.into(),
            status: self.status_code().as_u16(),
            detail: self.detail(),
            field: match self {
                Self::Validation { field, .. } => Some(field.clone()),
                Self::TextTooLong { .. } => Some("text".into()),
                _ => None,
            },
            header: match self {
                Self::InvalidHeader { header, .. } => Some((*header).to_owned()),
                _ => None,
            },
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::InvalidHeader { .. } | Self::MalformedJson(_) | Self::UnreadableBody(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::Validation { .. } | Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::PayloadTooLarge { .. } | Self::TextTooLong { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::InProgress => StatusCode::CONFLICT,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::MalformedRequest => StatusCode::BAD_REQUEST,
            Self::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::BodyBudgetExhausted
            | Self::RedisUnavailable(_)
            | Self::PostgresUnavailable(_)
            | Self::Unavailable(_)
            | Self::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        // A refusal for lack of room is load shedding, counted in the request metrics; a
        // log line each would flood the log exactly when the process is under attack.
        if status.is_server_error() && !matches!(self, Self::BodyBudgetExhausted) {
            // The cause stays in the log; the client gets what to do about it.
            tracing::warn!(error = %self, status = status.as_u16(), "request failed");
        }
        let mut builder = HttpResponse::build(status);
        builder.insert_header((CONTENT_TYPE, PROBLEM_JSON));
        match self {
            Self::InProgress => {
                builder.insert_header((RETRY_AFTER, CONFLICT_RETRY_AFTER_S));
            }
            Self::MethodNotAllowed { allow } => {
                builder.insert_header((ALLOW, *allow));
            }
            Self::Unauthorized(_) => {
                builder.insert_header((WWW_AUTHENTICATE, "Bearer"));
            }
            Self::RateLimited { retry_after_s, .. } => {
                builder.insert_header((RETRY_AFTER, retry_after_s.to_string()));
            }
            // The rest of the body is not read: close the connection rather than let the
            // client keep it (and its buffers) open.
            Self::RequestTimeout => {
                builder.force_close();
            }
            Self::BodyBudgetExhausted => {
                builder.insert_header((RETRY_AFTER, BODY_BUDGET_RETRY_AFTER_S));
                builder.force_close();
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE => {
                builder.insert_header((RETRY_AFTER, UNAVAILABLE_RETRY_AFTER_S));
            }
            _ => {}
        }
        // Serialising a struct of strings cannot fail; an empty body still carries the status.
        builder.body(serde_json::to_string(&self.problem()).unwrap_or_default())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InProgress => Self::InProgress,
            StoreError::KeyReused => Self::KeyReused,
            StoreError::Unavailable(cause) => Self::RedisUnavailable(cause),
            StoreError::Corrupt(cause) => Self::Unavailable(cause),
            StoreError::OverLimit(over) => Self::RateLimited {
                limit: over.limit,
                // Whole seconds, rounded up: a client retrying sooner is refused again.
                retry_after_s: over.retry_after.as_millis().div_ceil(1000).max(1) as u64,
            },
        }
    }
}

impl From<deadpool_redis::PoolError> for ApiError {
    fn from(e: deadpool_redis::PoolError) -> Self {
        Self::RedisUnavailable(e.to_string())
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        Self::RedisUnavailable(e.to_string())
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> Self {
        Self::PostgresUnavailable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_problem_json_and_never_500() {
        let all = [
            ApiError::InvalidHeader {
                header: "Idempotency-Key",
                message: "is required".into(),
            },
            ApiError::MalformedJson("eof".into()),
            ApiError::validation("notify", "is required"),
            ApiError::PayloadTooLarge { limit: 10 },
            ApiError::UnsupportedMediaType { got: None },
            ApiError::UnreadableBody("reset".into()),
            ApiError::RequestTimeout,
            ApiError::MalformedRequest,
            ApiError::HeadTooLarge,
            ApiError::BodyBudgetExhausted,
            ApiError::InProgress,
            ApiError::KeyReused,
            ApiError::RedisUnavailable("down".into()),
            ApiError::PostgresUnavailable("down".into()),
            ApiError::Unavailable("bad record".into()),
            ApiError::NotReady("redis".into()),
            ApiError::NotFound("no such job".into()),
            ApiError::MethodNotAllowed { allow: "POST" },
        ];
        for e in all {
            let res = e.error_response();
            assert_ne!(res.status(), StatusCode::INTERNAL_SERVER_ERROR, "{e}");
            assert_eq!(res.headers().get(CONTENT_TYPE).unwrap(), PROBLEM_JSON);
            let p = e.problem();
            assert_eq!(p.status, res.status().as_u16());
            assert!(!p.detail.is_empty() && !p.title.is_empty());
            if res.status() == StatusCode::SERVICE_UNAVAILABLE {
                assert!(res.headers().contains_key(RETRY_AFTER), "{e}");
            }
        }
    }

    #[test]
    fn server_errors_do_not_leak_causes() {
        let p = ApiError::RedisUnavailable("connection refused 10.0.0.7:6379".into()).problem();
        assert!(!p.detail.contains("10.0.0.7"));
    }
}
