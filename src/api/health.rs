//! Liveness and readiness for orchestrators.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::problem::{ApiError, Problem};
use super::state::{ApiServices, ApiState};
use crate::config::roles::Role;

/// Our manifests give the probe 2 s (`timeoutSeconds: 2`); each check must answer inside
/// it, and the checks run concurrently, so a dead dependency cannot make the probe itself
/// time out and the body can say which one it was. 800 ms turned out too tight: on a
/// loaded two-core machine a healthy Redis and Postgres were both seen to take longer, and
/// the pod would leave the load balancer for nothing.
const CHECK_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok` (liveness) or `ready` (readiness).
    pub(crate) status: String,
    /// Per dependency: `ok` or why not (readiness only). `model:<provider>` entries say
    /// whether that model provider's circuit breaker is open; they never make the process
    /// unready. `mail` appears while the mail provider refuses the relay as misconfigured
    /// (in a process that also serves the API, which stays ready).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) checks: BTreeMap<String, String>,
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process lives", body = Health))
)]
pub(crate) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok".into(),
        checks: BTreeMap::new(),
    })
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The dependencies of the enabled roles answer (api, worker: Redis and Postgres; relay: Postgres)", body = Health),
        (status = 503, description = "A dependency does not answer, the worker or relay loop failed its last passes, the mail provider refuses the relay of a process without the api role as misconfigured (the detail says which and why), or shutdown has begun", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds"))),
    )
)]
pub(crate) async fn readyz(state: web::Data<ApiState>) -> Result<HttpResponse, ApiError> {
    if state.shutdown.is_triggered() {
        return Err(ApiError::NotReady("shutting down".into()));
    }
    let roles = state.roles;
    let services = &state.services;
    let (redis, postgres) = tokio::join!(
        async {
            roles
                .needs_redis()
                .then_some(bounded(check_redis(services)).await)
        },
        async {
            roles
                .needs_postgres()
                .then_some(bounded(check_postgres(services)).await)
        },
    );
    let mut checks = BTreeMap::new();
    let mut failing = Vec::new();
    for (name, result) in [("redis", redis), ("postgres", postgres)] {
        match result {
            None => {}
            Some(Ok(())) => {
                checks.insert(name.to_owned(), "ok".to_owned());
            }
            Some(Err(e)) => {
                tracing::warn!(dependency = name, error = %e, "readiness check failed");
                failing.push(name);
                checks.insert(name.to_owned(), e);
            }
        }
    }
    // A loop whose every pass fails is not ready even when its dependencies answer a ping
    // (a missing table, a stream key of the wrong type): say which, and why.
    let mut broken = Vec::new();
    for (role, passes, reason) in services.metrics.failing_loops() {
        let enabled = role.parse::<Role>().is_ok_and(|r| roles.has(r));
        if enabled {
            let why = format!("{passes} consecutive failed passes; last: {reason}");
            broken.push(format!("{role} loop: {why}"));
        }
    }
    // The mail provider refusing our credentials or URL pauses the relay: rows wait until a
    // person fixes the configuration (a restart will not). A process without the api role
    // says so by being unready, which also stops a rollout that brought the wrong setting.
    // One that serves the API stays ready and says it in its body: taking it out of the
    // load balancer would turn emails that wait into summaries nobody can request.
    let mail = roles
        .has(Role::Relay)
        .then(|| services.metrics.mail_misconfigured())
        .flatten()
        .map(|reason| {
            format!(
                "mail provider misconfigured, relay paused (rows wait and are retried, none is parked): {reason}"
            )
        });
    if let Some(why) = &mail
        && !roles.has(Role::Api)
    {
        broken.push(why.clone());
    }
    if !failing.is_empty() || !broken.is_empty() {
        let mut reasons = Vec::new();
        if !failing.is_empty() {
            reasons.push(format!("{} not answering", failing.join(" and ")));
        }
        reasons.extend(broken);
        return Err(ApiError::NotReady(reasons.join("; ")));
    }
    if roles.has(Role::Worker) {
        checks.extend(model_checks(services));
    }
    if let Some(why) = mail {
        checks.insert("mail".to_owned(), why);
    }
    Ok(HttpResponse::Ok().json(Health {
        status: "ready".into(),
        checks,
    }))
}

/// `model:<provider>` per model provider of this process's worker: `ok`, or why its breaker
/// is open. Reported, never a reason to be unready: an outage of the provider is not this
/// pod's fault, and restarting pods would not end it (the consumers wait it out).
fn model_checks(services: &ApiServices) -> Vec<(String, String)> {
    let Some(model) = &services.model else {
        return Vec::new();
    };
    model
        .statuses()
        .into_iter()
        .map(|s| {
            let state = s.open.unwrap_or_else(|| "ok".into());
            (format!("model:{}", s.provider), state)
        })
        .collect()
}

async fn bounded(check: impl Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::time::timeout(CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {CHECK_TIMEOUT:?}")))
}

async fn check_redis(services: &ApiServices) -> Result<(), String> {
    let mut conn = services.redis.get().await.map_err(|e| e.to_string())?;
    let _: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

async fn check_postgres(services: &ApiServices) -> Result<(), String> {
    let client = services.pg.get().await.map_err(|e| e.to_string())?;
    client
        .simple_query("SELECT 1")
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}
