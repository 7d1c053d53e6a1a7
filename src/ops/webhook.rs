//! `summaryd webhook deliveries`, `webhook replay`, `webhook enable` and `webhook secret
//! new`: see what became of the signed webhooks, send them again, re-enable an endpoint the
//! relay disabled, and make a signing secret.

use clap::Subcommand;
use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::{Row, one_line, parse_duration, print_rows};
use crate::db::webhooks::{self, DeliveryRow, Selection};
use crate::domain::{JobId, TenantId, WebhookSecret, WebhookUrl};

#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Webhook deliveries, oldest first: id, job_id, type, url, attempts, last_status,
    /// last_error, next_at, delivered_at.
    Deliveries {
        /// Only this job's webhooks (its job_id).
        #[arg(long, value_name = "ID")]
        job: Option<JobId>,
        /// Only webhooks not delivered whose last attempt failed: still retrying, parked
        /// past SUMMARYD_WEBHOOK_GIVE_UP_S, or skipped because the endpoint is disabled.
        #[arg(long)]
        failed: bool,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Send webhooks again, with the same webhook-id, as if new (attempts from 0). Rows a
    /// relay is sending right now are left alone; rows to a disabled endpoint are skipped
    /// again until `webhook enable`.
    Replay {
        /// Delivery ids (from `webhook deliveries`).
        #[arg(required_unless_present_any = ["job", "failed_since"],
              conflicts_with_all = ["job", "failed_since"])]
        ids: Vec<i64>,
        /// Every webhook of this job (its job_id), delivered or not.
        #[arg(long, value_name = "ID", conflicts_with = "failed_since")]
        job: Option<JobId>,
        /// Every webhook not delivered whose last attempt failed (or was skipped) within
        /// this long: a number and a unit, s, m, h, d or w (e.g. 2h).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        failed_since: Option<Duration>,
    },
    /// Re-enable an endpoint disabled for a tenant (a 410 Gone, or every delivery failing
    /// for SUMMARYD_WEBHOOK_DISABLE_AFTER_S). Webhooks skipped meanwhile are not sent until
    /// `webhook replay`.
    Enable {
        /// The tenant the endpoint was disabled for (1–64 of A-Z a-z 0-9 . _ -).
        #[arg(long, value_name = "T", value_parser = parse_tenant)]
        tenant: TenantId,
        /// The endpoint's URL, as the webhooks were sent to it (`webhook deliveries`).
        #[arg(long, value_name = "URL", value_parser = parse_url)]
        url: WebhookUrl,
    },
    /// Webhook signing secrets.
    #[command(subcommand)]
    Secret(SecretCommand),
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Print a fresh whsec_ secret once, and the lines that configure it.
    New,
}

/// clap's error for a bad value names the argument (`--tenant <T>`) and exits 2.
fn parse_tenant(raw: &str) -> Result<TenantId, String> {
    TenantId::parse(raw).map_err(|e| e.message)
}

/// Syntax only, as the relay reads a stored target: the policy (https, public addresses)
/// was applied when the job was accepted and is applied again at every send. Normalised
/// as the stored target was, so `https://Hooks.Example.com` finds `https://hooks.example.com/`.
fn parse_url(raw: &str) -> Result<WebhookUrl, String> {
    WebhookUrl::from_stored(raw).map_err(|e| e.message)
}

impl Row for DeliveryRow {
    const COLUMNS: &'static [&'static str] = &[
        "id",
        "job_id",
        "type",
        "url",
        "attempts",
        "last_status",
        "last_error",
        "next_at",
        "delivered_at",
    ];
    fn cells(&self) -> Vec<String> {
        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.to_rfc3339()).unwrap_or_default()
        };
        vec![
            self.id.to_string(),
            self.job_id.clone().unwrap_or_default(),
            self.kind.clone().unwrap_or_default(),
            one_line(self.url.as_deref().unwrap_or(""), 60),
            self.attempts.to_string(),
            self.last_status.map(|s| s.to_string()).unwrap_or_default(),
            one_line(self.last_error.as_deref().unwrap_or(""), 60),
            time(self.next_at),
            time(self.delivered_at),
        ]
    }
}

