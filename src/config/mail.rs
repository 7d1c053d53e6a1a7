//! `[mail]`: the mail provider (`SUMMARYD_MAIL_*`).

use std::time::Duration;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use super::{ConfigError, Millis, invalid, secret};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MailProvider {
    Log,
    Smtp,
    Http,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailSettings {
    pub provider: MailProvider,
    /// `smtp://user:password@host`: the URL carries the credentials.
    #[serde(serialize_with = "secret::expose_optional")]
    pub smtp_url: Option<SecretString>,
    /// Email APIs commonly take their key in the query string.
    #[serde(serialize_with = "secret::expose_optional")]
    pub http_url: Option<SecretString>,
    pub from: String,
    #[serde(rename = "timeout_ms", with = "Millis")]
    pub timeout: Duration,
}

impl Default for MailSettings {
    fn default() -> Self {
        Self {
            provider: MailProvider::Log,
            smtp_url: None,
            http_url: None,
            from: "summaryd@localhost".into(),
            timeout: Duration::from_secs(10),
        }
    }
}

impl MailSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        match self.provider {
            MailProvider::Smtp if self.smtp_url.is_none() => Err(invalid(
                "SUMMARYD_MAIL_SMTP_URL",
                "required when the mail provider is smtp",
            )),
            MailProvider::Http if self.http_url.is_none() => Err(invalid(
                "SUMMARYD_MAIL_HTTP_URL",
                "required when the mail provider is http",
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::super::testing::load;
    use super::*;

    #[test]
    fn the_timeout_is_milliseconds_and_the_urls_are_secrets() {
        let s = load(
            "[mail]\nprovider = \"smtp\"\nsmtp_url = \"smtp://mailer:smtp-pass@host:587\"\n",
            &[
                ("SUMMARYD_MAIL_TIMEOUT_MS", "2500"),
                (
                    "SUMMARYD_MAIL_HTTP_URL",
                    "https://mail/send?api_key=mail-key",
                ),
            ],
        )
        .unwrap();
        assert_eq!(s.mail.timeout, Duration::from_millis(2_500));
        let shown = format!("{:?}", s.mail);
        assert!(
            !shown.contains("smtp-pass") && !shown.contains("mail-key"),
            "{shown}"
        );
        assert_eq!(
            s.mail.smtp_url.as_ref().map(|u| u.expose_secret()),
            Some("smtp://mailer:smtp-pass@host:587")
        );
        assert_eq!(
            s.mail.http_url.as_ref().map(|u| u.expose_secret()),
            Some("https://mail/send?api_key=mail-key")
        );
    }

    #[test]
    fn a_provider_needs_its_url() {
        let url = || Some(SecretString::from("x://y"));
        for (provider, smtp_url, http_url, refused) in [
            (MailProvider::Log, None, None, None),
            (
                MailProvider::Smtp,
                None,
                url(),
                Some("SUMMARYD_MAIL_SMTP_URL"),
            ),
            (MailProvider::Smtp, url(), None, None),
            (
                MailProvider::Http,
                url(),
                None,
                Some("SUMMARYD_MAIL_HTTP_URL"),
            ),
            (MailProvider::Http, None, url(), None),
        ] {
            let mail = MailSettings {
                provider,
                smtp_url,
                http_url,
                ..MailSettings::default()
            };
            let err = mail.check().err().map(|e| e.to_string());
            match refused {
                Some(setting) => assert!(
                    err.as_deref()
                        .is_some_and(|e| e.contains(setting) && e.contains("required")),
                    "{provider:?}: {err:?}"
                ),
                None => assert!(err.is_none(), "{provider:?}: {err:?}"),
            }
        }
    }
}
