//! `summaryd outbox stuck` and `summaryd outbox retry`.

use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::{Row, one_line, print_rows};
use crate::db::outbox::{self, StuckRow};

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
