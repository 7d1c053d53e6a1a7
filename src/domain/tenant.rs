use std::fmt;

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// Tenant identifier: 1–64 characters of `[A-Za-z0-9._-]`, safe inside a Redis key.
///
/// Deserialising parses too, so a stored value that is not a tenant is an error, not a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct TenantId(String);

impl TenantId {
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if raw.is_empty() || raw.len() > 64 || !raw.chars().all(ok_char) {
            return Err(ValidationError::new(
                "X-Tenant-Id",
                "must be 1–64 characters of A-Z, a-z, 0-9, '.', '_' or '-'",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TenantId {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        Self::parse(&raw).map_err(|e| e.message)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_allowed_characters_only() {
        assert!(TenantId::parse("acme.eu-1_x").is_ok());
        assert!(TenantId::parse("").is_err());
        assert!(TenantId::parse("a:b").is_err());
        assert!(TenantId::parse(&"a".repeat(65)).is_err());
    }
}
