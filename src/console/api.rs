//! `/console/api/`: the data of every page as JSON, and the same actions, for scripts. A
//! user's API token (`token_sha256` in the users file) or a browser session authenticates;
//! a session's changes need the `X-CSRF-Token` header. Bodies of changes are JSON objects
//! with the same fields the pages' forms send.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use super::Console;
use super::access::{self, Who};
use super::error::{ApiFailure, ConsoleError};
use super::form::Fields;
use super::pages::{dead_letters, jobs, outbox, overview, pause, runs, tenants};
use crate::domain::JobId;
use crate::stream::bulk::BulkRun;

type Answer = Result<HttpResponse, ApiFailure>;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/api")
            .route("/overview", web::get().to(get_overview))
            .route("/jobs", web::get().to(find_job))
            .route("/jobs/{job_id}", web::get().to(get_job))
            .route("/jobs/{job_id}/replay", web::post().to(replay_job))
            .route("/dead-letters", web::get().to(get_dead_letters))
            .route("/runs", web::post().to(start_run))
            .route("/runs/{run_id}", web::get().to(get_run))
            .route("/outbox", web::get().to(get_outbox))
            .route("/outbox/retry", web::post().to(retry_outbox))
            .route("/tenants", web::get().to(get_tenants))
            .route("/pause", web::get().to(get_pause))
            .route("/pause", web::post().to(post_pause))
            .route("/resume", web::post().to(post_resume))
            .default_service(web::to(|| async {
                Err::<HttpResponse, _>(ApiFailure(ConsoleError::NotFound(
                    "no such console API route; see docs/console.md".into(),
                )))
            })),
    );
}

fn json<T: Serialize>(value: &T) -> HttpResponse {
    HttpResponse::Ok().json(value)
}

async fn reader(req: &HttpRequest, console: &Console) -> Result<Who, ConsoleError> {
    access::who(req, console, true).await
}

/// A change's body, a JSON object, as the fields its form would send: arrays become
/// repeated fields, so one parser serves both.
pub(crate) fn body_fields(body: &[u8]) -> Result<Fields, ConsoleError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Fields::default());
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ConsoleError::BadInput(format!("the body must be a JSON object: {e}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| ConsoleError::BadInput("the body must be a JSON object".into()))?;
    let scalar = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(true) => Some("1".into()),
        _ => None,
    };
    let mut pairs = Vec::new();
    for (name, value) in object {
        // `ids` in JSON is `id` repeated in a form.
        let field = if name == "ids" { "id" } else { name.as_str() };
        match value {
            serde_json::Value::Array(items) => {
                pairs.extend(
                    items
                        .iter()
                        .filter_map(scalar)
                        .map(|v| (field.to_owned(), v)),
                );
            }
            other => pairs.extend(scalar(other).map(|v| (field.to_owned(), v))),
        }
    }
    let mut encoded = url::form_urlencoded::Serializer::new(String::new());
    encoded.extend_pairs(pairs);
    Ok(Fields::parse(encoded.finish().as_bytes()))
}

async fn changer(
    req: &HttpRequest,
    console: &Console,
    body: &web::Bytes,
) -> Result<(Who, Fields), ConsoleError> {
    let who = reader(req, console).await?;
    let fields = body_fields(body)?;
    who.may_change(req, &fields)?;
    Ok((who, fields))
}

fn query(req: &HttpRequest) -> Fields {
    Fields::parse(req.query_string().as_bytes())
}

async fn get_overview(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    Ok(json(&overview::load(&console).await?))
}

fn job_id(req: &HttpRequest) -> Result<JobId, ConsoleError> {
    let raw = req.match_info().get("job_id").unwrap_or_default();
    raw.parse()
        .map_err(|_| ConsoleError::BadInput(format!("{raw:?} is not a job id (a UUID)")))
}

async fn get_job(req: HttpRequest, console: web::Data<Console>) -> Answer {
    let who = reader(&req, &console).await?;
    Ok(json(&jobs::load(&console, job_id(&req)?, &who).await?))
}

/// `?tenant=T&key=K`: the job that key made, as `{"job_id": …}`.
async fn find_job(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    let fields = query(&req);
    let tenant = fields.require("tenant")?;
    let key = fields.require("key")?;
    match jobs::found_by_key(&console, tenant, key).await? {
        Ok(job_id) => Ok(json(&serde_json::json!({ "job_id": job_id.to_string() }))),
        Err(why) => Err(ConsoleError::NotFound(why).into()),
    }
}

async fn replay_job(req: HttpRequest, console: web::Data<Console>, body: web::Bytes) -> Answer {
    let (who, _) = changer(&req, &console, &body).await?;
    let replayed = jobs::apply_replay(&console, &who, job_id(&req)?).await?;
    Ok(json(&serde_json::json!({ "replayed": replayed })))
}

