//! `GET /metrics` and the middleware that counts requests by route template.

use std::future::Future;
use std::time::Duration;

use actix_web::dev::ServiceResponse;
use actix_web::{HttpResponse, web};

use super::state::{ApiServices, ApiState};
use crate::metrics::Metrics;

/// A scrape must stay fast even with a dependency down (Prometheus' default scrape timeout
/// is 10 s); a gauge that cannot be refreshed in time keeps its last value.
const GAUGE_TIMEOUT: Duration = Duration::from_millis(500);

/// Label for requests that matched no route, so scanners cannot explode label cardinality.
const UNMATCHED_ROUTE: &str = "unmatched";

/// Label values with a fixed set, created at zero so that dashboards and alerts see the
/// series (and the metric names) before the first event.
pub fn init_series(metrics: &Metrics) {
    for outcome in ["new", "replayed", "conflict", "mismatch"] {
        metrics.idempotency.with_label_values(&[outcome]);
    }
    for outcome in ["done", "duplicate", "retry", "dead_lettered"] {
        metrics.jobs.with_label_values(&[outcome]);
    }
    // `status_<code>` results appear when they happen; the rest is a fixed set.
    for result in [
        "ok",
        "timeout",
        "connect",
        "malformed",
        "invalid_input",
        "other",
    ] {
        metrics.llm_requests.with_label_values(&[result]);
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain; version=0.0.4"))
)]
pub async fn metrics(state: web::Data<ApiState>) -> HttpResponse {
    refresh_gauges(&state.services).await;
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.services.metrics.render())
}

/// Refresh the gauges that are read from Redis and Postgres; skip silently what fails.
async fn refresh_gauges(services: &ApiServices) {
    let m = &services.metrics;
    let (pending, dead, unsent) = tokio::join!(
        bounded(stream_pending(services)),
        bounded(dead_letters(services)),
        bounded(outbox_unsent(services)),
    );
    if let Some(n) = pending {
        m.stream_pending.set(n);
    }
    if let Some(n) = dead {
        m.dead_letters.set(n);
    }
    if let Some(n) = unsent {
        m.outbox_unsent.set(n);
    }
}

async fn bounded<E>(f: impl Future<Output = Result<i64, E>>) -> Option<i64> {
    tokio::time::timeout(GAUGE_TIMEOUT, f).await.ok()?.ok()
}

async fn stream_pending(services: &ApiServices) -> Result<i64, Box<dyn std::error::Error>> {
    let mut conn = services.redis.get().await?;
    // NOGROUP before the first worker created the group is an error we skip.
    let n = crate::stream::consumer_group::pending_count(&mut conn, &services.keys).await?;
    Ok(i64::try_from(n)?)
}

async fn dead_letters(services: &ApiServices) -> Result<i64, Box<dyn std::error::Error>> {
    let mut conn = services.redis.get().await?;
    let n = crate::stream::dead_letters::count(&mut conn, &services.keys).await?;
    Ok(i64::try_from(n)?)
}

async fn outbox_unsent(services: &ApiServices) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(crate::db::outbox::count_unsent(&services.pg).await?)
}

/// Count a finished request under its route template (`/v1/summaries/{job_id}`), never the
/// raw path, so job ids do not become label values.
pub fn record_request<B>(metrics: &Metrics, res: &ServiceResponse<B>) {
    let route = res
        .request()
        .match_pattern()
        .unwrap_or_else(|| UNMATCHED_ROUTE.to_owned());
    metrics
        .http_requests
        .with_label_values(&[route.as_str(), res.status().as_str()])
        .inc();
}

/// Route template of a request that failed before producing a response.
pub fn record_failed(metrics: &Metrics, req_pattern: Option<String>, status: u16) {
    let route = req_pattern.unwrap_or_else(|| UNMATCHED_ROUTE.to_owned());
    metrics
        .http_requests
        .with_label_values(&[route.as_str(), &status.to_string()])
        .inc();
}
