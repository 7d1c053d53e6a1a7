//! Wiring: build the services of the chosen roles, bind the listener, run until shutdown.
//!
//! Tests use this the same way `main` does, with port 0 and in-process fake providers.

mod handles;
pub mod supervisor;

pub use handles::{Handles, HandlesError};

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;
use tracing::{info, warn};

use crate::api::ApiServices;
use crate::app::supervisor::Supervisor;
use crate::config::Settings;
use crate::config::roles::{Role, Roles};
use crate::console::Console;
use crate::llm::{Llm, LlmConfigError, ModelChain};
use crate::mail::{MailConfigError, Mailer};
use crate::relay::RelayServices;
use crate::resilience::backoff::{Backoff, Jitter};
use crate::shutdown::Shutdown;
use crate::worker::WorkerServices;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A check that depends on the roles (`Settings::validate_for`).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Auth(#[from] crate::api::auth::AuthFileError),
    #[error(transparent)]
    ConsoleUsers(#[from] crate::console::UsersError),
    #[error(transparent)]
    Llm(#[from] LlmConfigError),
    #[error(transparent)]
    Mail(#[from] MailConfigError),
    #[error(transparent)]
    Handles(#[from] HandlesError),
    #[error(transparent)]
    Migration(#[from] crate::db::DbError),
    #[error(transparent)]
    Redis(#[from] crate::infra::redis::RedisSetupError),
    #[error(transparent)]
    Layout(#[from] crate::stream::layout::LayoutError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
}

impl StartError {
    /// A setting or a file it names is wrong: fixing the configuration fixes the start.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            Self::Config(_)
                | Self::Auth(_)
                | Self::ConsoleUsers(_)
                | Self::Llm(_)
                | Self::Mail(_)
                | Self::Handles(HandlesError::WebhookSecrets { .. })
                | Self::Layout(crate::stream::layout::LayoutError::Stranded { .. })
        )
    }
}

/// Refuse to start over jobs another shard layout left behind. A Redis that does not answer
/// now is not a reason to stop (the roles wait for it); readiness reports it.
async fn refuse_stranded(handles: &Handles) -> Result<(), StartError> {
    let settings = &handles.settings;
    let mut conn = match handles.redis.get().await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::warn!(error = %e, "could not check Redis for jobs under another shard layout");
            return Ok(());
        }
    };
    let checked = crate::stream::layout::refuse_stranded(
        &mut conn,
        &settings.key_prefix,
        &handles.keys,
        settings.redis_is_cluster(),
    )
    .await;
    match checked {
        Err(crate::stream::layout::LayoutError::Redis(e)) => {
            tracing::warn!(error = %e, "could not check Redis for jobs under another shard layout");
            Ok(())
        }
        other => Ok(other?),
    }
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

/// Where the model and the mail provider come from.
enum Providers {
    /// Built from the settings, only for the roles that use them (`summaryd serve`).
    FromSettings,
    /// Given by the caller (tests: in-process fakes).
    Given {
        llm: Arc<dyn Llm>,
        mailer: Arc<dyn Mailer>,
    },
}

impl Providers {
    /// The model chain: every configured provider, or the given model as the only one.
    fn model(
        &self,
        settings: &Settings,
        metrics: Arc<crate::infra::metrics::Metrics>,
    ) -> Result<ModelChain, LlmConfigError> {
        match self {
            Self::FromSettings => ModelChain::from_settings(&settings.llm, Some(metrics)),
            Self::Given { llm, .. } => Ok(ModelChain::single(
                &settings.llm,
                llm.clone(),
                Some(metrics),
            )),
        }
    }

    fn mailer(
        &self,
        settings: &Settings,
        log_key: &Arc<crate::infra::log_key::DeploymentKey>,
    ) -> Result<Arc<dyn Mailer>, MailConfigError> {
        match self {
            Self::FromSettings => crate::mail::from_settings(&settings.mail, log_key.clone()),
            Self::Given { mailer, .. } => Ok(mailer.clone()),
        }
    }
}

pub struct Application {
    handles: Handles,
    roles: Roles,
    /// Serves the operations routes in every process, `/v1/*` with role api.
    api: ApiServices,
    worker: Option<WorkerServices>,
    relay: Option<RelayServices>,
    listener: TcpListener,
    port: u16,
    /// `SUMMARYD_OPS_LISTEN`, bound: the ops routes' own listener.
    ops_listener: Option<TcpListener>,
    /// The operator console, on the ops listener, when a users file is configured.
    console: Option<Console>,
    /// The tenants with a budget, for maintenance's budget gauge (with the tokens file).
    budgets: Option<crate::maintenance::BudgetSource>,
}

/// The console, when `SUMMARYD_CONSOLE_USERS_FILE` is set and there is an ops listener to
/// serve it on (never on the tenants' listener). A users file that cannot be read or
/// parsed stops the start (exit 2).
fn console(
    handles: &Handles,
    settings: &Arc<Settings>,
    tokens: Option<&Arc<crate::api::auth::Tokens>>,
) -> Result<Option<Console>, StartError> {
    let Some(path) = &settings.console.users_file else {
        return Ok(None);
    };
    if settings.ops.listen.is_none() {
        tracing::warn!(
            "SUMMARYD_CONSOLE_USERS_FILE is set but SUMMARYD_OPS_LISTEN is not: the console \
             is served only on the ops listener, so it is off"
        );
        return Ok(None);
    }
    let users = Arc::new(crate::console::Users::load(path)?);
    // The tenants page shows each tenant's limits: a process without the api or relay
    // role reads the tokens file for it too.
    let tokens = match (tokens, &settings.auth.tokens_file) {
        (Some(tokens), _) => Some(tokens.clone()),
        (None, Some(path)) => Some(Arc::new(crate::api::auth::Tokens::load(path)?)),
        (None, None) => None,
    };
    Ok(Some(Console::new(
        settings.clone(),
        handles.keys.clone(),
        handles.redis.clone(),
        handles.pg.clone(),
        handles.metrics.clone(),
        users,
        tokens,
    )))
}

impl Application {
    /// What `summaryd serve` runs: the model and the mail provider are built from the
    /// settings, each only if a role that uses it runs here.
    pub async fn from_settings(
        settings: Settings,
        roles: Roles,
        migrate: bool,
    ) -> Result<Self, StartError> {
        settings.warn_about_ignored();
        // Before anything connects: the warning must be in the log even when the
        // connection it warns about then fails.
        crate::infra::cleartext::warn_at_startup(&settings, roles.needs_redis());
        Self::assemble(settings, roles, Providers::FromSettings, migrate).await
    }

    /// With the given providers (tests pass fakes). Binds the listener and (unless `migrate`
    /// is false) brings the schema up to date.
    pub async fn build(
        settings: Settings,
        roles: Roles,
        llm: Arc<dyn Llm>,
        mailer: Arc<dyn Mailer>,
        migrate: bool,
    ) -> Result<Self, StartError> {
        Self::assemble(settings, roles, Providers::Given { llm, mailer }, migrate).await
    }

    async fn assemble(
        settings: Settings,
        roles: Roles,
        providers: Providers,
        migrate: bool,
    ) -> Result<Self, StartError> {
        // Configuration first, so a wrong setting fails before any waiting on the database.
        settings.validate_for(roles)?;
        let auth = if roles.has(Role::Api) {
            crate::api::auth::from_settings(&settings.auth, &settings.notify)?.map(Arc::new)
        } else if roles.has(Role::Relay)
            && let Some(path) = &settings.auth.tokens_file
        {
            // The relay signs webhooks with each tenant's secrets from the same file; the
            // api's warnings about how tenants are identified are not the relay's to give.
            Some(Arc::new(crate::api::auth::Tokens::load(path)?))
        } else {
            None
        };
        // No connection is made here; the handles only carry the metrics the providers use.
        let handles = Handles::with_tokens(settings, auth.clone())?;
        let budgets = auth.clone().map(|tokens| {
            Arc::new(move || {
                tokens
                    .current()
                    .tenants()
                    .filter_map(|(id, policy)| policy.budget.map(|b| (id.to_string(), b)))
                    .collect()
            }) as crate::maintenance::BudgetSource
        });
        let settings = handles.settings.clone();
        let model = if roles.has(Role::Worker) {
            Some(Arc::new(
                providers
                    .model(&settings, handles.metrics.clone())?
                    .shared(&handles.model_limits()),
            ))
        } else {
            None
        };
        let mailer = if roles.has(Role::Relay) {
            Some(providers.mailer(&settings, &handles.log_key)?)
        } else {
            None
        };
        if migrate {
            migrate_with_patience(
                settings.database_url.expose_secret(),
                settings.database.ca_file.as_deref(),
            )
            .await?;
        }
        // A TLS misconfiguration stops startup here; risky durability settings are logged.
        // Only where Redis is used: a relay is given no Redis URL (deploy/kubernetes) and
        // must not probe the default one.
        if roles.needs_redis() {
            crate::infra::redis::check_at_startup(&settings, true).await?;
            refuse_stranded(&handles).await?;
        }
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
        let console = console(&handles, &settings, auth.as_ref())?;
        Ok(Self {
            console,
            budgets,
            api: handles.api(auth, model.clone()),
            worker: model.map(|model| handles.worker(model)),
            relay: mailer.map(|mailer| handles.relay(mailer)),
            handles,
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

    /// Every handle of this process (benchmarks enqueue and count through them).
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// Serve until `shutdown` is triggered, then drain: HTTP stops accepting and finishes
    /// in-flight requests, role tasks finish their current unit within the grace period.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), StartError> {
        let Self {
            handles,
            roles,
            api,
            worker,
            relay,
            listener,
            port,
            ops_listener,
            console,
            budgets,
        } = self;
        let ops_port = ops_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port());
        let grace = handles.settings.shutdown.grace;
        let ops_routes = console.map(|console| -> crate::api::OpsRoutes {
            Arc::new(move |cfg: &mut actix_web::web::ServiceConfig| console.configure(cfg))
        });
        let server = crate::api::build_server(
            api,
            roles,
            shutdown.clone(),
            listener,
            ops_listener,
            ops_routes,
        )
        .map_err(StartError::Http)?;
        // Stops accepting and drains in-flight requests by itself once shutdown is triggered.
        let mut http_task =
            tokio::spawn(crate::api::serve_until_shutdown(server, shutdown.clone()));

        let mut supervisor = Supervisor::new(shutdown.clone());
        if let Some(worker) = worker {
            // Before any consumer starts: a process starting into a paused fleet takes nothing.
            crate::worker::sync_pause(&worker).await;
            let (services, watch_shutdown) = (worker.clone(), shutdown.clone());
            supervisor.spawn("worker pause watch".into(), move || {
                crate::worker::watch_pause(services.clone(), watch_shutdown.clone())
            });
            for index in 0..handles.settings.worker.consumers {
                let name = crate::worker::consumer_name(index);
                let (services, shutdown) = (worker.clone(), shutdown.clone());
                supervisor.spawn(format!("worker {name}"), move || {
                    crate::worker::run(services.clone(), name.clone(), shutdown.clone())
                });
            }
        }
        if let Some(relay) = relay {
            for index in 0..handles.settings.relay.tasks {
                let name = format!("relay-{index}");
                let (services, shutdown) = (relay.clone(), shutdown.clone());
                supervisor.spawn(name.clone(), move || {
                    crate::relay::run(services.clone(), name.clone(), shutdown.clone())
                });
            }
        }
        // Every role: each refreshes the gauges it can measure (an api-only process reports
        // the queue it feeds even with no worker running), and retention goes on wherever
        // the advisory lock lands.
        let (maintenance, maintenance_shutdown) = (
            handles.maintenance(roles).with_budgets(budgets),
            shutdown.clone(),
        );
        supervisor.spawn("maintenance".into(), move || {
            maintenance.clone().run(maintenance_shutdown.clone())
        });
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
            Err(
                e @ (crate::db::DbError::Query(_)
                | crate::db::DbError::Connect(crate::infra::postgres::PostgresError::Connect(_))),
            ) if tokio::time::Instant::now() < give_up => {
                warn!(error = %e, "database not ready for migrations; retrying");
                tokio::time::sleep(MIGRATE_RETRY.delay(failures)).await;
                failures += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
