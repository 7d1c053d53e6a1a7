//! `summaryd outbox stuck` and `summaryd outbox retry`.

use clap::Subcommand;
use std::io::Write;

use super::AdminError;
use super::output::{Row, one_line, print_rows};
use crate::db::outbox::{self, StuckRow};

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Rows failed permanently, or failing past SUMMARYD_RELAY_GIVE_UP_S since their first
    /// failure.
    Stuck {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make stuck rows eligible for the relay again (their give-up horizon restarts at their
    /// next failure). Rows a relay is sending right now are left alone.
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

/// Rows that need a person: failed permanently, or failed again past `relay.give_up_s`
/// since their first failure.
pub async fn stuck(
    pg: &deadpool_postgres::Pool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let rows = outbox::stuck(pg).await?;
    print_rows(out, &rows, json)?;
    Ok(())
}

/// Make stuck rows eligible for the relay again, restarting their give-up horizon; returns
/// how many were reset (never a row a relay holds a lease on).
pub async fn retry(
    pg: &deadpool_postgres::Pool,
    ids: &[i64],
    all: bool,
    out: &mut impl Write,
) -> Result<u64, AdminError> {
    let ids = if all { None } else { Some(ids) };
    let n = outbox::retry(pg, ids).await?;
    writeln!(out, "{n} outbox row(s) will be sent again")?;
    Ok(n)
}
