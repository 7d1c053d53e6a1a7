//! The operator console: `/console` on the ops listener (`docs/console.md`).
//!
//! Server-rendered pages (maud, compiled in) that read without JavaScript, the same data as
//! JSON under `/console/api/`, sign-in with sessions in Redis, and the operator's actions:
//! replay and purge dead letters, retry outbox rows, pause and resume consumption. It sits
//! above the roles because it shows all of them (the tokens file's limits come from the
//! api's `auth`), and it changes nothing itself: every action is a call into the adapter
//! that owns the data (`stream::dead_letters`, `stream::bulk`, `db::outbox`,
//! `stream::pause`), the same calls the CLI makes.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web;

use crate::api::auth::Tokens;
use crate::config::Settings;
use crate::infra::keys::Shards;
use crate::infra::metrics::Metrics;

pub(crate) mod access;
pub(crate) mod api;
pub(crate) mod assets;
pub(crate) mod document;
pub(crate) mod error;
pub(crate) mod form;
pub(crate) mod layout;
pub(crate) mod pages;
pub(crate) mod session;
pub mod users;

pub use users::{Users, UsersError};

/// Every path the console serves, in one place.
pub(crate) mod paths {
    pub(crate) const HOME: &str = "/console";
    pub(crate) const SIGN_IN: &str = "/console/sign-in";
    pub(crate) const SIGN_OUT: &str = "/console/sign-out";
    pub(crate) const JOBS: &str = "/console/jobs";
    pub(crate) const DEAD_LETTERS: &str = "/console/dead-letters";
    pub(crate) const OUTBOX: &str = "/console/outbox";
    pub(crate) const TENANTS: &str = "/console/tenants";
    pub(crate) const PAUSE: &str = "/console/pause";
    pub(crate) const RUNS: &str = "/console/runs";
    pub(crate) const STATIC: &str = "/console/static";
}

/// What the console reads and acts on; one per process.
#[derive(Clone)]
pub struct Console {
    pub(crate) keys: Shards,
    pub(crate) redis: crate::infra::redis::RedisPool,
    pub(crate) pg: deadpool_postgres::Pool,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) users: Arc<Users>,
    /// The tenants and their limits, in token mode.
    pub(crate) tokens: Option<Arc<Tokens>>,
    /// A session unused this long is signed out.
    pub(crate) idle: Duration,
    /// The providers' prices, for the money the tenants page shows.
    pub(crate) llm: crate::config::LlmSettings,
}

/// What operators can change; the label of `summaryd_console_actions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Replay,
    Purge,
    OutboxRetry,
    Pause,
    Resume,
}

impl Action {
    pub(crate) const ALL: [Action; 5] = [
        Action::Replay,
        Action::Purge,
        Action::OutboxRetry,
        Action::Pause,
        Action::Resume,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Purge => "purge",
            Action::OutboxRetry => "outbox_retry",
            Action::Pause => "pause",
            Action::Resume => "resume",
        }
    }
}

impl Console {
    pub fn new(
        settings: Arc<Settings>,
        keys: Shards,
        redis: crate::infra::redis::RedisPool,
        pg: deadpool_postgres::Pool,
        metrics: Arc<Metrics>,
        users: Arc<Users>,
        tokens: Option<Arc<Tokens>>,
    ) -> Self {
        for action in Action::ALL {
            metrics
                .console_actions
                .with_label_values(&[action.as_str()]);
        }
        let idle = Duration::from_secs(settings.console.session_idle_s);
        Self {
            keys,
            redis,
            pg,
            metrics,
            users,
            tokens,
            idle,
            llm: settings.llm.clone(),
        }
    }

    /// An operator changed something: one log line naming who, what and which, and the
    /// action counted.
    pub(crate) fn record(&self, who: &access::Who, action: Action, touched: &str) {
        tracing::info!(
            user = %who.name,
            action = action.as_str(),
            touched,
            "console action"
        );
        self.metrics
            .console_actions
            .with_label_values(&[action.as_str()])
            .inc();
    }

    /// Mount the console's routes (on the ops listener's app).
    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        cfg.service(
            web::scope(paths::HOME)
                .app_data(web::Data::new(self.clone()))
                .app_data(web::PayloadConfig::new(form::MAX_FORM_BYTES))
                .wrap(assets::security_headers())
                .configure(pages::routes)
                .configure(api::routes),
        );
    }
}
