use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use secrecy::ExposeSecret;
use summaryd::app::Application;
use summaryd::cli::{Cli, Command, SecretCommand, ServeArgs, TokenCommand, WebhookCommand};
use summaryd::config::{FlagOverrides, RelayFlags, Settings, WorkerFlags};
use summaryd::ops::{AdminCommand, AdminError};
use summaryd::shutdown::{Shutdown, os_signal};
use tracing::error;

// Every role allocates small, short-lived values per request and per job; see Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// 0 ok, 1 runtime failure, 2 usage or configuration error.
const EXIT_RUNTIME: u8 = 1;
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("summaryd: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let config = cli.config.as_deref();
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(config, args).await,
            Command::Migrate => migrate(config).await,
            Command::Dlq(cmd) => admin(config, AdminCommand::Dlq(cmd)).await,
            Command::Outbox(cmd) => admin(config, AdminCommand::Outbox(cmd)).await,
            Command::Usage(args) => admin(config, AdminCommand::Usage(args)).await,
            Command::Budget(command) => admin(config, AdminCommand::Budget(command)).await,
            Command::Webhook(WebhookCommand::Secret(SecretCommand::New)) => webhook_secret_new(),
            Command::Webhook(cmd) => admin(config, AdminCommand::Webhook(cmd)).await,
            Command::Pause(args) => admin(config, AdminCommand::Pause(args)).await,
            Command::Resume => admin(config, AdminCommand::Resume).await,
            Command::Token(TokenCommand::New { tenant }) => token_new(&tenant),
            Command::Healthcheck(args) => summaryd::ops::healthcheck::run(config, &args),
        }
    })
}

/// Needs no configuration, database or Redis: it only prints.
fn token_new(tenant: &str) -> ExitCode {
    match summaryd::ops::token::new(tenant, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ summaryd::ops::token::TokenError::Tenant(..)) => {
            eprintln!("summaryd: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("summaryd: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// Needs no configuration, database or Redis either.
fn webhook_secret_new() -> ExitCode {
    match summaryd::ops::webhook::secret_new(&mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("summaryd: writing output: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// The settings, with the TLS files they name read and checked: a wrong one is a
/// configuration error of every command, before it connects anywhere.
fn load_settings(config: Option<&Path>, flags: &FlagOverrides) -> Result<Settings, ExitCode> {
    let refuse = |e: &dyn std::fmt::Display| {
        eprintln!("summaryd: {e}");
        ExitCode::from(EXIT_CONFIG)
    };
    let settings = Settings::load(config, flags).map_err(|e| refuse(&e))?;
    summaryd::infra::check_tls_files(&settings).map_err(|e| refuse(&e))?;
    Ok(settings)
}

async fn serve(config: Option<&Path>, args: ServeArgs) -> ExitCode {
    let flags = FlagOverrides {
        listen: args.listen,
        worker: args.consumers.map(|consumers| WorkerFlags { consumers }),
        relay: args.relays.map(|tasks| RelayFlags { tasks }),
    };
    let settings = match load_settings(config, &flags) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let tracing = summaryd::infra::telemetry::init_with_traces(settings.log.format, &settings.otel);
    // Installed before startup, so a SIGTERM during migrations or right after "summaryd
    // started" ends the run through the drain rather than by the default disposition.
    let signalled = os_signal();
    let app = match Application::from_settings(settings, args.roles, !args.no_migrate).await {
        Ok(app) => app,
        Err(e) => {
            error!("cannot start: {e}");
            let code = if e.is_configuration() {
                EXIT_CONFIG
            } else {
                EXIT_RUNTIME
            };
            return ExitCode::from(code);
        }
    };
    let shutdown = Shutdown::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        signalled.await;
        trigger.trigger();
    });
    let ran = app.run(shutdown).await;
    // The spans of the drain included; bounded, so a collector that is down costs the exit
    // a few seconds at most.
    if let Some(tracing) = tracing {
        tracing.shutdown().await;
    }
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

async fn migrate(config: Option<&Path>) -> ExitCode {
    let settings = match load_settings(config, &FlagOverrides::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    summaryd::infra::telemetry::init(settings.log.format);
    summaryd::infra::cleartext::warn_at_startup(&settings, false);
    match summaryd::db::migrate::run(
        settings.database_url.expose_secret(),
        settings.database.ca_file.as_deref(),
    )
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("migration failed: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// Operator commands: output goes to stdout (table or JSON lines), diagnostics to stderr.
async fn admin(config: Option<&Path>, command: AdminCommand) -> ExitCode {
    let settings = match load_settings(config, &FlagOverrides::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut out = std::io::stdout().lock();
    match summaryd::ops::run(&settings, command, &mut out).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("summaryd: {e}");
            let code = match e {
                AdminError::Setup(_)
                | AdminError::NoTokensFile
                | AdminError::TokensFile(_)
                | AdminError::ShardedId { .. } => EXIT_CONFIG,
                _ => EXIT_RUNTIME,
            };
            ExitCode::from(code)
        }
    }
}
