//! `[mail]`: the mail provider (`SUMMARYD_MAIL_*`).
//!
//! An SMTP URL with credentials must protect them with TLS (`SUMMARYD_MAIL_ALLOW_CLEARTEXT=1`
//! is the explicit way out). What protects them is decided as lettre 0.11's
//! `AsyncSmtpTransport::from_url` decides it (see [`SmtpSecurity`]), so the check and the
//! transport can never disagree about the same URL.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
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
    /// `SUMMARYD_MAIL_ALLOW_CLEARTEXT=1`: accept an SMTP URL that would send its password
    /// without TLS (a relay on the same host, a test sink).
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub allow_cleartext: bool,
}

/// How lettre's `from_url` protects an SMTP session, read from the URL alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpSecurity {
    /// `smtps://` (any `tls=` is ignored by lettre): TLS from the first byte.
    ImplicitTls,
    /// `smtp://…?tls=required`: STARTTLS, and no session (so no AUTH) without it.
    StartTlsRequired,
    /// `smtp://…?tls=opportunistic`: STARTTLS only when the server offers it. Whoever can
    /// alter the path can strip the offer from the EHLO reply, and lettre then
    /// authenticates in cleartext: for credentials this is no better than [`Self::Plain`].
    StartTlsOpportunistic,
    /// `smtp://` without `tls=`: lettre never starts TLS; AUTH PLAIN carries the password
    /// in clear.
    Plain,
}

impl SmtpSecurity {
    /// Whether credentials sent in this session are guaranteed to be inside TLS.
    pub fn protects_credentials(self) -> bool {
        matches!(self, Self::ImplicitTls | Self::StartTlsRequired)
    }

    /// The URL's security, or why lettre would refuse it. The reason never quotes the URL.
    pub fn of(url: &reqwest::Url) -> Result<Self, String> {
        let tls = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        match (url.scheme(), tls.as_deref()) {
            ("smtps", _) => Ok(Self::ImplicitTls),
            ("smtp", None) => Ok(Self::Plain),
            ("smtp", Some("required")) => Ok(Self::StartTlsRequired),
            ("smtp", Some("opportunistic")) => Ok(Self::StartTlsOpportunistic),
            ("smtp", Some(_)) => Err("tls= must be required or opportunistic".into()),
            (scheme, _) => Err(format!("scheme {scheme}:// is not smtp:// or smtps://")),
        }
    }
}

/// Whether lettre would authenticate with this URL: it builds credentials only when a
/// password is present (a user name alone sends no AUTH).
pub fn smtp_url_has_credentials(url: &reqwest::Url) -> bool {
    url.password().is_some()
}

impl Default for MailSettings {
    fn default() -> Self {
        Self {
            provider: MailProvider::Log,
            smtp_url: None,
            http_url: None,
            from: "summaryd@localhost".into(),
            timeout: Duration::from_secs(10),
            allow_cleartext: false,
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
            MailProvider::Smtp => self.check_smtp_transport(),
            _ => Ok(()),
        }
    }

