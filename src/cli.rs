//! Command-line interface (`docs/reference.md`, Command line). Parsing only; `main.rs` acts on it.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::roles::Roles;
pub use crate::ops::budget::BudgetCommand;
pub use crate::ops::dlq::DlqCommand;
pub use crate::ops::healthcheck::HealthcheckArgs;
pub use crate::ops::outbox::OutboxCommand;
pub use crate::ops::pause::PauseArgs;
pub use crate::ops::token::TokenCommand;
pub use crate::ops::usage::UsageArgs;
pub use crate::ops::webhook::{SecretCommand, WebhookCommand};

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
    /// Tenants' token budgets: reserved, used and left in the current period.
    #[command(subcommand)]
    Budget(BudgetCommand),
    /// See and resend signed webhooks, re-enable endpoints, make signing secrets.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Stop consumption fleet-wide: every worker takes no new work (deliveries in
    /// progress finish) until `summaryd resume`; the api keeps accepting, the relay sending.
    Pause(PauseArgs),
    /// Restart consumption after `summaryd pause`.
    Resume,
    /// GET /healthz of the summaryd configured here (on SUMMARYD_OPS_LISTEN when set, else
    /// SUMMARYD_LISTEN); exit 0 on 200, 1 otherwise (container health checks: no curl).
    Healthcheck(HealthcheckArgs),
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
    use std::time::Duration;

    use super::*;
    use crate::config::roles::Role;
    use crate::ops::output::parse_duration;

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
    fn budget_show_takes_a_tenant_and_json() {
        let cli = Cli::try_parse_from(["summaryd", "budget", "show", "--tenant", "acme", "--json"])
            .unwrap();
        let Command::Budget(BudgetCommand::Show(args)) = cli.command else {
            panic!("expected budget show")
        };
        assert_eq!(args.tenant.as_deref(), Some("acme"));
        assert!(args.json);
        let Command::Budget(BudgetCommand::Show(all)) =
            Cli::try_parse_from(["summaryd", "budget", "show"])
                .unwrap()
                .command
        else {
            panic!("expected budget show")
        };
        assert!(all.tenant.is_none() && !all.json);
        assert!(Cli::try_parse_from(["summaryd", "budget"]).is_err());
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

    #[test]
    fn webhook_deliveries_takes_a_job_failed_and_json() {
        let job = "6f1c0e3a-3b5e-5a7d-9c1e-2f4b6a8d0c1e";
        let cli = Cli::try_parse_from([
            "summaryd",
            "webhook",
            "deliveries",
            "--job",
            job,
            "--failed",
            "--json",
        ])
        .unwrap();
        let Command::Webhook(WebhookCommand::Deliveries {
            job: Some(id),
            failed,
            json,
        }) = cli.command
        else {
            panic!("expected webhook deliveries with a job")
        };
        assert_eq!(id.to_string(), job);
        assert!(failed && json);
        let err =
            Cli::try_parse_from(["summaryd", "webhook", "deliveries", "--job", "x"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--job"), "{err}");
    }

    #[test]
    fn webhook_replay_takes_exactly_one_selection() {
        let replay = |args: &[&str]| {
            let mut argv = vec!["summaryd", "webhook", "replay"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv)
        };
        let Command::Webhook(WebhookCommand::Replay { failed_since, .. }) =
            replay(&["--failed-since", "2h"]).unwrap().command
        else {
            panic!("expected webhook replay")
        };
        assert_eq!(failed_since, Some(Duration::from_secs(7_200)));
        let Command::Webhook(WebhookCommand::Replay { ids, .. }) =
            replay(&["3", "4"]).unwrap().command
        else {
            panic!("expected webhook replay")
        };
        assert_eq!(ids, [3, 4]);
        assert!(replay(&["--job", "6f1c0e3a-3b5e-5a7d-9c1e-2f4b6a8d0c1e"]).is_ok());
        for bad in [
            &[][..],
            &["3", "--failed-since", "1h"],
            &[
                "--job",
                "6f1c0e3a-3b5e-5a7d-9c1e-2f4b6a8d0c1e",
                "--failed-since",
                "1h",
            ],
            &["--failed-since", "soon"],
            &["x"],
        ] {
            let err = replay(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn webhook_enable_checks_the_tenant_and_url_and_names_the_argument() {
        let enable = |tenant: &str, url: &str| {
            Cli::try_parse_from([
                "summaryd", "webhook", "enable", "--tenant", tenant, "--url", url,
            ])
        };
        let Command::Webhook(WebhookCommand::Enable { tenant, url }) =
            enable("acme", "https://Hooks.Example.com").unwrap().command
        else {
            panic!("expected webhook enable")
        };
        assert_eq!(tenant.as_str(), "acme");
        assert_eq!(
            url.as_str(),
            "https://hooks.example.com/",
            "normalised as stored"
        );
        for (tenant, url, named) in [
            ("a:b", "https://hooks.example.com/", "--tenant"),
            ("acme", "ftp://hooks.example.com/", "--url"),
            ("acme", "hooks.example.com/x", "--url"),
        ] {
            let err = enable(tenant, url).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(named), "{named}: {err}");
        }
    }

    #[test]
    fn pause_takes_an_optional_reason_and_resume_nothing() {
        let cli = Cli::try_parse_from(["summaryd", "pause", "--reason", "incident 7"]).unwrap();
        let Command::Pause(args) = cli.command else {
            panic!("expected pause")
        };
        assert_eq!(args.reason.as_deref(), Some("incident 7"));
        let Command::Pause(bare) = Cli::try_parse_from(["summaryd", "pause"]).unwrap().command
        else {
            panic!("expected pause")
        };
        assert_eq!(bare.reason, None);
        assert!(matches!(
            Cli::try_parse_from(["summaryd", "resume"]).unwrap().command,
            Command::Resume
        ));
        let err = Cli::try_parse_from(["summaryd", "resume", "now"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn webhook_secret_new_takes_no_arguments() {
        let cli = Cli::try_parse_from(["summaryd", "webhook", "secret", "new"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Webhook(WebhookCommand::Secret(SecretCommand::New))
        ));
        assert!(Cli::try_parse_from(["summaryd", "webhook", "secret", "new", "x"]).is_err());
    }
}
