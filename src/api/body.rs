//! Reading a JSON request body ourselves, so every failure maps to its documented status:
//! 415 wrong content type, 413 over the limit, 400 syntax, 422 schema (naming the field),
//! 408 too slow, 503 no room in the process's body budget. actix's `web::Json` would
//! answer some of these as text/plain 400s, and buffers without a process-wide bound.

use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use actix_web::web::{self, Bytes, BytesMut};
use futures_util::StreamExt;
use serde::de::IgnoredAny;
use serde_json::error::Category;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::problem::ApiError;
use crate::config::ApiSettings;
use crate::domain::{SummaryRequest, ValidSummaryRequest};

/// 415 unless the request says `application/json` (parameters allowed, charset only UTF-8,
/// which RFC 8259 makes the only JSON encoding).
pub(crate) fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
    let raw = req.headers().get(CONTENT_TYPE).map(|v| v.to_str());
    let unsupported = |got: Option<String>| ApiError::UnsupportedMediaType { got };
    let value = match raw {
        None => return Err(unsupported(None)),
        Some(Err(_)) => return Err(unsupported(Some("a non-ASCII value".into()))),
        Some(Ok(v)) => v,
    };
    let mut parts = value.split(';').map(str::trim);
    let essence = parts.next().unwrap_or_default();
    let charset_ok = parts.all(|p| match p.split_once('=') {
        Some((name, cs)) if name.trim().eq_ignore_ascii_case("charset") => {
            let cs = cs.trim().trim_matches('"');
            cs.eq_ignore_ascii_case("utf-8") || cs.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    });
    if essence.eq_ignore_ascii_case("application/json") && charset_ok {
        Ok(())
    } else {
        Err(unsupported(Some(value.to_owned())))
    }
}

/// Bodies up to this size may use the whole budget; larger ones only `LARGE_SHARE` of it.
/// Ordinary requests are a few KiB, so a flood of large, slow bodies can never take the
/// room they need.
const SMALL_BODY_BYTES: usize = 16 * 1024;
/// The part of the budget (numerator / denominator) that large bodies may hold together.
const LARGE_SHARE: (usize, usize) = (3, 4);

/// The process-wide budget for request-body bytes in flight. A body is read only once its
/// whole declared size is reserved, so what the process holds is bounded by the budget,
/// not by how many clients send at once, and a request that cannot get room is refused
/// before any of its body is read.
pub(crate) struct BodyBudget {
    all: Arc<Semaphore>,
    large: Arc<Semaphore>,
    wait: Duration,
}

/// Room for one body; returned to the budget when dropped (when the handler is done).
pub(crate) struct BodyPermit {
    _all: OwnedSemaphorePermit,
    _large: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    pub fn new(settings: &ApiSettings) -> Self {
        let total = settings.body_budget_bytes;
        let large = total / LARGE_SHARE.1 * LARGE_SHARE.0;
        Self {
            all: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
            // At least one body at the limit must fit, or large bodies could never be read.
            large: Arc::new(Semaphore::new(
                large
                    .max(settings.max_body_bytes)
                    .min(Semaphore::MAX_PERMITS),
            )),
            wait: settings.body_budget_wait,
        }
    }

    /// Reserve `bytes`, waiting at most the configured time for others to finish.
    pub(crate) async fn reserve(&self, bytes: usize) -> Result<BodyPermit, ApiError> {
        let n = u32::try_from(bytes).map_err(|_| ApiError::BodyBudgetExhausted)?;
        let give_up = Instant::now() + self.wait;
        let take = |sem: &Arc<Semaphore>| {
            tokio::time::timeout_at(give_up, sem.clone().acquire_many_owned(n))
        };
        let large = if bytes > SMALL_BODY_BYTES {
            match take(&self.large).await {
                Ok(Ok(permit)) => Some(permit),
                _ => return Err(ApiError::BodyBudgetExhausted),
            }
        } else {
            None
        };
        match take(&self.all).await {
            Ok(Ok(all)) => Ok(BodyPermit {
                _all: all,
                _large: large,
            }),
            _ => Err(ApiError::BodyBudgetExhausted),
        }
    }
}

