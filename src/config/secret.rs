//! Serialising the secrets in [`super::Settings`]. A `SecretString` keeps them out of
//! `Debug` and so out of every log line; serialising has to show them, because the layered
//! loader feeds the built-in defaults (and tests compare files) through serde. Nothing else
//! serialises settings.

use secrecy::{ExposeSecret, SecretString};
use serde::Serializer;

pub(super) fn expose<S: Serializer>(
    secret: &SecretString,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(secret.expose_secret())
}

// serde's `serialize_with` hands the field over as it is declared.
#[allow(clippy::ref_option)]
pub(super) fn expose_optional<S: Serializer>(
    secret: &Option<SecretString>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match secret {
        Some(secret) => serializer.serialize_some(secret.expose_secret()),
        None => serializer.serialize_none(),
    }
}