async fn get_dead_letters(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    Ok(json(&dead_letters::load(&console, &query(&req)).await?))
}

#[derive(Serialize)]
struct RunView {
    #[serde(flatten)]
    run: BulkRun,
    finished: bool,
    /// A process is working the run now; a running run nobody works can be resumed by
    /// posting its `run_id` again.
    worked: bool,
}

/// Start a bulk run: `{"run_id"?, "action": "replay"|"purge", "ids": [...]}` or
/// `{"action", "all": true, "tenant"?, "class"?, "older_than"?, "newer_than"?, "upto"?}`.
/// Posting an existing `run_id` returns that run (and resumes it if nobody works it).
async fn start_run(req: HttpRequest, console: web::Data<Console>, body: web::Bytes) -> Answer {
    let (who, fields) = changer(&req, &console, &body).await?;
    let run_id = fields
        .get("run_id")
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
    let existing = {
        let mut conn = console.redis.get().await.map_err(ConsoleError::from)?;
        crate::stream::bulk::get(&mut conn, console.keys.global(), &run_id)
            .await
            .map_err(ConsoleError::from)?
    };
    let run = match existing {
        Some(run) => {
            runs::start_run(
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
            let action = runs::action(&fields)?;
            let shard = crate::console::pages::shard(&console, &fields)?;
            runs::start_run(
                &console,
                &who,
                &run_id,
                action,
                runs::selection(&fields)?,
                shard,
            )
            .await?
        }
    };
    let (run, worked) = runs::load(&console, &run.id).await?;
    Ok(HttpResponse::Accepted().json(RunView {
        finished: run.is_finished(),
        run,
        worked,
    }))
}

async fn get_run(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    let run_id = req.match_info().get("run_id").unwrap_or_default();
    let (run, worked) = runs::load(&console, run_id).await?;
    Ok(json(&RunView {
        finished: run.is_finished(),
        run,
        worked,
    }))
}

async fn get_outbox(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    Ok(json(&outbox::load(&console, &query(&req)).await?))
}

/// `{"ids": [...]}` or `{"all": true, "topic"?}`: answers how many rows were made due.
async fn retry_outbox(req: HttpRequest, console: web::Data<Console>, body: web::Bytes) -> Answer {
    let (who, fields) = changer(&req, &console, &body).await?;
    let all = fields.get("all").is_some();
    let ids: Vec<i64> = fields
        .all("id")
        .into_iter()
        .map(|id| {
            id.parse()
                .map_err(|_| ConsoleError::BadInput(format!("ids: {id:?} is not a row number")))
        })
        .collect::<Result<_, _>>()?;
    if !all && ids.is_empty() {
        return Err(ConsoleError::BadInput("give \"ids\" or \"all\": true".into()).into());
    }
    let n = outbox::apply_retry(&console, &who, all, outbox::topic(&fields)?, &ids).await?;
    Ok(json(&serde_json::json!({ "made_due": n })))
}

async fn get_tenants(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    Ok(json(&tenants::load(&console, &query(&req)).await?))
}

async fn get_pause(req: HttpRequest, console: web::Data<Console>) -> Answer {
    reader(&req, &console).await?;
    let paused = super::pages::paused(&console).await?;
    Ok(json(&serde_json::json!({ "paused": paused })))
}

/// `{"reason"?}`: pause (the first pause stays on record while paused).
async fn post_pause(req: HttpRequest, console: web::Data<Console>, body: web::Bytes) -> Answer {
    let (who, fields) = changer(&req, &console, &body).await?;
    let paused = pause::apply_pause(&console, &who, fields.get("reason")).await?;
    Ok(json(&serde_json::json!({ "paused": paused })))
}

async fn post_resume(req: HttpRequest, console: web::Data<Console>, body: web::Bytes) -> Answer {
    let (who, _) = changer(&req, &console, &body).await?;
    let cleared = pause::apply_resume(&console, &who).await?;
    Ok(json(
        &serde_json::json!({ "resumed": cleared.is_some(), "paused": null }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_read_as_form_fields() {
        let f = body_fields(
            br#"{"action":"replay","ids":["1-0","2-0"],"all":true,"n":3,"x":null,"no":false}"#,
        )
        .unwrap();
        assert_eq!(f.get("action"), Some("replay"));
        assert_eq!(f.all("id"), ["1-0", "2-0"]);
        assert_eq!(f.get("all"), Some("1"));
        assert_eq!(f.get("n"), Some("3"));
        assert_eq!(f.get("x"), None);
        assert_eq!(f.get("no"), None);
        assert!(body_fields(b"  ").unwrap().get("action").is_none());
        assert!(
            body_fields(b"[1]")
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        assert!(
            body_fields(b"{")
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
    }
}
