//! The parts of a page that need nobody signed in: the document head every page shares,
//! and the page a refused or failed request gets.

use actix_web::http::StatusCode;
use maud::{DOCTYPE, Markup, html};

use super::paths;

pub(crate) fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · summaryd console" }
            link rel="stylesheet" href={ (paths::STATIC) "/console.css" };
            script src={ (paths::STATIC) "/console.js" } defer {}
        }
    }
}

/// A page for a refused or failed request, without the navigation (the user may not be
/// signed in).
pub(crate) fn error_page(status: StatusCode, message: &str) -> Markup {
    let title = status.canonical_reason().unwrap_or("Error");
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                main #main {
                    h1 { (status.as_u16()) " " (title) }
                    p.error role="alert" { (message) }
                    p { a href=(paths::HOME) { "Back to the console" } }
                }
            }
        }
    }
}
