//! Form bodies and query strings as lists of fields. Repeated names (`id=1&id=2`, one per
//! ticked checkbox) are what HTML forms send, and serde's flat maps cannot hold them.

use super::error::ConsoleError;

/// The biggest form the console sends: a page of ticked ids is a few KiB.
pub(crate) const MAX_FORM_BYTES: usize = 64 * 1024;

#[derive(Debug, Default, Clone)]
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    pub(crate) fn parse(bytes: &[u8]) -> Self {
        Self(
            url::form_urlencoded::parse(bytes)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `name`, trimmed; `None` when absent or blank.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Every non-blank value of `name`, in order.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
            .collect()
    }

    pub(crate) fn require(&self, name: &str) -> Result<&str, ConsoleError> {
        self.get(name)
            .ok_or_else(|| ConsoleError::BadInput(format!("the form needs a value for `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_names_blanks_and_encoding() {
        let f = Fields::parse(b"id=1&id=%202%20&id=&csrf=a%2Bb&empty=");
        assert_eq!(f.all("id"), ["1", "2"]);
        assert_eq!(f.get("csrf"), Some("a+b"));
        assert_eq!(f.get("empty"), None);
        assert_eq!(f.get("missing"), None);
        assert!(
            f.require("empty")
                .unwrap_err()
                .to_string()
                .contains("`empty`")
        );
        assert_eq!(f.require("id").unwrap(), "1");
    }
}
