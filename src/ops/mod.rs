//! Operator commands (`docs/reference.md`, Command line): inspect and recover what landed in
//! a dead-letter place, see and resend webhooks, and report what the model cost. Each command
//! opens only the connection it needs: `dlq`, `pause` and `resume` Redis, `outbox`, `webhook`
//! and `usage` Postgres.

pub mod budget;
pub mod dlq;
pub mod healthcheck;
pub mod outbox;
pub(crate) mod output;
pub mod pause;
pub mod token;
pub mod usage;
pub mod webhook;

use std::io::Write;

use crate::config::Settings;
use crate::db::webhooks::Selection;
use crate::infra::connections::{self, ConnectError};
use crate::infra::keys::Shards;
use budget::BudgetCommand;
use dlq::DlqCommand;
use outbox::OutboxCommand;
use pause::PauseArgs;
use usage::UsageArgs;
use webhook::{SecretCommand, WebhookCommand};

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
    /// `pause` found the pause lifted again each time it looked who held it.
    #[error("consumption was paused and resumed by others {0} times while pausing; run it again")]
    PauseContended(usize),
    /// Budgets live in the tokens file; without one there are none to show.
    #[error("no tokens file (SUMMARYD_AUTH_TOKENS_FILE): budgets are set per tenant there")]
    NoTokensFile,
    #[error(transparent)]
    TokensFile(#[from] crate::api::auth::AuthFileError),
    /// With several shards, entry ids repeat across them: an id must say its shard.
    #[error(
        "dead-letter id {id:?}: with SUMMARYD_STREAM_SHARDS={shards}, give it as `dlq list` shows it, <shard>/<id> (shard 0 to {})",
        shards - 1
    )]
    ShardedId { id: String, shards: usize },
}

/// An operator command, as the command line names it.
pub enum AdminCommand {
    Dlq(DlqCommand),
    Outbox(OutboxCommand),
    Usage(UsageArgs),
    Webhook(WebhookCommand),
    Pause(PauseArgs),
    Resume,
    Budget(BudgetCommand),
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
            usage::report_priced(&pg, &settings.llm, &args, out).await
        }
        AdminCommand::Webhook(command) => run_webhook(settings, command, out).await,
        AdminCommand::Pause(args) => {
            let redis = connections::redis_pool(settings, &connections::redis_client(settings)?)?;
            let keys = Shards::from_settings(settings);
            let by = pause::cli_actor();
            pause::pause(&redis, keys.global(), &by, args.reason, out)
                .await
                .map(|_| ())
        }
        AdminCommand::Resume => {
            let redis = connections::redis_pool(settings, &connections::redis_client(settings)?)?;
            let keys = Shards::from_settings(settings);
            pause::resume(&redis, keys.global(), out).await.map(|_| ())
        }
        AdminCommand::Budget(BudgetCommand::Show(args)) => {
            let path = settings
                .auth
                .tokens_file
                .as_ref()
                .ok_or(AdminError::NoTokensFile)?;
            let store = crate::api::auth::TokenStore::load(path)?;
            let redis = connections::redis_pool(settings, &connections::redis_client(settings)?)?;
            let keys = Shards::from_settings(settings);
            budget::show(&redis, &keys, &store, &args, out).await
        }
    }
}

async fn run_dlq(
    settings: &Settings,
    command: DlqCommand,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let redis = connections::redis_pool(settings, &connections::redis_client(settings)?)?;
    let keys = Shards::from_settings(settings);
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

async fn run_webhook(
    settings: &Settings,
    command: WebhookCommand,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    // Opened by the commands that use it: printing a secret needs no database.
    let pg = || connections::pg_pool(settings);
    match command {
        WebhookCommand::Deliveries { job, failed, json } => {
            webhook::deliveries(&pg()?, job, failed, json, out).await
        }
        WebhookCommand::Replay {
            ids,
            job,
            failed_since,
        } => {
            let selection = match (job, failed_since) {
                (Some(job), _) => Selection::Job(job),
                (None, Some(within)) => Selection::FailedSince(within),
                (None, None) => Selection::Ids(ids),
            };
            webhook::replay(&pg()?, &selection, out).await.map(|_| ())
        }
        WebhookCommand::Enable { tenant, url } => webhook::enable(&pg()?, &tenant, &url, out)
            .await
            .map(|_| ()),
        WebhookCommand::Secret(SecretCommand::New) => Ok(webhook::secret_new(out)?),
    }
}
