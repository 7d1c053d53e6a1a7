//! Stuck outbox rows (emails and webhooks the relay gave up on), by topic; retry the ticked
//! ones or all that match. A retry touches only rows still stuck and unleased
//! (`db::outbox::retry`), so it can never resend a delivered effect.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Serialize;

use super::{change_form, see_other, signed_in};
use crate::console::access::Who;
use crate::console::error::ConsoleError;
use crate::console::form::Fields;
use crate::console::{Action, Console, layout, paths};
use crate::db::outbox::{self, StuckRow};
use crate::domain::{SummaryReady, WebhookEvent};

/// Rows shown per page.
pub(crate) const PAGE: usize = 100;
const TOPICS: [&str; 2] = [SummaryReady::TOPIC, WebhookEvent::TOPIC];

#[derive(Debug, Serialize)]
pub(crate) struct Outbox {
    pub(crate) topic: Option<String>,
    pub(crate) stuck: u64,
    pub(crate) rows: Vec<StuckRow>,
    pub(crate) offset: usize,
}

pub(crate) fn topic(fields: &Fields) -> Result<Option<&str>, ConsoleError> {
    match fields.get("topic") {
        None => Ok(None),
        Some(t) if TOPICS.contains(&t) => Ok(Some(t)),
        Some(t) => Err(ConsoleError::BadInput(format!(
            "topic: unknown topic {t:?}; one of {}",
            TOPICS.join(", ")
        ))),
    }
}

fn offset(fields: &Fields) -> Result<usize, ConsoleError> {
    fields
        .get("offset")
        .map(|o| {
            o.parse::<usize>().ok().ok_or_else(|| {
                ConsoleError::BadInput(format!("offset: {o:?} is not a whole number"))
            })
        })
        .transpose()
        .map(|o| o.unwrap_or(0))
}

pub(crate) async fn load(console: &Console, fields: &Fields) -> Result<Outbox, ConsoleError> {
    let topic = topic(fields)?;
    let offset = offset(fields)?;
    let stuck = outbox::count_stuck(&console.pg, topic).await?;
    let rows = outbox::stuck_matching(&console.pg, topic, PAGE, offset).await?;
    Ok(Outbox {
        topic: topic.map(str::to_owned),
        stuck,
        rows,
        offset,
    })
}

