use std::fmt;

use lettre::message::Mailbox;
use serde::{Deserialize, Serialize};

use super::ValidationError;

/// An address the mail providers can send to. There is one definition of that: lettre's
/// parser, the one the SMTP provider hands `to` to. Accepting anything it refuses would
/// turn a 202 into a paid model call followed by an email that can never be sent.
/// Additionally a bare address only (no display name or `<>`, which the HTTP provider
/// would pass through verbatim), at most 254 characters (RFC 5321's path limit).
///
/// Deserialising parses too, so a stored value that is not an address is an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct Email(String);

impl Email {
    pub const MAX_LEN: usize = 254;

    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        let invalid =
            |why: &str| ValidationError::new("notify", format!("not an email address: {why}"));
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
        for ok in [
            "a@b.co",
            "first.last+tag@mail.example.com",
            "o'neil@example.ie",
        ] {
            assert!(Email::parse(ok).is_ok(), "{ok}");
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
        }
    }

    #[test]
    fn every_accepted_address_is_one_lettre_sends_to() {
        for raw in ["a@b.co", "x.y+z@sub.example.org"] {
            let email = Email::parse(raw).unwrap();
            let mailbox: Mailbox = email.as_str().parse().unwrap();
            assert_eq!(mailbox.email.to_string(), raw);
        }
    }
}
