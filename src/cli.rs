//! Command-line interface (`docs/reference.md`, Command line). Parsing only; `main.rs` acts on it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::roles::Roles;

#[derive(Debug, Parser)]
#[command(
    name = "summaryd",
    version,
    about = "Reliable plumbing around an LLM step: idempotent intake, at-least-once queue, exactly-once effects"
)]
pub struct Cli {
    /// TOML config file (also SUMMARYD_CONFIG); see config/summaryd.toml.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the chosen roles until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Create the database if missing and apply pending migrations, then exit.
    Migrate,
    /// Inspect and replay dead-lettered jobs.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Inspect and retry outbox rows that need a person.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Tenant bearer tokens for the tokens file.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Jobs and model tokens per tenant and model, from the summaries table.
    Usage(UsageArgs),
    /// GET /healthz of the summaryd configured here (on SUMMARYD_OPS_LISTEN when set, else
    /// SUMMARYD_LISTEN); exit 0 on 200, 1 otherwise (container health checks: no curl).
    Healthcheck(HealthcheckArgs),
}

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// Address to check instead of the configured one; 0.0.0.0 and [::] mean loopback.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Deadline for the connect and for each read and write.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    /// Only summaries completed within this long: a number and a unit, s, m, h, d or w
    /// (e.g. 30d). Without it: every summary still stored.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Only this tenant.
    #[arg(long, value_name = "T")]
    pub tenant: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a fresh random token once, and the TOML lines that add its hash to the file.
    New {
        /// The tenant the token authenticates (1–64 of A-Z a-z 0-9 . _ -).
        #[arg(long, value_name = "NAME")]
        tenant: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead-lettered jobs, oldest first: id, job_id, tenant, reason, failed_at.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Re-enqueue with the SAME job_id and remove from the dead-letter stream.
    Replay {
        /// Dead-letter entry ids (from `dlq list`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<String>,
        #[arg(long)]
        all: bool,
    },
    /// Remove dead letters and their job state (GET then answers 404 for those jobs).
    Purge {
        /// Only dead letters that failed longer ago than this: a number and a unit, s, m,
        /// h, d or w (e.g. 30d). Without ids: every dead letter that old.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration,
              required_unless_present = "ids")]
        older_than: Option<Duration>,
        /// Dead-letter entry ids (from `dlq list`).
        ids: Vec<String>,
    },
}

/// `30s`, `15m`, `36h`, `14d`, `2w`: one whole number and one unit.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; use s, m, h, d or w, e.g. 14d"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number, e.g. 14d"))?;
    let unit_s = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}; use s, m, h, d or w"
            ));
        }
    };
    n.checked_mul(unit_s)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Rows at max attempts or failed permanently.
    Stuck {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make stuck rows eligible for the relay again.
    Retry {
        /// Outbox row ids (from `outbox stuck`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<i64>,
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Comma-separated subset of api, worker, relay.
    #[arg(long, default_value = "api,worker,relay", value_name = "ROLES")]
    pub roles: Roles,
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

    #[test]
    fn token_new_needs_a_tenant() {
        assert!(Cli::try_parse_from(["summaryd", "token", "new"]).is_err());
        let cli = Cli::try_parse_from(["summaryd", "token", "new", "--tenant", "acme"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Token(TokenCommand::New { tenant }) if tenant == "acme"
        ));
    }

    #[test]
    fn usage_takes_a_window_a_tenant_and_json() {
        let cli = Cli::try_parse_from([
            "summaryd", "usage", "--since", "30d", "--tenant", "acme", "--json",
        ])
        .unwrap();
        let Command::Usage(args) = cli.command else {
            panic!("expected usage")
        };
        assert_eq!(args.since, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(args.tenant.as_deref(), Some("acme"));
        assert!(args.json);
        let Command::Usage(all) = Cli::try_parse_from(["summaryd", "usage"]).unwrap().command
        else {
            panic!("expected usage")
        };
        assert_eq!((all.since, all.tenant, all.json), (None, None, false));
        assert!(Cli::try_parse_from(["summaryd", "usage", "--since", "soon"]).is_err());
    }

    #[test]
    fn purge_needs_an_age_or_ids_and_parses_durations() {
        assert!(Cli::try_parse_from(["summaryd", "dlq", "purge"]).is_err());
        let cli = Cli::try_parse_from(["summaryd", "dlq", "purge", "--older-than", "14d"]).unwrap();
        let Command::Dlq(DlqCommand::Purge { older_than, ids }) = cli.command else {
            panic!("expected dlq purge")
        };
        assert_eq!(older_than, Some(Duration::from_secs(14 * 86_400)));
        assert!(ids.is_empty());
        assert!(Cli::try_parse_from(["summaryd", "dlq", "purge", "1-0", "2-0"]).is_ok());
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(1_209_600)));
        for bad in ["14", "d", "1.5h", "3y", "-1d", "99999999999999999999w"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replay_needs_ids_or_all_but_not_both() {
        assert!(Cli::try_parse_from(["summaryd", "dlq", "replay"]).is_err());
        assert!(Cli::try_parse_from(["summaryd", "dlq", "replay", "1-0", "--all"]).is_err());
        assert!(Cli::try_parse_from(["summaryd", "dlq", "replay", "--all"]).is_ok());
        assert!(
            Cli::try_parse_from(["summaryd", "outbox", "retry", "x"]).is_err(),
            "ids are numbers"
        );
        let cli = Cli::try_parse_from([
            "summaryd", "outbox", "stuck", "--json", "--config", "f.toml",
        ])
        .unwrap();
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("f.toml")));
    }
}
