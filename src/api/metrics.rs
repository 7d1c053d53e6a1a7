//! `GET /metrics` and the middleware that counts requests by route template.

use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};

use super::state::ApiState;
use crate::infra::metrics::Metrics;

/// Label for requests that matched no route, so scanners cannot explode label cardinality.
const UNMATCHED_ROUTE: &str = "unmatched";

/// Label values with a fixed set, created at zero so that dashboards and alerts see the
/// series (and the metric names) before the first event.
pub(crate) fn init_series(metrics: &Metrics) {
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
    for stage in ["summarised", "emailed"] {
        metrics.job_latency.with_label_values(&[stage]);
    }
    // From 0, so `increase()` sees a process's first stuck webhook.
    for result in ["delivered", "retrying", "stuck", "skipped"] {
        metrics.webhook_deliveries.with_label_values(&[result]);
    }
    for outcome in ["done", "skipped", "error"] {
        metrics.maintenance_runs.with_label_values(&[outcome]);
    }
    for what in crate::infra::metrics::REMOVED_KINDS {
        metrics.maintenance_removed.with_label_values(&[what]);
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain; version=0.0.4"))
)]
pub async fn metrics(state: web::Data<ApiState>) -> HttpResponse {
    // Only renders: the cluster-wide gauges are refreshed by the maintenance task, so a
    // flood of scrapes cannot load Redis or Postgres.
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.services.metrics.render())
}

/// Count a finished request (or one that failed before producing a response) and its
/// duration under its route template (`/v1/summaries/{job_id}`), never the raw path, so job
/// ids do not become label values. The template is looked up once, before the call.
pub(crate) fn record_request(
    metrics: &Metrics,
    pattern: Option<&str>,
    status: StatusCode,
    started: Instant,
) {
    record(
        metrics,
        pattern.unwrap_or(UNMATCHED_ROUTE),
        status.as_str(),
        started,
    );
}

fn record(metrics: &Metrics, route: &str, status: &str, started: Instant) {
    metrics
        .http_requests
        .with_label_values(&[route, status])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[route])
        .observe(started.elapsed().as_secs_f64());
}
