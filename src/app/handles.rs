//! The handles one process opens, once, and the share of them each role gets.
//!
//! Built once so the roles of one process share the pools (their sizes are set for all of
//! them together) and one metrics registry. Nothing here connects: an unused pool costs
//! nothing. Only this wiring sees every handle; a role sees its own services.

use std::sync::Arc;

use crate::api::ApiServices;
use crate::api::auth::Tokens;
use crate::config::Settings;
use crate::config::roles::{Role, Roles};
use crate::domain::{TenantId, WebhookSecrets};
use crate::infra::connections::{self, ConnectError, SharedRedis};
use crate::infra::keys::Shards;
use crate::infra::log_key::DeploymentKey;
use crate::infra::metrics::Metrics;
use crate::llm::{ModelChain, SharedLimits};
use crate::mail::Mailer;
use crate::maintenance::Maintenance;
use crate::relay::{MailBreaker, RelayServices, SigningSecrets};
use crate::webhook::WebhookClient;
use crate::worker::{DependencyGate, WorkerServices};

#[derive(Clone)]
pub struct Handles {
    pub settings: Arc<Settings>,
    pub keys: Shards,
    pub redis: crate::infra::redis::RedisPool,
    pub redis_shared: SharedRedis,
    pub pg: deadpool_postgres::Pool,
    pub metrics: Arc<Metrics>,
    /// Whether this process's consumers may take work (closed while a dependency is down);
    /// one per process, so every consumer stops when one sees the dependency go.
    pub worker_gate: Arc<DependencyGate>,
    /// Whether this process's relay tasks may claim rows (open while the mail provider
    /// refuses us as misconfigured); one per process, like the worker gate.
    pub mail_breaker: Arc<MailBreaker>,
    /// The deployment's key for hashes of personal data in logs, read from Postgres once
    /// per process on first use.
    pub log_key: Arc<DeploymentKey>,
    /// What signs each tenant's webhooks: the tokens file's `webhook_secrets`, or header
    /// mode's `SUMMARYD_WEBHOOK_SECRETS_FILE`.
    pub signing: Arc<Signing>,
    /// The relay's client for every webhook (one pool, the public-only resolver).
    pub webhooks: Arc<WebhookClient>,
}

#[derive(Debug, thiserror::Error)]
pub enum HandlesError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("SUMMARYD_WEBHOOK_SECRETS_FILE {path}: {reason}")]
    WebhookSecrets { path: String, reason: String },
    #[error("webhook HTTP client: {0}")]
    WebhookClient(#[from] reqwest::Error),
}

/// The webhook secrets of each tenant, as the relay signs with them and the api checks
/// that a webhook can be signed at all. In token mode they come from the tokens file as
/// currently loaded (a reload that rotates a secret applies to the next attempt).
pub struct Signing {
    tokens: Option<Arc<Tokens>>,
    header: Option<Arc<WebhookSecrets>>,
}

impl Signing {
    /// Header mode's secrets (`SUMMARYD_WEBHOOK_SECRETS_FILE`), read once at start: a file
    /// that cannot be read or holds no valid secret stops the start, as a broken tokens
    /// file does. In token mode the file is not used (a warning says so).
    fn load(settings: &Settings, tokens: Option<Arc<Tokens>>) -> Result<Self, HandlesError> {
        let header = match (&settings.webhook.secrets_file, &tokens) {
            (None, _) => None,
            (Some(_), Some(_)) => {
                tracing::warn!(
                    "SUMMARYD_WEBHOOK_SECRETS_FILE has no effect with SUMMARYD_AUTH_TOKENS_FILE: \
                     give each tenant webhook_secrets in the tokens file"
                );
                None
            }
            (Some(path), None) => {
                let invalid = |reason: String| HandlesError::WebhookSecrets {
                    path: path.display().to_string(),
                    reason,
                };
                let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
                Some(Arc::new(
                    WebhookSecrets::parse_file(&text).map_err(invalid)?,
                ))
            }
        };
        Ok(Self { tokens, header })
    }

    /// Header mode's secrets, the same for every tenant.
    pub(crate) fn header(&self) -> Option<Arc<WebhookSecrets>> {
        self.header.clone()
    }
}

