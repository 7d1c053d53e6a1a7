//! The isolated world a test runs in: its own Postgres database (copied from a migrated
//! template) and its own Redis key prefix, so tests run in parallel against the real
//! services; and the one place tests build the services and the `Application` from it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use summaryd::api::ApiServices;
use summaryd::app::{Application, Handles};
use summaryd::config::Settings;
use summaryd::config::roles::Roles;
use summaryd::llm::{Llm, ModelChain};
use summaryd::mail::Mailer;
use summaryd::relay::RelayServices;
use summaryd::worker::WorkerServices;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::shared::fakes::{FakeLlm, FakeMailer};
use crate::shared::{cleanup, eventually};

pub fn pg_base_url() -> String {
    std::env::var("TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A Postgres client on `url`, its connection driven on the test's runtime.
pub async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e} (is Postgres running?)"));
    tokio::spawn(conn);
    client
}

/// A database name and a Redis key prefix no other test uses, under one id.
pub struct FreshNames {
    pub id: String,
    pub db_name: String,
    pub key_prefix: String,
}

impl FreshNames {
    /// `tag` says which suite made them, so a leftover is traced to its suite.
    pub fn new(tag: &str) -> FreshNames {
        let id = uuid::Uuid::new_v4().simple().to_string();
        FreshNames {
            db_name: format!("summaryd_{tag}_{id}"),
            key_prefix: format!("{tag}:{id}:"),
            id,
        }
    }
}

/// One isolated world: a database, a key prefix, and settings pointing at them.
pub struct TestEnv {
    pub db_name: String,
    pub settings: Settings,
}

impl TestEnv {
    /// A fresh migrated database and key prefix, with settings suited to fast tests.
    pub async fn new() -> TestEnv {
        let template = ensure_template().await;
        let FreshNames {
            db_name,
            key_prefix,
            ..
        } = FreshNames::new("t");
        let admin = admin_client().await;
        // CREATE DATABASE … TEMPLATE fails while anyone is connected to the template; the
        // migration connection may take a moment to go away.
        execute_when_unused(
            &admin,
            &format!("CREATE DATABASE \"{db_name}\" TEMPLATE \"{template}\""),
        )
        .await;
        let mut settings = Settings {
            database_url: format!("{}/{db_name}", pg_base_url()).into(),
            redis_url: redis_url().into(),
            key_prefix,
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Settings::default()
        };
        // Fast tests: short waits everywhere a real deployment would wait long.
        settings.worker.block = Duration::from_millis(50);
        settings.relay.poll = Duration::from_millis(20);
        settings.shutdown.grace = Duration::from_secs(5);
        TestEnv { db_name, settings }
    }

    /// Services wired to this env's database and prefix: a model that always answers and a
    /// mailer that always delivers, unless the test says otherwise.
    pub fn services(&self) -> Build {
        Build {
            settings: self.settings.clone(),
            llm: Arc::new(FakeLlm::ok()),
            mailer: Arc::new(FakeMailer::new()),
        }
    }

    /// A direct Postgres client on this test's database, for asserting rows.
    pub async fn pg(&self) -> tokio_postgres::Client {
        pg_connect(self.settings.database_url.expose_secret()).await
    }

    /// A direct Redis connection, for asserting stream state.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.settings.redis_url.expose_secret())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect redis")
    }

    /// Entries in the dead-letter stream.
    pub async fn dead_letters(&self) -> u64 {
        redis::cmd("XLEN")
            .arg(format!("{}jobs:summaries:dead", self.settings.key_prefix))
            .query_async(&mut self.redis().await)
            .await
            .expect("XLEN dead letters")
    }

    /// `SELECT count(*) FROM {table}`.
    pub async fn count(&self, table: &str) -> i64 {
        self.pg()
            .await
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .expect("count")
            .get(0)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        cleanup::drop_database_blocking(pg_base_url(), self.db_name.clone());
        cleanup::delete_redis_prefix_blocking(redis_url(), self.settings.key_prefix.clone());
    }
}

/// What a test wires its services from; `build` and `application` are the only places the
/// tests construct the service graph, so a change to it changes the harness once.
pub struct Build {
    settings: Settings,
    llm: Arc<dyn Llm>,
    mailer: Arc<dyn Mailer>,
}

impl Build {
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    pub fn llm(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = llm;
        self
    }

    pub fn mailer(mut self, mailer: Arc<dyn Mailer>) -> Self {
        self.mailer = mailer;
        self
    }

    pub fn build(self) -> Services {
        let handles = Handles::new(self.settings.clone()).expect("handles");
        self.with_handles(handles)
    }

