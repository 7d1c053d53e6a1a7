//! Turning an outbox payload into the email a person receives.
//!
//! The payload was written by `db::summaries::commit_with_outbox`; anything missing or
//! malformed here will be just as malformed on every later attempt, so a `ComposeError`
//! is a permanent failure for that row (it needs a person, not a retry).

use serde_json::Value;

use super::OutgoingEmail;
use crate::domain::{Email, JobId};

pub const SUMMARY_READY_SUBJECT: &str = "Your summary is ready";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComposeError {
    #[error("outbox payload is missing the field {0:?}")]
    MissingField(&'static str),
    #[error("outbox payload field {field:?} is invalid: {reason}")]
    InvalidField { field: &'static str, reason: String },
}

/// The "summary ready" email for one outbox payload `{job_id, tenant, to, summary}`.
pub fn summary_ready_email(from: &str, payload: &Value) -> Result<OutgoingEmail, ComposeError> {
    let job_id: JobId = string_field(payload, "job_id")?
        .parse()
        .map_err(|e: uuid::Error| invalid("job_id", e.to_string()))?;
    let to = Email::parse(string_field(payload, "to")?).map_err(|e| invalid("to", e.message))?;
    let summary = string_field(payload, "summary")?;
    if summary.trim().is_empty() {
        return Err(invalid("summary", "is empty".into()));
    }
    let text = format!(
        "Hello,\n\nthe summary you requested is ready.\n\nJob: {job_id}\n\n{summary}\n\n-- \nsummaryd\n"
    );
    Ok(OutgoingEmail {
        from: from.to_owned(),
        to: to.as_str().to_owned(),
        subject: SUMMARY_READY_SUBJECT.to_owned(),
        text,
    })
}

fn string_field<'a>(payload: &'a Value, field: &'static str) -> Result<&'a str, ComposeError> {
    match payload.get(field) {
        None | Some(Value::Null) => Err(ComposeError::MissingField(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(invalid(field, "is not a string".into())),
    }
}

fn invalid(field: &'static str, reason: String) -> ComposeError {
    ComposeError::InvalidField { field, reason }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const JOB: &str = "3f2b1c9e-5d4a-5b6c-8d7e-0f1a2b3c4d5e";

    #[test]
    fn email_carries_recipient_summary_and_job_id() {
        let payload =
            json!({"job_id": JOB, "tenant": "acme", "to": "a@b.co", "summary": "Q3 is up."});
        let email = summary_ready_email("me@x.io", &payload).unwrap();
        assert_eq!(email.from, "me@x.io");
        assert_eq!(email.to, "a@b.co");
        assert!(email.subject.contains("summary is ready"));
        assert!(email.text.contains("Q3 is up.") && email.text.contains(JOB));
    }

    #[test]
    fn missing_or_invalid_fields_are_errors() {
        let ok = json!({"job_id": JOB, "to": "a@b.co", "summary": "s"});
        for (field, bad) in [
            ("job_id", json!("not-a-uuid")),
            ("job_id", json!(7)),
            ("to", json!("nobody")),
            ("summary", json!("  ")),
            ("summary", Value::Null),
        ] {
            let mut payload = ok.clone();
            payload[field] = bad;
            assert!(summary_ready_email("f@x.io", &payload).is_err(), "{field}");
        }
        let mut payload = ok.clone();
        payload.as_object_mut().unwrap().remove("to");
        assert_eq!(
            summary_ready_email("f@x.io", &payload),
            Err(ComposeError::MissingField("to"))
        );
    }
}
