//! Tenant authentication with bearer tokens (`docs/reference.md`, Tenants).
//!
//! The tokens file holds SHA-256 hashes, never tokens, so a leaked file or config map does
//! not let anyone in. A presented token is hashed and compared in constant time against every
//! tenant's hash, so timing reveals neither which tenant matched nor how much of a hash did.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::AuthSettings;
use crate::domain::TenantId;

#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("SUMMARYD_AUTH_TOKENS_FILE {path}: {reason}")]
    Invalid { path: String, reason: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tenants: BTreeMap<String, TenantEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    token_sha256: String,
    /// Sustained requests per second this tenant may make to this replica.
    rate_per_s: Option<f64>,
    /// Requests it may make in a burst above the sustained rate.
    burst: Option<u32>,
}

struct Entry {
    tenant: TenantId,
    hash: [u8; 32],
    limiter: Option<Mutex<TokenBucket>>,
}

/// The loaded tokens file.
pub struct TokenStore {
    entries: Vec<Entry>,
}

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No or unknown token.
    Unauthenticated,
    /// Over the tenant's rate; try again after this long.
    RateLimited(Duration),
}

/// The token store the API authenticates with, loaded once at start-up: `None` (tenants from
/// `X-Tenant-Id`, with a warning) when no tokens file is configured. A file that cannot be
/// read or parsed is an error, so the process refuses to start rather than run unprotected.
pub fn from_settings(settings: &AuthSettings) -> Result<Option<Tokens>, AuthFileError> {
    match &settings.tokens_file {
        Some(path) => Tokens::load(path).map(Some),
        None => {
            tracing::warn!(
                "SUMMARYD_AUTH_TOKENS_FILE is not set: tenants are taken from X-Tenant-Id and are not authenticated"
            );
            Ok(None)
        }
    }
}

impl TokenStore {
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        let invalid = |reason: String| AuthFileError::Invalid {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        Self::parse(&text).map_err(invalid)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.tenants.is_empty() {
            return Err("no [tenants.NAME] tables: every request would be refused".into());
        }
        let mut entries = Vec::with_capacity(file.tenants.len());
        for (name, entry) in file.tenants {
            let tenant =
                TenantId::parse(&name).map_err(|e| format!("tenant {name:?}: {}", e.message))?;
            let mut hash = [0u8; 32];
            hex::decode_to_slice(entry.token_sha256.trim(), &mut hash).map_err(|_| {
                format!("tenants.{name}.token_sha256 must be 64 hex characters (the SHA-256 of the token)")
            })?;
            let limiter = match (entry.rate_per_s, entry.burst) {
                (None, None) => None,
                (rate, burst) => {
                    let rate = rate.unwrap_or(f64::INFINITY);
                    if rate.is_nan() || rate <= 0.0 {
                        return Err(format!("tenants.{name}.rate_per_s must be positive"));
                    }
                    // Without a burst, allow one second's worth (at least one request).
                    let burst = burst.map(f64::from).unwrap_or(rate.ceil().max(1.0));
                    if burst < 1.0 {
                        return Err(format!("tenants.{name}.burst must be at least 1"));
                    }
                    Some(Mutex::new(TokenBucket::new(rate, burst)))
                }
            };
            entries.push(Entry {
                tenant,
                hash,
                limiter,
            });
        }
        Ok(Self { entries })
    }

    /// The tenant owning `token`, if any, after its rate limit.
    pub fn authenticate(&self, token: &str) -> Result<TenantId, Denied> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Compare against every entry without stopping early.
        let mut found: Option<&Entry> = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        let entry = found.ok_or(Denied::Unauthenticated)?;
        if let Some(limiter) = &entry.limiter {
            let mut bucket = limiter.lock().unwrap_or_else(|p| p.into_inner());
            bucket.take(Instant::now()).map_err(Denied::RateLimited)?;
        }
        Ok(entry.tenant.clone())
    }
}

/// The tokens file as currently loaded, replaceable while requests run: a reload swaps
/// the whole store at once, so every request is checked against exactly one version of the
/// file, and no request waits for a reload or is dropped by it.
pub struct Tokens {
    path: PathBuf,
    current: ArcSwap<TokenStore>,
}

impl Tokens {
    /// Load `path`: an error if it cannot be read or parsed (start-up refuses to run
    /// unprotected).
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        Ok(Self {
            path: path.to_path_buf(),
            current: ArcSwap::from_pointee(TokenStore::load(path)?),
        })
    }

    /// The store requests are checked against right now.
    pub fn current(&self) -> Arc<TokenStore> {
        self.current.load_full()
    }

    /// Read the file again and switch to it. An invalid file changes nothing: the store in
    /// use stays, and the error says why. Returns the number of tenants now loaded.
    /// Per-replica rate-limit buckets start full again in the new store.
    pub fn reload(&self) -> Result<usize, AuthFileError> {
        let store = TokenStore::load(&self.path)?;
        let tenants = store.entries.len();
        self.current.store(Arc::new(store));
        Ok(tenants)
    }
}

