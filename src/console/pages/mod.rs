//! The console's pages: each file loads one page's data (the JSON API serves the same
//! value) and renders it. This file holds the routes, signing in and out, and the frame.

use actix_web::http::StatusCode;
use actix_web::http::header::{LOCATION, SET_COOKIE};
use actix_web::{HttpRequest, HttpResponse, web};
use maud::Markup;

use super::Console;
use super::access::{self, Via, Who};
use super::assets;
use super::error::ConsoleError;
use super::form::Fields;
use super::layout::{self, Frame};
use super::paths;
use super::session;
use crate::domain::Pause;

pub(crate) mod dead_letters;
pub(crate) mod jobs;
pub(crate) mod outbox;
pub(crate) mod overview;
pub(crate) mod pause;
pub(crate) mod runs;
pub(crate) mod tenants;

/// Routes relative to `/console`.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("", web::get().to(overview::page))
        .route("/", web::get().to(overview::page))
        .route("/sign-in", web::get().to(sign_in_form))
        .route("/sign-in", web::post().to(sign_in))
        .route("/sign-out", web::post().to(sign_out))
        .route("/static/{name}", web::get().to(assets::serve))
        .route("/jobs", web::get().to(jobs::search))
        .route("/jobs/{job_id}", web::get().to(jobs::page))
        .route("/jobs/{job_id}/replay", web::post().to(jobs::replay))
        .route("/dead-letters", web::get().to(dead_letters::page))
        .route(
            "/dead-letters/confirm",
            web::post().to(dead_letters::confirm),
        )
        .route("/runs", web::post().to(runs::start))
        .route("/runs/{run_id}", web::get().to(runs::page))
        .route("/outbox", web::get().to(outbox::page))
        .route("/outbox/confirm", web::post().to(outbox::confirm))
        .route("/outbox/retry", web::post().to(outbox::retry))
        .route("/tenants", web::get().to(tenants::page))
        .route("/pause", web::get().to(pause::page))
        .route("/pause", web::post().to(pause::pause))
        .route("/resume", web::post().to(pause::resume));
}

/// The signed-in user (from the session cookie) and the pause state every page shows.
pub(crate) struct Signed {
    pub(crate) who: Who,
    pub(crate) paused: Option<Pause>,
}

impl Signed {
    /// `content` in the frame, under the navigation entry `section`.
    pub(crate) fn page(&self, title: &str, section: &'static str, content: Markup) -> HttpResponse {
        layout::page(
            title,
            &frame(&self.who, self.paused.as_ref(), section),
            content,
        )
    }
}

pub(crate) async fn signed_in(
    req: &HttpRequest,
    console: &Console,
) -> Result<Signed, ConsoleError> {
    let who = access::who(req, console, false).await?;
    let paused = paused(console).await?;
    Ok(Signed { who, paused })
}

/// A GET's query string as fields (filters, windows, cursors).
/// The stream shard a dead-letter page or bulk action is about: the form's `shard`
/// (0 when absent, as on a deployment with one shard).
pub(crate) fn shard(console: &Console, fields: &Fields) -> Result<u16, ConsoleError> {
    let Some(raw) = fields.get("shard") else {
        return Ok(0);
    };
    let count = console.keys.count();
    raw.parse::<u16>()
        .ok()
        .filter(|s| usize::from(*s) < count)
        .ok_or_else(|| {
            ConsoleError::BadInput(format!(
                "shard must be a number from 0 to {} (SUMMARYD_STREAM_SHARDS is {count})",
                count - 1
            ))
        })
}

pub(crate) fn query(req: &HttpRequest) -> Fields {
    Fields::parse(req.query_string().as_bytes())
}

pub(crate) async fn paused(console: &Console) -> Result<Option<Pause>, ConsoleError> {
    let mut conn = console.redis.get().await?;
    Ok(crate::stream::pause::current(&mut conn, console.keys.global()).await?)
}

/// A page's frame.
pub(crate) fn frame<'a>(
    who: &'a Who,
    paused: Option<&'a Pause>,
    section: &'static str,
) -> Frame<'a> {
    Frame {
        who,
        paused,
        section,
    }
}

/// Back to `to` after a change: the browser reloads a page instead of re-posting a form.
pub(crate) fn see_other(to: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((LOCATION, to.to_owned()))
        .finish()
}

/// A signed-in browser's form, read and checked: the user may change things and the
/// form carries the session's CSRF token.
pub(crate) async fn change_form(
    req: &HttpRequest,
    console: &Console,
    body: &web::Bytes,
) -> Result<(Who, Fields), ConsoleError> {
    let who = access::who(req, console, false).await?;
    let fields = Fields::parse(body);
    who.may_change(req, &fields)?;
    Ok((who, fields))
}

/// The cookie of the pre-sign-in token that stands in for a session's CSRF token on the
/// sign-in form (a double-submit cookie), so no other site can sign a browser in.
const SIGN_IN_COOKIE: &str = "summaryd_console_sign_in";

