use std::process::ExitCode;

use clap::Parser;
use summaryd::app::Application;
use summaryd::cli::{Cli, Command, DlqCommand, OutboxCommand, ServeArgs};
use summaryd::config::{FlagOverrides, RelayFlags, Settings, WorkerFlags};
use summaryd::shutdown::{Shutdown, os_signal};
use tracing::{error, warn};

/// Contract §1: 0 ok, 1 runtime failure, 2 usage or configuration error.
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
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(config, args)),
        Command::Migrate => runtime.block_on(migrate(config)),
        Command::Dlq(cmd) => runtime.block_on(admin(config, AdminCommand::Dlq(cmd))),
        Command::Outbox(cmd) => runtime.block_on(admin(config, AdminCommand::Outbox(cmd))),
    }
}

enum AdminCommand {
    Dlq(DlqCommand),
    Outbox(OutboxCommand),
}

fn load_settings(
    config: Option<&std::path::Path>,
    flags: &FlagOverrides,
) -> Result<Settings, ExitCode> {
    Settings::load(config, flags).map_err(|e| {
        eprintln!("summaryd: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

async fn serve(config: Option<&std::path::Path>, args: ServeArgs) -> ExitCode {
    let flags = FlagOverrides {
        listen: args.listen,
        worker: args.consumers.map(|consumers| WorkerFlags { consumers }),
        relay: args.relays.map(|tasks| RelayFlags { tasks }),
    };
    let settings = match load_settings(config, &flags) {
        Ok(s) => s,
        Err(code) => return code,
    };
    summaryd::telemetry::init(settings.log.format);
    for name in Settings::ignored_env_vars() {
        warn!(variable = %name, "environment variable names no setting; ignored");
    }
    if settings.worker.claim_idle_ms <= settings.job_budget_ms {
        // Correct either way (the handler is idempotent), but a live worker still inside its
        // budget would have its message claimed from under it and the model paid twice.
        warn!(
            claim_idle_ms = settings.worker.claim_idle_ms,
            job_budget_ms = settings.job_budget_ms,
            "SUMMARYD_WORKER_CLAIM_IDLE_MS should exceed SUMMARYD_JOB_BUDGET_MS (the slowest successful delivery)"
        );
    }
    if settings.auth.tokens_file.is_none() {
        warn!(
            "SUMMARYD_AUTH_TOKENS_FILE is not set: tenants are taken from X-Tenant-Id and are not authenticated"
        );
    }
    let llm = match summaryd::llm::from_settings(&settings.llm) {
        Ok(llm) => llm,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mailer = match summaryd::mail::from_settings(&settings.mail) {
        Ok(m) => m,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let app = match Application::build(settings, args.roles, llm, mailer, !args.no_migrate).await {
        Ok(app) => app,
        Err(e) => {
            error!("cannot start: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let shutdown = Shutdown::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        os_signal().await;
        trigger.trigger();
    });
    match app.run(shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

async fn migrate(config: Option<&std::path::Path>) -> ExitCode {
    let settings = match load_settings(config, &FlagOverrides::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    summaryd::telemetry::init(settings.log.format);
    match summaryd::db::migrate::run(&settings.database_url, settings.database.ca_file.as_deref())
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
async fn admin(config: Option<&std::path::Path>, command: AdminCommand) -> ExitCode {
    use summaryd::admin;
    let settings = match load_settings(config, &FlagOverrides::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // Admin commands never call the model or send mail; the defaults need no network.
    let services = match summaryd::context::Services::new(
        settings,
        std::sync::Arc::new(summaryd::llm::BuiltinSummariser),
        std::sync::Arc::new(summaryd::mail::LogMailer),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("summaryd: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut out = std::io::stdout().lock();
    let result = match command {
        AdminCommand::Dlq(DlqCommand::List { limit, json }) => {
            admin::dlq::list(&services, limit, json, &mut out).await
        }
        AdminCommand::Dlq(DlqCommand::Replay { ids, all }) => {
            admin::dlq::replay(&services, &ids, all, &mut out)
                .await
                .map(|_| ())
        }
        AdminCommand::Outbox(OutboxCommand::Stuck { json }) => {
            admin::outbox::stuck(&services, json, &mut out).await
        }
        AdminCommand::Outbox(OutboxCommand::Retry { ids, all }) => {
            admin::outbox::retry(&services, &ids, all, &mut out)
                .await
                .map(|_| ())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("summaryd: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}
