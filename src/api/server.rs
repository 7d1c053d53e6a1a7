//! Wiring: routes per role, the request-metrics middleware, the problem+json fallbacks,
//! and the HTTP server itself.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_http::error::DispatchError;
use actix_http::{HttpService, Protocol};
use actix_service::{IntoServiceFactory, ServiceFactoryExt, map_config};
use actix_web::body::MessageBody;
use actix_web::dev::{
    AppConfig, Server, Service, ServiceFactory, ServiceRequest, ServiceResponse, fn_service,
};
use actix_web::rt::net::TcpStream;
use actix_web::{App, ResponseError, web};

use super::connection::ProblemIo;
use super::problem::ApiError;
use super::slots::Slots;
use super::state::{ApiServices, ApiState};
use super::{health, metrics, openapi, summaries};

use crate::config::roles::{Role, Roles};
use crate::infra::metrics::Metrics;
use crate::shutdown::Shutdown;

/// Connections a listener accepts beyond its cap, each waiting for a slot (and making one
/// by closing a connection that is only waiting, `api::slots`).
const ADMISSION_QUEUE: usize = 16;

/// Routes, shared state and fallbacks. Ops routes are served on every role; `/v1/*` only
/// with role api, so a worker-only process answers 404 there.
pub fn configure(
    services: ApiServices,
    roles: Roles,
    shutdown: Shutdown,
) -> impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static {
    routes(state(services, roles, shutdown), Routes::All, None)
}

/// Which routes one listener serves: everything, or (with `SUMMARYD_OPS_LISTEN`) the public
/// `/v1` routes on one listener and the ops routes on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routes {
    All,
    Api,
    Ops,
}

fn state(services: ApiServices, roles: Roles, shutdown: Shutdown) -> web::Data<ApiState> {
    metrics::init_series(&services.metrics);
    web::Data::new(ApiState::new(services, roles, shutdown))
}

/// More routes for the ops listener only, given by the process (the operator console):
/// the api cannot name them, they sit above it.
pub type OpsRoutes = Arc<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

fn routes(
    state: web::Data<ApiState>,
    which: Routes,
    ops_routes: Option<OpsRoutes>,
) -> impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.clone());
        if which != Routes::Api {
            cfg.service(get_only("/healthz", health::healthz))
                .service(get_only("/readyz", health::readyz))
                .service(get_only("/metrics", metrics::metrics))
                .service(get_only("/openapi.json", openapi::openapi_json));
        }
        if which == Routes::Ops
            && let Some(extra) = &ops_routes
        {
            extra(cfg);
        }
        if which != Routes::Ops && state.roles.has(Role::Api) {
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

/// A GET route that answers any other method with 405 + `Allow: GET` (not 404: the
/// route exists, and the document lists its one method).
fn get_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler))
        .default_service(web::to(|| async {
            ApiError::MethodNotAllowed { allow: "GET" }.error_response()
        }))
}

/// The whole application, for the HTTP servers and for `actix_web::test::init_service`.
pub fn app(
    services: ApiServices,
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
        let started = std::time::Instant::now();
        let call = srv.call(req);
        async move {
            let result = call.await;
            let status = match &result {
                Ok(res) => res.status(),
                Err(e) => e.as_response_error().status_code(),
            };
            metrics::record_request(&metrics, pattern.as_deref(), status, started);
            result
        }
    })
}

/// The HTTP servers: the main one on `listener`, and the ops one on `ops_listener` when
/// there is one (`SUMMARYD_OPS_LISTEN`). Both share one state, so `/readyz` on the ops port
/// reports the same process. Run them with [`serve_until_shutdown`].
pub struct HttpServers {
    main: Server,
    ops: Option<Server>,
}