fn cookie(req: &HttpRequest, name: &str, value: &str, clear: bool) -> String {
    // Secure wherever the browser reached us over TLS (a TLS-terminating proxy says so in
    // X-Forwarded-Proto / Forwarded); a spoofed header only makes the cookie stricter.
    let secure = req.connection_info().scheme() == "https";
    format!(
        "{name}={value}; Path={}; HttpOnly; SameSite=Strict{}{}",
        paths::HOME,
        if secure { "; Secure" } else { "" },
        if clear { "; Max-Age=0" } else { "" }
    )
}

fn cookie_value(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_owned())
}

fn sign_in_response(req: &HttpRequest, status: StatusCode, error: Option<&str>) -> HttpResponse {
    let token = {
        let bytes: [u8; 24] = rand::random();
        hex::encode(bytes)
    };
    HttpResponse::build(status)
        .insert_header((SET_COOKIE, cookie(req, SIGN_IN_COOKIE, &token, false)))
        .content_type("text/html; charset=utf-8")
        .body(layout::sign_in(error, &token).into_string())
}

pub(crate) async fn sign_in_form(req: HttpRequest) -> HttpResponse {
    sign_in_response(&req, StatusCode::OK, None)
}

/// Check the name and password, within the failed-sign-in limits, and open a session.
pub(crate) async fn sign_in(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let fields = Fields::parse(&body);
    let expected = cookie_value(&req, SIGN_IN_COOKIE);
    let given = fields.get(access::CSRF_FIELD);
    let genuine = matches!((expected.as_deref(), given), (Some(e), Some(g))
        if !e.is_empty() && bool::from(subtle::ConstantTimeEq::ct_eq(e.as_bytes(), g.as_bytes())));
    if !genuine {
        return Ok(sign_in_response(
            &req,
            StatusCode::FORBIDDEN,
            Some("The sign-in form had expired; please sign in again."),
        ));
    }
    let (Some(name), Some(password)) = (fields.get("user"), fields.get("password")) else {
        return Ok(sign_in_response(
            &req,
            StatusCode::BAD_REQUEST,
            Some("Give a user name and a password."),
        ));
    };
    let name = name.to_owned();
    // The peer, not a forwarded header: a client could write any address there and so
    // escape the limit.
    let address = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mut conn = console.redis.get().await?;
    if let Some(wait) =
        session::locked_for(&mut conn, console.keys.global(), &name, &address).await?
    {
        let seconds = wait.as_secs().max(1);
        tracing::warn!(user = %name, %address, "console sign-in refused: too many failures");
        let mut res = sign_in_response(
            &req,
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "Too many failed sign-ins; try again in {} minute(s).",
                seconds.div_ceil(60)
            )),
        );
        if let Ok(value) = seconds.to_string().parse() {
            res.headers_mut()
                .insert(actix_web::http::header::RETRY_AFTER, value);
        }
        return Ok(res);
    }
    let users = console.users.current().await;
    let password = password.to_owned();
    let checked = {
        let users = users.clone();
        let name = name.clone();
        // argon2 takes tens of milliseconds of CPU on purpose: off the async threads.
        web::block(move || {
            users
                .check_password(&name, &password)
                .map(|u| u.name.clone())
        })
        .await
        .map_err(|e| ConsoleError::Internal(e.to_string()))?
    };
    let Some(user) = checked else {
        session::note_failure(&mut conn, console.keys.global(), &name, &address).await?;
        tracing::warn!(user = %name, %address, "console sign-in failed");
        return Ok(sign_in_response(
            &req,
            StatusCode::UNAUTHORIZED,
            Some("Wrong user name or password."),
        ));
    };
    session::clear_failures(&mut conn, console.keys.global(), &user, &address).await?;
    let (id, _) = session::create(&mut conn, console.keys.global(), &user, console.idle).await?;
    tracing::info!(user = %user, %address, "console sign-in");
    Ok(HttpResponse::SeeOther()
        .insert_header((LOCATION, paths::HOME))
        .append_header((SET_COOKIE, cookie(&req, session::COOKIE, &id, false)))
        .append_header((SET_COOKIE, cookie(&req, SIGN_IN_COOKIE, "", true)))
        .finish())
}

/// End the session (a POST with its CSRF token, so no other site can sign anyone out).
pub(crate) async fn sign_out(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let who = access::who(&req, &console, false).await?;
    let fields = Fields::parse(&body);
    let Via::Session { id, session } = &who.via else {
        return Err(ConsoleError::NotSignedIn);
    };
    if !fields
        .get(access::CSRF_FIELD)
        .is_some_and(|t| session.csrf_matches(t))
    {
        return Err(ConsoleError::Csrf);
    }
    let mut conn = console.redis.get().await?;
    session::end(&mut conn, console.keys.global(), id).await?;
    tracing::info!(user = %who.name, "console sign-out");
    Ok(HttpResponse::SeeOther()
        .insert_header((LOCATION, paths::SIGN_IN))
        .append_header((SET_COOKIE, cookie(&req, session::COOKIE, "", true)))
        .finish())
}
