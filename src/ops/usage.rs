//! `summaryd usage`: jobs and model tokens per tenant and model, from the summaries table,
//! and what they cost where the providers have prices.

use clap::Args;
use std::io::Write;
use std::time::Duration;

use super::AdminError;
use super::output::parse_duration;
use super::output::{Row, print_rows};
use crate::config::LlmSettings;
use crate::db::summaries::{self, UsageRow};
use serde::Serialize;

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

/// A usage row with what it cost at its provider's prices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PricedRow {
    #[serde(flatten)]
    row: UsageRow,
    /// `None` (null in JSON, `-` in the table) when the row's model has no price.
    cost: Option<f64>,
}

impl Row for PricedRow {
    const COLUMNS: &'static [&'static str] = &[
        "tenant",
        "model",
        "jobs",
        "prompt_tokens",
        "completion_tokens",
        "cost",
    ];
    fn cells(&self) -> Vec<String> {
        let mut cells = self.row.cells();
        cells.push(self.cost.map_or_else(|| "-".into(), |c| format!("{c:.4}")));
        cells
    }
}

/// [`report`], with a `cost` per row when `llm` gives any provider a price
/// (`price_per_mtok_input`/`_output`; matched by the model the summaries store).
pub async fn report_priced(
    pg: &deadpool_postgres::Pool,
    llm: &LlmSettings,
    args: &UsageArgs,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let priced = llm.price_per_mtok_input.is_some()
        || llm.price_per_mtok_output.is_some()
        || llm
            .fallback
            .iter()
            .any(|f| f.price_per_mtok_input.is_some() || f.price_per_mtok_output.is_some());
    if !priced {
        return report(pg, args, out).await;
    }
    let rows: Vec<PricedRow> = summaries::usage(pg, args.since, args.tenant.as_deref())
        .await?
        .into_iter()
        .map(|row| PricedRow {
            cost: llm.cost_of(&row.model, row.prompt_tokens, row.completion_tokens),
            row,
        })
        .collect();
    print_rows(out, &rows, args.json)?;
    Ok(())
}
