//! `[notify]`: whom and how often summaryd may email on a client's behalf
//! (`SUMMARYD_NOTIFY_*`). In token mode each tenant's `notify_domains` and `notify_per_hour`
//! in the tokens file come first; these are header mode's policy and the default rate.

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};
use crate::domain::NotifyDomains;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySettings {
    /// Header mode: the domains `notify` may use (`acme.com`, `*.acme.com`); none = any.
    /// A comma-separated string (the environment's spelling) or, in the file, a list.
    pub domains: Option<DomainList>,
    /// Emails one recipient may be sent per rolling hour, per tenant, for tenants without
    /// their own `notify_per_hour` (and in header mode); none = no limit.
    pub per_hour: Option<u32>,
}

/// `"acme.com,*.acme.com"` or `["acme.com", "*.acme.com"]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DomainList {
    Joined(String),
    List(Vec<String>),
}

impl DomainList {
    fn patterns(&self) -> Vec<&str> {
        match self {
            Self::Joined(joined) => joined.split(',').collect(),
            Self::List(list) => list.iter().map(String::as_str).collect(),
        }
    }
}

impl NotifySettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        self.domains()?;
        if self.per_hour == Some(0) {
            return Err(invalid(
                "SUMMARYD_NOTIFY_PER_HOUR",
                "must be at least 1 (leave it unset for no limit)",
            ));
        }
        Ok(())
    }

    /// The header-mode recipient policy; `None` allows every domain.
    pub fn domains(&self) -> Result<Option<NotifyDomains>, ConfigError> {
        self.domains
            .as_ref()
            .map(|list| {
                NotifyDomains::parse(list.patterns())
                    .map_err(|why| invalid("SUMMARYD_NOTIFY_DOMAINS", &why))
            })
            .transpose()
    }

    pub fn per_hour(&self) -> Option<u32> {
        self.per_hour
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_come_joined_or_listed_and_are_checked() {
        let joined = NotifySettings {
            domains: Some(DomainList::Joined("acme.com, *.acme.com".into())),
            per_hour: None,
        };
        let listed = NotifySettings {
            domains: Some(DomainList::List(vec![
                "acme.com".into(),
                "*.acme.com".into(),
            ])),
            per_hour: None,
        };
        assert_eq!(joined.domains().unwrap(), listed.domains().unwrap());
        assert!(joined.check().is_ok());
        assert!(NotifySettings::default().domains().unwrap().is_none());

        let bad = NotifySettings {
            domains: Some(DomainList::Joined("acme.com,localhost".into())),
            per_hour: None,
        };
        let err = bad.check().unwrap_err().to_string();
        assert!(
            err.contains("SUMMARYD_NOTIFY_DOMAINS") && err.contains("localhost"),
            "{err}"
        );
        let zero = NotifySettings {
            domains: None,
            per_hour: Some(0),
        };
        assert!(
            zero.check()
                .unwrap_err()
                .to_string()
                .contains("SUMMARYD_NOTIFY_PER_HOUR")
        );
    }

    #[test]
    fn the_environment_spells_domains_comma_separated() {
        let settings = crate::config::testing::load(
            "",
            &[
                ("SUMMARYD_NOTIFY_DOMAINS", "acme.com,*.acme.com"),
                ("SUMMARYD_NOTIFY_PER_HOUR", "20"),
            ],
        )
        .unwrap();
        let domains = settings.notify.domains().unwrap().unwrap();
        assert_eq!(domains.to_string(), "acme.com, *.acme.com");
        assert_eq!(settings.notify.per_hour(), Some(20));
        let file =
            crate::config::testing::load("[notify]\ndomains = [\"acme.com\"]\nper_hour = 5\n", &[])
                .unwrap();
        assert_eq!(
            file.notify.domains().unwrap().unwrap().to_string(),
            "acme.com"
        );
        let bad = crate::config::testing::load("", &[("SUMMARYD_NOTIFY_DOMAINS", "intranet")])
            .unwrap_err();
        assert!(bad.contains("SUMMARYD_NOTIFY_DOMAINS"), "{bad}");
    }
}
