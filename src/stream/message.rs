//! The job as it travels on the stream. Field names are part of the on-wire format: old
//! messages still pending after an upgrade must parse, so only add optional fields.

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use redis::Value;
use serde::{Deserialize, Serialize};

use crate::domain::JobId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMessage {
    pub job_id: JobId,
    pub tenant: String,
    pub payload: JobPayload,
    /// When the API accepted the job; GET reports it as `created_at`.
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPayload {
    pub text: String,
    pub notify: String,
}

/// A stream entry that is not a job we can ever process: dead-letter it at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed job message: {0}")]
pub struct MalformedMessage(pub String);

impl JobMessage {
    pub fn to_fields(&self) -> [(&'static str, String); 4] {
        [
            ("job_id", self.job_id.to_string()),
            ("tenant", self.tenant.clone()),
            (
                "payload",
                serde_json::to_string(&self.payload).unwrap_or_default(),
            ),
            (
                "created_at",
                self.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            ),
        ]
    }

    pub fn from_fields(fields: &HashMap<String, Value>) -> Result<Self, MalformedMessage> {
        let get = |name: &str| -> Result<String, MalformedMessage> {
            match fields.get(name) {
                Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone())
                    .map_err(|_| MalformedMessage(format!("field {name} is not UTF-8"))),
                Some(Value::SimpleString(s)) => Ok(s.clone()),
                Some(_) => Err(MalformedMessage(format!(
                    "field {name} has an unexpected type"
                ))),
                None => Err(MalformedMessage(format!("field {name} is missing"))),
            }
        };
        let job_id = get("job_id")?
            .parse()
            .map_err(|e| MalformedMessage(format!("job_id: {e}")))?;
        let payload = serde_json::from_str(&get("payload")?)
            .map_err(|e| MalformedMessage(format!("payload: {e}")))?;
        let created_at = DateTime::parse_from_rfc3339(&get("created_at")?)
            .map_err(|e| MalformedMessage(format!("created_at: {e}")))?
            .with_timezone(&Utc);
        Ok(Self {
            job_id,
            tenant: get("tenant")?,
            payload,
            created_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_stream_fields() {
        let msg = JobMessage {
            job_id: JobId::from_scoped_key("x"),
            tenant: "acme".into(),
            payload: JobPayload {
                text: "Grüße. Hello.".into(),
                notify: "a@b.co".into(),
            },
            created_at: Utc::now(),
        };
        let fields: HashMap<String, Value> = msg
            .to_fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::BulkString(v.into_bytes())))
            .collect();
        let back = JobMessage::from_fields(&fields).unwrap();
        assert_eq!(back.job_id, msg.job_id);
        assert_eq!(back.payload, msg.payload);
        assert_eq!(
            back.created_at.timestamp_micros(),
            msg.created_at.timestamp_micros()
        );
    }

    #[test]
    fn missing_fields_are_malformed() {
        assert!(JobMessage::from_fields(&HashMap::new()).is_err());
    }
}