    /// Refuses an SMTP URL whose credentials would cross the network without TLS. Checked
    /// with the settings, so every command and role refuses it before connecting anywhere,
    /// not only the relay that sends. The message never contains the URL.
    fn check_smtp_transport(&self) -> Result<(), ConfigError> {
        const SETTING: &str = "SUMMARYD_MAIL_SMTP_URL";
        let Some(raw) = self.smtp_url.as_ref().map(|u| u.expose_secret().trim()) else {
            return Ok(());
        };
        // url's parse errors are fixed phrases that never quote the input.
        let url =
            reqwest::Url::parse(raw).map_err(|e| invalid(SETTING, &format!("not a URL: {e}")))?;
        let security = SmtpSecurity::of(&url).map_err(|reason| invalid(SETTING, &reason))?;
        if !smtp_url_has_credentials(&url)
            || security.protects_credentials()
            || self.allow_cleartext
        {
            return Ok(());
        }
        let why = match security {
            SmtpSecurity::StartTlsOpportunistic => {
                "has credentials and tls=opportunistic: the password is sent in clear whenever \
                 STARTTLS is not offered, and anyone on the path can remove the offer"
            }
            _ => "has credentials but no TLS: smtp:// without tls= sends the password in clear",
        };
        Err(invalid(
            SETTING,
            &format!(
                "{why}; use smtps://host:465 or smtp://host:587?tls=required, or set \
                 SUMMARYD_MAIL_ALLOW_CLEARTEXT=1 if the path is trusted (e.g. a relay on this host)"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    #[test]
    fn the_timeout_is_milliseconds_and_the_urls_are_secrets() {
        let s = load(
            "[mail]\nprovider = \"smtp\"\nsmtp_url = \"smtp://mailer:smtp-pass@host:587?tls=required\"\n",
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
            Some("smtp://mailer:smtp-pass@host:587?tls=required")
        );
        assert_eq!(
            s.mail.http_url.as_ref().map(|u| u.expose_secret()),
            Some("https://mail/send?api_key=mail-key")
        );
    }

    #[test]
    fn a_provider_needs_its_url() {
        let url = || Some(SecretString::from("smtps://y"));
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

    /// lettre's `from_url` table: only smtps:// and ?tls=required keep AUTH inside TLS.
    #[test]
    fn smtp_security_follows_lettres_url_forms() {
        let of = |u: &str| SmtpSecurity::of(&reqwest::Url::parse(u).unwrap());
        for (url, expected) in [
            ("smtps://u:p@h", SmtpSecurity::ImplicitTls),
            (
                "smtps://u:p@h:465?tls=opportunistic",
                SmtpSecurity::ImplicitTls,
            ),
            (
                "smtp://u:p@h:587?tls=required",
                SmtpSecurity::StartTlsRequired,
            ),
            (
                "smtp://u:p@h:587?x=1&tls=required",
                SmtpSecurity::StartTlsRequired,
            ),
            (
                "smtp://u:p@h:587?tls=opportunistic",
                SmtpSecurity::StartTlsOpportunistic,
            ),
            ("smtp://u:p@h:587", SmtpSecurity::Plain),
            ("smtp://h", SmtpSecurity::Plain),
        ] {
            assert_eq!(of(url), Ok(expected), "{url}");
        }
        assert!(SmtpSecurity::ImplicitTls.protects_credentials());
        assert!(SmtpSecurity::StartTlsRequired.protects_credentials());
        assert!(!SmtpSecurity::StartTlsOpportunistic.protects_credentials());
        assert!(!SmtpSecurity::Plain.protects_credentials());
        assert!(of("smtp://h?tls=wrapper").is_err());
        assert!(of("http://h").unwrap_err().contains("http://"));
        // lettre sends AUTH only with a password; an empty one is no password.
        let creds = |u: &str| smtp_url_has_credentials(&reqwest::Url::parse(u).unwrap());
        assert!(creds("smtp://u:p@h") && creds("smtp://:p@h"));
        assert!(!creds("smtp://u@h") && !creds("smtp://h") && !creds("smtp://u:@h"));
    }

    fn smtp(url: &str, allow_cleartext: bool) -> Result<(), String> {
        MailSettings {
            provider: MailProvider::Smtp,
            smtp_url: Some(url.into()),
            allow_cleartext,
            ..MailSettings::default()
        }
        .check()
        .map_err(|e| e.to_string())
    }

    #[test]
    fn smtp_credentials_without_tls_are_refused_unless_allowed() {
        for url in [
            "smtp://user:secret@127.0.0.1:2525",
            "smtp://user:secret@mail.example.com:587?tls=opportunistic",
            " smtp://:secret@mail.example.com ",
        ] {
            let err = smtp(url, false).unwrap_err();
            assert!(
                err.starts_with("invalid configuration: SUMMARYD_MAIL_SMTP_URL: ")
                    && err.contains("SUMMARYD_MAIL_ALLOW_CLEARTEXT=1")
                    && err.contains("tls=required")
                    && !err.contains("secret"),
                "{url}: {err}"
            );
            assert_eq!(smtp(url, true), Ok(()), "{url}");
        }
        assert!(
            smtp("smtp://u:p@h?tls=opportunistic", false)
                .unwrap_err()
                .contains("STARTTLS")
        );
        for url in [
            "smtps://user:secret@mail.example.com",
            "smtp://user:secret@mail.example.com:587?tls=required",
            "smtp://127.0.0.1:25",
            "smtp://user@mail.example.com:25",
        ] {
            assert_eq!(smtp(url, false), Ok(()), "{url}");
        }
        for (url, reason) in [
            ("smtp://h?tls=yes", "tls= must be"),
            ("mail.example.com:587", "scheme"),
            ("smtp://u:secret@[::1", "not a URL"),
        ] {
            let err = smtp(url, false).unwrap_err();
            assert!(
                err.contains(reason) && !err.contains("secret"),
                "{url}: {err}"
            );
        }
        // The log and http providers never use the URL.
        let unused = MailSettings {
            smtp_url: Some("smtp://user:secret@h".into()),
            ..MailSettings::default()
        };
        assert!(unused.check().is_ok());
    }

    #[test]
    fn allow_cleartext_is_read_from_env_and_file() {
        let url = ("SUMMARYD_MAIL_SMTP_URL", "smtp://u:pw@relay.internal:25");
        let provider = ("SUMMARYD_MAIL_PROVIDER", "smtp");
        let err = load("", &[provider, url]).unwrap_err();
        assert!(err.contains("SUMMARYD_MAIL_SMTP_URL"), "{err}");
        let s = load("", &[provider, url, ("SUMMARYD_MAIL_ALLOW_CLEARTEXT", "1")]).unwrap();
        assert!(s.mail.allow_cleartext);
        let s = load("[mail]\nallow_cleartext = true\n", &[provider, url]).unwrap();
        assert!(s.mail.allow_cleartext);
        assert!(!load("", &[]).unwrap().mail.allow_cleartext);
        let err = load("", &[("SUMMARYD_MAIL_ALLOW_CLEARTEXT", "2")]).unwrap_err();
        assert!(err.contains("SUMMARYD_MAIL_ALLOW_CLEARTEXT"), "{err}");
    }
}
