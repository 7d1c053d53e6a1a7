//! `summaryd budget show`: each tenant's token budget (from the tokens file) and what is
//! reserved and used of it in the current period (from Redis).

use std::io::Write;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::AdminError;
use super::output::{Row, print_rows};
use crate::api::auth::TokenStore;
use crate::infra::keys::Shards;
use crate::stream::budget;

#[derive(Debug, Clone, Subcommand)]
pub enum BudgetCommand {
    /// Tenants with a budget: the period, the budget, and what is reserved, used and left.
    Show(ShowArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// Only this tenant.
    #[arg(long, value_name = "T")]
    pub tenant: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One tenant's budget in the current period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetRow {
    pub tenant: String,
    /// The period's id: `2026-12-02` (day) or `2026-12` (month), UTC.
    pub period: String,
    pub budget_tokens: u64,
    pub reserved: u64,
    pub used: u64,
    pub left: u64,
}

impl Row for BudgetRow {
    const COLUMNS: &'static [&'static str] = &[
        "tenant",
        "period",
        "budget_tokens",
        "reserved",
        "used",
        "left",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.tenant.clone(),
            self.period.clone(),
            self.budget_tokens.to_string(),
            self.reserved.to_string(),
            self.used.to_string(),
            self.left.to_string(),
        ]
    }
}

/// The rows for every tenant of `store` with a budget (only `tenant` when given), at `now`.
pub async fn rows<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &Shards,
    store: &TokenStore,
    tenant: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<BudgetRow>, AdminError> {
    let mut rows = Vec::new();
    for (id, policy) in store.tenants() {
        let Some(b) = policy.budget else { continue };
        if tenant.is_some_and(|t| t != id.as_str()) {
            continue;
        }
        let period = b.period.id(now);
        let taken = budget::read(conn, keys.of_tenant(id.as_str()), id.as_str(), &period).await?;
        rows.push(BudgetRow {
            tenant: id.to_string(),
            period,
            budget_tokens: b.tokens,
            reserved: taken.reserved,
            used: taken.used,
            left: b.left(taken),
        });
    }
    Ok(rows)
}

pub async fn show(
    redis: &crate::infra::redis::RedisPool,
    keys: &Shards,
    store: &TokenStore,
    args: &ShowArgs,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let mut conn = redis.get().await?;
    let rows = rows(&mut conn, keys, store, args.tenant.as_deref(), Utc::now()).await?;
    print_rows(out, &rows, args.json)?;
    Ok(())
}
