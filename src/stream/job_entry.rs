//! A [`Job`] as a stream entry: the on-wire field names and formats, and nothing else.
//!
//! Entries still pending after an upgrade must parse, so fields may only be added, and
//! only as optional ones; the names below never change.

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use redis::Value;
use serde::Deserialize;
use serde_json::Map;

use crate::domain::{Email, Job, JobId, JobText, TenantId, TraceContext, WebhookUrl};

pub(crate) const JOB_ID: &str = "job_id";
pub(crate) const TENANT: &str = "tenant";
/// JSON object `{"text", "notify"?, "webhook"?}`, or `{"text_stored": true, …}` for a text
/// kept in Postgres (`db::job_texts`). A job has at least one of `notify` and `webhook` (the
/// target URL as a string).
pub(crate) const PAYLOAD: &str = "payload";
pub(crate) const CREATED_AT: &str = "created_at";
/// The W3C trace context of the accept (optional: absent with trace export off, and on
/// entries of older versions). A delivery continues that trace, a redelivery links to it.
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";

/// Every field of a job entry, in the order they are written.
pub(crate) const FIELDS: [&str; 4] = [JOB_ID, TENANT, PAYLOAD, CREATED_AT];

/// Fields of the `payload` JSON.
const TEXT: &str = "text";
const TEXT_STORED: &str = "text_stored";
const NOTIFY: &str = "notify";
const WEBHOOK: &str = "webhook";

/// What `payload` decodes into; its field names are `TEXT`, `TEXT_STORED`, `NOTIFY` and
/// `WEBHOOK`.
#[derive(Deserialize)]
struct Payload {
    text: Option<String>,
    #[serde(default)]
    text_stored: bool,
    notify: Option<String>,
    webhook: Option<String>,
}

/// A stream entry that is not a job we can ever process: dead-letter it at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed job message: {0}")]
pub struct MalformedMessage(pub String);

/// How times are written on entries (and copied into the job state): RFC 3339, UTC, µs.
pub(crate) fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