/// The HTTP servers. They do not watch signals (the supervisor owns them) and do not stop
/// on `shutdown` by themselves: run them with [`serve_until_shutdown`].
pub fn build_server(
    services: ApiServices,
    roles: Roles,
    shutdown: Shutdown,
    listener: TcpListener,
    ops_listener: Option<TcpListener>,
    ops_routes: Option<OpsRoutes>,
) -> std::io::Result<HttpServers> {
    // In-flight requests get the same grace as every other role's drain, rounded up to
    // whole seconds because that is what actix accepts.
    let grace = services.settings.shutdown.grace;
    let grace_s = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    let metrics = services.metrics.clone();
    let limits = services.settings.api.clone();
    let state = state(services, roles, shutdown.clone());
    tokio::spawn(crate::api::auth::reload_on_sighup(
        state.services.auth.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(crate::api::auth::reload_on_change(
        state.services.auth.clone(),
        shutdown,
    ));
    let serve = |which: Routes, listener: TcpListener| -> std::io::Result<Server> {
        let config = routes(state.clone(), which, ops_routes.clone());
        let metrics = metrics.clone();
        let limits = limits.clone();
        // Probes and scrapes are tiny; one worker thread keeps the ops port from taking a
        // thread per core away from the API.
        let workers = match which {
            Routes::Ops => 1,
            _ => std::thread::available_parallelism().map_or(1, usize::from),
        };
        // The cap itself is `Slots` (per listener, across worker threads). actix's own
        // count, per worker thread, also bounds the connections accepted but not yet given
        // a slot: at the cap a newcomer first closes a connection that is only waiting, so
        // it must wait here, not in the kernel's backlog where it could not make room. A
        // few such newcomers are enough (one at a time makes room); letting in as many as
        // the cap again made an attack of slow bodies turn slots over faster and raised the
        // peak memory of `chaos::front_door::slow_bodies_…` by about a fifth.
        let slots = Slots::new(limits.max_connections);
        let per_worker = limits
            .max_connections
            .saturating_add(ADMISSION_QUEUE)
            .div_ceil(workers)
            .max(1);
        // What actix-web's `HttpServer::listen` builds, with one difference: each connection
        // gets a slot and is wrapped in `ProblemIo`, which times every request head (actix
        // times only the first) and makes the HTTP layer's own error answers problem
        // details too.
        let builder = Server::build()
            .workers(workers)
            .max_concurrent_connections(per_worker)
            .disable_signals()
            .shutdown_timeout(grace_s);
        // Lets keep-alive connections close at once when the server stops, instead of
        // holding the drain until their idle timeout.
        let graceful = builder.graceful_shutdown_signal();
        let server = builder.listen("summaryd-http", listener, move || {
            let graceful = graceful.clone();
            let app = app_with(config.clone(), metrics.clone())
                .into_factory()
                .map_err(|e| e.error_response());
            let http = HttpService::build()
                .graceful_shutdown_signal(move || {
                    let graceful = graceful.clone();
                    async move { graceful.notified().await }
                })
                // Off: `ProblemIo` times every head, actix only the first. The body has its own
                // deadline of the same length (`api::body`).
                .client_request_timeout(Duration::ZERO)
                .keep_alive(limits.keep_alive)
                .client_disconnect_timeout(limits.disconnect_timeout)
                .finish(map_config(app, |()| AppConfig::default()));
            let slots = slots.clone();
            let timeout = limits.request_timeout;
            fn_service(move |io: TcpStream| {
                let slots = slots.clone();
                async move {
                    let accepted = tokio::time::Instant::now();
                    let peer = io.peer_addr().ok();
                    // No room by its first head's deadline: closed unanswered, as a server
                    // that never accepted it.
                    let Some(slot) = slots.admit(accepted + timeout).await else {
                        return Err(DispatchError::SlowRequestTimeout);
                    };
                    Ok((
                        ProblemIo::new(io, slot, accepted, timeout),
                        Protocol::Http1,
                        peer,
                    ))
                }
            })
            .and_then(http)
        })?;
        Ok(server.run())
    };
    Ok(match ops_listener {
        None => HttpServers {
            main: serve(Routes::All, listener)?,
            ops: None,
        },
        Some(ops) => HttpServers {
            main: serve(Routes::Api, listener)?,
            ops: Some(serve(Routes::Ops, ops)?),
        },
    })
}

/// Run the servers until one exits or `shutdown` is triggered; then stop accepting
/// connections on both and let in-flight requests finish within the shutdown timeout.
/// Either server stopping by itself stops the other: a process without its API or without
/// its probes is not serving.
pub async fn serve_until_shutdown(servers: HttpServers, shutdown: Shutdown) -> std::io::Result<()> {
    let HttpServers { main, ops } = servers;
    let Some(ops) = ops else {
        return serve_one(main, shutdown).await;
    };
    let (main_handle, ops_handle) = (main.handle(), ops.handle());
    let mut main = std::pin::pin!(main);
    let mut ops = std::pin::pin!(ops);
    tokio::select! {
        result = &mut main => {
            let ((), _) = tokio::join!(ops_handle.stop(true), ops);
            result
        }
        result = &mut ops => {
            let ((), _) = tokio::join!(main_handle.stop(true), main);
            result
        }
        () = shutdown.wait() => {
            // The server futures execute the stop commands, so keep polling them meanwhile.
            let ((), main_result, (), ops_result) =
                tokio::join!(main_handle.stop(true), main, ops_handle.stop(true), ops);
            main_result.and(ops_result)
        }
    }
}

async fn serve_one(server: Server, shutdown: Shutdown) -> std::io::Result<()> {
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
