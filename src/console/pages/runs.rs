//! Bulk runs: start one from a confirmation, follow its progress, resume one whose process
//! stopped. A run is idempotent by its id and resumable from its saved cursor
//! (`stream::bulk`), so neither a double click nor a crash replays anything twice.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};

use super::{change_form, see_other, signed_in};
use crate::console::access::Who;
use crate::console::error::ConsoleError;
use crate::console::form::Fields;
use crate::console::{Action, Console, layout, paths};
use crate::stream::bulk::{self, BulkAction, BulkError, BulkRun, Selection};

impl From<BulkError> for ConsoleError {
    fn from(e: BulkError) -> Self {
        match e {
            BulkError::Redis(e) => Self::Redis(e),
            BulkError::InvalidRunId(id) => Self::NotFound(format!("no bulk run {id:?}")),
            other => Self::Internal(other.to_string()),
        }
    }
}

pub(crate) fn action(fields: &Fields) -> Result<BulkAction, ConsoleError> {
    match fields.require("action")? {
        "replay" => Ok(BulkAction::Replay),
        "purge" => Ok(BulkAction::Purge),
        other => Err(ConsoleError::BadInput(format!(
            "action: {other:?} is neither replay nor purge"
        ))),
    }
}

/// The run a confirmed form describes.
pub(crate) fn selection(fields: &Fields) -> Result<Selection, ConsoleError> {
    if fields.get("all").is_some() {
        Ok(Selection::Matching {
            filter: super::dead_letters::filter(fields)?,
            upto: fields.get("upto").map(str::to_owned),
        })
    } else {
        let ids: Vec<String> = fields.all("id").into_iter().map(str::to_owned).collect();
        if ids.is_empty() {
            return Err(ConsoleError::BadInput("no dead letter was selected".into()));
        }
        Ok(Selection::Ids(ids))
    }
}

/// Start the run (or find the one a first click started) and work it on a task of this
/// process; if its process stopped, this resumes it.
pub(crate) async fn start_run(
    console: &Console,
    who: &Who,
    run_id: &str,
    action: BulkAction,
    selection: Selection,
    shard: u16,
) -> Result<BulkRun, ConsoleError> {
    let mut conn = console.redis.get().await?;
    let existing = bulk::get(&mut conn, console.keys.global(), run_id).await?;
    let run = bulk::start(
        &mut conn,
        console.keys.get(shard),
        run_id,
        action,
        selection,
        &who.name,
    )
    .await?;
    if existing.is_none() {
        let touched = format!("bulk run {run_id}: {} dead letter(s)", run.total);
        console.record(
            who,
            match action {
                BulkAction::Replay => Action::Replay,
                BulkAction::Purge => Action::Purge,
            },
            &touched,
        );
    }
    if !run.is_finished() && !bulk::is_worked(&mut conn, console.keys.global(), run_id).await? {
        work(console.clone(), run_id.to_owned(), run.shard);
    }
    Ok(run)
}

/// Work the run to its end on its own task: the request that started it returns at once.
fn work(console: Console, run_id: String, shard: u16) {
    tokio::spawn(async move {
        let result = async {
            let mut conn = console.redis.get().await?;
            Ok::<_, ConsoleError>(
                bulk::run_to_end(
                    &mut conn,
                    console.keys.get(shard),
                    &run_id,
                    bulk::DEFAULT_PAGE,
                )
                .await?,
            )
        }
        .await;
        match result {
            Ok(run) => tracing::info!(run = %run_id, done = run.done, skipped = run.skipped,
                failed = run.failed, "console bulk run finished"),
            Err(e) => tracing::warn!(run = %run_id, error = %e,
                "console bulk run stopped; its page can resume it"),
        }
    });
}

pub(crate) async fn start(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, fields) = change_form(&req, &console, &body).await?;
    let run_id = fields.require("run_id")?.to_owned();
    let global = console.keys.global();
    let run = match bulk::get(&mut console.redis.get().await?, global, &run_id).await? {
        // A resume, or a second click: the stored run decides what happens.
        Some(run) => {
            start_run(
                &console,
                &who,
                &run_id,
                run.action,
                run.selection,
                run.shard,
            )
            .await?
        }
        None => {
            start_run(
                &console,
                &who,
                &run_id,
                action(&fields)?,
                selection(&fields)?,
                super::shard(&console, &fields)?,
            )
            .await?
        }
    };
    Ok(see_other(&format!("{}/{}", paths::RUNS, run.id)))
}

pub(crate) async fn load(console: &Console, run_id: &str) -> Result<(BulkRun, bool), ConsoleError> {
    let mut conn = console.redis.get().await?;
    let run = bulk::get(&mut conn, console.keys.global(), run_id)
        .await?
        .ok_or_else(|| {
            ConsoleError::NotFound(format!("no bulk run {run_id:?} (runs are kept 7 days)"))
        })?;
    let worked = bulk::is_worked(&mut conn, console.keys.global(), run_id).await?;
    Ok((run, worked))
}

pub(crate) fn render(run: &BulkRun, worked: bool, who: &Who) -> Markup {
    let verb = match run.action {
        BulkAction::Replay => "Replay",
        BulkAction::Purge => "Purge",
    };
    let dealt = run.done + run.skipped + run.failed;
    html! {
        div data-run-status={ "/console/api/runs/" (run.id) } data-finished=(run.is_finished()) {
            p { (verb) " of " (run.total) " dead letter(s), started by " (run.started_by) " at " (layout::time(&run.started_at)) "." }
            label for="run-progress" { "Progress" }
            progress #run-progress data-run-progress max=(run.total.max(1)) value=(dealt) { (dealt) " of " (run.total) }
            p data-run-text aria-live="polite" {
                (run.done) " done, " (run.skipped) " already gone, " (run.failed) " failed of " (run.total)
                @if run.is_finished() { " (finished)" } @else { " (running)" }
            }
            @if let Some(at) = &run.finished_at { p { "Finished at " (layout::time(at)) "." } }
            @if !run.is_finished() && !worked {
                p.notice { "No process is working this run (the one that started it stopped)." }
                @if who.is_operator() {
                    form method="post" action=(paths::RUNS) {
                        (layout::csrf(who))
                        input type="hidden" name="run_id" value=(run.id);
                        button type="submit" { "Resume the run" }
                    }
                }
            }
            @if !run.is_finished() && worked {
                p.muted { "This page follows the run by itself with JavaScript; without it, " a href={ (paths::RUNS) "/" (run.id) } { "reload" } " to see progress." }
            }
            p { a href=(paths::DEAD_LETTERS) { "Back to the dead letters" } }
        }
    }
}

pub(crate) async fn page(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let who = &signed.who;
    let run_id = req.match_info().get("run_id").unwrap_or_default();
    let (run, worked) = load(&console, run_id).await?;
    Ok(signed.page("Bulk run", paths::DEAD_LETTERS, render(&run, worked, who)))
}
