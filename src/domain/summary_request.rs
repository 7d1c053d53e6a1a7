use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Email, ValidationError, WebhookRules, WebhookUrl};

/// The body of `POST /v1/summaries` as it arrives: loosely typed so that a wrong type or a
/// missing field becomes a 422 naming the field rather than a generic parse error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryRequest {
    pub(crate) text: Option<serde_json::Value>,
    /// `null` is kept (`Some(Value::Null)`) and refused as the wrong type: an optional
    /// field is absent or valid, as the schema says.
    #[serde(default, deserialize_with = "present")]
    pub(crate) notify: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) webhook: Option<serde_json::Value>,
}

/// A field that is there, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSummaryRequest {
    pub notify: Option<Email>,
    /// `webhook.url`; the tenant's default `webhook_url` is not part of the request.
    pub webhook: Option<WebhookUrl>,
    pub text: String,
}

impl SummaryRequest {
    /// `rules`: what a `webhook.url` must satisfy (`[webhook]` settings). Whether the request
    /// asks for any effect at all (a `notify`, a `webhook` or the tenant's default) is the
    /// handler's to decide: only it knows the tenant.
    pub fn validate(self, rules: WebhookRules) -> Result<ValidSummaryRequest, ValidationError> {
        let text = match self.text {
            None => return Err(ValidationError::new("text", "is required")),
            Some(serde_json::Value::String(s)) => s,
            Some(_) => return Err(ValidationError::new("text", "must be a string")),
        };
        if text.trim().is_empty() {
            return Err(ValidationError::new("text", "must not be empty"));
        }
        // Postgres text cannot hold NUL, and the other C0 controls corrupt prompts and
        // emails: a job carrying one could be accepted but never finished.
        if let Some((at, c)) = text
            .chars()
            .enumerate()
            .find(|(_, c)| u32::from(*c) < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
        {
            return Err(ValidationError::new(
                "text",
                format!(
                    "must not contain NUL or control characters other than tab, newline and \
                     carriage return (found U+{:04X} at character {})",
                    u32::from(c),
                    at + 1
                ),
            ));
        }
        let notify = match self.notify {
            None => None,
            Some(serde_json::Value::String(s)) => Some(Email::parse_recipient(&s)?),
            Some(_) => {
                return Err(ValidationError::new(
                    "notify",
                    "must be a string (an email address)",
                ));
            }
        };
        let webhook = self.webhook.map(|w| webhook_url(w, rules)).transpose()?;
        Ok(ValidSummaryRequest {
            notify,
            webhook,
            text,
        })
    }
}

/// `{"url": "https://…"}` and nothing else: an object leaves room for options later.
fn webhook_url(value: Value, rules: WebhookRules) -> Result<WebhookUrl, ValidationError> {
    let Value::Object(mut fields) = value else {
        return Err(ValidationError::new(
            "webhook",
            r#"must be an object like {"url": "https://hooks.example.com/summaryd"}"#,
        ));
    };
    let url = fields.remove("url");
    if let Some(other) = fields.keys().next() {
        return Err(ValidationError::new(
            "webhook",
            format!("has the unknown field {other:?}; the only field is url"),
        ));
    }
    match url {
        Some(Value::String(raw)) => WebhookUrl::parse(&raw, rules),
        Some(_) => Err(ValidationError::new("webhook.url", "must be a string")),
        None => Err(ValidationError::new("webhook.url", "is required")),
    }
}

impl ValidSummaryRequest {
    /// SHA-256 of the canonical JSON: the validated fields as one object with sorted keys,
    /// so whitespace and field order of the original do not matter. The error is the
    /// serialiser's and cannot happen for these fields (strings, into a hash that takes
    /// every byte); it is passed on rather than hidden.
    pub fn fingerprint(&self) -> Result<String, serde_json::Error> {
        // Absent fields stay absent, so a request without a webhook keeps the fingerprint
        // it had before webhooks existed (stored records are compared against it). The
        // canonical form is the compact JSON of an object with its keys in order, written
        // straight into the hash: every POST computes it, and the text may be long.
        let mut hasher = Hashing(Sha256::new());
        serde_json::to_writer(
            &mut hasher,
            &Canonical {
                notify: self.notify.as_ref().map(Email::as_str),
                text: &self.text,
                webhook: self
                    .webhook
                    .as_ref()
                    .map(|url| CanonicalWebhook { url: url.as_str() }),
            },
        )?;
        Ok(hex::encode(hasher.0.finalize()))
    }
}

/// Bytes written go into the hash (the digest crate's own adapter needs its `std` feature).
struct Hashing(Sha256);

impl std::io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a request's fingerprint hashes. The fields are in the order of their names, as
/// the fingerprint of a JSON object with sorted keys has always been taken.
#[derive(Serialize)]
struct Canonical<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    notify: Option<&'a str>,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    webhook: Option<CanonicalWebhook<'a>>,
}

