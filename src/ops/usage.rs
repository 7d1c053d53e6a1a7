//! `summaryd usage`: jobs and model tokens per tenant and model, from the summaries table.

use clap::Args;
use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::parse_duration;
use super::output::{Row, print_rows};
use crate::db::summaries::{self, UsageRow};

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

impl Row for UsageRow {
    const COLUMNS: &'static [&'static str] = &[
        "tenant",
        "model",
        "jobs",
        "prompt_tokens",
        "completion_tokens",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.tenant.clone(),
            self.model.clone(),
            self.jobs.to_string(),
            self.prompt_tokens.to_string(),
            self.completion_tokens.to_string(),
        ]
    }
}

pub async fn report(
    pg: &deadpool_postgres::Pool,
    args: &UsageArgs,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let rows = summaries::usage(pg, args.since, args.tenant.as_deref()).await?;
    print_rows(out, &rows, args.json)?;
    Ok(())
}
