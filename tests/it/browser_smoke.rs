//! The browser-test machinery itself (tests/support/browser.rs) against two small pages on a
//! loopback server: a real Chromium loads them, fills and submits a form, clicks, is moved
//! through by Tab, takes a screenshot, and axe-core passes the accessible page and fails the
//! inaccessible one, so an accessibility check that could never fail cannot pass for one.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;

use crate::shared::browser::{Browser, Violation};
use crate::shared::http_request::Request;
use crate::shared::http_stub::{Connections, Reply, Server, handler};

/// Landmarks, a labelled field, named controls, a language: nothing axe-core objects to.
const GOOD_PAGE: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Find a job</title></head>
<body>
<header><nav aria-label="Main"><a id="home" href="/good">Home</a></nav></header>
<main>
<h1>Find a job</h1>
<form method="post" action="/search">
  <label for="key">Idempotency-Key</label>
  <input id="key" name="key" type="text">
  <button id="search" type="submit">Search</button>
</form>
<button id="refresh" type="button">Refresh</button>
<p id="refreshed" hidden>Refreshed</p>
</main>
<script src="/page.js"></script>
</body>
</html>"#;

/// Behaviour in a script file rather than inline, as the console's CSP will require.
const PAGE_JS: &str = r#"
document.getElementById('refresh').addEventListener('click', () => {
    document.getElementById('refreshed').hidden = false;
});
"#;

/// No language, an image without alternative text, a button with no name and an unlabelled
/// field: each a serious or critical axe-core violation.
const BAD_PAGE: &str = r#"<!doctype html>
<html>
<head><meta charset="utf-8"><title>Broken</title></head>
<body>
<main>
<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">
<button id="icon" type="button"></button>
<input id="unlabelled" type="text">
</main>
</body>
</html>"#;

fn html(body: String) -> Reply {
    Reply::Respond {
        status: 200,
        headers: vec![("Content-Type".into(), "text/html; charset=utf-8".into())],
        body,
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Serves the pages and records every form submission it receives.
async fn pages() -> (Server, Arc<Mutex<Vec<Request>>>) {
    let searches = Arc::new(Mutex::new(Vec::new()));
    let server = Server::start(
        handler(searches.clone(), |searches, request| async move {
            match (request.method.as_str(), request.path.as_str()) {
                ("GET", "/good") => html(GOOD_PAGE.into()),
                ("GET", "/bad") => html(BAD_PAGE.into()),
                ("GET", "/page.js") => Reply::Respond {
                    status: 200,
                    headers: vec![("Content-Type".into(), "text/javascript".into())],
                    body: PAGE_JS.into(),
                },
                ("POST", "/search") => {
                    let body = String::from_utf8_lossy(&request.body).into_owned();
                    searches.lock().unwrap().push(request);
                    html(format!(
                        r#"<!doctype html><html lang="en"><head><title>Results</title></head>
                        <body><main><h1>Results</h1><p id="result">Searched: {}</p></main></body></html>"#,
                        escape(&body)
                    ))
                }
                _ => Reply::text(404, "not found"),
            }
        }),
        Connections::KeepAlive,
    )
    .await;
    (server, searches)
}

#[tokio::test]
async fn a_browser_fills_a_form_clicks_tabs_and_takes_a_screenshot() {
    let (server, searches) = pages().await;
    let browser = Browser::start().await;
    browser.goto(&server.url("/good")).await;
    assert_eq!(browser.title().await, "Find a job");

    // A click that runs the page's script, seen in the DOM.
    assert!(
        !browser
            .find("#refreshed")
            .await
            .is_displayed()
            .await
            .unwrap()
    );
    browser.click("#refresh").await;
    assert_eq!(browser.text("#refreshed").await, "Refreshed");

    // Keyboard only: Tab reaches the link, the field and both buttons, in document order.
    let order = browser.tab_order(20).await;
    let ids: Vec<Option<&str>> = order.iter().map(|f| f.id.as_deref()).collect();
    assert_eq!(
        ids,
        [Some("home"), Some("key"), Some("search"), Some("refresh")],
        "focus order: {order:?}"
    );
    assert_eq!(order[0].tag, "a");
    assert_eq!(order[0].label, "Home");
    assert_eq!(order[3].label, "Refresh");
    browser.focus_page_start().await;
    let reached = browser
        .press_tab_until(10, |f| f.tag == "button" && f.label == "Search")
        .await;
    assert_eq!(reached.map(|f| f.path), Some("button#search".to_string()));

    let shot_dir = tempfile::tempdir().unwrap();
    let shot = shot_dir.path().join("pages/good.png");
    browser.screenshot_png(&shot).await;
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 1000, "a {}-byte screenshot", png.len());

    // The form, typed into and submitted by clicking its button: the server receives the
    // value and the browser shows the page it answered with.
    browser.fill("#key", "first").await;
    browser.fill("#key", "job <42> & co").await;
    browser.click("#search").await;
    assert_eq!(
        browser.text("#result").await,
        "Searched: key=job+%3C42%3E+%26+co"
    );
    assert!(browser.current_url().await.ends_with("/search"));
    let searches = searches.lock().unwrap();
    assert_eq!(searches.len(), 1, "one submission");
    assert_eq!(searches[0].body, b"key=job+%3C42%3E+%26+co");
    assert_eq!(
        searches[0].header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
}

fn ids(violations: &[Violation]) -> Vec<&str> {
    violations.iter().map(|v| v.id.as_str()).collect()
}

#[tokio::test]
async fn axe_passes_the_accessible_page_and_fails_the_inaccessible_one() {
    let (server, _) = pages().await;
    let browser = Browser::start().await;

    browser.goto(&server.url("/good")).await;
    let good = browser.axe_check().await;
    assert!(
        good.iter().all(|v| !v.is_serious()),
        "serious violations on the good page: {}",
        good.iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    );
    browser.assert_no_serious_violations("the good page").await;

    browser.goto(&server.url("/bad")).await;
    let bad = browser.axe_check().await;
    let found = ids(&bad);
    for rule in ["image-alt", "button-name", "label", "html-has-lang"] {
        let violation = bad
            .iter()
            .find(|v| v.id == rule)
            .unwrap_or_else(|| panic!("axe-core misses {rule}; found {found:?}"));
        assert!(violation.is_serious(), "{violation}");
    }
    let button = bad.iter().find(|v| v.id == "button-name").unwrap();
    assert_eq!(button.nodes.len(), 1);
    assert_eq!(button.nodes[0].target, [serde_json::json!("#icon")]);

    // The assertion the console's tests use fails here, naming the rules.
    let outcome = AssertUnwindSafe(browser.assert_no_serious_violations("the bad page"))
        .catch_unwind()
        .await;
    let panic = outcome.expect_err("the bad page must fail the accessibility check");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("on the bad page"), "{message}");
    assert!(message.contains("image-alt (critical)"), "{message}");
    assert!(message.contains("button-name (critical)"), "{message}");
}