/// Collect the body within the budget and by `deadline`, refusing (413) as soon as it
/// exceeds `limit` bytes: a declared Content-Length over the limit is refused before
/// reading anything. Without a Content-Length (chunked), room for `limit` is reserved.
pub(crate) async fn read_limited(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    budget: &BodyBudget,
    deadline: Instant,
) -> Result<(Bytes, BodyPermit), ApiError> {
    let too_large = || ApiError::PayloadTooLarge { limit };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let read = async {
        let permit = budget.reserve(declared.unwrap_or(limit)).await?;
        // Grown as bytes arrive, never sized from the header: a client that declares
        // 256 KiB and sends 10 bytes costs 10 bytes.
        let mut body = BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(ApiError::UnreadableBody)?;
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body.freeze(), permit))
    };
    tokio::time::timeout_at(deadline, read)
        .await
        .map_err(|_| ApiError::RequestTimeout)?
}

/// Parse and validate the body of `POST /v1/summaries`.
pub fn parse_summary_request(bytes: &[u8]) -> Result<ValidSummaryRequest, ApiError> {
    // serde would also build the struct from an array (`["text", "a@b.co"]`); the schema
    // is an object, so anything else is refused (after its syntax, which decides 400 vs 422).
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        serde_json::from_slice::<IgnoredAny>(bytes).map_err(classify)?;
        return Err(not_an_object());
    }
    // Straight into the struct rather than via `Value`, which would hide duplicate fields.
    let raw: SummaryRequest = serde_json::from_slice(bytes).map_err(classify)?;
    raw.validate()
        .map_err(|e| ApiError::validation(e.field, e.message))
}

fn not_an_object() -> ApiError {
    ApiError::validation(
        "body",
        "must be a JSON object with the fields text and notify",
    )
}

/// Syntax errors are the client's JSON (400); data errors are our schema (422).
fn classify(e: serde_json::Error) -> ApiError {
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::MalformedJson(e),
        Category::Data => {
            let msg = e.to_string();
            // serde names the offender in backticks: "unknown field `cc`, expected ...".
            let named = ["unknown field", "duplicate field"]
                .iter()
                .find(|p| msg.starts_with(*p))
                .and_then(|_| msg.split('`').nth(1));
            match named {
                Some(field) if msg.starts_with("unknown") => ApiError::validation(
                    field,
                    "is not part of the schema; the allowed fields are text and notify",
                ),
                Some(field) => ApiError::validation(field, "appears more than once"),
                None => not_an_object(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(json: &str) -> Option<String> {
        match parse_summary_request(json.as_bytes()) {
            Err(ApiError::Validation { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn schema_errors_name_the_field_and_syntax_errors_are_400() {
        assert_eq!(
            field_of(r#"{"text":"x","notify":"a@b.co","cc":1}"#).as_deref(),
            Some("cc")
        );
        assert_eq!(
            field_of(r#"{"text":"x","text":"y","notify":"a@b.co"}"#).as_deref(),
            Some("text")
        );
        assert_eq!(field_of(r#"["x","a@b.co"]"#).as_deref(), Some("body"));
        assert_eq!(field_of("null").as_deref(), Some("body"));
        assert_eq!(
            field_of(r#"{"text":5,"notify":"a@b.co"}"#).as_deref(),
            Some("text")
        );
        for bad in [r#"{"text":"#, "", "{'text':1}", r#"{"text":"x"} trailing"#] {
            assert!(
                matches!(
                    parse_summary_request(bad.as_bytes()),
                    Err(ApiError::MalformedJson(_))
                ),
                "{bad}"
            );
        }
        assert!(parse_summary_request(br#"{"text":"x","notify":"a@b.co"}"#).is_ok());
    }
}
