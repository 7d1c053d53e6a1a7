//! The frame every console page shares: navigation, who is signed in, the pause banner.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use maud::{DOCTYPE, Markup, html};

use super::access::{CSRF_FIELD, Who};
use super::document::head;
use super::paths;
use crate::domain::Pause;

const NAV: [(&str, &str); 6] = [
    (paths::HOME, "Overview"),
    (paths::JOBS, "Jobs"),
    (paths::DEAD_LETTERS, "Dead letters"),
    (paths::OUTBOX, "Outbox"),
    (paths::TENANTS, "Tenants"),
    (paths::PAUSE, "Pause"),
];

/// What the frame needs besides the page's own content.
pub(crate) struct Frame<'a> {
    pub(crate) who: &'a Who,
    pub(crate) paused: Option<&'a Pause>,
    /// The navigation entry this page belongs to.
    pub(crate) section: &'static str,
}

/// The hidden field every state-changing form carries.
pub(crate) fn csrf(who: &Who) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(who.csrf()); }
}

pub(crate) fn paused_banner(paused: Option<&Pause>) -> Markup {
    html! {
        @if let Some(p) = paused {
            div.banner role="status" {
                strong { "Consumption is paused" }
                " by " (p.by()) " since " (time(&p.since()))
                @if let Some(reason) = p.reason() { " — " (reason) }
                ". Workers take no jobs until an operator resumes it "
                a href=(paths::PAUSE) { "(Pause page)" } "."
            }
        }
    }
}

pub(crate) fn render(title: &str, frame: &Frame<'_>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    span.brand { "summaryd console" }
                    nav aria-label="Console sections" {
                        ul {
                            @for (href, label) in NAV {
                                li {
                                    @if href == frame.section {
                                        a href=(href) aria-current="page" { (label) }
                                    } @else {
                                        a href=(href) { (label) }
                                    }
                                }
                            }
                        }
                    }
                    div.me {
                        span { (frame.who.name) " (" (frame.who.role.as_str()) ")" }
                        form.inline method="post" action=(paths::SIGN_OUT) {
                            (csrf(frame.who))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                (paused_banner(frame.paused))
                main #main tabindex="-1" {
                    h1 { (title) }
                    (content)
                }
            }
        }
    }
}

pub(crate) fn page(title: &str, frame: &Frame<'_>, content: Markup) -> HttpResponse {
    html_response(StatusCode::OK, render(title, frame, content))
}

pub(crate) fn html_response(status: StatusCode, markup: Markup) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(markup.into_string())
}

pub(crate) fn sign_in(error: Option<&str>, token: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Sign in"))
            body {
                main #main {
                    h1 { "Sign in to the summaryd console" }
                    @if let Some(message) = error { p.error role="alert" { (message) } }
                    form.stack method="post" action=(paths::SIGN_IN) {
                        input type="hidden" name=(CSRF_FIELD) value=(token);
                        label for="user" { "User name"
                            input #user type="text" name="user" autocomplete="username" required autofocus;
                        }
                        label for="password" { "Password"
                            input #password type="password" name="password" autocomplete="current-password" required;
                        }
                        button type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

/// `2026-12-02T14:03:11Z`, the form every page shows times in.
pub(crate) fn time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
