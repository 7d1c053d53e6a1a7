//! Dropping the service's Postgres sessions, the fault `pg_drop` injects.

use crate::shared::test_env::{pg_base_url, pg_connect};

/// Terminate every session on `db_name` (the service's pooled connections) except ours.
/// Returns how many were terminated.
pub async fn terminate_sessions(db_name: &str) -> usize {
    let admin = pg_connect(&format!("{}/postgres", pg_base_url())).await;
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