impl SigningSecrets for Signing {
    fn secrets(&self, tenant: &TenantId) -> Option<Arc<WebhookSecrets>> {
        match &self.tokens {
            Some(tokens) => tokens.current().policy_of(tenant)?.webhook_secrets.clone(),
            None => self.header.clone(),
        }
    }
}

impl Handles {
    /// Header mode (no tokens file loaded).
    pub fn new(settings: Settings) -> Result<Self, HandlesError> {
        Self::with_tokens(settings, None)
    }

    /// With the loaded tokens file, whose tenants' webhook secrets the relay signs with.
    pub fn with_tokens(
        settings: Settings,
        tokens: Option<Arc<Tokens>>,
    ) -> Result<Self, HandlesError> {
        let signing = Arc::new(Signing::load(&settings, tokens)?);
        let webhooks = Arc::new(WebhookClient::new(&settings.webhook)?);
        let redis_client = connections::redis_client(&settings)?;
        let pg = connections::pg_pool(&settings)?;
        Ok(Self {
            keys: Shards::from_settings(&settings),
            redis: connections::redis_pool(&settings, &redis_client)?,
            redis_shared: SharedRedis::new(redis_client)?,
            log_key: Arc::new(DeploymentKey::from_postgres(pg.clone())),
            pg,
            metrics: Arc::new(Metrics::new()?),
            worker_gate: Arc::new(DependencyGate::new()),
            mail_breaker: Arc::new(MailBreaker::new(&settings.relay)),
            signing,
            webhooks,
            settings: Arc::new(settings),
        })
    }

    /// The HTTP side's share; `auth` is the loaded tokens file, if the role api runs with one.
    /// `model` is the worker's chain when this process runs the worker role (for `/readyz`).
    pub fn api(&self, auth: Option<Arc<Tokens>>, model: Option<Arc<ModelChain>>) -> ApiServices {
        ApiServices {
            settings: self.settings.clone(),
            keys: self.keys.clone(),
            redis: self.redis.clone(),
            redis_shared: self.redis_shared.clone(),
            pg: self.pg.clone(),
            metrics: self.metrics.clone(),
            auth,
            model,
            header_webhook_secrets: self.signing.header(),
        }
    }

    /// The model providers' state shared with every process (limits, cool-until, breakers).
    pub fn model_limits(&self) -> SharedLimits {
        SharedLimits::new(self.redis.clone(), self.keys.global().clone())
    }

    pub fn worker(&self, model: Arc<ModelChain>) -> WorkerServices {
        WorkerServices {
            settings: self.settings.clone(),
            keys: self.keys.clone(),
            redis: self.redis.clone(),
            pg: self.pg.clone(),
            model,
            metrics: self.metrics.clone(),
            gate: self.worker_gate.clone(),
            checks: crate::worker::Checker::start(
                self.pg.clone(),
                self.settings.worker.commit_batch,
            ),
            commits: crate::worker::Committer::start(
                self.pg.clone(),
                crate::worker::Batching {
                    max: self.settings.worker.commit_batch,
                    wait: self.settings.worker.commit_wait,
                },
                self.metrics.clone(),
            ),
            acker: crate::worker::Acker::start(
                self.redis.clone(),
                self.keys.clone(),
                self.settings.worker.commit_batch,
                crate::stream::replicas::ReplicaAcks::from_settings(&self.settings.redis),
                self.metrics.clone(),
            ),
        }
    }

    pub fn relay(&self, mailer: Arc<dyn Mailer>) -> RelayServices {
        RelayServices {
            settings: self.settings.clone(),
            pg: self.pg.clone(),
            mailer,
            metrics: self.metrics.clone(),
            mail_breaker: self.mail_breaker.clone(),
            webhooks: self.webhooks.clone(),
            signing: self.signing.clone(),
        }
    }

    /// The maintenance task's share for a process with `roles`: Redis with the api or the
    /// worker role, the roles that use it (a relay-only process may have no Redis at all).
    pub fn maintenance(&self, roles: Roles) -> Maintenance {
        Maintenance::new(
            &self.settings,
            self.pg.clone(),
            (roles.has(Role::Api) || roles.has(Role::Worker)).then(|| self.redis.clone()),
            self.keys.clone(),
            self.metrics.clone(),
        )
    }
}
