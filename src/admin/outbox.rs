//! `summaryd outbox stuck` and `summaryd outbox retry`.

use std::io::Write;

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

/// Rows that need a person: failed permanently, or `max_attempts` (`relay.max_attempts`) used up.
pub async fn stuck(
    pg: &deadpool_postgres::Pool,
    max_attempts: i32,
    json: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let rows = outbox::stuck(pg, max_attempts).await?;
    print_rows(out, &rows, json)?;
    Ok(())
}

/// Make stuck rows eligible for the relay again; returns how many were reset.
pub async fn retry(
    pg: &deadpool_postgres::Pool,
    max_attempts: i32,
    ids: &[i64],
    all: bool,
    out: &mut impl Write,
) -> Result<u64, AdminError> {
    let ids = if all { None } else { Some(ids) };
    let n = outbox::retry(pg, max_attempts, ids).await?;
    writeln!(out, "{n} outbox row(s) will be sent again")?;
    Ok(n)
}
