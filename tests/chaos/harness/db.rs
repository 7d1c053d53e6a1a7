//! Postgres for one test: its own database (created by `summaryd migrate`), queries for
//! assertions, the session killer, and cleanup.

use tokio_postgres::NoTls;

pub fn pg_base_url() -> String {
    std::env::var("TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    tokio::spawn(conn);
    client
}

/// Terminate every session on `db_name` (the service's pooled connections) except ours.
/// Returns how many were terminated.
pub async fn terminate_sessions(db_name: &str) -> usize {
    let admin = connect(&format!("{}/postgres", pg_base_url())).await;
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db_name],
        )
        .await
        .expect("pg_terminate_backend");
    rows.iter().filter(|r| r.get::<_, bool>(0)).count()
}
