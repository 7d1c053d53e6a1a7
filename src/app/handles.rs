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
use crate::infra::connections::{self, ConnectError, SharedRedis};
use crate::infra::keys::RedisKeys;
use crate::infra::log_key::DeploymentKey;
use crate::infra::metrics::Metrics;
use crate::llm::ModelChain;
use crate::mail::Mailer;
use crate::maintenance::Maintenance;
use crate::relay::{MailBreaker, RelayServices};
use crate::worker::{DependencyGate, WorkerServices};

#[derive(Clone)]
pub struct Handles {
    pub settings: Arc<Settings>,
    pub keys: RedisKeys,
    pub redis: deadpool_redis::Pool,
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
}

#[derive(Debug, thiserror::Error)]
pub enum HandlesError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
}

impl Handles {
    pub fn new(settings: Settings) -> Result<Self, HandlesError> {
        let redis_client = connections::redis_client(&settings)?;
        let pg = connections::pg_pool(&settings)?;
        Ok(Self {
            keys: RedisKeys::new(settings.key_prefix.clone()),
            redis: connections::redis_pool(&settings, &redis_client)?,
            redis_shared: SharedRedis::new(redis_client),
            log_key: Arc::new(DeploymentKey::from_postgres(pg.clone())),
            pg,
            metrics: Arc::new(Metrics::new()?),
            worker_gate: Arc::new(DependencyGate::new()),
            mail_breaker: Arc::new(MailBreaker::new(&settings.relay)),
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
        }
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
        }
    }

    pub fn relay(&self, mailer: Arc<dyn Mailer>) -> RelayServices {
        RelayServices {
            settings: self.settings.clone(),
            pg: self.pg.clone(),
            mailer,
            metrics: self.metrics.clone(),
            mail_breaker: self.mail_breaker.clone(),
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
