use serde::{Deserialize, Serialize};

use super::{Email, Job, JobId, TenantId};

/// The "summary ready" event: the database commits it with the summary (as an outbox row),
/// the relay delivers it, and the mailer turns it into the email. Its JSON is the row's
/// payload, so the field names are a stored format: rows written by older versions must
/// still decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryReady {
    pub job_id: JobId,
    pub tenant: TenantId,
    /// The recipient (the job's `notify`).
    pub to: Email,
    pub summary: String,
    /// When the API accepted the job, for the acceptance-to-email latency. Absent in rows
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// An outbox payload that is not a valid event. It will be just as invalid on every later
/// attempt, so the row needs a person, not a retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{topic} payload is invalid: {reason}")]
pub struct InvalidEvent {
    pub(crate) topic: &'static str,
    pub(crate) reason: String,
}

impl SummaryReady {
    /// The outbox topic. Stored on every row: fixed forever.
    pub const TOPIC: &'static str = "email.summary_ready";
    /// The payload field holding the job id (`summaryd outbox stuck` reports it even for a
    /// payload that does not decode).
    pub(crate) const JOB_ID_FIELD: &'static str = "job_id";

    /// The event of a job that asked for an email (`to` is its `notify`).
    pub fn new(job: &Job, to: Email, summary: impl Into<String>) -> Self {
        Self {
            job_id: job.job_id,
            tenant: job.tenant.clone(),
            to,
            summary: summary.into(),
            accepted_at: Some(job.created_at),
        }
    }

    /// The outbox dedupe key of a job's event, which is also the mail provider's
    /// idempotency key: one per job, so a job is emailed once however often it is sent.
    pub fn dedupe_key(job_id: JobId) -> String {
        format!("summary_ready:{job_id}")
    }

    /// Decode a stored payload. Errors name the field at fault; an event without a summary
    /// is invalid too (there would be nothing to tell the recipient).
    pub(crate) fn decode(payload: &serde_json::Value) -> Result<Self, InvalidEvent> {
        let event: Self = serde_path_to_error::deserialize(payload).map_err(|e| InvalidEvent {
            topic: Self::TOPIC,
            reason: e.to_string(),
        })?;
        if event.summary.trim().is_empty() {
            return Err(InvalidEvent {
                topic: Self::TOPIC,
                reason: "summary: is empty".into(),
            });
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const JOB: &str = "3f2b1c9e-5d4a-5b6c-8d7e-0f1a2b3c4d5e";

    fn stored() -> Value {
        json!({"job_id": JOB, "tenant": "acme", "to": "a@b.co", "summary": "Q3 is up."})
    }

    #[test]
    fn decodes_the_stored_payload_shape_and_encodes_it_back() {
        let event = SummaryReady::decode(&stored()).unwrap();
        assert_eq!(event.job_id.to_string(), JOB);
        assert_eq!(event.to.as_str(), "a@b.co");
        assert_eq!(serde_json::to_value(&event).unwrap(), stored());
        assert!(stored().get(SummaryReady::JOB_ID_FIELD).is_some());
    }

    #[test]
    fn invalid_payloads_are_errors_naming_the_field() {
        for (field, bad) in [
            ("job_id", json!("not-a-uuid")),
            ("job_id", json!(7)),
            ("tenant", json!("a:b")),
            ("to", json!("nobody")),
            ("summary", json!("  ")),
            ("summary", Value::Null),
        ] {
            let mut payload = stored();
            payload[field] = bad;
            let err = SummaryReady::decode(&payload).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
        let mut payload = stored();
        payload.as_object_mut().unwrap().remove("to");
        let err = SummaryReady::decode(&payload).unwrap_err().to_string();
        assert!(err.contains("`to`"), "{err}");
    }

    #[test]
    fn dedupe_key_is_per_job() {
        let job = JobId::from_scoped_key("k");
        assert_eq!(
            SummaryReady::dedupe_key(job),
            format!("summary_ready:{job}")
        );
    }
}
