#![allow(dead_code, unused_imports)] // shared by test modules; not every module uses every helper
//! Test harness: each test gets its own Postgres database (copied from a migrated template)
//! and its own Redis key prefix, so tests run in parallel against the real services.

pub mod fakes;
pub mod http_stub;
pub mod log_capture;
pub mod smtp_sink;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use summaryd::config::Settings;
use summaryd::context::Services;
use summaryd::llm::Llm;
use summaryd::mail::Mailer;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

pub use fakes::{FakeLlm, FakeMailer};

use crate::shared::cleanup;

pub fn pg_base_url() -> String {
    std::env::var("TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
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
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("summaryd_t_{id}");
        let admin = admin_client().await;
        // CREATE DATABASE … TEMPLATE fails while anyone is connected to the template; the
        // migration connection may take a moment to go away.
        let mut tries = 0;
        loop {
            match admin
                .batch_execute(&format!(
                    "CREATE DATABASE \"{db_name}\" TEMPLATE \"{template}\""
                ))
                .await
            {
                Ok(()) => break,
                Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("create test database: {e}"),
            }
        }
        let mut settings = Settings {
            database_url: format!("{}/{db_name}", pg_base_url()),
            redis_url: redis_url(),
            key_prefix: format!("t:{id}:"),
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Settings::default()
        };
        // Fast tests: short waits everywhere a real deployment would wait long.
        settings.worker.block_ms = 50;
        settings.relay.poll_ms = 20;
        settings.shutdown.grace_ms = 5_000;
        TestEnv { db_name, settings }
    }

    /// Services wired to this env's database and prefix, with the given fakes.
    pub fn services(&self, llm: Arc<dyn Llm>, mailer: Arc<dyn Mailer>) -> Services {
        Services::new(self.settings.clone(), llm, mailer).expect("services")
    }

    pub fn services_with(
        &self,
        settings: Settings,
        llm: Arc<dyn Llm>,
        mailer: Arc<dyn Mailer>,
    ) -> Services {
        Services::new(settings, llm, mailer).expect("services")
    }

    /// A direct Postgres client on this test's database, for asserting rows.
    pub async fn pg(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.settings.database_url, NoTls)
            .await
            .expect("connect test db");
        tokio::spawn(conn);
        client
    }

    /// A direct Redis connection, for asserting stream state.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.settings.redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect redis")
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

async fn admin_client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&format!("{}/postgres", pg_base_url()), NoTls)
        .await
        .expect("connect to Postgres (is it running on 127.0.0.1:5432?)");
    tokio::spawn(conn);
    client
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
        summaryd::db::migrate::run(&format!("{}/{building}", pg_base_url()))
            .await
            .expect("migrate template");
        // Publish atomically: a half-migrated template is never visible under the real name.
        let mut tries = 0;
        loop {
            match admin
                .batch_execute(&format!(
                    "ALTER DATABASE \"{building}\" RENAME TO \"{template}\""
                ))
                .await
            {
                Ok(()) => break,
                Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("publish template: {e}"),
            }
        }
    }
    admin
        .execute("SELECT pg_advisory_unlock(7243001)", &[])
        .await
        .expect("unlock");
    template
}
