use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{InvalidEvent, Job, JobId, TenantId, WebhookUrl};

/// A signed webhook to send: the worker commits it as an outbox row (with the summary, or
/// before the dead letter), the relay signs and posts it. Its JSON is the row's payload,
/// so the field names are a stored format. The webhook-id is the row's dedupe key
/// ([`WebhookEvent::webhook_id`]): the same on every attempt, so a receiver can drop a
/// repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// Whose secrets sign it, and whose endpoint state (disabled or not) applies.
    pub tenant: TenantId,
    pub url: WebhookUrl,
    /// The request body, as sent on every attempt.
    pub body: WebhookBody,
}

/// The body of a webhook request (Standard Webhooks' `type`, `timestamp`, `data`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookBody {
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When the event happened (not when this attempt is made: that is `webhook-timestamp`).
    pub timestamp: DateTime<Utc>,
    pub data: EventData,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[serde(rename = "summary.completed")]
    Completed,
    #[serde(rename = "summary.failed")]
    Failed,
}

/// The job's status as GET reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventStatus {
    Done,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventData {
    pub job_id: JobId,
    pub status: EventStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// summaryd's own wording of the failure class (GET's `error`), never a provider's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
}

impl EventType {
    /// The name receivers see in `type`, and the tail of the webhook-id.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Completed => "summary.completed",
            EventType::Failed => "summary.failed",
        }
    }
}

impl WebhookEvent {
    /// The outbox topic of every webhook row. Stored on every row: fixed forever.
    pub const TOPIC: &'static str = "webhook";

    /// `summary.completed` for a job whose summary is being committed now.
    pub fn completed(
        job: &Job,
        url: WebhookUrl,
        summary: &str,
        model: &str,
        completed_at: DateTime<Utc>,
    ) -> Self {
        Self {
            tenant: job.tenant.clone(),
            url,
            body: WebhookBody {
                kind: EventType::Completed,
                timestamp: completed_at,
                data: EventData {
                    job_id: job.job_id,
                    status: EventStatus::Done,
                    summary: Some(summary.to_owned()),
                    error: None,
                    model: Some(model.to_owned()),
                    completed_at: Some(completed_at),
                },
            },
        }
    }

    /// `summary.failed` for a job being dead-lettered; `error` is the tenant-facing wording.
    pub fn failed(job: &Job, url: WebhookUrl, error: &str, failed_at: DateTime<Utc>) -> Self {
        Self {
            tenant: job.tenant.clone(),
            url,
            body: WebhookBody {
                kind: EventType::Failed,
                timestamp: failed_at,
                data: EventData {
                    job_id: job.job_id,
                    status: EventStatus::Failed,
                    summary: None,
                    error: Some(error.to_owned()),
                    model: None,
                    completed_at: None,
                },
            },
        }
    }

    /// The webhook-id of a job's event of one type, which is also the row's dedupe key: one
    /// event of each type per job, however often the job is delivered or the row is sent.
    pub fn webhook_id(job_id: JobId, kind: EventType) -> String {
        let tail = kind.as_str().replace('.', "_");
        format!("msg_{}_{tail}", job_id.as_uuid().simple())
    }

    /// This event's webhook-id.
    pub fn id(&self) -> String {
        Self::webhook_id(self.body.data.job_id, self.body.kind)
    }

    /// The bytes every attempt sends (and signs).
    pub fn body_json(&self) -> String {
        // A struct of strings, an enum and timestamps: serialising cannot fail.
        serde_json::to_string(&self.body).unwrap_or_default()
    }

    /// Decode a stored payload; errors name the field at fault.
    pub(crate) fn decode(payload: &serde_json::Value) -> Result<Self, InvalidEvent> {
        serde_path_to_error::deserialize(payload).map_err(|e| InvalidEvent {
            topic: Self::TOPIC,
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::JobText;

    fn job() -> Job {
        Job {
            job_id: JobId::from_scoped_key("k"),
            tenant: TenantId::parse("acme").unwrap(),
            text: JobText::from("text"),
            notify: None,
            webhook: None,
            created_at: Utc::now(),
        }
    }

    fn url() -> WebhookUrl {
        WebhookUrl::from_stored("https://hooks.example.com/summaryd").unwrap()
    }

    #[test]
    fn completed_body_has_the_contract_s_fields() {
        let at = DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let event = WebhookEvent::completed(&job(), url(), "Up 4%.", "gpt-4.1-mini", at);
        let body: serde_json::Value = serde_json::from_str(&event.body_json()).unwrap();
        assert_eq!(
            body,
            json!({
                "type": "summary.completed",
                "timestamp": "2026-12-02T10:00:00Z",
                "data": {
                    "job_id": job().job_id.to_string(),
                    "status": "done",
                    "summary": "Up 4%.",
                    "model": "gpt-4.1-mini",
                    "completed_at": "2026-12-02T10:00:00Z",
                }
            })
        );
    }

    #[test]
    fn failed_body_carries_the_error_and_no_summary() {
        let event = WebhookEvent::failed(
            &job(),
            url(),
            "the text could not be summarised",
            Utc::now(),
        );
        let body: serde_json::Value = serde_json::from_str(&event.body_json()).unwrap();
        assert_eq!(body["type"], "summary.failed");
        assert_eq!(body["data"]["status"], json!(EventStatus::Failed));
        assert_eq!(body["data"]["error"], "the text could not be summarised");
        assert!(body["data"].get("summary").is_none());
        assert!(body["data"].get("completed_at").is_none());
    }

    #[test]
    fn payload_round_trips_and_ids_are_per_job_and_type() {
        let event = WebhookEvent::completed(&job(), url(), "s", "m", Utc::now());
        let stored = serde_json::to_value(&event).unwrap();
        assert_eq!(WebhookEvent::decode(&stored).unwrap(), event);
        let id = event.id();
        assert_eq!(
            id,
            format!("msg_{}_summary_completed", job().job_id.as_uuid().simple())
        );
        assert_ne!(
            id,
            WebhookEvent::webhook_id(job().job_id, EventType::Failed)
        );
        let mut bad = stored.clone();
        bad["url"] = json!("not a url");
        let err = WebhookEvent::decode(&bad).unwrap_err().to_string();
        assert!(err.contains("url") && err.contains("webhook"), "{err}");
    }
}
