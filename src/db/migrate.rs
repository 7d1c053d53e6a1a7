//! `summaryd migrate` and migrate-on-start: create the database if missing, then apply
//! `migrations/` under an advisory lock so replicas starting together do not race.

use std::path::Path;

use tokio_postgres::error::SqlState;
use tracing::info;

use super::DbError;
use crate::infra::postgres::{PgTarget, PostgresError};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Arbitrary but fixed: every summaryd replica must use the same lock id.
const MIGRATION_LOCK_ID: i64 = 0x5355_4d4d_4152_5944; // "SUMMARYD"

/// Create the database named in `url` if it does not exist, then apply pending migrations.
/// `ca_file` is `SUMMARYD_DATABASE_CA_FILE` (see `infra::postgres` for the URL's TLS options).
pub async fn run(url: &str, ca_file: Option<&Path>) -> Result<(), DbError> {
    let target = PgTarget::parse(url, ca_file)?;
    create_database_if_missing(&target).await?;
    let (mut client, conn_task) = target.connect().await?;
    target.warn_if_cleartext(&client).await;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_ID])
        .await?;
    let result = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(&mut client)
        .await;
    // Unlock explicitly; dropping the connection would release it too.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_ID])
        .await;
    drop(client);
    conn_task.abort();
    let report = result.map_err(DbError::Migration)?;
    for m in report.applied_migrations() {
        info!(migration = %m, "applied migration");
    }
    Ok(())
}

async fn create_database_if_missing(target: &PgTarget) -> Result<(), DbError> {
    let Some(dbname) = target.config.get_dbname().map(str::to_owned) else {
        return Ok(());
    };
    // Connecting to the target first avoids needing rights on the maintenance database.
    match target.connect().await {
        Ok((_, task)) => {
            task.abort();
            return Ok(());
        }
        // A TLS failure would fail the same way on the maintenance database; say it now.
        Err(e @ PostgresError::Tls { .. }) => return Err(e.into()),
        Err(_) => {}
    }
    let (client, conn_task) = target.with_dbname("postgres").connect().await?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&dbname])
        .await?
        .is_some();
    if !exists {
        let sql = format!("CREATE DATABASE \"{}\"", dbname.replace('"', "\"\""));
        match client.batch_execute(&sql).await {
            Ok(()) => info!(database = %dbname, "created database"),
            // Another replica created it between our check and our CREATE.
            Err(e)
                if e.code() == Some(&SqlState::DUPLICATE_DATABASE)
                    || e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {}
            Err(e) => return Err(e.into()),
        }
    }
    conn_task.abort();
    Ok(())
}