pub(crate) fn render(o: &Outbox, who: &Who) -> Markup {
    let selected = o.topic.as_deref().unwrap_or("");
    let topic_query = o
        .topic
        .as_deref()
        .map(|t| format!("topic={t}&"))
        .unwrap_or_default();
    html! {
        form.filters method="get" action=(paths::OUTBOX) {
            label for="o-topic" { "Topic"
                select #o-topic name="topic" {
                    option value="" selected[selected.is_empty()] { "every topic" }
                    @for t in TOPICS { option value=(t) selected[selected == t] { (t) } }
                }
            }
            button type="submit" { "Filter" }
        }
        p { strong { (o.stuck) } " stuck row(s)" @if let Some(t) = &o.topic { " of topic " code { (t) } } "." }
        @if o.rows.is_empty() {
            p.muted { "Nothing is stuck." }
        } @else {
            form method="post" action={ (paths::OUTBOX) "/confirm" } {
                (layout::csrf(who))
                @if let Some(t) = &o.topic { input type="hidden" name="topic" value=(t); }
                table {
                    caption.visually-hidden { "Stuck outbox rows" }
                    thead { tr {
                        @if who.is_operator() {
                            th scope="col" { input type="checkbox" data-select-all aria-label="Select every row on this page"; }
                        }
                        th.num scope="col" { "Row" } th scope="col" { "Topic" } th scope="col" { "Job" }
                        th.num scope="col" { "Attempts" } th scope="col" { "Last error" } th scope="col" { "Created" }
                    } }
                    tbody {
                        @for r in &o.rows {
                            tr {
                                @if who.is_operator() {
                                    td { input type="checkbox" name="id" value=(r.id) aria-label={ "Select row " (r.id) }; }
                                }
                                td.num { (r.id) }
                                td { code { (r.topic) } }
                                td { @if let Some(job) = &r.job_id { a.mono href={ (paths::JOBS) "/" (job) } { (job) } } @else { "—" } }
                                td.num { (r.attempts) }
                                td { (r.last_error.as_deref().unwrap_or("—")) }
                                td.when { (layout::time(&r.created_at)) }
                            }
                        }
                    }
                }
                @if who.is_operator() {
                    div.actions {
                        button type="submit" name="do" value="retry-selected" { "Retry selected" }
                        button type="submit" name="do" value="retry-all" { "Retry all " (o.stuck) " matching" }
                    }
                }
            }
            @if ((o.offset + PAGE) as u64) < o.stuck {
                p { a href={ (paths::OUTBOX) "?" (topic_query) "offset=" (o.offset + PAGE) } { "Next page" } }
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
    Ok(signed.page("Outbox", paths::OUTBOX, render(&data, who)))
}

fn ids(fields: &Fields) -> Result<Vec<i64>, ConsoleError> {
    fields
        .all("id")
        .into_iter()
        .map(|id| {
            id.parse()
                .map_err(|_| ConsoleError::BadInput(format!("id: {id:?} is not a row number")))
        })
        .collect()
}

/// How many rows the retry will touch, and a button that does it.
pub(crate) async fn confirm(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, fields) = change_form(&req, &console, &body).await?;
    let topic = topic(&fields)?;
    let all = match fields.require("do")? {
        "retry-all" => true,
        "retry-selected" => false,
        other => {
            return Err(ConsoleError::BadInput(format!(
                "do: unknown action {other:?}; one of retry-selected, retry-all"
            )));
        }
    };
    let ids = ids(&fields)?;
    if !all && ids.is_empty() {
        return Err(ConsoleError::BadInput(
            "tick at least one row, or use \"Retry all matching\"".into(),
        ));
    }
    let count = if all {
        outbox::count_stuck(&console.pg, topic).await?
    } else {
        ids.len() as u64
    };
    let signed = super::Signed {
        paused: super::paused(&console).await?,
        who,
    };
    let who = &signed.who;
    let content = html! {
        p { "Retry " strong { (count) } " stuck row(s)"
            @if all { " (all" @if let Some(t) = topic { " of topic " code { (t) } } ")" } "?" }
        p.muted { "They become due at once, with their attempts counted from zero; a row sent or leased meanwhile is left alone." }
        form method="post" action={ (paths::OUTBOX) "/retry" } {
            (layout::csrf(who))
            @if all {
                input type="hidden" name="all" value="1";
                @if let Some(t) = topic { input type="hidden" name="topic" value=(t); }
            } @else {
                @for id in &ids { input type="hidden" name="id" value=(id); }
            }
            div.actions {
                button type="submit" { "Confirm: retry " (count) }
                a href=(paths::OUTBOX) { "Cancel" }
            }
        }
    };
    Ok(signed.page("Retry outbox rows", paths::OUTBOX, content))
}

/// Retry the rows; `all` retries every stuck row of the topic (or of every topic).
pub(crate) async fn apply_retry(
    console: &Console,
    who: &Who,
    all: bool,
    topic: Option<&str>,
    ids: &[i64],
) -> Result<u64, ConsoleError> {
    let n = if all {
        outbox::retry_matching(&console.pg, topic).await?
    } else {
        outbox::retry(&console.pg, Some(ids)).await?
    };
    let touched = if all {
        format!("all stuck rows of {}", topic.unwrap_or("every topic"))
    } else {
        format!("rows {ids:?}")
    };
    console.record(
        who,
        Action::OutboxRetry,
        &format!("{touched}: {n} made due"),
    );
    Ok(n)
}

pub(crate) async fn retry(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, fields) = change_form(&req, &console, &body).await?;
    let all = fields.get("all").is_some();
    let ids = ids(&fields)?;
    if !all && ids.is_empty() {
        return Err(ConsoleError::BadInput("no row was selected".into()));
    }
    apply_retry(&console, &who, all, topic(&fields)?, &ids).await?;
    // Back where the operator came from, if that is a console page.
    let back = fields
        .get("return_to")
        .filter(|to| to.starts_with("/console/") && !to.contains("//"))
        .unwrap_or(paths::OUTBOX);
    Ok(see_other(back))
}
