//! `summaryd usage`: jobs and model tokens per tenant and model, from the summaries table.

use std::io::Write;

use super::AdminError;
use super::output::{Row, print_rows};
use crate::cli::UsageArgs;
use crate::db::summaries::{self, UsageRow};

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
