use super::ValidationError;

/// `Idempotency-Key` header value: 16–128 visible ASCII characters.
///
/// The lower bound rejects keys too short to be unique per request (a counter, a date);
/// the upper bound keeps Redis keys small.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub(crate) const MIN_LEN: usize = 16;
    pub const MAX_LEN: usize = 128;

    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let field = "Idempotency-Key";
        if !(Self::MIN_LEN..=Self::MAX_LEN).contains(&raw.len()) {
            return Err(ValidationError::new(
                field,
                format!(
                    "must be {}–{} characters, got {}",
                    Self::MIN_LEN,
                    Self::MAX_LEN,
                    raw.len()
                ),
            ));
        }
        if !raw.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ValidationError::new(
                field,
                "must contain only visible ASCII characters (no spaces or control characters)",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_visible_ascii_within_bounds() {
        assert!(IdempotencyKey::parse("0123456789abcdef").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(128)).is_ok());
    }

    #[test]
    fn rejects_short_long_and_invisible() {
        assert!(IdempotencyKey::parse("short").is_err());
        assert!(IdempotencyKey::parse(&"k".repeat(129)).is_err());
        assert!(IdempotencyKey::parse("0123456789 abcdef").is_err());
        assert!(IdempotencyKey::parse("0123456789abcdeé").is_err());
    }
}
