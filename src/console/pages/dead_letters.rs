//! Dead letters: filter them, and replay or purge the ticked ones or all that match, after
//! a confirmation that says how many. The work itself is a bulk run (`stream::bulk`).

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Serialize;

use super::{change_form, signed_in};
use crate::console::access::Who;
use crate::console::error::ConsoleError;
use crate::console::form::Fields;
use crate::console::{Console, layout, paths};
use crate::domain::ReasonClass;
use crate::stream::bulk::BulkAction;
use crate::stream::dead_letters::{self, DeadLetter, DeadLetterFilter};

/// Dead letters shown per page.
pub(crate) const PAGE: usize = 50;

/// A dead letter as the console shows it (the CLI's fields and the reason class).
#[derive(Debug, Serialize)]
pub(crate) struct DeadLetterView {
    pub(crate) id: String,
    pub(crate) job_id: String,
    pub(crate) tenant: String,
    pub(crate) class: &'static str,
    pub(crate) reason: String,
    pub(crate) failed_at: String,
}

impl From<DeadLetter> for DeadLetterView {
    fn from(d: DeadLetter) -> Self {
        Self {
            class: d.class.as_str(),
            id: d.id,
            job_id: d.job_id,
            tenant: d.tenant,
            reason: d.reason,
            failed_at: d.failed_at,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct DeadLetters {
    /// How many dead letters match the filter, up to `upto`.
    pub(crate) matching: usize,
    /// The newest dead letter when counted: "all matching" means up to this one.
    pub(crate) upto: Option<String>,
    pub(crate) dead_letters: Vec<DeadLetterView>,
    /// Pass as `after` for the next page; `None` on the last.
    pub(crate) next: Option<String>,
    /// How many stream shards there are (`SUMMARYD_STREAM_SHARDS`): with more than one,
    /// the page lists one shard's dead letters at a time and offers the others.
    pub(crate) shards: usize,
}

fn duration(fields: &Fields, name: &str) -> Result<Option<Duration>, ConsoleError> {
    fields
        .get(name)
        .map(|text| {
            crate::domain::parse_duration(text)
                .map_err(|e| ConsoleError::BadInput(format!("{name}: {e}")))
        })
        .transpose()
}

/// The filter in a query string or form: `tenant`, `class`, `older_than`, `newer_than`.
pub(crate) fn filter(fields: &Fields) -> Result<DeadLetterFilter, ConsoleError> {
    let class = fields
        .get("class")
        .map(|raw| {
            ReasonClass::parse(raw).ok_or_else(|| {
                let known: Vec<&str> = ReasonClass::ALL.iter().map(|c| c.as_str()).collect();
                ConsoleError::BadInput(format!(
                    "class: unknown reason class {raw:?}; one of {}",
                    known.join(", ")
                ))
            })
        })
        .transpose()?;
    Ok(DeadLetterFilter {
        tenant: fields.get("tenant").map(str::to_owned),
        class,
        older_than: duration(fields, "older_than")?,
        newer_than: duration(fields, "newer_than")?,
    })
}

/// The filter as query-string fields, to carry it through forms and links.
fn filter_fields(fields: &Fields) -> Vec<(&'static str, String)> {
    // The shard travels with the filter: every page, confirmation and bulk run of a
    // listing acts on the shard it shows.
    ["tenant", "class", "older_than", "newer_than", "shard"]
        .into_iter()
        .filter_map(|name| fields.get(name).map(|v| (name, v.to_owned())))
        .collect()
}

fn describe(fields: &Fields) -> String {
    let parts: Vec<String> = filter_fields(fields)
        .into_iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    if parts.is_empty() {
        "every dead letter".into()
    } else {
        parts.join(", ")
    }
}

pub(crate) async fn load(console: &Console, fields: &Fields) -> Result<DeadLetters, ConsoleError> {
    let filter = filter(fields)?;
    let keys = console.keys.get(super::shard(console, fields)?);
    let mut conn = console.redis.get().await?;
    let upto = dead_letters::newest_id(&mut conn, keys).await?;
    let matching = match &upto {
        Some(upto) => dead_letters::count_matching(&mut conn, keys, &filter, upto).await?,
        None => 0,
    };
    let (page, next) =
        dead_letters::list_matching(&mut conn, keys, &filter, fields.get("after"), PAGE).await?;
    Ok(DeadLetters {
        matching,
        upto,
        dead_letters: page.into_iter().map(DeadLetterView::from).collect(),
        next,
        shards: console.keys.count(),
    })
}

fn query(pairs: &[(&str, String)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        q.append_pair(k, v);
    }
    q.finish()
}

fn hidden_filter(fields: &Fields) -> Markup {
    html! {
        @for (name, value) in filter_fields(fields) {
            input type="hidden" name=(name) value=(value);
        }
    }
}

pub(crate) fn render(d: &DeadLetters, fields: &Fields, who: &Who) -> Markup {
    let class = fields.get("class").unwrap_or("");
    let next_page = d.next.as_ref().map(|next| {
        let mut pairs = filter_fields(fields);
        pairs.push(("after", next.clone()));
        format!("{}?{}", paths::DEAD_LETTERS, query(&pairs))
    });
    html! {
        form.filters method="get" action=(paths::DEAD_LETTERS) {
            label for="f-tenant" { "Tenant" input #f-tenant type="text" name="tenant" value=(fields.get("tenant").unwrap_or("")); }
            label for="f-class" { "Reason class"
                select #f-class name="class" {
                    option value="" selected[class.is_empty()] { "any" }
                    @for c in ReasonClass::ALL {
                        option value=(c.as_str()) selected[class == c.as_str()] { (c.as_str()) }
                    }
                }
            }
            label for="f-older" { "Older than (e.g. 2h)" input #f-older type="text" name="older_than" value=(fields.get("older_than").unwrap_or("")); }
            label for="f-newer" { "Newer than (e.g. 7d)" input #f-newer type="text" name="newer_than" value=(fields.get("newer_than").unwrap_or("")); }
            @if d.shards > 1 {
                @let shard = fields.get("shard").unwrap_or("0");
                label for="f-shard" { "Shard"
                    select #f-shard name="shard" {
                        @for s in 0..d.shards {
                            @let s = s.to_string();
                            option value=(s) selected[shard == s] { (s) }
                        }
                    }
                }
            }
            button type="submit" { "Filter" }
        }
        p { strong { (d.matching) } " dead letter(s) match (" (describe(fields)) ")." }
        @if d.dead_letters.is_empty() {
            p.muted { "Nothing to show." }
        } @else {
            form method="post" action={ (paths::DEAD_LETTERS) "/confirm" } {
                (layout::csrf(who))
                (hidden_filter(fields))
                @if let Some(upto) = &d.upto { input type="hidden" name="upto" value=(upto); }
                table {
                    caption.visually-hidden { "Dead letters" }
                    thead { tr {
                        @if who.is_operator() {
                            th scope="col" { input #select-all type="checkbox" data-select-all aria-label="Select every dead letter on this page"; }
                        }
                        th scope="col" { "Job" } th scope="col" { "Tenant" } th scope="col" { "Class" }
                        th scope="col" { "Reason" } th scope="col" { "Failed at" }
                    } }
                    tbody {
                        @for x in &d.dead_letters {
                            tr {
                                @if who.is_operator() {
                                    td { input type="checkbox" name="id" value=(x.id) aria-label={ "Select job " (x.job_id) }; }
                                }
                                td { a.mono href={ (paths::JOBS) "/" (x.job_id) } { (x.job_id) } }
                                td { (x.tenant) }
                                td { code { (x.class) } }
                                td { (x.reason) }
                                td.when { (x.failed_at) }
                            }
                        }
                    }
                }
                @if who.is_operator() {
                    div.actions {
                        button type="submit" name="do" value="replay-selected" { "Replay selected" }
                        button.danger type="submit" name="do" value="purge-selected" { "Purge selected" }
                        button type="submit" name="do" value="replay-all" { "Replay all " (d.matching) " matching" }
                        button.danger type="submit" name="do" value="purge-all" { "Purge all " (d.matching) " matching" }
                    }
                }
            }
            @if let Some(next) = &next_page {
                p { a href=(next) { "Next page" } }
            }
        }
    }
}

pub(crate) async fn page(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let who = &signed.who;
    let fields = super::query(&req);
    let data = load(&console, &fields).await?;
    Ok(signed.page(
        "Dead letters",
        paths::DEAD_LETTERS,
        render(&data, &fields, who),
    ))
}

/// What a confirmed form asks for: the action and whether it is the ticked ids or all
/// matching.
pub(crate) fn requested(fields: &Fields) -> Result<(BulkAction, bool), ConsoleError> {
    match fields.require("do")? {
        "replay-selected" => Ok((BulkAction::Replay, false)),
        "purge-selected" => Ok((BulkAction::Purge, false)),
        "replay-all" => Ok((BulkAction::Replay, true)),
        "purge-all" => Ok((BulkAction::Purge, true)),
        other => Err(ConsoleError::BadInput(format!(
            "do: unknown action {other:?}; one of replay-selected, purge-selected, replay-all, purge-all"
        ))),
    }
}

fn verb(action: BulkAction) -> &'static str {
    match action {
        BulkAction::Replay => "Replay",
        BulkAction::Purge => "Purge",
    }
}

/// The confirmation: how many dead letters the action will touch, and a run id chosen now,
/// so a second click on "Confirm" finds the run the first one started.
pub(crate) async fn confirm(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, fields) = change_form(&req, &console, &body).await?;
    let (action, all) = requested(&fields)?;
    let ids = fields.all("id");
    let count = if all {
        let filter = filter(&fields)?;
        let upto = fields.require("upto")?;
        let keys = console.keys.get(super::shard(&console, &fields)?);
        let mut conn = console.redis.get().await?;
        dead_letters::count_matching(&mut conn, keys, &filter, upto).await?
    } else {
        if ids.is_empty() {
            return Err(ConsoleError::BadInput(
                "tick at least one dead letter, or use the \"all matching\" buttons".into(),
            ));
        }
        ids.len()
    };
    let run_id = uuid::Uuid::new_v4().to_string();
    let signed = super::Signed {
        paused: super::paused(&console).await?,
        who,
    };
    let who = &signed.who;
    let what = if all {
        format!("all {count} dead letter(s) matching {}", describe(&fields))
    } else {
        format!("the {count} selected dead letter(s)")
    };
    let content = html! {
        p { (verb(action)) " " strong { (what) } "?" }
        @match action {
            BulkAction::Replay => p.muted { "Each goes back on the job stream with the same job id, so it cannot make a second summary or email." },
            BulkAction::Purge => p.muted { "Each is removed with its job state, for good." },
        }
        form method="post" action=(paths::RUNS) {
            (layout::csrf(who))
            input type="hidden" name="run_id" value=(run_id);
            input type="hidden" name="action" value=(if action == BulkAction::Replay { "replay" } else { "purge" });
            @if all {
                input type="hidden" name="all" value="1";
                (hidden_filter(&fields))
                input type="hidden" name="upto" value=(fields.get("upto").unwrap_or(""));
            } @else {
                @for id in &ids { input type="hidden" name="id" value=(id); }
            }
            div.actions {
                button type="submit" { "Confirm: " (verb(action)) " " (count) }
                a href=(paths::DEAD_LETTERS) { "Cancel" }
            }
        }
    };
    Ok(signed.page(
        &format!("{} dead letters", verb(action)),
        paths::DEAD_LETTERS,
        content,
    ))
}
