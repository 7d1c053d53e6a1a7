//! Command-line interface (contract §1). Parsing only; `main.rs` acts on it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::roles::Roles;

#[derive(Debug, Parser)]
#[command(name = "summaryd", version, about = "Reliable plumbing around an LLM step: idempotent intake, at-least-once queue, exactly-once effects")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the chosen roles until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Create the database if missing and apply pending migrations, then exit.
    Migrate(ConfigArg),
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// TOML config file (also SUMMARYD_CONFIG); see config/summaryd.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Comma-separated subset of api, worker, relay.
    #[arg(long, default_value = "api,worker,relay", value_name = "ROLES")]
    pub roles: Roles,
    #[command(flatten)]
    pub config: ConfigArg,
    /// HTTP listen address (overrides SUMMARYD_LISTEN).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Consumer tasks in this process (overrides SUMMARYD_WORKER_CONSUMERS).
    #[arg(long, value_name = "N")]
    pub consumers: Option<usize>,
    /// Relay tasks in this process (overrides SUMMARYD_RELAY_TASKS).
    #[arg(long, value_name = "N")]
    pub relays: Option<usize>,
    /// Do not apply pending migrations on start (when a Kubernetes Job runs `migrate`).
    #[arg(long)]
    pub no_migrate: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roles::Role;

    #[test]
    fn serve_defaults_to_all_roles() {
        let cli = Cli::try_parse_from(["summaryd", "serve"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("expected serve")
        };
        assert!(Role::ALL.iter().all(|r| args.roles.has(*r)));
        assert!(!args.no_migrate);
    }

    #[test]
    fn unknown_role_is_a_usage_error_naming_valid_roles() {
        let err = Cli::try_parse_from(["summaryd", "serve", "--roles", "api,bogus"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains("api, worker, relay"), "{text}");
    }
}
