//! Tenant authentication with bearer tokens (`docs/reference.md`, Tenants).
//!
//! The tokens file holds SHA-256 hashes, never tokens, so a leaked file or config map does
//! not let anyone in. A presented token is hashed and compared in constant time against every
//! tenant's hash, so timing reveals neither which tenant matched nor how much of a hash did.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthSettings, NotifySettings};
use crate::domain::{
    Budget, BudgetPeriod, DEFAULT_SOFT_RATIO, NotifyDomains, TenantId, WebhookSecrets, WebhookUrl,
};
use crate::stream::TenantLimits;

#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("SUMMARYD_AUTH_TOKENS_FILE {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// `reason` says which entry is wrong and why, in our words (several checks, no one
    /// error type behind them).
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
    /// Sustained jobs per second this tenant may submit, across all replicas.
    rate_per_s: Option<f64>,
    /// Jobs it may submit at once above the sustained rate.
    burst: Option<u32>,
    /// Jobs it may have accepted and not yet finished.
    max_in_flight: Option<u32>,
    /// The domains `notify` may use (`acme.com`, `*.acme.com`); absent: any.
    notify_domains: Option<Vec<String>>,
    /// Emails one recipient may be sent per rolling hour; absent: `SUMMARYD_NOTIFY_PER_HOUR`.
    notify_per_hour: Option<u32>,
    /// Where this tenant's jobs send webhooks when a request names none.
    webhook_url: Option<String>,
    /// `whsec_` secrets; the first signs, every one adds a signature (rotation).
    webhook_secrets: Option<Vec<String>>,
    /// Tokens (prompt and completion, every model call) the tenant may spend per period.
    budget_tokens: Option<u64>,
    /// `day` or `month`, in UTC; required with `budget_tokens`.
    budget_period: Option<String>,
    /// Share of the budget at which operators are warned; in (0, 1], default 0.8.
    budget_soft_ratio: Option<f64>,
    /// Share of dispatch against other tenants with jobs queued (default 1).
    weight: Option<f64>,
    /// Jobs of this tenant dispatched and not yet finished at once, fleet-wide.
    max_concurrent: Option<u32>,
}

struct Entry {
    tenant: TenantId,
    hash: [u8; 32],
    policy: Arc<TenantPolicy>,
}

/// What a tenant may do, from the file version that authenticated the request: a request
/// is held to the limits of the same file its token was checked against, even when a
/// reload lands while it runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantPolicy {
    /// Enforced where jobs are accepted (`stream::tenant_limits`), across replicas.
    pub(crate) limits: TenantLimits,
    /// `None`: `notify` may use any domain.
    pub(crate) notify_domains: Option<NotifyDomains>,
    /// The tenant's default webhook target (syntax checked at load; the `[webhook]` rules
    /// are applied where a job is accepted).
    pub(crate) webhook_url: Option<WebhookUrl>,
    /// What signs the tenant's webhooks; without it no webhook can be accepted.
    pub(crate) webhook_secrets: Option<Arc<WebhookSecrets>>,
    /// The tenant's token budget (`stream::budget`); `None`: unlimited. Header mode has none.
    pub(crate) budget: Option<Budget>,
}

impl TenantPolicy {
    /// Header mode's policy, the same for every tenant: the `[notify]` settings. Settings
    /// are checked when loaded, so their domains parse; if they did not, no domain is
    /// allowed rather than every one.
    /// `webhook_secrets` is `SUMMARYD_WEBHOOK_SECRETS_FILE`, loaded at start.
    pub(crate) fn header_mode(
        notify: &NotifySettings,
        webhook_secrets: Option<Arc<WebhookSecrets>>,
    ) -> Self {
        let notify_domains = notify.domains().unwrap_or_else(|e| {
            tracing::error!(error = %e, "refusing every notify");
            Some(NotifyDomains::nothing())
        });
        Self {
            limits: TenantLimits::default(),
            notify_domains,
            webhook_url: None,
            webhook_secrets,
            budget: None,
        }
    }

    /// The limits a job is accepted under: the tenant's own, and for a tenant without its
    /// own `notify_per_hour`, the deployment's default.
    pub(crate) fn limits(&self, notify: &NotifySettings) -> TenantLimits {
        let mut limits = self.limits;
        limits.notify_per_hour = limits.notify_per_hour.or(notify.per_hour());
        limits
    }
}

