//! Operator commands (`docs/reference.md`, Command line): inspect and recover what landed in
//! a dead-letter place, and report what the model cost. Each command opens only the
//! connection it needs: `dlq` Redis, `outbox` and `usage` Postgres.

pub mod dlq;
pub mod healthcheck;
pub mod outbox;
pub(crate) mod output;
pub mod token;
pub mod usage;

use std::io::Write;

use crate::config::Settings;
use crate::infra::connections::{self, ConnectError};
use crate::infra::keys::RedisKeys;
use dlq::DlqCommand;
use outbox::OutboxCommand;
use usage::UsageArgs;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The connection could not even be set up (e.g. a malformed URL): a configuration error.
    #[error(transparent)]
    Setup(#[from] ConnectError),
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("Redis pool: {0}")]
    RedisPool(#[from] deadpool_redis::PoolError),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error(transparent)]
    Replay(#[from] crate::stream::dead_letters::ReplayError),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    /// `dlq replay` replayed the rest but skipped these: they still need a person.
    #[error("{0} dead-lettered entries are not jobs and were skipped; they stay dead-lettered")]
    SkippedMalformed(usize),
}

/// An operator command, as the command line names it.
pub enum AdminCommand {
    Dlq(DlqCommand),
    Outbox(OutboxCommand),
    Usage(UsageArgs),
}

/// Run `command`, writing its output to `out` (a table or JSON lines).
pub async fn run(
    settings: &Settings,
    command: AdminCommand,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    match command {
        AdminCommand::Dlq(command) => run_dlq(settings, command, out).await,
        AdminCommand::Outbox(command) => run_outbox(settings, command, out).await,
        AdminCommand::Usage(args) => {
            let pg = connections::pg_pool(settings)?;
            usage::report(&pg, &args, out).await
        }
    }
}

async fn run_dlq(
    settings: &Settings,
    command: DlqCommand,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let redis = connections::redis_pool(settings, &connections::redis_client(settings)?)?;
    let keys = RedisKeys::new(settings.key_prefix.clone());
    match command {
        DlqCommand::List { limit, json } => dlq::list(&redis, &keys, limit, json, out).await,
        DlqCommand::Replay { ids, all } => {
            let report = dlq::replay(&redis, &keys, &ids, all, out).await?;
            match report.malformed {
                0 => Ok(()),
                n => Err(AdminError::SkippedMalformed(n)),
            }
        }
        DlqCommand::Purge { older_than, ids } => dlq::purge(&redis, &keys, &ids, older_than, out)
            .await
            .map(|_| ()),
    }
}

async fn run_outbox(
    settings: &Settings,
    command: OutboxCommand,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let pg = connections::pg_pool(settings)?;
    match command {
        OutboxCommand::Stuck { json } => outbox::stuck(&pg, json, out).await,
        OutboxCommand::Retry { ids, all } => outbox::retry(&pg, &ids, all, out).await.map(|_| ()),
    }
}
