//! Where a webhook may connect: only to public addresses unless `allow_private`.
//!
//! The check runs twice: at intake (`check_target`, a 422 the client can fix) and inside
//! the relay's HTTP client as its DNS resolver ([`PublicOnly`]), so the addresses that were
//! checked are the addresses connected to. A name that resolved to a public address at
//! intake and to an internal one later (DNS rebinding) is refused at connect time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::domain::{NonPublicAddress, WebhookRules, WebhookUrl, check_addresses};

/// How long intake waits for a webhook host's name to resolve.
const INTAKE_LOOKUP: Duration = Duration::from_secs(3);

/// Why a target was refused.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{0}")]
    NonPublic(#[from] NonPublicAddress),
    #[error("its host {host:?} does not resolve: {reason}")]
    Unresolved { host: String, reason: String },
    #[error("its host {host:?} did not resolve within {} s", INTAKE_LOOKUP.as_secs())]
    LookupTimeout { host: String },
}

impl TargetError {
    /// The DNS did not answer in time: ours to retry, not the client's to fix.
    pub fn is_timeout(&self) -> bool {
        matches!(self, TargetError::LookupTimeout { .. })
    }
}

/// Intake's check of a target: an IP literal must be public, and a name must resolve, to
/// public addresses only (unless `rules.allow_private`).
pub async fn check_target(url: &WebhookUrl, rules: WebhookRules) -> Result<(), TargetError> {
    if let Some(ip) = url.ip_literal() {
        return Ok(check_addresses(&[ip], rules)?);
    }
    if rules.allow_private {
        return Ok(());
    }
    let host = url.host_name().unwrap_or_default().to_owned();
    let addrs = tokio::time::timeout(INTAKE_LOOKUP, lookup(&host))
        .await
        .map_err(|_| TargetError::LookupTimeout { host: host.clone() })?
        .map_err(|e| TargetError::Unresolved {
            host: host.clone(),
            reason: e.to_string(),
        })?;
    Ok(check_addresses(&addrs, rules)?)
}

async fn lookup(host: &str) -> std::io::Result<Vec<IpAddr>> {
    let addrs: Vec<IpAddr> = tokio::net::lookup_host((host, 0))
        .await?
        .map(|a| a.ip())
        .collect();
    if addrs.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no addresses",
        ));
    }
    Ok(addrs)
}

/// The relay client's resolver: the system's answer, refused as a whole when any address
/// in it is not public (an attacker who controls a name picks which of its addresses is
/// tried). reqwest connects only to the addresses this returns.
#[derive(Debug, Clone, Copy)]
pub(super) struct PublicOnly {
    pub(super) rules: WebhookRules,
}

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let rules = self.rules;
        Box::pin(async move {
            let ips = lookup(name.as_str()).await?;
            check_addresses(&ips, rules)?;
            // Port 0: the client puts the URL's port in.
            let addrs: Addrs = Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

impl PublicOnly {
    pub(super) fn shared(rules: WebhookRules) -> Arc<Self> {
        Arc::new(Self { rules })
    }
}
