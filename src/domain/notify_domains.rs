use std::fmt;

use super::email::normalise_domain;
use super::{Email, ValidationError};

/// The domains a tenant may have summaryd email (`notify_domains` in the tokens file,
/// `SUMMARYD_NOTIFY_DOMAINS` in header mode): `acme.com` allows exactly that domain,
/// `*.acme.com` every name under it (not `acme.com` itself: list both for both). Patterns
/// and recipients are compared IDNA-normalised, so spelling and case do not matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyDomains {
    patterns: Vec<DomainPattern>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DomainPattern {
    Exact(String),
    /// `*.acme.com`, held as `.acme.com`: a suffix match that cannot match `evilacme.com`.
    Under(String),
}

impl NotifyDomains {
    /// Parse a list of patterns; the error says which one is wrong and why. An empty list
    /// would refuse every request, so it is an error too.
    pub fn parse<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut parsed = Vec::new();
        for raw in patterns {
            let raw = raw.trim();
            let pattern = match raw.strip_prefix("*.") {
                Some(parent) => DomainPattern::Under(format!(".{}", normalised(raw, parent)?)),
                None => DomainPattern::Exact(normalised(raw, raw)?),
            };
            parsed.push(pattern);
        }
        if parsed.is_empty() {
            return Err("lists no domain: every notify would be refused".into());
        }
        Ok(Self { patterns: parsed })
    }

    /// Allows no domain: what a policy that cannot be read falls back to (fail closed).
    pub fn nothing() -> Self {
        Self {
            patterns: Vec::new(),
        }
    }

    /// Whether `domain` (IDNA-normalised, as [`Email::domain`] gives it) is allowed.
    pub fn allows_domain(&self, domain: &str) -> bool {
        self.patterns.iter().any(|p| match p {
            DomainPattern::Exact(d) => d == domain,
            DomainPattern::Under(suffix) => domain.ends_with(suffix.as_str()),
        })
    }

    /// `Ok` when `email`'s domain is allowed; otherwise a 422-worthy error naming `notify`.
    pub fn check(&self, email: &Email) -> Result<(), ValidationError> {
        if self.allows_domain(&email.domain()?) {
            return Ok(());
        }
        Err(ValidationError::new(
            "notify",
            format!("this tenant may only notify addresses at {self}"),
        ))
    }
}

fn normalised(raw: &str, domain: &str) -> Result<String, String> {
    if domain.contains('*') {
        return Err(format!(
            "{raw:?}: a wildcard is only allowed as the whole first label (*.example.com)"
        ));
    }
    normalise_domain(domain).map_err(|why| format!("{raw:?}: {why}"))
}

impl fmt::Display for NotifyDomains {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.patterns.is_empty() {
            return f.write_str("no domain");
        }
        for (i, p) in self.patterns.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match p {
                DomainPattern::Exact(d) => f.write_str(d)?,
                DomainPattern::Under(suffix) => write!(f, "*{suffix}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn email(raw: &str) -> Email {
        Email::parse_recipient(raw).unwrap()
    }

    #[test]
    fn exact_and_wildcard_patterns() {
        let allowed =
            NotifyDomains::parse(["acme.com", "*.acme.com", "B\u{00FC}cher.example"]).unwrap();
        for ok in [
            "a@acme.com",
            "a@ACME.com",
            "a@eu.acme.com",
            "a@x.eu.acme.com",
            "a@xn--bcher-kva.example",
        ] {
            assert!(allowed.check(&email(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "a@evilacme.com",
            "a@acme.com.evil.io",
            "a@acme.co",
            "a@sub.b\u{00FC}cher.example",
        ] {
            let err = allowed.check(&email(bad)).unwrap_err();
            assert_eq!(err.field, "notify");
            assert!(err.message.contains("*.acme.com"), "{}", err.message);
        }
        let only_under = NotifyDomains::parse(["*.acme.com"]).unwrap();
        assert!(only_under.check(&email("a@acme.com")).is_err());
        assert_eq!(
            allowed.to_string(),
            "acme.com, *.acme.com, xn--bcher-kva.example"
        );
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        for bad in [
            "localhost",
            "acme",
            "10.0.0.5",
            "*.com.*",
            "a.*.acme.com",
            "*acme.com",
            "*",
            "",
        ] {
            let err = NotifyDomains::parse([bad]).unwrap_err();
            assert!(err.contains(&format!("{:?}", bad.trim())), "{bad}: {err}");
        }
        assert!(NotifyDomains::parse(std::iter::empty()).is_err());
        let nothing = NotifyDomains::nothing();
        assert!(!nothing.allows_domain("acme.com"));
        assert!(
            nothing
                .check(&email("a@acme.com"))
                .unwrap_err()
                .message
                .contains("no domain")
        );
        assert!(NotifyDomains::parse([" acme.com "]).is_ok());
    }
}
