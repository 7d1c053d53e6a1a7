//! `[auth]`: how clients authenticate (`SUMMARYD_AUTH_TOKENS_FILE`, `SUMMARYD_AUTH_MODE`).
//! The tokens file itself is read by the api role, which is the only one that needs it.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub tokens_file: Option<PathBuf>,
    /// Without a tokens file, header mode is accepted on a loopback listener only (a
    /// developer's machine, a sidecar); elsewhere the operator must say it is meant.
    pub mode: Option<AuthMode>,
}

/// The one mode that can be asked for: the tokens file is how token mode is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Tenants come from `X-Tenant-Id`, unauthenticated: only behind a proxy that sets it.
    Header,
}

impl AuthSettings {
    /// Protected mode: an api listener reachable from other hosts never runs without
    /// authentication by default, because anyone reaching it could act as any tenant. Only
    /// the public listener of the api role matters; the ops listener serves no tenant data.
    pub(super) fn check_listener(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        match (&self.tokens_file, self.mode) {
            (Some(_), Some(AuthMode::Header)) => Err(invalid(
                "SUMMARYD_AUTH_MODE",
                "header contradicts SUMMARYD_AUTH_TOKENS_FILE (token mode); unset one of them",
            )),
            (None, None) if !listen.ip().to_canonical().is_loopback() => Err(invalid(
                "SUMMARYD_AUTH_MODE",
                &format!(
                    "the api listens on {listen}, not a loopback address, without \
                     SUMMARYD_AUTH_TOKENS_FILE: anyone who reaches it could pick any tenant with \
                     X-Tenant-Id. Set SUMMARYD_AUTH_TOKENS_FILE, or SUMMARYD_AUTH_MODE=header \
                     if a trusted proxy in front of it sets X-Tenant-Id"
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;
    use super::*;

    fn check(tokens: bool, mode: Option<AuthMode>, listen: &str) -> Result<(), String> {
        AuthSettings {
            tokens_file: tokens.then(|| PathBuf::from("/etc/summaryd/tokens.toml")),
            mode,
        }
        .check_listener(listen.parse().unwrap())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn header_mode_off_loopback_needs_to_be_asked_for() {
        for listen in [
            "0.0.0.0:8080",
            "[::]:8080",
            "10.1.2.3:8080",
            "[::ffff:10.0.0.1]:80",
        ] {
            let err = check(false, None, listen).unwrap_err();
            assert!(
                err.starts_with("invalid configuration: SUMMARYD_AUTH_MODE: ")
                    && err.contains(listen)
                    && err.contains("SUMMARYD_AUTH_TOKENS_FILE"),
                "{listen}: {err}"
            );
            assert_eq!(check(false, Some(AuthMode::Header), listen), Ok(()));
            assert_eq!(check(true, None, listen), Ok(()));
        }
        for listen in [
            "127.0.0.1:8080",
            "127.9.9.9:0",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert_eq!(check(false, None, listen), Ok(()), "{listen}");
        }
        let err = check(true, Some(AuthMode::Header), "127.0.0.1:8080").unwrap_err();
        assert!(
            err.contains("SUMMARYD_AUTH_MODE") && err.contains("contradicts"),
            "{err}"
        );
    }

    #[test]
    fn the_mode_is_header_or_nothing() {
        let s = load("[auth]\nmode = \"header\"\n", &[]).unwrap();
        assert_eq!(s.auth.mode, Some(AuthMode::Header));
        let s = load("", &[("SUMMARYD_AUTH_MODE", "header")]).unwrap();
        assert_eq!(s.auth.mode, Some(AuthMode::Header));
        assert_eq!(load("", &[]).unwrap().auth.mode, None);
        for value in ["token", "none", "Header"] {
            let err = load("", &[("SUMMARYD_AUTH_MODE", value)]).unwrap_err();
            assert!(err.contains("SUMMARYD_AUTH_MODE"), "{value}: {err}");
        }
    }
}
