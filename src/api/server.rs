//! Wiring: routes per role, the request-metrics middleware, the problem+json fallbacks,
//! and the HTTP server itself.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Server, Service, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{App, HttpServer, ResponseError, web};

use super::problem::ApiError;
use super::state::ApiState;
use super::{health, metrics, openapi, summaries};
use crate::context::Services;
use crate::metrics::Metrics;
use crate::roles::{Role, Roles};
use crate::shutdown::Shutdown;

/// Routes, shared state and fallbacks. Ops routes are served on every role; `/v1/*` only
/// with role api, so a worker-only process answers 404 there.
pub fn configure(
    services: Services,
    roles: Roles,
    shutdown: Shutdown,
) -> impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static {
    metrics::init_series(&services.metrics);
    let state = web::Data::new(ApiState::new(services, roles, shutdown));
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.clone())
            .route("/healthz", web::get().to(health::healthz))
            .route("/readyz", web::get().to(health::readyz))
            .route("/metrics", web::get().to(metrics::metrics))
            .route("/openapi.json", web::get().to(openapi::openapi_json));
        if state.roles.has(Role::Api) {
            cfg.service(
                web::resource("/v1/summaries")
                    .route(web::post().to(summaries::create))
                    .default_service(web::to(|| async {
                        ApiError::MethodNotAllowed { allow: "POST" }.error_response()
                    })),
            )
            .service(
                web::resource("/v1/summaries/{job_id}")
                    .route(web::get().to(summaries::get))
                    .default_service(web::to(|| async {
                        ApiError::MethodNotAllowed { allow: "GET" }.error_response()
                    })),
            );
        }
        cfg.default_service(web::to(|| async {
            ApiError::NotFound("No such route; see /openapi.json.".into()).error_response()
        }));
    }
}

/// The whole application, for `HttpServer` and for `actix_web::test::init_service`.
pub fn app(
    services: Services,
    roles: Roles,
    shutdown: Shutdown,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let metrics = services.metrics.clone();
    app_with(configure(services, roles, shutdown), metrics)
}

fn app_with(
    config: impl FnOnce(&mut web::ServiceConfig),
    metrics: Arc<Metrics>,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new().configure(config).wrap_fn(move |req, srv| {
        let metrics = metrics.clone();
        let pattern = req.match_pattern();
        let call = srv.call(req);
        async move {
            let result = call.await;
            match &result {
                Ok(res) => metrics::record_request(&metrics, res),
                Err(e) => metrics::record_failed(
                    &metrics,
                    pattern,
                    e.as_response_error().status_code().as_u16(),
                ),
            }
            result
        }
    })
}

/// The HTTP server on `listener`. It does not watch signals (the supervisor owns them) and
/// does not stop on `shutdown` by itself: run it with [`serve_until_shutdown`].
pub fn build_server(
    services: Services,
    roles: Roles,
    shutdown: Shutdown,
    listener: TcpListener,
) -> std::io::Result<Server> {
    // In-flight requests get the same grace as every other role's drain, rounded up to
    // whole seconds because that is what actix accepts.
    let grace = Duration::from_millis(services.settings.shutdown.grace_ms);
    let grace_s = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    let metrics = services.metrics.clone();
    let config = configure(services, roles, shutdown);
    let server = HttpServer::new(move || app_with(config.clone(), metrics.clone()))
        .disable_signals()
        .shutdown_timeout(grace_s)
        .listen(listener)?
        .run();
    Ok(server)
}

/// Run `server` until it exits or `shutdown` is triggered; then stop accepting connections
/// and let in-flight requests finish within the shutdown timeout.
pub async fn serve_until_shutdown(server: Server, shutdown: Shutdown) -> std::io::Result<()> {
    let handle = server.handle();
    let mut server = std::pin::pin!(server);
    tokio::select! {
        result = &mut server => result,
        () = shutdown.wait() => {
            // The server future executes the stop command, so keep polling it meanwhile.
            let ((), result) = tokio::join!(handle.stop(true), server);
            result
        }
    }
}
