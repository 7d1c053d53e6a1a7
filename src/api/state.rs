//! What every handler can reach, shared by all actix workers (one instance per process).

use std::sync::Arc;

use crate::llm::Fit;

use crate::api::auth::{TenantPolicy, Tokens};
use crate::api::body::BodyBudget;
use crate::api::idempotency::IdempotencyStore;
use crate::config::Settings;
use crate::config::roles::Roles;
use crate::domain::WebhookSecrets;
use crate::infra::connections::SharedRedis;
use crate::infra::keys::Shards;
use crate::infra::metrics::Metrics;
use crate::llm::ModelChain;
use crate::shutdown::Shutdown;

/// What the HTTP side uses: `/v1/summaries` (role api) and the operations routes every
/// process serves (readiness, metrics). No model calls, no mailer: the API only enqueues and
/// reads (it may look at the worker's model breakers, for `/readyz`).
#[derive(Clone)]
pub struct ApiServices {
    pub(crate) settings: Arc<Settings>,
    pub(crate) keys: Shards,
    /// Dedicated connections, for readiness checks and the stream gauges at scrape time.
    pub(crate) redis: crate::infra::redis::RedisPool,
    /// Per-thread multiplexed connections for the short commands requests make.
    pub(crate) redis_shared: SharedRedis,
    /// GET reads finished summaries; the outbox gauge reads the outbox.
    pub(crate) pg: deadpool_postgres::Pool,
    pub(crate) metrics: Arc<Metrics>,
    /// Token mode when a tokens file is configured; `None`: tenant from `X-Tenant-Id`.
    /// SIGHUP reloads it (see `auth::reload_on_sighup`).
    pub(crate) auth: Option<Arc<Tokens>>,
    /// The worker's model providers when this process runs the worker role: `/readyz`
    /// reports their breakers.
    pub(crate) model: Option<Arc<ModelChain>>,
    /// Header mode's webhook secrets (`SUMMARYD_WEBHOOK_SECRETS_FILE`): without them no
    /// webhook can be accepted in header mode.
    pub(crate) header_webhook_secrets: Option<Arc<WebhookSecrets>>,
}

pub struct ApiState {
    pub(crate) services: ApiServices,
    pub(crate) roles: Roles,
    /// Once triggered, /readyz answers 503 so load balancers stop sending traffic.
    pub(crate) shutdown: Shutdown,
    pub(crate) idempotency: IdempotencyStore,
    /// Request-body bytes this process may hold at once, shared by all actix workers.
    pub(crate) body_budget: BodyBudget,
    /// What every tenant may do in header mode (`[notify]`); token mode reads each
    /// tenant's own from the tokens file.
    pub(crate) header_policy: Arc<TenantPolicy>,
    /// What fits each configured model provider, to refuse a text that would need more
    /// than `SUMMARYD_LLM_MAX_PARTS` calls before it is accepted.
    pub(crate) fits: Arc<Vec<Fit>>,
}

impl ApiState {
    pub fn new(services: ApiServices, roles: Roles, shutdown: Shutdown) -> Self {
        let idempotency = IdempotencyStore::new(
            services.redis_shared.clone(),
            services.keys.clone(),
            services.metrics.clone(),
            &services.settings.idempotency,
        )
        .with_replica_acks(crate::stream::replicas::ReplicaAcks::from_settings(
            &services.settings.redis,
        ));
        let body_budget = BodyBudget::new(&services.settings.api);
        let header_policy = Arc::new(TenantPolicy::header_mode(
            &services.settings.notify,
            services.header_webhook_secrets.clone(),
        ));
        let fits = Arc::new(crate::llm::fits(&services.settings.llm));
        Self {
            header_policy,
            fits,
            services,
            roles,
            shutdown,
            idempotency,
            body_budget,
        }
    }
}