    /// Like `build`, with the settings' tokens file loaded into the handles as the
    /// application loads it, so the relay signs each tenant's webhooks with the tenant's
    /// `webhook_secrets` (`build` gives the relay header mode's secrets only).
    pub fn build_with_tokens(self) -> Services {
        let tokens = summaryd::api::auth::from_settings(&self.settings.auth, &self.settings.notify)
            .expect("tokens file")
            .map(Arc::new);
        let handles = Handles::with_tokens(self.settings.clone(), tokens).expect("handles");
        self.with_handles(handles)
    }

    /// The fake model as the worker's one provider, over `handles`.
    fn with_handles(self, handles: Handles) -> Services {
        let model = ModelChain::single(
            &handles.settings.llm,
            self.llm.clone(),
            Some(handles.metrics.clone()),
        );
        Services {
            handles,
            llm: self.llm,
            model: Arc::new(model),
            mailer: self.mailer,
        }
    }

    /// Like `build`, with the model chain built from the settings (`[llm]` and its
    /// fallbacks, real HTTP clients) instead of the fake model.
    pub fn build_with_configured_models(self) -> Services {
        let handles = Handles::new(self.settings).expect("handles");
        let model = ModelChain::from_settings(&handles.settings.llm, Some(handles.metrics.clone()))
            .expect("model providers");
        Services {
            handles,
            llm: self.llm,
            model: Arc::new(model),
            mailer: self.mailer,
        }
    }

    /// The whole application with `roles`, on the database the env already migrated.
    pub async fn application(self, roles: Roles) -> Application {
        Application::build(self.settings, roles, self.llm, self.mailer, false)
            .await
            .expect("build app")
    }
}

/// Every handle of one process plus the fakes, as `Application` wires them: a test takes the
/// services of the role it drives (`worker()`, `relay()`, `api()`), and reads pools, keys
/// and metrics directly through `Deref`.
#[derive(Clone)]
pub struct Services {
    pub handles: Handles,
    pub llm: Arc<dyn Llm>,
    /// The worker's providers (one chain per process, as `Application` builds it): every
    /// `worker()` shares its breakers.
    pub model: Arc<ModelChain>,
    pub mailer: Arc<dyn Mailer>,
}

impl Services {
    pub fn worker(&self) -> WorkerServices {
        self.handles.worker(self.model.clone())
    }

    pub fn relay(&self) -> RelayServices {
        self.handles.relay(self.mailer.clone())
    }

    /// With the settings' tokens file loaded, as the api role loads it at start-up.
    pub fn api(&self) -> ApiServices {
        let auth = summaryd::api::auth::from_settings(&self.settings.auth, &self.settings.notify)
            .expect("tokens file");
        self.handles
            .api(auth.map(Arc::new), Some(self.model.clone()))
    }
}

impl std::ops::Deref for Services {
    type Target = Handles;
    fn deref(&self) -> &Handles {
        &self.handles
    }
}

/// Run `sql`, waiting (up to 5 s) while the database it names is still in use: a
/// connection that just closed can linger a moment on the server.
async fn execute_when_unused(admin: &tokio_postgres::Client, sql: &str) {
    let ran = eventually(Duration::from_secs(5), || async {
        match admin.batch_execute(sql).await {
            Ok(()) => true,
            Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => false,
            Err(e) => panic!("{sql}: {e}"),
        }
    })
    .await;
    assert!(ran, "{sql}: the database stayed in use");
}

async fn admin_client() -> tokio_postgres::Client {
    pg_connect(&format!("{}/postgres", pg_base_url())).await
}

/// The template is named by a hash of the migrations, so a changed migration gets a new one.
async fn ensure_template() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("migrations dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for f in &files {
        hasher.update(f.file_name().unwrap().to_string_lossy().as_bytes());
        hasher.update(std::fs::read(f).expect("read migration"));
    }
    let hash = hex::encode(hasher.finalize());
    let template = format!("summaryd_tmpl_{}", &hash[..16]);
    let admin = admin_client().await;
    // Serialise template creation across test threads and processes.
    admin
        .execute("SELECT pg_advisory_lock(7243001)", &[])
        .await
        .expect("lock");
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&template])
        .await
        .expect("query")
        .is_some();
    if !exists {
        let building = format!("{template}_building");
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"
            ))
            .await
            .expect("drop stale template");
        summaryd::db::migrate::run(&format!("{}/{building}", pg_base_url()), None)
            .await
            .expect("migrate template");
        // Publish atomically: a half-migrated template is never visible under the real name.
        execute_when_unused(
            &admin,
            &format!("ALTER DATABASE \"{building}\" RENAME TO \"{template}\""),
        )
        .await;
    }
    admin
        .execute("SELECT pg_advisory_unlock(7243001)", &[])
        .await
        .expect("unlock");
    template
}
