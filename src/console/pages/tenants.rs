//! Tenants: jobs finished and tokens used over a chosen window, jobs in flight and queued
//! in their lanes now, and
//! the limits the tokens file gives them.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Serialize;

use super::signed_in;
use crate::console::error::ConsoleError;
use crate::console::form::Fields;
use crate::console::{Console, paths};

/// The windows the page offers; any `parse_duration` text works in the query too.
pub(crate) const WINDOWS: [&str; 4] = ["1h", "24h", "7d", "30d"];
pub(crate) const DEFAULT_WINDOW: &str = "24h";

#[derive(Debug, Serialize, Default, PartialEq)]
pub(crate) struct TenantRow {
    pub(crate) tenant: String,
    /// Jobs finished (summaries committed) in the window.
    pub(crate) jobs: i64,
    pub(crate) prompt_tokens: i64,
    pub(crate) completion_tokens: i64,
    /// Accepted and not yet finished, now.
    pub(crate) in_flight: u64,
    /// From the tokens file; `None` in header mode or for a tenant not in the file.
    pub(crate) limits: Option<Limits>,
    /// Accepted and waiting in the tenant's lane for dispatch, now.
    pub(crate) queued: u64,
    /// What the window's tokens cost at the providers' prices; `None` without prices.
    pub(crate) cost: Option<f64>,
    /// The tenant's budget in the current period; `None` for a tenant without one.
    pub(crate) budget: Option<BudgetRow>,
}

#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct BudgetRow {
    /// `2026-12-02` (day) or `2026-12` (month), UTC.
    pub(crate) period: String,
    pub(crate) budget_tokens: u64,
    pub(crate) reserved: u64,
    pub(crate) used: u64,
    pub(crate) left: u64,
}

#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Limits {
    pub(crate) rate_per_s: Option<f64>,
    pub(crate) burst: Option<u32>,
    pub(crate) max_in_flight: Option<u32>,
    pub(crate) notify_per_hour: Option<u32>,
    pub(crate) weight: Option<f64>,
    pub(crate) max_concurrent: Option<u32>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Tenants {
    pub(crate) window: String,
    pub(crate) tenants: Vec<TenantRow>,
}

pub(crate) fn window(fields: &Fields) -> Result<(String, Duration), ConsoleError> {
    let text = fields.get("window").unwrap_or(DEFAULT_WINDOW);
    let duration = crate::domain::parse_duration(text)
        .map_err(|e| ConsoleError::BadInput(format!("window: {e}")))?;
    Ok((text.to_owned(), duration))
}

pub(crate) async fn load(console: &Console, fields: &Fields) -> Result<Tenants, ConsoleError> {
    let (window_text, window) = window(fields)?;
    let usage = crate::db::summaries::usage(&console.pg, Some(window), None).await?;
    let mut conn = console.redis.get().await?;
    // A tenant lives in one shard, so the shards' rows never overlap.
    let mut in_flight = Vec::new();
    let mut queued = Vec::new();
    for keys in console.keys.all() {
        in_flight.extend(crate::stream::tenant_limits::in_flight_by_tenant(&mut conn, keys).await?);
        queued.extend(
            crate::stream::lanes::backlog(&mut conn, keys)
                .await?
                .per_tenant,
        );
    }
    let mut rows: BTreeMap<String, TenantRow> = BTreeMap::new();
    fn row<'a>(rows: &'a mut BTreeMap<String, TenantRow>, tenant: &str) -> &'a mut TenantRow {
        rows.entry(tenant.to_owned()).or_insert_with(|| TenantRow {
            tenant: tenant.to_owned(),
            ..TenantRow::default()
        })
    }
    for u in usage {
        let cost = console
            .llm
            .cost_of(&u.model, u.prompt_tokens, u.completion_tokens);
        let r = row(&mut rows, &u.tenant);
        if let Some(cost) = cost {
            r.cost = Some(r.cost.unwrap_or(0.0) + cost);
        }
        r.jobs += u.jobs;
        r.prompt_tokens += u.prompt_tokens;
        r.completion_tokens += u.completion_tokens;
    }
    for (tenant, n) in in_flight {
        row(&mut rows, &tenant).in_flight = n;
    }
    for (tenant, n) in queued {
        row(&mut rows, &tenant).queued = n;
    }
    if let Some(tokens) = &console.tokens {
        let store = tokens.current();
        for (tenant, policy) in store.tenants() {
            let l = &policy.limits;
            row(&mut rows, tenant.as_str()).limits = Some(Limits {
                rate_per_s: l.rate_per_s,
                burst: l.burst,
                max_in_flight: l.max_in_flight,
                notify_per_hour: l.notify_per_hour,
                weight: l.weight,
                max_concurrent: l.max_concurrent,
            });
            if let Some(budget) = policy.budget {
                let period = budget.period.id(chrono::Utc::now());
                let keys = console.keys.of_tenant(tenant.as_str());
                let taken =
                    crate::stream::budget::read(&mut conn, keys, tenant.as_str(), &period).await?;
                row(&mut rows, tenant.as_str()).budget = Some(BudgetRow {
                    period,
                    budget_tokens: budget.tokens,
                    reserved: taken.reserved,
                    used: taken.used,
                    left: budget.left(taken),
                });
            }
        }
    }
    Ok(Tenants {
        window: window_text,
        tenants: rows.into_values().collect(),
    })
}