#[derive(Serialize)]
struct CanonicalWebhook<'a> {
    url: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ValidSummaryRequest, String> {
        let req: SummaryRequest = serde_json::from_str(json).map_err(|e| e.to_string())?;
        req.validate(WebhookRules::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn fingerprint_ignores_whitespace_and_field_order() {
        let a = parse(r#"{"text":"hello","notify":"a@b.co"}"#).unwrap();
        let b = parse("{ \"notify\" : \"a@b.co\",\n \"text\": \"hello\" }").unwrap();
        assert_eq!(a.fingerprint().unwrap(), b.fingerprint().unwrap());
        let c = parse(r#"{"text":"hello!","notify":"a@b.co"}"#).unwrap();
        assert_ne!(a.fingerprint().unwrap(), c.fingerprint().unwrap());
    }

    #[test]
    fn fingerprint_is_the_hash_of_the_sorted_compact_json_of_the_fields_sent() {
        // The form every stored record was fingerprinted with: a JSON object with sorted
        // keys, compact, absent fields left out.
        let by_value = |req: &ValidSummaryRequest| {
            let mut canonical = serde_json::Map::new();
            if let Some(notify) = &req.notify {
                canonical.insert("notify".into(), Value::from(notify.as_str()));
            }
            if let Some(webhook) = &req.webhook {
                canonical.insert(
                    "webhook".into(),
                    serde_json::json!({"url": webhook.as_str()}),
                );
            }
            canonical.insert("text".into(), Value::from(req.text.as_str()));
            hex::encode(Sha256::digest(Value::Object(canonical).to_string()))
        };
        for body in [
            r#"{"text":"Grüße \"q\"\n\t\u0085","notify":"a@b.co"}"#,
            r#"{"text":"hi","webhook":{"url":"https://hooks.example.com/a?b=1&c=\u00e9"}}"#,
            r#"{"text":"hi","notify":"a@b.co","webhook":{"url":"https://example.com/x"}}"#,
        ] {
            let req = parse(body).unwrap();
            assert_eq!(req.fingerprint().unwrap(), by_value(&req), "{body}");
        }
    }

    /// Stored idempotency records hold fingerprints: if these bytes ever changed, a client
    /// retrying across an upgrade would get 422 for its own request.
    #[test]
    fn fingerprint_bytes_are_stable() {
        let req = parse(r#"{"text":"Grüße \"q\"\n","notify":"a@b.co"}"#).unwrap();
        assert_eq!(
            req.fingerprint().unwrap(),
            "6cb9b2c5cc10021e473b97d2e5ff01fa99d76dc6b58fb8aba832a914ac451c48"
        );
    }

    #[test]
    fn control_characters_other_than_tab_and_line_breaks_are_refused() {
        for bad in ["a\\u0000b", "\\u0007", "x\\u001b[31m", "\\u001f"] {
            let err = parse(&format!(r#"{{"text":"{bad}","notify":"a@b.co"}}"#)).unwrap_err();
            assert!(
                err.starts_with("text") && err.contains("U+00"),
                "{bad}: {err}"
            );
        }
        for ok in ["a\\tb\\nc\\r\\nd", "caf\\u00e9 \\u007f \\u0085"] {
            assert!(
                parse(&format!(r#"{{"text":"{ok}","notify":"a@b.co"}}"#)).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn names_the_field_at_fault() {
        assert!(
            parse(r#"{"notify":"a@b.co"}"#)
                .unwrap_err()
                .starts_with("text")
        );
        assert!(
            parse(r#"{"text":5,"notify":"a@b.co"}"#)
                .unwrap_err()
                .starts_with("text")
        );
        assert!(
            parse(r#"{"text":"  ","notify":"a@b.co"}"#)
                .unwrap_err()
                .starts_with("text")
        );
        assert!(
            parse(r#"{"text":"x","notify":"nope"}"#)
                .unwrap_err()
                .starts_with("notify")
        );
        assert!(
            parse(r#"{"text":"x","webhook":{"url":"http://hooks.example.com/"}}"#)
                .unwrap_err()
                .starts_with("webhook.url")
        );
        assert!(
            parse(r#"{"text":"x","webhook":"https://hooks.example.com/"}"#)
                .unwrap_err()
                .starts_with("webhook:")
        );
        assert!(
            parse(r#"{"text":"x","webhook":{"url":"https://hooks.example.com/","secret":"s"}}"#)
                .unwrap_err()
                .contains("secret")
        );
        assert!(
            parse(r#"{"text":"x","webhook":{}}"#)
                .unwrap_err()
                .starts_with("webhook.url")
        );
        assert!(
            parse(r#"{"text":"x","notify":null,"webhook":{"url":"https://a.example/"}}"#)
                .unwrap_err()
                .starts_with("notify")
        );
        assert!(
            parse(r#"{"text":"x","notify":"a@b.co","webhook":null}"#)
                .unwrap_err()
                .starts_with("webhook:")
        );
        assert!(
            parse(r#"{"text":"x","notify":"a@b.co","cc":1}"#)
                .unwrap_err()
                .contains("cc")
        );
    }
}