/// The webhook rows, oldest first: of one job, and/or only the failed ones.
pub async fn deliveries(
    pg: &deadpool_postgres::Pool,
    job: Option<JobId>,
    failed: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let rows = webhooks::deliveries(pg, job, failed).await?;
    print_rows(out, &rows, json)?;
    Ok(())
}

/// Make the selected webhook rows due again; returns how many (never a row a relay holds).
pub async fn replay(
    pg: &deadpool_postgres::Pool,
    selection: &Selection,
    out: &mut impl Write,
) -> Result<u64, AdminError> {
    let n = webhooks::replay(pg, selection).await?;
    writeln!(out, "{n} webhook(s) will be sent again")?;
    Ok(n)
}

/// Enable the endpoint for the tenant; returns whether it was disabled.
pub async fn enable(
    pg: &deadpool_postgres::Pool,
    tenant: &TenantId,
    url: &WebhookUrl,
    out: &mut impl Write,
) -> Result<bool, AdminError> {
    let was_disabled = webhooks::enable(pg, tenant, url.as_str()).await?;
    if was_disabled {
        writeln!(
            out,
            "enabled {url} for tenant {tenant}; it was disabled. Webhooks skipped while it was \
             disabled are not sent by themselves: `summaryd webhook deliveries --failed`, then \
             `summaryd webhook replay`"
        )?;
    } else {
        writeln!(
            out,
            "{url} was not disabled for tenant {tenant}; nothing changed"
        )?;
    }
    Ok(was_disabled)
}

/// Print a new signing secret once, with the lines that configure it in either mode. The
/// secret is stored nowhere; needs no configuration, database or Redis.
pub fn secret_new(out: &mut impl Write) -> std::io::Result<()> {
    let secret = WebhookSecret::generate();
    writeln!(
        out,
        "# Webhook signing secret; shown only now. Give it to the receiver, which verifies the\n\
         # webhook-signature header with it (any Standard Webhooks library):\n\
         {secret}\n\
         \n\
         # Token mode: in the tenant's [tenants.NAME] table of the tokens file\n\
         # (SUMMARYD_AUTH_TOKENS_FILE). The first secret signs and every one listed adds a\n\
         # signature: to rotate, put it first and keep the old one after it until the\n\
         # receiver has moved. A changed file is loaded within seconds (or at SIGHUP).\n\
         webhook_secrets = [\"{secret}\"]\n\
         \n\
         # Header mode: as the first line of the file SUMMARYD_WEBHOOK_SECRETS_FILE names (one\n\
         # secret a line, the first signs); the file is read when summaryd starts.\n\
         {secret}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::WebhookSecrets;

    #[test]
    fn a_new_secret_is_printed_in_both_modes_forms_and_parses() {
        let mut out = Vec::new();
        secret_new(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let secret = text
            .lines()
            .find(|l| l.starts_with(WebhookSecret::PREFIX))
            .unwrap();
        WebhookSecret::parse(secret).unwrap();
        let toml_line = text
            .lines()
            .find(|l| l.starts_with("webhook_secrets"))
            .unwrap();
        let table: toml::Table = toml::from_str(toml_line).unwrap();
        let listed: Vec<&str> = table["webhook_secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(listed, [secret]);
        WebhookSecrets::parse_list(listed).unwrap();
        assert_eq!(
            text.lines().filter(|l| *l == secret).count(),
            2,
            "once to hand over, once as the secrets file's line:\n{text}"
        );
    }

    #[test]
    fn secrets_differ() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        secret_new(&mut a).unwrap();
        secret_new(&mut b).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn table_cells_follow_the_columns_and_leave_absent_values_empty() {
        let row = DeliveryRow {
            id: 7,
            job_id: Some("j".into()),
            kind: Some("summary.completed".into()),
            url: Some("https://hooks.example.com/x".into()),
            attempts: 2,
            last_status: Some(503),
            last_error: Some("503\nService Unavailable".into()),
            next_at: None,
            delivered_at: None,
        };
        let cells = row.cells();
        assert_eq!(cells.len(), DeliveryRow::COLUMNS.len());
        assert_eq!(cells[5], "503");
        assert_eq!(cells[6], "503 Service Unavailable");
        assert_eq!(&cells[7..], ["", ""]);
    }
}
