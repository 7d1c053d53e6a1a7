//! `summaryd outbox stuck` and `summaryd outbox retry`.

use clap::Subcommand;
use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::{Row, one_line, print_rows};
use crate::db::outbox::{self, StuckRow};

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

impl Row for StuckRow {
    const COLUMNS: &'static [&'static str] = &[
        "id",
        "job_id",
        "topic",
        "dedupe_key",
        "attempts",
        "last_error",
        "created_at",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.job_id.clone().unwrap_or_default(),
            self.topic.clone(),
            self.dedupe_key.clone(),
            self.attempts.to_string(),
            one_line(self.last_error.as_deref().unwrap_or(""), 60),
            self.created_at.to_rfc3339(),
        ]
    }
}

/// Rows that need a person: failed permanently, or failing past `give_up`
/// (`relay.give_up_s`) since they were created or last retried.
pub async fn stuck(
    pg: &deadpool_postgres::Pool,
    give_up: Duration,
    json: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let rows = outbox::stuck(pg, give_up).await?;
    print_rows(out, &rows, json)?;
    Ok(())
}

/// Make stuck rows eligible for the relay again, restarting their give-up horizon; returns
/// how many were reset.
pub async fn retry(
    pg: &deadpool_postgres::Pool,
    give_up: Duration,
    ids: &[i64],
    all: bool,
    out: &mut impl Write,
) -> Result<u64, AdminError> {
    let ids = if all { None } else { Some(ids) };
    let n = outbox::retry(pg, give_up, ids).await?;
    writeln!(out, "{n} outbox row(s) will be sent again")?;
    Ok(n)
}
