//! Wiring: build the services for the chosen roles, bind the listener, run until shutdown.
//!
//! Tests use this the same way `main` does, with port 0 and in-process fake providers.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::backoff::{Backoff, Jitter};
use crate::config::Settings;
use crate::context::{Services, ServicesError};
use crate::llm::Llm;
use crate::mail::Mailer;
use crate::roles::{Role, Roles};
use crate::shutdown::Shutdown;
use crate::supervisor::Supervisor;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Services(#[from] ServicesError),
    #[error(transparent)]
    Migration(#[from] crate::db::DbError),
    #[error(transparent)]
    Redis(#[from] crate::redis_conn::RedisSetupError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
}

/// How long `serve` keeps retrying migrations while Postgres is still starting (e.g. a pod
/// that comes up together with its database); after that it exits and the orchestrator restarts it.
const MIGRATE_PATIENCE: Duration = Duration::from_secs(30);
/// A database that is starting answers within seconds; waits grow from 250 ms to 5 s so the
/// patience above is spent on a few attempts, not a busy loop. No jitter: one process waiting.
const MIGRATE_RETRY: Backoff = Backoff::new(
    Duration::from_millis(250),
    Duration::from_secs(5),
    Jitter::None,
);

pub struct Application {
    services: Services,
    roles: Roles,
    listener: TcpListener,
    port: u16,
    /// `SUMMARYD_OPS_LISTEN`, bound: the ops routes' own listener.
    ops_listener: Option<TcpListener>,
}

impl Application {
    /// Bind the listener and (unless `migrate` is false) bring the schema up to date.
    pub async fn build(
        settings: Settings,
        roles: Roles,
        llm: Arc<dyn Llm>,
        mailer: Arc<dyn Mailer>,
        migrate: bool,
    ) -> Result<Self, StartError> {
        if migrate {
            migrate_with_patience(&settings.database_url, settings.database.ca_file.as_deref())
                .await?;
        }
        // A TLS misconfiguration stops startup here; risky durability settings are logged.
        let takes_jobs = roles.has(Role::Api) || roles.has(Role::Worker);
        crate::redis_conn::check_at_startup(&settings, takes_jobs).await?;
        let addr = settings.listen;
        let listener =
            TcpListener::bind(addr).map_err(|source| StartError::Listen { addr, source })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartError::Listen { addr, source })?
            .port();
        let ops_listener = match settings.ops.listen {
            Some(addr) => Some(
                TcpListener::bind(addr).map_err(|source| StartError::Listen { addr, source })?,
            ),
            None => None,
        };
        let services = Services::new(settings, llm, mailer)?;
        Ok(Self {
            services,
            roles,
            listener,
            port,
            ops_listener,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The ops listener's port, when `SUMMARYD_OPS_LISTEN` is set.
    pub fn ops_port(&self) -> Option<u16> {
        let addr = self.ops_listener.as_ref()?.local_addr().ok()?;
        Some(addr.port())
    }

    pub fn services(&self) -> &Services {
        &self.services
    }

    /// Serve until `shutdown` is triggered, then drain: HTTP stops accepting and finishes
    /// in-flight requests, role tasks finish their current unit within the grace period.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), StartError> {
        let Self {
            services,
            roles,
            listener,
            port,
            ops_listener,
        } = self;
        let ops_port = ops_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port());
        let grace = Duration::from_millis(services.settings.shutdown.grace_ms);
        let server = crate::api::build_server(
            services.clone(),
            roles,
            shutdown.clone(),
            listener,
            ops_listener,
        )
        .map_err(StartError::Http)?;
        // Stops accepting and drains in-flight requests by itself once shutdown is triggered.
        let mut http_task =
            tokio::spawn(crate::api::serve_until_shutdown(server, shutdown.clone()));

        let mut supervisor = Supervisor::new(shutdown.clone());
        if roles.has(Role::Worker) {
            for index in 0..services.settings.worker.consumers {
                let name = crate::worker::consumer_name(index);
                let (services, shutdown) = (services.clone(), shutdown.clone());
                supervisor.spawn(format!("worker {name}"), move || {
                    crate::worker::run(services.clone(), name.clone(), shutdown.clone())
                });
            }
        }
        if roles.has(Role::Relay) {
            for index in 0..services.settings.relay.tasks {
                let name = format!("relay-{index}");
                let (services, shutdown) = (services.clone(), shutdown.clone());
                supervisor.spawn(name.clone(), move || {
                    crate::relay::run(services.clone(), name.clone(), shutdown.clone())
                });
            }
        }
        info!(%roles, port, ops_port, "summaryd started");

        let http_result = tokio::select! {
            // A server that ended because shutdown began is not an unexpected stop.
            biased;
            _ = shutdown.wait() => None,
            res = &mut http_task => Some(res),
        };
        if let Some(res) = http_result {
            // The HTTP server stopped by itself: that is fatal for every role (no probes).
            warn!("HTTP server stopped unexpectedly; shutting down");
            shutdown.trigger();
            supervisor.drain(grace).await;
            return match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StartError::Http(e)),
                Err(e) => Err(StartError::Http(std::io::Error::other(e))),
            };
        }
        info!(
            grace_ms = grace.as_millis() as u64,
            "shutdown requested; draining"
        );
        let (http_result, ()) = tokio::join!(
            tokio::time::timeout(grace, http_task),
            supervisor.drain(grace)
        );
        if let Ok(Ok(Err(e))) = http_result {
            warn!(error = %e, "HTTP server failed while draining");
        }
        info!("summaryd stopped");
        Ok(())
    }
}

async fn migrate_with_patience(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<(), crate::db::DbError> {
    let give_up = tokio::time::Instant::now() + MIGRATE_PATIENCE;
    let mut failures = 0;
    loop {
        match crate::db::migrate::run(url, ca_file).await {
            Ok(()) => return Ok(()),
            Err(e @ crate::db::DbError::Query(_)) if tokio::time::Instant::now() < give_up => {
                warn!(error = %e, "database not ready for migrations; retrying");
                tokio::time::sleep(MIGRATE_RETRY.delay(failures)).await;
                failures += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
