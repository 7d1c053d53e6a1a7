//! What every handler can reach, shared by all actix workers (one instance per process).

use std::sync::Arc;

use crate::api::idempotency::IdempotencyStore;
use crate::auth::TokenStore;
use crate::context::Services;
use crate::roles::Roles;
use crate::shutdown::Shutdown;

pub struct ApiState {
    pub services: Services,
    pub roles: Roles,
    /// Once triggered, /readyz answers 503 so load balancers stop sending traffic.
    pub shutdown: Shutdown,
    pub idempotency: IdempotencyStore,
    /// Token mode when a tokens file is configured; `None`: tenant from `X-Tenant-Id`.
    pub auth: Option<Arc<TokenStore>>,
}

impl ApiState {
    pub fn new(services: Services, roles: Roles, shutdown: Shutdown) -> Self {
        let idempotency = IdempotencyStore::new(
            services.redis_shared.clone(),
            services.keys.clone(),
            services.metrics.clone(),
            &services.settings.idempotency,
        );
        let auth = services.settings.auth.tokens_file.as_deref().map(|path| {
            // Settings validation already loaded this file once; if it broke since, refuse
            // everyone rather than fall back to unauthenticated tenants.
            Arc::new(TokenStore::load(path).unwrap_or_else(|e| {
                tracing::error!(error = %e, "tokens file unreadable: refusing all requests");
                TokenStore::deny_all()
            }))
        });
        Self {
            services,
            roles,
            shutdown,
            idempotency,
            auth,
        }
    }
}