fn limit<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "none".into(), |v| v.to_string())
}

pub(crate) fn render(t: &Tenants, token_mode: bool) -> Markup {
    html! {
        form.filters method="get" action=(paths::TENANTS) {
            label for="window" { "Window"
                select #window name="window" {
                    @for w in WINDOWS {
                        option value=(w) selected[w == t.window] { "last " (w) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
        @if !token_mode {
            p.notice { "Header mode: tenants are not configured, so no limits are shown (SUMMARYD_AUTH_TOKENS_FILE gives each tenant its own)." }
        }
        @if t.tenants.is_empty() {
            p.muted { "No tenant has finished a job in this window or has one in flight." }
        } @else {
            table {
                caption.visually-hidden { "Tenants over the last " (t.window) }
                thead { tr {
                    th scope="col" { "Tenant" }
                    th.num scope="col" { "Jobs finished" }
                    th.num scope="col" { "Prompt tokens" }
                    th.num scope="col" { "Completion tokens" }
                    th.num scope="col" { "Cost" }
                    th.num scope="col" { "In flight" }
                    th.num scope="col" { "Queued" }
                    th scope="col" { "Limits" }
                    th scope="col" { "Budget (this period)" }
                } }
                tbody {
                    @for r in &t.tenants {
                        tr {
                            td { a href={ (paths::DEAD_LETTERS) "?tenant=" (r.tenant) } { (r.tenant) } }
                            td.num { (r.jobs) }
                            td.num { (r.prompt_tokens) }
                            td.num { (r.completion_tokens) }
                            td.num {
                                @match r.cost {
                                    Some(cost) => { (format!("{cost:.4}")) }
                                    None => span.muted { "-" }
                                }
                            }
                            td.num { (r.in_flight) }
                            td.num { (r.queued) }
                            td {
                                @match &r.limits {
                                    Some(l) => {
                                        "rate " (limit(l.rate_per_s)) "/s, burst " (limit(l.burst))
                                        ", in flight " (limit(l.max_in_flight)) ", per recipient " (limit(l.notify_per_hour)) "/h"
                                        ", weight " (limit(l.weight)) ", concurrent " (limit(l.max_concurrent))
                                    }
                                    None => span.muted { "not in the tokens file" }
                                }
                            }
                            td {
                                @match &r.budget {
                                    Some(b) => {
                                        (b.period) ": " (b.used) " used, " (b.reserved) " reserved, "
                                        (b.left) " left of " (b.budget_tokens)
                                    }
                                    None => span.muted { "none" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(crate) async fn page(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let fields = super::query(&req);
    let tenants = load(&console, &fields).await?;
    Ok(signed.page(
        "Tenants",
        paths::TENANTS,
        render(&tenants, console.tokens.is_some()),
    ))
}
