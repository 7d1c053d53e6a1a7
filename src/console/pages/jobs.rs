//! One job's whole story: where it is, every model call it made, its email and webhook
//! rows, its dead letter; and the actions that fit (replay a dead-lettered job, retry a
//! stuck row).

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Serialize;

use super::dead_letters::DeadLetterView;
use super::{change_form, see_other, signed_in};
use crate::console::access::Who;
use crate::console::error::ConsoleError;
use crate::console::form::Fields;
use crate::console::{Action, Console, layout, paths};
use crate::db::outbox::JobOutboxRow;
use crate::domain::{IdempotencyKey, JobId, ModelCall, TenantId};
use crate::stream::dead_letters::{self, DeadLetterFilter, ReplayOutcome};
use crate::stream::job_state;

/// Dead letters read per page while looking for one job's.
const SCAN_PAGE: usize = 500;

#[derive(Debug, Serialize)]
pub(crate) struct JobDetail {
    pub(crate) job_id: String,
    pub(crate) tenant: Option<String>,
    /// `done`, `queued`, `failed` (dead-lettered) or `unknown` (only its model calls or
    /// outbox rows are left; a job with no trace at all is a 404).
    pub(crate) status: &'static str,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) completed_at: Option<DateTime<Utc>>,
    /// What GET tells the tenant about a failure.
    pub(crate) error: Option<String>,
    /// The last failed delivery's reason while the job is still queued.
    pub(crate) last_failure: Option<String>,
    /// Deliveries that reached the model so far (the highest delivery number of its calls).
    pub(crate) deliveries: Option<u32>,
    pub(crate) model: Option<String>,
    pub(crate) parts: Option<i32>,
    /// Operators only; `None` for viewers, and once retention removed the text.
    pub(crate) summary: Option<String>,
    pub(crate) model_calls: Vec<ModelCall>,
    /// The job's outbox rows: its email and webhook deliveries.
    pub(crate) outbox: Vec<JobOutboxRow>,
    pub(crate) dead_letter: Option<DeadLetterView>,
}

/// The dead letter of `job_id`, if it has one: the dead-letter stream is bounded
/// (retention), so a scan in pages is cheap enough for a person's lookup.
pub(crate) async fn dead_letter_of(
    console: &Console,
    job_id: JobId,
) -> Result<Option<DeadLetterView>, ConsoleError> {
    Ok(dead_letter_in_shards(console, job_id)
        .await?
        .map(|(_, found)| found))
}