pub fn to_fields(job: &Job) -> [(&'static str, String); 4] {
    // A JSON object of two strings, built as a `Value`: serialising a `Value` has no error
    // path, so there is no fallback to get wrong.
    let mut payload = Map::new();
    match &job.text {
        JobText::Inline(text) => payload.insert(TEXT.into(), text.as_str().into()),
        JobText::Stored => payload.insert(TEXT_STORED.into(), true.into()),
    };
    if let Some(notify) = &job.notify {
        payload.insert(NOTIFY.into(), notify.as_str().into());
    }
    if let Some(webhook) = &job.webhook {
        payload.insert(WEBHOOK.into(), webhook.as_str().into());
    }
    [
        (JOB_ID, job.job_id.to_string()),
        (TENANT, job.tenant.to_string()),
        (PAYLOAD, serde_json::Value::Object(payload).to_string()),
        (CREATED_AT, timestamp(job.created_at)),
    ]
}

pub fn from_fields(fields: &HashMap<String, Value>) -> Result<Job, MalformedMessage> {
    let get = |name: &str| -> Result<String, MalformedMessage> {
        let bytes = field_bytes(fields, name)
            .ok_or_else(|| MalformedMessage(format!("field {name} is missing")))?;
        String::from_utf8(bytes).map_err(|_| MalformedMessage(format!("field {name} is not UTF-8")))
    };
    let malformed =
        |name: &str, e: &dyn std::fmt::Display| MalformedMessage(format!("{name}: {e}"));
    let job_id = get(JOB_ID)?.parse().map_err(|e| malformed(JOB_ID, &e))?;
    let tenant = TenantId::parse(&get(TENANT)?).map_err(|e| malformed(TENANT, &e.message))?;
    let payload: Payload =
        serde_json::from_str(&get(PAYLOAD)?).map_err(|e| malformed(PAYLOAD, &e))?;
    let notify = payload
        .notify
        .map(|raw| Email::parse(&raw).map_err(|e| malformed(NOTIFY, &e.message)))
        .transpose()?;
    let webhook = payload
        .webhook
        .map(|raw| WebhookUrl::from_stored(&raw).map_err(|e| malformed(WEBHOOK, &e.message)))
        .transpose()?;
    if notify.is_none() && webhook.is_none() {
        return Err(malformed(PAYLOAD, &"has neither notify nor webhook"));
    }
    let text = match (payload.text, payload.text_stored) {
        (Some(text), _) => JobText::Inline(text),
        (None, true) => JobText::Stored,
        (None, false) => return Err(malformed(PAYLOAD, &"has no text")),
    };
    let created_at = DateTime::parse_from_rfc3339(&get(CREATED_AT)?)
        .map_err(|e| malformed(CREATED_AT, &e))?
        .with_timezone(&Utc);
    Ok(Job {
        job_id,
        tenant,
        text,
        notify,
        webhook,
        created_at,
    })
}

/// The fields that carry `trace`, written after the job's own ([`to_fields`]).
pub fn trace_fields(trace: Option<&TraceContext>) -> Vec<(&'static str, String)> {
    let Some(trace) = trace else {
        return Vec::new();
    };
    let mut fields = vec![(TRACEPARENT, trace.traceparent().to_owned())];
    if let Some(state) = trace.tracestate() {
        fields.push((TRACESTATE, state.to_owned()));
    }
    fields
}

/// The trace context an entry carries. One that is absent or does not parse is no reason
/// to refuse the job: the delivery then starts a trace of its own.
pub fn trace_context(fields: &HashMap<String, Value>) -> Option<TraceContext> {
    let text = |name| String::from_utf8(field_bytes(fields, name)?).ok();
    TraceContext::parse(&text(TRACEPARENT)?, text(TRACESTATE).as_deref()).ok()
}

/// The job id of an entry, if it has a valid one (a malformed entry may not).
pub fn job_id(fields: &HashMap<String, Value>) -> Option<JobId> {
    String::from_utf8(field_bytes(fields, JOB_ID)?)
        .ok()?
        .parse()
        .ok()
}

/// The job id field exactly as the entry spells it (a script that finds the job's state
/// by it uses these very bytes).
pub(crate) fn job_id_as_spelt(fields: &HashMap<String, Value>) -> Option<String> {
    String::from_utf8(field_bytes(fields, JOB_ID)?).ok()
}

/// The value of one field as Redis returned it, or `None` if it is absent.
pub(crate) fn field_bytes(fields: &HashMap<String, Value>, name: &str) -> Option<Vec<u8>> {
    match fields.get(name)? {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_entry(fields: [(&'static str, String); 4]) -> HashMap<String, Value> {
        fields
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::BulkString(v.into_bytes())))
            .collect()
    }

    fn job() -> Job {
        Job {
            job_id: JobId::from_scoped_key("x"),
            tenant: TenantId::parse("acme").unwrap(),
            text: "Grüße. \"Hello.\"\n".into(),
            notify: Some(Email::parse("a@b.co").unwrap()),
            webhook: None,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn round_trips_through_stream_fields() {
        let job = job();
        let back = from_fields(&as_entry(to_fields(&job))).unwrap();
        assert_eq!(
            back.created_at.timestamp_micros(),
            job.created_at.timestamp_micros()
        );
        assert_eq!(
            Job {
                created_at: job.created_at,
                ..back
            },
            job
        );
    }

    /// The format of entries already on streams (and of `bench/run.sh`'s reference calls).
    #[test]
    fn parses_the_stored_wire_format() {
        let stored = as_entry([
            (JOB_ID, "6a0c1f8e-5b7d-4c2a-9e31-7d44b2f0a915".into()),
            (TENANT, "acme".into()),
            (PAYLOAD, r#"{"text":"Hi.","notify":"a@b.co"}"#.into()),
            (CREATED_AT, "2025-01-01T00:00:00.000000Z".into()),
        ]);
        let job = from_fields(&stored).unwrap();
        assert_eq!(job.tenant.as_str(), "acme");
        assert_eq!(job.text, JobText::from("Hi."));
        assert_eq!(job.notify.as_ref().unwrap().as_str(), "a@b.co");
        assert_eq!(timestamp(job.created_at), "2025-01-01T00:00:00.000000Z");
        assert_eq!(job.webhook, None);
        assert_eq!(to_fields(&job)[2].1, r#"{"notify":"a@b.co","text":"Hi."}"#);
    }

    #[test]
    fn a_webhook_travels_with_or_without_notify() {
        let webhook = WebhookUrl::from_stored("https://hooks.example.com/s?x=1").unwrap();
        let job = Job {
            notify: None,
            webhook: Some(webhook.clone()),
            ..job()
        };
        let fields = to_fields(&job);
        assert_eq!(
            fields[2].1,
            r#"{"text":"Grüße. \"Hello.\"\n","webhook":"https://hooks.example.com/s?x=1"}"#
        );
        let back = from_fields(&as_entry(fields)).unwrap();
        assert_eq!(back.webhook, Some(webhook));
        assert_eq!(back.notify, None);
    }

    #[test]
    fn a_stored_text_travels_as_a_reference() {
        let job = Job {
            text: JobText::Stored,
            ..job()
        };
        let fields = to_fields(&job);
        assert_eq!(fields[2].1, r#"{"notify":"a@b.co","text_stored":true}"#);
        assert_eq!(
            from_fields(&as_entry(fields)).unwrap().text,
            JobText::Stored
        );
    }

    #[test]
    fn the_trace_context_travels_beside_the_job_and_is_optional() {
        let trace = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("congo=t61rcWkgMzE"),
        )
        .unwrap();
        let mut entry = as_entry(to_fields(&job()));
        for (name, value) in trace_fields(Some(&trace)) {
            entry.insert(name.into(), Value::BulkString(value.into_bytes()));
        }
        assert_eq!(trace_context(&entry), Some(trace));
        assert_eq!(from_fields(&entry).map(|j| j.job_id), Ok(job().job_id));
        // Entries of older producers, and a context that does not parse, carry none.
        let mut old = as_entry(to_fields(&job()));
        assert_eq!(trace_context(&old), None);
        assert!(from_fields(&old).is_ok());
        old.insert(TRACEPARENT.into(), Value::BulkString(b"garbage".to_vec()));
        assert_eq!(trace_context(&old), None);
        assert!(from_fields(&old).is_ok());
        assert!(trace_fields(None).is_empty());
    }

    #[test]
    fn missing_or_invalid_fields_are_malformed() {
        assert!(from_fields(&HashMap::new()).is_err());
        for (name, bad) in [
            (TENANT, "a:b"),
            (PAYLOAD, r#"{"text":"Hi.","notify":"nobody"}"#),
            (PAYLOAD, r#"{"text":"Hi."}"#),
            (PAYLOAD, r#"{"text":"Hi.","webhook":"not a url"}"#),
            (PAYLOAD, r#"{"notify":"a@b.co"}"#),
            (PAYLOAD, r#"{"notify":"a@b.co","text_stored":false}"#),
        ] {
            let mut entry = as_entry(to_fields(&job()));
            entry.insert(name.into(), Value::BulkString(bad.as_bytes().to_vec()));
            assert!(from_fields(&entry).is_err(), "{name} = {bad}");
        }
    }
}
