//! Pause and resume consumption fleet-wide (`stream::pause`, as `summaryd pause` does).

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;

use super::{change_form, see_other, signed_in};
use crate::console::access::Who;
use crate::console::error::ConsoleError;
use crate::console::{Action, Console, layout, paths};
use crate::domain::Pause;

pub(crate) async fn page(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let who = &signed.who;
    let content = html! {
        @match &signed.paused {
            Some(p) => {
                p { "Consumption is " strong { "paused" } " since " (layout::time(&p.since())) " by " (p.by())
                    @if let Some(reason) = p.reason() { ": " (reason) } "." }
                p.muted { "No worker takes a job or re-delivers one while paused, so paused jobs spend no deliveries. The api keeps accepting jobs and the relay keeps sending emails and webhooks." }
                @if who.is_operator() {
                    form method="post" action={ (paths::HOME) "/resume" } {
                        (layout::csrf(who))
                        button type="submit" { "Resume consumption" }
                    }
                }
            }
            None => {
                p { "Consumption is " strong { "running" } "." }
                p.muted { "Pausing stops every worker process from taking jobs within about a second; jobs being summarised finish. The api keeps accepting jobs and the relay keeps sending." }
                @if who.is_operator() {
                    form.stack method="post" action=(paths::PAUSE) {
                        (layout::csrf(who))
                        label for="reason" { "Reason (shown to everyone)"
                            input #reason type="text" name="reason" maxlength="500";
                        }
                        button.danger type="submit" { "Pause consumption" }
                    }
                }
            }
        }
        @if !who.is_operator() { p.notice { "Viewers can see the state; an operator can change it." } }
    };
    Ok(signed.page("Pause", paths::PAUSE, content))
}

/// Pause: keeps the first pauser when already paused.
pub(crate) async fn apply_pause(
    console: &Console,
    who: &Who,
    reason: Option<&str>,
) -> Result<Option<Pause>, ConsoleError> {
    let pause = Pause::new(
        format!("console:{}", who.name),
        reason.map(str::to_owned),
        chrono::Utc::now(),
    );
    let mut conn = console.redis.get().await?;
    let newly = crate::stream::pause::pause(&mut conn, console.keys.global(), &pause).await?;
    if newly {
        console.record(who, Action::Pause, reason.unwrap_or("no reason given"));
    }
    Ok(crate::stream::pause::current(&mut conn, console.keys.global()).await?)
}

pub(crate) async fn apply_resume(
    console: &Console,
    who: &Who,
) -> Result<Option<Pause>, ConsoleError> {
    let mut conn = console.redis.get().await?;
    let cleared = crate::stream::pause::resume(&mut conn, console.keys.global()).await?;
    if let Some(p) = &cleared {
        console.record(who, Action::Resume, &format!("pause by {}", p.by()));
    }
    Ok(cleared)
}

pub(crate) async fn pause(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, fields) = change_form(&req, &console, &body).await?;
    apply_pause(&console, &who, fields.get("reason")).await?;
    Ok(see_other(paths::PAUSE))
}

pub(crate) async fn resume(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (who, _) = change_form(&req, &console, &body).await?;
    apply_resume(&console, &who).await?;
    Ok(see_other(paths::PAUSE))
}