/// The loaded tokens file.
pub struct TokenStore {
    entries: Vec<Entry>,
}

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No or unknown token.
    Unauthenticated,
}

/// The token store the API authenticates with, loaded once at start-up: `None` (tenants from
/// `X-Tenant-Id`, with a warning) when no tokens file is configured. A file that cannot be
/// read or parsed is an error, so the process refuses to start rather than run unprotected.
pub fn from_settings(
    settings: &AuthSettings,
    notify: &NotifySettings,
) -> Result<Option<Tokens>, AuthFileError> {
    match &settings.tokens_file {
        Some(path) => {
            if notify.domains.is_some() {
                // Token mode reads each tenant's own policy; a deployment-wide list here
                // would look like a restriction that is not there.
                tracing::warn!(
                    "SUMMARYD_NOTIFY_DOMAINS has no effect with SUMMARYD_AUTH_TOKENS_FILE: \
                     give each tenant notify_domains in the tokens file"
                );
            }
            Tokens::load(path).map(Some)
        }
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
        let text = std::fs::read_to_string(path).map_err(|source| AuthFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(invalid)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.tenants.is_empty() {
            return Err("no [tenants.NAME] tables: every request would be refused".into());
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(file.tenants.len());
        for (name, entry) in file.tenants {
            let tenant =
                TenantId::parse(&name).map_err(|e| format!("tenant {name:?}: {}", e.message))?;
            let mut hash = [0u8; 32];
            hex::decode_to_slice(entry.token_sha256.trim(), &mut hash).map_err(|_| {
                format!("tenants.{name}.token_sha256 must be 64 hex characters (the SHA-256 of the token)")
            })?;
            // Two tenants behind one token: the request would act for whichever is
            // compared last, so neither tenant's limits nor its data would be its own.
            if let Some(other) = entries.iter().find(|e| e.hash == hash) {
                return Err(format!(
                    "tenants.{name}.token_sha256 is also tenants.{}.token_sha256: give each tenant its own token",
                    other.tenant.as_str()
                ));
            }
            // inf would mean "no limit" spelled as a limit, and NaN compares false with
            // everything: both would switch the rate limit off while looking like one.
            if entry.rate_per_s.is_some_and(|r| !r.is_finite() || r <= 0.0) {
                return Err(format!(
                    "tenants.{name}.rate_per_s must be a positive finite number (remove it for no limit)"
                ));
            }
            if entry.burst == Some(0) {
                return Err(format!("tenants.{name}.burst must be at least 1"));
            }
            if entry.max_in_flight == Some(0) {
                return Err(format!("tenants.{name}.max_in_flight must be at least 1"));
            }
            if entry.weight.is_some_and(|w| !w.is_finite() || w <= 0.0) {
                return Err(format!(
                    "tenants.{name}.weight must be a positive finite number (remove it for 1)"
                ));
            }
            if entry.max_concurrent == Some(0) {
                return Err(format!(
                    "tenants.{name}.max_concurrent must be at least 1 (remove it for no cap)"
                ));
            }
            if entry.notify_per_hour == Some(0) {
                return Err(format!(
                    "tenants.{name}.notify_per_hour must be at least 1 (remove it for the default)"
                ));
            }
            let notify_domains = entry
                .notify_domains
                .as_ref()
                .map(|list| NotifyDomains::parse(list.iter().map(String::as_str)))
                .transpose()
                .map_err(|why| format!("tenants.{name}.notify_domains: {why}"))?;
            let webhook_url = entry
                .webhook_url
                .as_deref()
                .map(WebhookUrl::from_stored)
                .transpose()
                .map_err(|e| format!("tenants.{name}.webhook_url: {}", e.message))?;
            let webhook_secrets = entry
                .webhook_secrets
                .as_ref()
                .map(|list| WebhookSecrets::parse_list(list.iter().map(String::as_str)))
                .transpose()
                .map_err(|why| format!("tenants.{name}.webhook_secrets: {why}"))?
                .map(Arc::new);
            let budget = budget_of(&name, &entry)?;
            entries.push(Entry {
                tenant,
                hash,
                policy: Arc::new(TenantPolicy {
                    limits: TenantLimits {
                        rate_per_s: entry.rate_per_s,
                        burst: entry.burst,
                        max_in_flight: entry.max_in_flight,
                        notify_per_hour: entry.notify_per_hour,
                        weight: entry.weight,
                        max_concurrent: entry.max_concurrent,
                    },
                    notify_domains,
                    webhook_url,
                    webhook_secrets,
                    budget,
                }),
            });
        }
        Ok(Self { entries })
    }

    /// Every tenant of this file version with its policy (the console's tenants page).
    pub(crate) fn tenants(&self) -> impl Iterator<Item = (&TenantId, &TenantPolicy)> {
        self.entries.iter().map(|e| (&e.tenant, e.policy.as_ref()))
    }

    /// The policy of `tenant` in this file version (the relay signs with its secrets).
    pub(crate) fn policy_of(&self, tenant: &TenantId) -> Option<Arc<TenantPolicy>> {
        self.entries
            .iter()
            .find(|e| &e.tenant == tenant)
            .map(|e| e.policy.clone())
    }

    /// The tenant owning `token`, if any, with its policy from this same file version. Its
    /// limits are enforced where jobs are accepted (`stream::tenant_limits`), so they hold
    /// across replicas.
    pub(crate) fn authenticate(
        &self,
        token: &str,
    ) -> Result<(TenantId, Arc<TenantPolicy>), Denied> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Compare against every entry without stopping early.
        let mut found: Option<&Entry> = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        found
            .map(|entry| (entry.tenant.clone(), entry.policy.clone()))
            .ok_or(Denied::Unauthenticated)
    }
}

/// The tenant's budget from its entry: `budget_tokens` with `budget_period`, and an optional
/// `budget_soft_ratio`; either of the others without `budget_tokens` is a mistake worth
/// refusing the file for (it would read as a budget that is not there).
fn budget_of(name: &str, entry: &TenantEntry) -> Result<Option<Budget>, String> {
    let Some(tokens) = entry.budget_tokens else {
        if entry.budget_period.is_some() {
            return Err(format!(
                "tenants.{name}.budget_period needs budget_tokens (the tokens per period); remove it for no budget"
            ));
        }
        if entry.budget_soft_ratio.is_some() {
            return Err(format!(
                "tenants.{name}.budget_soft_ratio needs budget_tokens (the tokens per period); remove it for no budget"
            ));
        }
        return Ok(None);
    };
    if tokens == 0 {
        return Err(format!(
            "tenants.{name}.budget_tokens must be at least 1 (remove it for no budget)"
        ));
    }
    let period = match entry.budget_period.as_deref() {
        Some(raw) => BudgetPeriod::parse(raw).ok_or_else(|| {
            format!("tenants.{name}.budget_period must be \"day\" or \"month\" (UTC), not {raw:?}")
        })?,
        None => {
            return Err(format!(
                "tenants.{name}.budget_tokens needs budget_period = \"day\" or \"month\" (UTC)"
            ));
        }
    };
    let soft_ratio = entry.budget_soft_ratio.unwrap_or(DEFAULT_SOFT_RATIO);
    if !soft_ratio.is_finite() || soft_ratio <= 0.0 || soft_ratio > 1.0 {
        return Err(format!(
            "tenants.{name}.budget_soft_ratio must be above 0 and at most 1 (a share of budget_tokens), not {soft_ratio}"
        ));
    }
    Ok(Some(Budget {
        tokens,
        period,
        soft_ratio,
    }))
}

/// How often the tokens file is read for a change. A revoked token stops working within
/// two of these after the file settles (see [`Settle`]); reading a file of a few KiB once a
/// second costs nothing.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The tokens file as currently loaded, replaceable while requests run: a reload swaps
/// the whole store at once, so every request is checked against exactly one version of the
/// file, and no request waits for a reload or is dropped by it.
pub struct Tokens {
    path: PathBuf,
    current: ArcSwap<TokenStore>,
    /// SHA-256 of the content last acted on (loaded, or refused and logged), so the watcher
    /// acts on each version of the file once, whoever read it first.
    seen: Mutex<[u8; 32]>,
}

impl Tokens {
    /// Load `path`: an error if it cannot be read or parsed (start-up refuses to run
    /// unprotected).
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        // Hashed before it is loaded: a file replaced in between then differs from what was
        // hashed, and the watcher loads it again, rather than taking it for one already seen.
        let seen = Sha256::digest(read(path)?.as_bytes()).into();
        Ok(Self {
            path: path.to_path_buf(),
            current: ArcSwap::from_pointee(TokenStore::load(path)?),
            seen: Mutex::new(seen),
        })
    }

    /// The store requests are checked against right now.
    pub(crate) fn current(&self) -> Arc<TokenStore> {
        self.current.load_full()
    }

    /// Read the file again and switch to it. An invalid file changes nothing: the store in
    /// use stays, and the error says why. Returns the number of tenants now loaded.
    pub(crate) fn reload(&self) -> Result<usize, AuthFileError> {
        let text = read(&self.path)?;
        self.apply(&text)
    }

    /// Switch to `text` (the file's content) if it parses; either way it is the version
    /// acted on.
    fn apply(&self, text: &str) -> Result<usize, AuthFileError> {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) =
            Sha256::digest(text.as_bytes()).into();
        let store = TokenStore::parse(text).map_err(|reason| invalid(&self.path, reason))?;
        let tenants = store.entries.len();
        self.current.store(Arc::new(store));
        Ok(tenants)
    }

    /// One look at the file for the watcher: what it now holds decides, with `settle`
    /// carrying the version seen on the previous look.
    fn look(&self, text: &str, settle: &mut Settle) -> Look {
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        let seen = *self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match settle.next(seen, digest) {
            Step::Unchanged | Step::Settling => Look::Nothing,
            Step::Apply => match self.apply(text) {
                Ok(tenants) => Look::Reloaded(tenants),
                Err(e) => Look::Refused(e),
            },
        }
    }
}

