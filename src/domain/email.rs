use std::fmt;

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// A deliverable-looking address: `local@domain` with a dotted domain, no spaces,
/// at most 254 characters (RFC 5321's path limit). Deliverability is the provider's job.
///
/// Deserialising parses too, so a stored value that is not an address is an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct Email(String);

impl Email {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let invalid =
            |why: &str| ValidationError::new("notify", format!("not an email address: {why}"));
        if raw.len() > 254 {
            return Err(invalid("longer than 254 characters"));
        }
        if raw.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | ',' | ';' | '"')
        }) {
            return Err(invalid("contains spaces, control characters or <>,;\""));
        }
        let Some((local, domain)) = raw.rsplit_once('@') else {
            return Err(invalid("expected local@domain"));
        };
        if local.is_empty() || local.len() > 64 || local.contains('@') {
            return Err(invalid(
                "the part before @ must be 1–64 characters without @",
            ));
        }
        let labels_ok = domain.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_alphanumeric() || c == '-')
        });
        if !domain.contains('.') || !labels_ok {
            return Err(invalid("the domain must be dotted labels like example.com"));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Email {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        // Only the message: the field name in `ValidationError` is the API's (`notify`),
        // and a decoder names the field it was reading itself.
        Self::parse(&raw).map_err(|e| e.message)
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_addresses() {
        for ok in ["a@b.co", "first.last+tag@mail.example.com", "ü@exämple.de"] {
            assert!(Email::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_malformed_addresses() {
        for bad in [
            "", "a", "a@", "@b.co", "a@b", "a b@c.de", "a@-b.co", "a@b..co", "<a@b.co>",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad}");
        }
    }
}
