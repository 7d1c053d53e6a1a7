//! `summaryd token new --tenant NAME`: a fresh bearer token, printed once, and the lines
//! that put its hash in the tokens file. The token itself is stored nowhere.

use clap::Subcommand;
use std::io::Write;

use crate::api::auth::token_sha256;
use crate::domain::TenantId;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a fresh random token once, and the TOML lines that add its hash to the file.
    New {
        /// The tenant the token authenticates (1–64 of A-Z a-z 0-9 . _ -).
        #[arg(long, value_name = "NAME")]
        tenant: String,
    },
}

/// 32 random bytes (256 bits), hex-encoded: far beyond guessing, and only characters that
/// survive headers, shells and config files unquoted.
const TOKEN_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("--tenant {0:?}: {1}")]
    Tenant(String, String),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// A new random token (from the thread-local CSPRNG, seeded by the operating system).
pub(crate) fn generate() -> String {
    hex::encode(rand::random::<[u8; TOKEN_BYTES]>())
}

/// Print a new token for `tenant` and the TOML to add for it.
pub fn new(tenant: &str, out: &mut impl Write) -> Result<(), TokenError> {
    let tenant =
        TenantId::parse(tenant).map_err(|e| TokenError::Tenant(tenant.to_owned(), e.message))?;
    let token = generate();
    writeln!(
        out,
        "# Token for tenant {tenant}; shown only now. Give it to the tenant, who sends\n\
         # `Authorization: Bearer <token>`:\n\
         {token}\n\
         \n\
         # Add to the tokens file (SUMMARYD_AUTH_TOKENS_FILE), replacing any [tenants.{tenant}]\n\
         # table to rotate, then send SIGHUP to every summaryd process to load it:\n\
         [tenants.{tenant}]\n\
         token_sha256 = \"{hash}\"",
        hash = token_sha256(&token)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::auth::TokenStore;

    #[test]
    fn prints_a_token_and_toml_that_authenticates_it() {
        let mut out = Vec::new();
        new("acme", &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let token = text
            .lines()
            .find(|l| !l.starts_with('#') && !l.is_empty())
            .unwrap();
        assert_eq!(token.len(), 2 * TOKEN_BYTES);
        let toml = &text[text.rfind("[tenants.acme]").unwrap()..];
        let store = TokenStore::parse(toml).unwrap();
        assert_eq!(store.authenticate(token).unwrap().0.as_str(), "acme");
        assert!(
            !toml.contains(token),
            "the file gets the hash, never the token"
        );
    }

    #[test]
    fn tokens_differ_and_bad_tenant_names_are_refused() {
        assert_ne!(generate(), generate());
        let err = new("a:b", &mut Vec::new()).unwrap_err().to_string();
        assert!(err.contains("a:b"), "{err}");
    }
}