fn read(path: &Path) -> Result<String, AuthFileError> {
    std::fs::read_to_string(path).map_err(|source| AuthFileError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn invalid(path: &Path, reason: String) -> AuthFileError {
    AuthFileError::Invalid {
        path: path.display().to_string(),
        reason,
    }
}

/// A new version of the file is applied only once two looks in a row find the same
/// content: an editor or `cat > file` writes in steps, and a half-written file that still
/// parses (cut after one tenant's table) would lock every other tenant out until the next
/// look. An atomic replace (a rename, or a Kubernetes ConfigMap's symlink swap) settles at
/// once, so its cost is one interval.
#[derive(Debug, Default)]
struct Settle {
    pending: Option<[u8; 32]>,
}

#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The content is the version already acted on.
    Unchanged,
    /// A new version, not yet seen twice.
    Settling,
    /// A new version seen on two looks in a row.
    Apply,
}

impl Settle {
    fn next(&mut self, seen: [u8; 32], now: [u8; 32]) -> Step {
        if now == seen {
            self.pending = None;
            return Step::Unchanged;
        }
        if self.pending.replace(now) == Some(now) {
            self.pending = None;
            return Step::Apply;
        }
        Step::Settling
    }
}

enum Look {
    Nothing,
    Reloaded(usize),
    Refused(AuthFileError),
}

/// Reload `tokens` on every SIGHUP until `shutdown`. Installed even without a tokens file,
/// so an operator's SIGHUP never kills the process (the default action of the signal).
pub(crate) async fn reload_on_sighup(
    tokens: Option<Arc<Tokens>>,
    shutdown: crate::shutdown::Shutdown,
) {
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

/// Reload `tokens` when the file's content changes, until `shutdown`, so a revoked token
/// stops working without a signal.
///
/// Polled, not watched with inotify: Kubernetes updates a mounted ConfigMap or Secret by
/// swapping a `..data` symlink, which an inotify watch on the file's path does not see
/// (the watched inode never changes, it is only unlinked), and inotify does not work on
/// network filesystems. The content is compared, not the mtime and size: a rotated hash
/// has the same size, and a coarse mtime can hide a second write in the same second.
pub(crate) async fn reload_on_change(
    tokens: Option<Arc<Tokens>>,
    shutdown: crate::shutdown::Shutdown,
) {
    let Some(tokens) = tokens else { return };
    let mut settle = Settle::default();
    let mut unreadable = false;
    loop {
        tokio::select! {
            () = shutdown.wait() => return,
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        let text = match tokio::fs::read_to_string(&tokens.path).await {
            Ok(text) => text,
            Err(e) => {
                // Once per outage: a file that is gone for a while (mid-deploy) is one event.
                if !std::mem::replace(&mut unreadable, true) {
                    tracing::warn!(path = %tokens.path.display(), error = %e,
                        "tokens file cannot be read; the loaded one stays in use");
                }
                continue;
            }
        };
        unreadable = false;
        match tokens.look(&text, &mut settle) {
            Look::Nothing => {}
            Look::Reloaded(tenants) => {
                tracing::info!(tenants, "tokens file changed on disk: reloaded");
            }
            Look::Refused(e) => tracing::error!(
                error = %e,
                "tokens file changed on disk but not reloaded; the previous one stays in use"
            ),
        }
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
        assert_eq!(s.authenticate("acme-token").unwrap().0.as_str(), "acme");
        assert_eq!(s.authenticate("globex-token").unwrap().0.as_str(), "globex");
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
    fn weight_and_max_concurrent_are_read_per_tenant() {
        let s = store("weight = 2.5\nmax_concurrent = 4");
        let (_, acme) = s.authenticate("acme-token").unwrap();
        assert_eq!(acme.limits.weight, Some(2.5));
        assert_eq!(acme.limits.max_concurrent, Some(4));
        let (_, globex) = s.authenticate("globex-token").unwrap();
        assert_eq!(globex.limits.weight, None);
        assert_eq!(globex.limits.max_concurrent, None);
    }

    #[test]
    fn limits_are_read_per_tenant_and_validated() {
        let s = store(
            "rate_per_s = 50.0\nburst = 100\nmax_in_flight = 1000\nnotify_per_hour = 7\nnotify_domains = [\"acme.com\", \"*.acme.com\"]",
        );
        let (_, acme) = s.authenticate("acme-token").unwrap();
        assert_eq!(
            acme.limits,
            TenantLimits {
                rate_per_s: Some(50.0),
                burst: Some(100),
                max_in_flight: Some(1000),
                notify_per_hour: Some(7),
                weight: None,
                max_concurrent: None,
            }
        );
        assert_eq!(
            acme.notify_domains.as_ref().unwrap().to_string(),
            "acme.com, *.acme.com"
        );
        let (_, globex) = s.authenticate("globex-token").unwrap();
        assert_eq!(*globex, TenantPolicy::default());
        for (bad, names) in [
            ("rate_per_s = 0.0", "rate_per_s"),
            ("rate_per_s = -1.0", "rate_per_s"),
            ("rate_per_s = inf", "rate_per_s"),
            ("rate_per_s = -inf", "rate_per_s"),
            ("rate_per_s = nan", "rate_per_s"),
            ("burst = 0", "burst"),
            ("max_in_flight = 0", "max_in_flight"),
            ("notify_per_hour = 0", "notify_per_hour"),
            ("weight = 0.0", "weight"),
            ("weight = -1.0", "weight"),
            ("weight = inf", "weight"),
            ("weight = nan", "weight"),
            ("max_concurrent = 0", "max_concurrent"),
            ("notify_domains = []", "notify_domains"),
            ("notify_domains = [\"localhost\"]", "notify_domains"),
            ("notify_domains = [\"*.10.0.0.5\"]", "notify_domains"),
        ] {
            let text = format!(
                "[tenants.acme]\ntoken_sha256 = \"{}\"\n{bad}\n",
                token_sha256("x")
            );
            let err = TokenStore::parse(&text).err().unwrap();
            assert!(
                err.contains(&format!("tenants.acme.{names}")),
                "{bad}: {err}"
            );
        }
        // The largest finite rate is a limit like any other.
        assert!(
            TokenStore::parse(&format!(
                "[tenants.acme]\ntoken_sha256 = \"{}\"\nrate_per_s = 1e300\n",
                token_sha256("x")
            ))
            .is_ok()
        );
    }

    #[test]
    fn header_mode_holds_every_tenant_to_the_notify_settings() {
        let notify = NotifySettings {
            domains: Some(crate::config::DomainList::Joined("acme.com".into())),
            per_hour: None,
        };
        let policy = TenantPolicy::header_mode(&notify, None);
        assert_eq!(policy.notify_domains.unwrap().to_string(), "acme.com");
        assert_eq!(policy.limits, TenantLimits::default());
        // Settings that would not load fail closed: no domain at all, not every one.
        let broken = NotifySettings {
            domains: Some(crate::config::DomainList::Joined("localhost".into())),
            per_hour: None,
        };
        let policy = TenantPolicy::header_mode(&broken, None);
        assert_eq!(policy.notify_domains.unwrap().to_string(), "no domain");
    }

    #[test]
    fn the_settings_choose_token_mode_only_with_a_tokens_file() {
        let notify = NotifySettings::default();
        let none = from_settings(&AuthSettings::default(), &notify).unwrap();
        assert!(none.is_none(), "header mode");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(
            &path,
            format!("[tenants.acme]\ntoken_sha256 = \"{}\"\n", token_sha256("t")),
        )
        .unwrap();
        let settings = AuthSettings {
            tokens_file: Some(path),
            ..Default::default()
        };
        let tokens = from_settings(&settings, &notify)
            .unwrap()
            .expect("token mode");
        assert_eq!(
            tokens.current().authenticate("t").unwrap().0.as_str(),
            "acme"
        );
    }

    #[test]
    fn budgets_parse_with_their_period_and_soft_ratio_and_mistakes_name_the_field() {
        let budget = |extra: &str| {
            let parse = |extra: &str| {
                TokenStore::parse(&format!(
                    "[tenants.acme]\ntoken_sha256 = \"{}\"\n{extra}\n",
                    token_sha256("acme-token")
                ))
            };
            parse(extra).map(|s| s.authenticate("acme-token").unwrap().1.budget)
        };
        let ok = |tokens, period, soft_ratio| -> Result<Option<Budget>, &str> {
            Ok(Some(Budget {
                tokens,
                period,
                soft_ratio,
            }))
        };
        let rows: [(&str, Result<Option<Budget>, &str>); 13] = [
            ("", Ok(None)),
            (
                "budget_tokens = 1000\nbudget_period = \"day\"",
                ok(1000, BudgetPeriod::Day, 0.8),
            ),
            (
                "budget_tokens = 5\nbudget_period = \"month\"\nbudget_soft_ratio = 1.0",
                ok(5, BudgetPeriod::Month, 1.0),
            ),
            (
                "budget_tokens = 5\nbudget_period = \"month\"\nbudget_soft_ratio = 0.25",
                ok(5, BudgetPeriod::Month, 0.25),
            ),
            (
                "budget_period = \"day\"",
                Err("tenants.acme.budget_period needs budget_tokens"),
            ),
            (
                "budget_soft_ratio = 0.5",
                Err("tenants.acme.budget_soft_ratio needs budget_tokens"),
            ),
            (
                "budget_tokens = 1000",
                Err("tenants.acme.budget_tokens needs budget_period"),
            ),
            (
                "budget_tokens = 0\nbudget_period = \"day\"",
                Err("tenants.acme.budget_tokens must be at least 1"),
            ),
            (
                "budget_tokens = 10\nbudget_period = \"week\"",
                Err("tenants.acme.budget_period must be \"day\" or \"month\""),
            ),
            (
                "budget_tokens = 10\nbudget_period = \"day\"\nbudget_soft_ratio = 0.0",
                Err("tenants.acme.budget_soft_ratio must be above 0 and at most 1"),
            ),
            (
                "budget_tokens = 10\nbudget_period = \"day\"\nbudget_soft_ratio = 1.5",
                Err("tenants.acme.budget_soft_ratio must be above 0 and at most 1"),
            ),
            (
                "budget_tokens = 10\nbudget_period = \"day\"\nbudget_soft_ratio = nan",
                Err("tenants.acme.budget_soft_ratio must be above 0 and at most 1"),
            ),
            (
                "budget_tokens = -1\nbudget_period = \"day\"",
                Err("budget_tokens"),
            ),
        ];
        for (extra, expected) in rows {
            match (budget(extra), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{extra}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{extra}: {got}"),
                (got, want) => panic!("{extra}: got {got:?}, want {want:?}"),
            }
        }
        let header = TenantPolicy::header_mode(&NotifySettings::default(), None);
        assert_eq!(header.budget, None, "header mode has no budgets");
    }

    #[test]
    fn one_token_for_two_tenants_refuses_the_file() {
        let hash = token_sha256("shared");
        let err = TokenStore::parse(&format!(
            "[tenants.acme]\ntoken_sha256 = \"{hash}\"\n[tenants.globex]\ntoken_sha256 = \"{}\"\n",
            hash.to_uppercase()
        ))
        .err()
        .unwrap();
        assert!(
            err.contains("tenants.globex.token_sha256") && err.contains("tenants.acme"),
            "{err}"
        );
    }

    #[test]
    fn the_default_notify_rate_applies_only_to_tenants_without_their_own() {
        let notify = NotifySettings {
            per_hour: Some(20),
            ..Default::default()
        };
        let s = store("notify_per_hour = 3");
        let (_, acme) = s.authenticate("acme-token").unwrap();
        let (_, globex) = s.authenticate("globex-token").unwrap();
        assert_eq!(acme.limits(&notify).notify_per_hour, Some(3));
        assert_eq!(globex.limits(&notify).notify_per_hour, Some(20));
        assert_eq!(
            globex.limits(&NotifySettings::default()).notify_per_hour,
            None
        );
        let header = TenantPolicy::header_mode(&notify, None);
        assert_eq!(header.limits(&notify).notify_per_hour, Some(20));
        assert!(header.notify_domains.is_none());
    }

    #[test]
    fn a_new_version_applies_once_seen_twice_and_only_once() {
        let (a, b, c) = ([1; 32], [2; 32], [3; 32]);
        let mut settle = Settle::default();
        assert_eq!(settle.next(a, a), Step::Unchanged);
        assert_eq!(settle.next(a, b), Step::Settling);
        assert_eq!(settle.next(a, c), Step::Settling, "still being written");
        assert_eq!(settle.next(a, c), Step::Apply);
        assert_eq!(settle.next(c, c), Step::Unchanged);
        // A change that is undone before it settled is forgotten.
        assert_eq!(settle.next(c, b), Step::Settling);
        assert_eq!(settle.next(c, c), Step::Unchanged);
        assert_eq!(settle.next(c, b), Step::Settling);
        assert_eq!(settle.next(c, b), Step::Apply);
    }

    #[test]
    fn the_watcher_applies_a_changed_file_and_keeps_the_old_one_on_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let file = |tokens: &[&str]| {
            tokens
                .iter()
                .enumerate()
                .map(|(i, t)| format!("[tenants.t{i}]\ntoken_sha256 = \"{}\"\n", token_sha256(t)))
                .collect::<String>()
        };
        std::fs::write(&path, file(&["a", "b"])).unwrap();
        let tokens = Tokens::load(&path).unwrap();
        let mut settle = Settle::default();
        let look = |text: &str, settle: &mut Settle| match tokens.look(text, settle) {
            Look::Nothing => "nothing".to_owned(),
            Look::Reloaded(n) => format!("reloaded {n}"),
            Look::Refused(e) => e.to_string(),
        };
        assert_eq!(look(&file(&["a", "b"]), &mut settle), "nothing");
        let revoked = file(&["a"]);
        assert_eq!(look(&revoked, &mut settle), "nothing");
        assert!(
            tokens.current().authenticate("b").is_ok(),
            "not settled yet"
        );
        assert_eq!(look(&revoked, &mut settle), "reloaded 1");
        assert_eq!(
            tokens.current().authenticate("b"),
            Err(Denied::Unauthenticated)
        );
        assert!(tokens.current().authenticate("a").is_ok());
        assert_eq!(look(&revoked, &mut settle), "nothing");

        let broken = "[tenants.t0]\ntoken_sha256 = \"nope\"\n";
        assert_eq!(look(broken, &mut settle), "nothing");
        assert!(look(broken, &mut settle).contains("64 hex"));
        assert_eq!(
            look(broken, &mut settle),
            "nothing",
            "refused once, not every look"
        );
        assert!(
            tokens.current().authenticate("a").is_ok(),
            "the old file stays"
        );

        // A SIGHUP reload counts as acted on: the watcher does not repeat it.
        std::fs::write(&path, file(&["c"])).unwrap();
        assert_eq!(tokens.reload().unwrap(), 1);
        assert_eq!(look(&file(&["c"]), &mut settle), "nothing");
        assert_eq!(look(&file(&["c"]), &mut settle), "nothing");
    }
}