/// The job's dead letter and the shard it is in: each shard's dead letters in turn.
async fn dead_letter_in_shards(
    console: &Console,
    job_id: JobId,
) -> Result<Option<(u16, DeadLetterView)>, ConsoleError> {
    let mut conn = console.redis.get().await?;
    let wanted = job_id.to_string();
    let everything = DeadLetterFilter::default();
    for keys in console.keys.all() {
        let mut after: Option<String> = None;
        loop {
            let (page, next) = dead_letters::list_matching(
                &mut conn,
                keys,
                &everything,
                after.as_deref(),
                SCAN_PAGE,
            )
            .await?;
            if let Some(found) = page.into_iter().find(|d| d.job_id == wanted) {
                return Ok(Some((keys.shard(), found.into())));
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(None)
}

pub(crate) async fn load(
    console: &Console,
    job_id: JobId,
    who: &Who,
) -> Result<JobDetail, ConsoleError> {
    // State before summary, as GET reads them: a job acknowledged in between is found by
    // the second read.
    let state = {
        let mut conn = console.redis.get().await?;
        let mut found = None;
        for keys in console.keys.all() {
            found = job_state::get(&mut conn, keys, job_id).await?;
            if found.is_some() {
                break;
            }
        }
        found
    };
    let summary = crate::db::summaries::find(&console.pg, job_id).await?;
    let model_calls = crate::db::model_calls::for_job(&console.pg, &job_id).await?;
    let outbox = crate::db::outbox::for_job(&console.pg, &job_id).await?;
    let dead_letter = dead_letter_of(console, job_id).await?;
    let deliveries = model_calls.iter().map(|c| c.delivery).max();
    let mut detail = JobDetail {
        job_id: job_id.to_string(),
        tenant: None,
        status: "unknown",
        created_at: None,
        completed_at: None,
        error: None,
        last_failure: None,
        deliveries,
        model: None,
        parts: None,
        summary: None,
        model_calls,
        outbox,
        dead_letter,
    };
    if let Some(row) = summary {
        detail.status = "done";
        detail.tenant = Some(row.tenant);
        detail.created_at = Some(row.created_at);
        detail.completed_at = Some(row.completed_at);
        detail.model = row.model;
        detail.parts = row.parts;
        if who.is_operator() {
            detail.summary = row.summary;
        }
    } else if let Some(state) = state {
        detail.status = state.status.as_str();
        detail.tenant = Some(state.tenant);
        detail.created_at = state.created_at;
        detail.error = state.error;
        detail.last_failure = state.last_failure;
    } else if let Some(dead) = &detail.dead_letter {
        detail.status = job_state::Status::Failed.as_str();
        detail.tenant = Some(dead.tenant.clone());
    } else if detail.model_calls.is_empty() && detail.outbox.is_empty() {
        return Err(ConsoleError::NotFound(format!(
            "no trace of job {job_id}: never accepted, purged, or its records expired"
        )));
    }
    Ok(detail)
}

fn search_form(fields: &Fields) -> Markup {
    html! {
        h2 { "Find a job" }
        form.filters method="get" action=(paths::JOBS) {
            label for="s-job" { "Job id" input #s-job type="search" name="job_id" value=(fields.get("job_id").unwrap_or("")) size="38"; }
            button type="submit" { "Find by id" }
        }
        form.filters method="get" action=(paths::JOBS) {
            label for="s-tenant" { "Tenant" input #s-tenant type="text" name="tenant" value=(fields.get("tenant").unwrap_or("")); }
            label for="s-key" { "Idempotency-Key" input #s-key type="search" name="key" value=(fields.get("key").unwrap_or("")); }
            button type="submit" { "Find by key" }
        }
    }
}

/// `/console/jobs`: the search form, or the job it finds.
pub(crate) async fn search(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let fields = super::query(&req);
    let mut message = None;
    if let Some(raw) = fields.get("job_id") {
        match raw.parse::<JobId>() {
            Ok(job_id) => return Ok(see_other(&format!("{}/{job_id}", paths::JOBS))),
            Err(_) => message = Some(format!("{raw:?} is not a job id (a UUID).")),
        }
    } else if let (Some(tenant), Some(key)) = (fields.get("tenant"), fields.get("key")) {
        match found_by_key(&console, tenant, key).await? {
            Ok(job_id) => return Ok(see_other(&format!("{}/{job_id}", paths::JOBS))),
            Err(why) => message = Some(why),
        }
    }
    let content = html! {
        @if let Some(m) = &message { p.error role="alert" { (m) } }
        (search_form(&fields))
        p.muted { "A key finds its job while its idempotency record lives (SUMMARYD_IDEMPOTENCY_RESULT_TTL_S)." }
    };
    Ok(signed.page("Jobs", paths::JOBS, content))
}

/// The job `tenant`'s request with Idempotency-Key `key` made, or why there is none.
pub(crate) async fn found_by_key(
    console: &Console,
    tenant: &str,
    key: &str,
) -> Result<Result<JobId, String>, ConsoleError> {
    let tenant = match TenantId::parse(tenant) {
        Ok(t) => t,
        Err(e) => return Ok(Err(format!("tenant: {e}"))),
    };
    let key = match IdempotencyKey::parse(key) {
        Ok(k) => k,
        Err(e) => return Ok(Err(format!("Idempotency-Key: {e}"))),
    };
    let mut conn = console.redis.get().await?;
    let keys = console.keys.of_tenant(tenant.as_str());
    match crate::api::idempotency::job_of(&mut conn, keys, &tenant, &key).await {
        Ok(Some(job_id)) => Ok(Ok(job_id)),
        Ok(None) => Ok(Err(format!(
            "No job of tenant {} has Idempotency-Key {:?} (or its record expired).",
            tenant.as_str(),
            key.as_str()
        ))),
        Err(e) => Err(ConsoleError::Internal(e.to_string())),
    }
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "—".into(), |v| v.to_string())
}

pub(crate) fn render(job: &JobDetail, who: &Who) -> Markup {
    let status_class = if job.status == "done" {
        "status-done"
    } else if job.status == job_state::Status::Failed.as_str() {
        "status-failed"
    } else {
        ""
    };
    html! {
        dl.cards {
            div { dt { "Status" } dd class=(status_class) { (job.status) } }
            div { dt { "Tenant" } dd { (opt(job.tenant.as_deref())) } }
            div { dt { "Deliveries so far" } dd { (opt(job.deliveries)) } }
            div { dt { "Model" } dd { (opt(job.model.as_deref())) } }
        }
        table {
            caption.visually-hidden { "Job facts" }
            tbody {
                tr { th scope="row" { "Job id" } td.mono { (job.job_id) } }
                tr { th scope="row" { "Accepted" } td { (opt(job.created_at.as_ref().map(layout::time))) } }
                tr { th scope="row" { "Completed" } td { (opt(job.completed_at.as_ref().map(layout::time))) } }
                @if let Some(parts) = job.parts { tr { th scope="row" { "Parts" } td { (parts) } } }
                @if let Some(e) = &job.error { tr { th scope="row" { "Error (as the tenant sees it)" } td { (e) } } }
                @if let Some(e) = &job.last_failure { tr { th scope="row" { "Last failed delivery" } td { (e) } } }
            }
        }
        @if let Some(dead) = &job.dead_letter {
            h2 { "Dead letter" }
            p { "Dead-lettered at " (dead.failed_at) " (class " code { (dead.class) } "): " (dead.reason) }
            @if who.is_operator() {
                form method="post" action={ (paths::JOBS) "/" (job.job_id) "/replay" } {
                    (layout::csrf(who))
                    button type="submit" { "Replay this job" }
                }
            }
        }
        h2 { "Model calls" }
        @if job.model_calls.is_empty() {
            p.muted { "No model call recorded." }
        } @else {
            table {
                caption.visually-hidden { "Model calls" }
                thead { tr {
                    th.num scope="col" { "Delivery" } th scope="col" { "Provider" } th scope="col" { "Model" }
                    th.num scope="col" { "Prompt tokens" } th.num scope="col" { "Completion tokens" }
                    th.num scope="col" { "Duration" } th scope="col" { "Error" } th scope="col" { "At" }
                } }
                tbody {
                    @for c in &job.model_calls {
                        tr {
                            td.num { (c.delivery) }
                            td { (c.provider) }
                            td { (c.model) }
                            td.num { (opt(c.prompt_tokens)) }
                            td.num { (opt(c.completion_tokens)) }
                            td.num { (c.duration_ms) " ms" }
                            td { (opt(c.error_class.as_deref())) }
                            td.when { (layout::time(&c.at)) }
                        }
                    }
                }
            }
        }
        h2 { "Emails and webhooks" }
        @if job.outbox.is_empty() {
            p.muted { "No outbox row (none yet, or removed by retention after sending)." }
        }
        @if !job.outbox.is_empty() {
            table {
                caption.visually-hidden { "Outbox rows" }
                thead { tr {
                    th.num scope="col" { "Row" } th scope="col" { "Topic" } th scope="col" { "Dedupe key" }
                    th.num scope="col" { "Failed attempts" } th scope="col" { "Last status" } th scope="col" { "Last error" }
                    th scope="col" { "Created" } th scope="col" { "Sent" } th scope="col" { "Next attempt" } th scope="col" { "State" }
                } }
                tbody {
                    @for r in &job.outbox {
                        tr {
                            td.num { (r.id) }
                            td { code { (r.topic) } }
                            td.mono { (r.dedupe_key) }
                            td.num { (r.attempts) }
                            td { (opt(r.last_status)) }
                            td { (opt(r.last_error.as_deref())) }
                            td.when { (layout::time(&r.created_at)) }
                            td.when { (opt(r.sent_at.as_ref().map(layout::time))) }
                            td.when { (opt(r.next_attempt_at.as_ref().map(layout::time))) }
                            td {
                                @if r.sent_at.is_some() { "sent" }
                                @else if r.skipped_at.is_some() { "skipped (endpoint disabled)" }
                                @else if r.failed_at.is_some() {
                                    "stuck"
                                    @if who.is_operator() {
                                        form.inline method="post" action={ (paths::OUTBOX) "/retry" } {
                                            (layout::csrf(who))
                                            input type="hidden" name="id" value=(r.id);
                                            input type="hidden" name="return_to" value={ (paths::JOBS) "/" (job.job_id) };
                                            " " button type="submit" aria-label={ "Retry outbox row " (r.id) } { "Retry" }
                                        }
                                    }
                                }
                                @else { "pending" }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(summary) = &job.summary {
            h2 { "Summary" }
            pre.summary { (summary) }
        }
        p { a href=(paths::JOBS) { "Find another job" } }
    }
}

fn job_id_of(req: &HttpRequest) -> Result<JobId, ConsoleError> {
    let raw = req.match_info().get("job_id").unwrap_or_default();
    raw.parse()
        .map_err(|_| ConsoleError::BadInput(format!("{raw:?} is not a job id (a UUID)")))
}

pub(crate) async fn page(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let who = &signed.who;
    let job_id = job_id_of(&req)?;
    let job = load(&console, job_id, who).await?;
    Ok(signed.page(&format!("Job {job_id}"), paths::JOBS, render(&job, who)))
}

/// Replay a dead-lettered job: back on the stream with the same job id. A second click
/// finds no dead letter and changes nothing.
pub(crate) async fn apply_replay(
    console: &Console,
    who: &Who,
    job_id: JobId,
) -> Result<bool, ConsoleError> {
    let Some((shard, dead)) = dead_letter_in_shards(console, job_id).await? else {
        return Ok(false);
    };
    let mut conn = console.redis.get().await?;
    match dead_letters::replay(&mut conn, console.keys.get(shard), &dead.id)
        .await
        .map_err(|e| ConsoleError::Internal(e.to_string()))?
    {
        ReplayOutcome::Replayed { .. } => {
            console.record(who, Action::Replay, &format!("job {job_id}"));
            Ok(true)
        }
        ReplayOutcome::NotFound => Ok(false),
    }
}

pub(crate) async fn replay(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, _) = change_form(&req, &console, &body).await?;
    let job_id = job_id_of(&req)?;
    apply_replay(&console, &who, job_id).await?;
    Ok(see_other(&format!("{}/{job_id}", paths::JOBS)))
}
