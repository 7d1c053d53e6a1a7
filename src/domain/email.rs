use std::fmt;
use std::net::IpAddr;

use lettre::message::Mailbox;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

use super::ValidationError;

/// An address the mail providers can send to. There is one definition of that: lettre's
/// parser, the one the SMTP provider hands `to` to. Accepting anything it refuses would
/// turn a 202 into a paid model call followed by an email that can never be sent.
/// Additionally a bare address only (no display name or `<>`, which the HTTP provider
/// would pass through verbatim), at most 254 characters (RFC 5321's path limit).
///
/// Deserialising parses too, so a stored value that is not an address is an error. Stored
/// values are held to the syntax only: a job accepted before the stricter intake rules of
/// [`Email::parse_recipient`] still decodes, so it is finished rather than stranded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct Email(String);

/// Why a recipient's domain is refused at intake. Each names what the client can fix.
const NEEDS_DOTTED_NAME: &str =
    "the domain must be a dotted domain name (like example.com), not a single label";

impl Email {
    pub const MAX_LEN: usize = 254;

    /// The syntax lettre sends to: what a stored job or event must satisfy.
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        if raw.len() > Self::MAX_LEN {
            return Err(invalid("longer than 254 characters"));
        }
        let mailbox: Mailbox = raw
            .parse()
            .map_err(|e: lettre::address::AddressError| invalid(&e.to_string()))?;
        if mailbox.name.is_some() || AsRef::<str>::as_ref(&mailbox.email) != raw {
            return Err(invalid(
                "send the bare address (local@domain), without a name, <> or spaces",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// A recipient a client may ask summaryd to email: the syntax of [`Email::parse`], no
    /// invisible, bidirectional-control or format character anywhere (they make an address
    /// read as another one in a log or a console), and a domain that is a public-looking
    /// dotted name after IDNA normalisation: no IP literal or all-numeric name, no
    /// `localhost`, no single label. Reserved test names such as `example.test` stay valid.
    ///
    /// The address is kept as sent (the request's fingerprint is over the sent text); its
    /// normalised domain is [`Email::domain`].
    pub fn parse_recipient(raw: &str) -> Result<Self, ValidationError> {
        if let Some((at, c)) = raw.chars().enumerate().find(|(_, c)| invisible(*c)) {
            return Err(invalid(&format!(
                "contains the invisible or control character U+{:04X} at character {}",
                u32::from(c),
                at + 1
            )));
        }
        // The domain first: for an IP literal lettre's own message would not say why.
        if let Some((_, domain)) = raw.rsplit_once('@') {
            normalise_domain(domain).map_err(|why| invalid(&why))?;
        }
        Self::parse(raw)
    }

    /// The domain, IDNA-normalised (ASCII, lower case), checked as [`Email::parse_recipient`]
    /// describes. Recipient policies and rate limits compare this form, so `ACME.com`,
    /// `acme.com` and a Unicode spelling of an IDN are one domain.
    pub fn domain(&self) -> Result<String, ValidationError> {
        let (_, domain) = self
            .0
            .rsplit_once('@')
            .ok_or_else(|| invalid("has no @domain"))?;
        normalise_domain(domain).map_err(|why| invalid(&why))
    }

    /// A stable identity of the mailbox for per-recipient limits: a SHA-256 of the address
    /// with its domain normalised and its local part in lower case (mail systems treat
    /// local parts case-insensitively in practice; counting two spellings as one errs on
    /// the safe side). Hex, 32 digits: Redis key names stay free of addresses.
    /// An address stored before the intake rules whose domain does not normalise is
    /// identified by its domain in lower case.
    pub fn recipient_id(&self) -> String {
        let (local, domain) = self.0.rsplit_once('@').unwrap_or(("", self.0.as_str()));
        let domain = self.domain().unwrap_or_else(|_| domain.to_lowercase());
        let digest = Sha256::digest(format!("{}@{domain}", local.to_lowercase()));
        let mut id = hex::encode(digest);
        id.truncate(32);
        id
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn invalid(why: &str) -> ValidationError {
    ValidationError::new("notify", format!("not an email address: {why}"))
}

/// `domain` as an IDNA ASCII name (lower case, no trailing dot) that can name a host on the
/// public mail system, or why not. Shared by recipients and the domain patterns a tenant
/// may notify (`NotifyDomains`), so both sides compare the same form.
pub(crate) fn normalise_domain(domain: &str) -> Result<String, String> {
    if domain.starts_with('[') {
        return Err("the domain must be a name, not an IP address literal".into());
    }
    if let Some(c) = domain.chars().find(|c| invisible(*c)) {
        return Err(format!(
            "the domain contains the invisible or control character U+{:04X}",
            u32::from(c)
        ));
    }
    let ascii = idna::domain_to_ascii_strict(domain)
        .map_err(|_| "the domain is not a valid internationalised domain name".to_owned())?;
    if ascii.parse::<IpAddr>().is_ok() {
        return Err("the domain must be a name, not an IP address".into());
    }
    let labels: Vec<&str> = ascii.split('.').collect();
    if labels.last() == Some(&"localhost") {
        return Err("the domain must not be localhost: it names the sending machine".into());
    }
    if labels.len() < 2 || labels.iter().any(|l| l.is_empty()) {
        return Err(NEEDS_DOTTED_NAME.into());
    }
    // A top-level domain is never all digits; such a name is an address in disguise
    // (`10.0.0.5` that failed to parse as one, `0x7f.1`).
    if labels
        .last()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("the domain must be a name, not an IP address".into());
    }
    Ok(ascii)
}

/// Characters that render as nothing or rearrange the text around them: controls (C0, C1
/// such as U+0085), format characters (bidi controls such as U+202E, zero-width joiners,
/// soft hyphen), line and paragraph separators, spaces, private-use and unassigned code
/// points, and the letters and marks that are blank by design (Hangul fillers, variation
/// selectors, the combining grapheme joiner). Webhook URLs are held to the same rule.
pub(crate) fn invisible(c: char) -> bool {
    use GeneralCategory as G;
    // Most addresses and URLs are ASCII, where the answer needs no table: the controls
    // (C0 and DEL) and the space are the only invisible ASCII characters.
    if c.is_ascii() {
        return c.is_ascii_control() || c == ' ';
    }
    matches!(
        c.general_category(),
        G::Control
            | G::Format
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::SpaceSeparator
            | G::PrivateUse
            | G::Surrogate
            | G::Unassigned
    ) || matches!(
        c,
        '\u{034F}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{E0100}'..='\u{E01EF}'
    )
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
    fn the_ascii_shortcut_agrees_with_the_character_table() {
        for c in (0u8..=0x7F).map(char::from) {
            let by_table = matches!(
                c.general_category(),
                GeneralCategory::Control | GeneralCategory::SpaceSeparator
            );
            assert_eq!(invisible(c), by_table, "U+{:04X}", u32::from(c));
        }
        assert!(invisible('\u{0085}') && invisible('\u{202E}') && !invisible('é'));
    }

    #[test]
    fn accepts_ordinary_addresses() {
        for ok in [
            "a@b.co",
            "first.last+tag@mail.example.com",
            "o'neil@example.ie",
            "ops@example.test",
            "x@sub.domain.example",
        ] {
            assert!(Email::parse_recipient(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_what_the_smtp_provider_cannot_send() {
        for bad in [
            "",
            "a",
            "a@",
            "@b.co",
            "a b@c.de",
            "a@b..co",
            "<a@b.co>",
            "Ann <a@b.co>",
            " a@b.co",
            "a@b.co ",
            "a@@b.co",
            "a@-b.co",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad}");
            assert!(Email::parse_recipient(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_path_limit_is_254_characters() {
        let domain = format!(
            "{}.{}.{}.example",
            "a".repeat(60),
            "b".repeat(60),
            "c".repeat(60)
        );
        let at_limit = format!("{}@{domain}", "x".repeat(Email::MAX_LEN - 1 - domain.len()));
        assert_eq!(at_limit.len(), 254);
        assert!(Email::parse(&at_limit).is_ok());
        assert!(Email::parse_recipient(&at_limit).is_ok());
        let over = format!("x{at_limit}");
        let err = Email::parse(&over).unwrap_err();
        assert!(err.message.contains("254"), "{}", err.message);
        assert!(Email::parse_recipient(&over).is_err());
    }

    #[test]
    fn every_accepted_address_is_one_lettre_sends_to() {
        for raw in ["a@b.co", "x.y+z@sub.example.org"] {
            let email = Email::parse(raw).unwrap();
            let mailbox: Mailbox = email.as_str().parse().unwrap();
            assert_eq!(mailbox.email.to_string(), raw);
        }
    }

    /// The relay-abuse targets: the sending machine, internal addresses, bare hosts, and
    /// addresses that read as another one.
    #[test]
    fn refuses_recipients_that_are_not_public_dotted_names() {
        for (bad, why) in [
            ("a@localhost", "localhost"),
            ("a@LOCALHOST", "localhost"),
            ("a@mail.localhost", "localhost"),
            ("x@10.0.0.5", "IP address"),
            ("x@127.0.0.1", "IP address"),
            ("x@[10.0.0.5]", "IP address"),
            ("x@[IPv6:::1]", "IP address"),
            ("x@1.2.3.999", "IP address"),
            ("a@b", "single label"),
            ("a@intranet", "single label"),
            ("a@b.co\u{202E}", "U+202E"),
            ("a\u{202E}oc.b@evil.co", "U+202E"),
            ("a\u{0085}@b.co", "U+0085"),
            ("a@b\u{200B}.co", "U+200B"),
            ("a@b\u{00AD}c.co", "U+00AD"),
            ("a\u{FEFF}@b.co", "U+FEFF"),
            ("a@b\u{3164}.co", "U+3164"),
        ] {
            let err = Email::parse_recipient(bad).expect_err(bad);
            assert_eq!(err.field, "notify", "{bad}");
            assert!(err.message.contains(why), "{bad}: {}", err.message);
        }
    }

    #[test]
    fn stored_addresses_decode_by_syntax_alone() {
        // Accepted before the intake rules existed: still a job that can finish.
        let old: Email = serde_json::from_str(r#""a@localhost""#).unwrap();
        assert_eq!(old.as_str(), "a@localhost");
        assert!(serde_json::from_str::<Email>(r#""not an address""#).is_err());
    }

    #[test]
    fn domains_are_compared_idna_normalised() {
        let email = Email::parse_recipient("Ann@B\u{00FC}cher.Example").unwrap();
        assert_eq!(email.as_str(), "Ann@B\u{00FC}cher.Example");
        assert_eq!(email.domain().unwrap(), "xn--bcher-kva.example");
        let same = Email::parse_recipient("ann@xn--bcher-kva.example").unwrap();
        assert_eq!(email.recipient_id(), same.recipient_id());
        let other = Email::parse_recipient("bob@xn--bcher-kva.example").unwrap();
        assert_ne!(email.recipient_id(), other.recipient_id());
        assert_eq!(email.recipient_id().len(), 32);
        // Stored before the intake rules: still one identity per mailbox.
        let old = Email::parse("Ann@LOCALHOST").unwrap();
        assert_eq!(
            old.recipient_id(),
            Email::parse("ann@localhost").unwrap().recipient_id()
        );
        assert_ne!(old.recipient_id(), email.recipient_id());
    }

    #[test]
    fn normalised_domains_reject_what_cannot_be_a_public_name() {
        assert_eq!(normalise_domain("Acme.COM").unwrap(), "acme.com");
        for bad in [
            "acme.com.",
            ".acme.com",
            "acme",
            "localhost",
            "0x7f.1",
            "::1",
            "a_b.com",
        ] {
            assert!(normalise_domain(bad).is_err(), "{bad}");
        }
    }
}