/// Reload `tokens` on every SIGHUP until `shutdown`. Installed even without a tokens file,
/// so an operator's SIGHUP never kills the process (the default action of the signal).
pub async fn reload_on_sighup(tokens: Option<Arc<Tokens>>, shutdown: crate::shutdown::Shutdown) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP; tokens file reload disabled");
            return;
        }
    };
    loop {
        tokio::select! {
            () = shutdown.wait() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        match &tokens {
            None => tracing::info!("SIGHUP: no tokens file configured; nothing to reload"),
            Some(tokens) => match tokens.reload() {
                Ok(tenants) => tracing::info!(tenants, "SIGHUP: tokens file reloaded"),
                Err(e) => tracing::error!(
                    error = %e,
                    "SIGHUP: tokens file not reloaded; the previous one stays in use"
                ),
            },
        }
    }
}

/// Classic token bucket: `burst` tokens, refilled at `rate` per second.
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            updated: Instant::now(),
        }
    }

    /// Take one token, or say how long until one is available.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - self.tokens) / self.rate;
        Err(Duration::from_secs_f64(wait.min(3600.0)))
    }
}

/// The hex SHA-256 of a token, as the tokens file stores it.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(extra: &str) -> TokenStore {
        TokenStore::parse(&format!(
            "[tenants.acme]\ntoken_sha256 = \"{}\"\n{extra}\n[tenants.globex]\ntoken_sha256 = \"{}\"\n",
            token_sha256("acme-token"),
            token_sha256("globex-token")
        ))
        .unwrap()
    }

    #[test]
    fn a_token_maps_to_its_tenant_and_unknown_tokens_are_refused() {
        let s = store("");
        assert_eq!(s.authenticate("acme-token").unwrap().as_str(), "acme");
        assert_eq!(s.authenticate("globex-token").unwrap().as_str(), "globex");
        assert_eq!(s.authenticate("acme-token "), Err(Denied::Unauthenticated));
        assert_eq!(s.authenticate(""), Err(Denied::Unauthenticated));
    }

    #[test]
    fn bad_files_are_rejected_with_the_reason() {
        assert!(TokenStore::parse("").err().unwrap().contains("tenants"));
        let err = TokenStore::parse("[tenants.acme]\ntoken_sha256 = \"abc\"\n")
            .err()
            .unwrap();
        assert!(err.contains("64 hex"), "{err}");
        let err = TokenStore::parse(&format!(
            "[tenants.\"a:b\"]\ntoken_sha256 = \"{}\"\n",
            token_sha256("x")
        ))
        .err()
        .unwrap();
        assert!(err.contains("a:b"), "{err}");
        let err = TokenStore::parse(&format!(
            "[tenants.acme]\ntoken_sha256 = \"{}\"\ntoken = \"plain\"\n",
            token_sha256("x")
        ))
        .err()
        .unwrap();
        assert!(err.contains("token"), "{err}");
    }

    #[test]
    fn reload_switches_files_and_an_invalid_file_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let write = |token: &str| {
            std::fs::write(
                &path,
                format!(
                    "[tenants.acme]\ntoken_sha256 = \"{}\"\n",
                    token_sha256(token)
                ),
            )
            .unwrap()
        };
        write("old-token");
        let tokens = Tokens::load(&path).unwrap();
        assert!(tokens.current().authenticate("old-token").is_ok());
        write("new-token");
        assert!(
            tokens.current().authenticate("old-token").is_ok(),
            "nothing changes before a reload"
        );
        assert_eq!(tokens.reload().unwrap(), 1);
        assert!(tokens.current().authenticate("new-token").is_ok());
        assert_eq!(
            tokens.current().authenticate("old-token"),
            Err(Denied::Unauthenticated)
        );
        std::fs::write(&path, "[tenants.acme]\ntoken_sha256 = \"nope\"\n").unwrap();
        let err = tokens.reload().unwrap_err().to_string();
        assert!(err.contains("64 hex"), "{err}");
        assert!(tokens.current().authenticate("new-token").is_ok());
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let mut b = TokenBucket::new(2.0, 3.0);
        let t0 = b.updated;
        assert!(b.take(t0).is_ok() && b.take(t0).is_ok() && b.take(t0).is_ok());
        let wait = b.take(t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(400) && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(b.take(t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn rate_limits_apply_per_tenant() {
        let s = store("rate_per_s = 0.001\nburst = 1");
        assert!(s.authenticate("acme-token").is_ok());
        assert!(matches!(
            s.authenticate("acme-token"),
            Err(Denied::RateLimited(_))
        ));
        assert!(
            s.authenticate("globex-token").is_ok(),
            "another tenant is not limited"
        );
    }
}
