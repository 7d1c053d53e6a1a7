//! What every handler can reach, shared by all actix workers (one instance per process).

use crate::api::idempotency::IdempotencyStore;
use crate::context::Services;
use crate::roles::Roles;
use crate::shutdown::Shutdown;

pub struct ApiState {
    pub services: Services,
    pub roles: Roles,
    /// Once triggered, /readyz answers 503 so load balancers stop sending traffic.
    pub shutdown: Shutdown,
    pub idempotency: IdempotencyStore,
}

impl ApiState {
    pub fn new(services: Services, roles: Roles, shutdown: Shutdown) -> Self {
        let idempotency = IdempotencyStore::new(
            services.redis_shared.clone(),
            services.keys.clone(),
            services.metrics.clone(),
            &services.settings.idempotency,
        );
        Self {
            services,
            roles,
            shutdown,
            idempotency,
        }
    }
}
