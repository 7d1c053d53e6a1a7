//! Reading a JSON request body ourselves, so every failure maps to the contract's status:
//! 415 wrong content type, 413 over the limit, 400 syntax, 422 schema (naming the field).
//! actix's `web::Json` would answer some of these as text/plain 400s.

use actix_web::HttpRequest;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use actix_web::web::{self, Bytes, BytesMut};
use futures_util::StreamExt;
use serde::de::IgnoredAny;
use serde_json::error::Category;

use super::problem::ApiError;
use crate::domain::{SummaryRequest, ValidSummaryRequest};

/// 415 unless the request says `application/json` (parameters allowed, charset only UTF-8,
/// which RFC 8259 makes the only JSON encoding).
pub fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
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

/// Collect the body, refusing (413) as soon as it exceeds `limit` bytes: a declared
/// Content-Length over the limit is refused before reading anything.
pub async fn read_limited(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::PayloadTooLarge { limit };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::UnreadableBody(e.to_string()))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
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
        Category::Syntax | Category::Eof | Category::Io => ApiError::MalformedJson(e.to_string()),
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
