//! The operator console in a real browser (headless Chromium over WebDriver,
//! `tests/support/browser.rs`) against the application on its ops listener, with real Redis
//! and Postgres: an operator signs in through the form, finds a dead-lettered job by its
//! Idempotency-Key and replays it to `done` with its email sent; a viewer sees no action and
//! a POST forged from the viewer's own browser is refused; and a tour of every page checks
//! that Tab reaches each action, that the throughput chart renders, that axe-core finds no
//! serious or critical violation, and saves a screenshot of each page.
//!
//! Screenshots go to `$SUMMARYD_CONSOLE_SCREENSHOTS` when set (the README's are made with
//! `SUMMARYD_CONSOLE_SCREENSHOTS=$PWD/docs/console`), else to a temporary directory, so a
//! plain test run leaves the tree alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, ModelSummary, TenantId, TokenUsage};
use summaryd::mail::MailError;
use summaryd::relay::relay_once;
use summaryd::worker::Consumer;

use crate::shared::browser::Browser;
use crate::shared::console::{ConsoleApp, PASSWORD, dead_letter, refused};
use crate::shared::fakes::{MailStep, Step};
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually, eventually_every, model_summary};

/// The names the navigation of every page has, and the sign-out button.
const FRAME_ACTIONS: [&str; 8] = [
    "Skip to content",
    "Overview",
    "Jobs",
    "Dead letters",
    "Outbox",
    "Tenants",
    "Pause",
    "Sign out",
];

fn job(tenant: &str, n: u32, text: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:{tenant}:POST:/v1/summaries:browser-{n}")),
        tenant: TenantId::parse(tenant).unwrap(),
        text: text.into(),
        notify: Some(Email::parse("lead@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

fn api_only() -> Roles {
    Roles::of(&[Role::Api])
}

/// Where this run's screenshots go; the temporary directory, if any, lives as long as the
/// returned guard.
fn screenshot_dir() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("SUMMARYD_CONSOLE_SCREENSHOTS") {
        Some(dir) if !dir.is_empty() => (PathBuf::from(dir), None),
        _ => {
            let tmp = tempfile::tempdir().unwrap();
            (tmp.path().to_owned(), Some(tmp))
        }
    }
}

/// Sign in through the form as a person does, and land on the overview.
async fn sign_in(browser: &Browser, app: &ConsoleApp, user: &str) {
    browser.goto(&app.url("/console")).await;
    assert!(
        browser.current_url().await.ends_with("/console/sign-in"),
        "not signed in: sent to the form"
    );
    browser.fill("#user", user).await;
    browser.fill("#password", PASSWORD).await;
    follow(browser, "button[type=submit]").await;
    assert!(
        browser.current_url().await.ends_with("/console"),
        "signed in, on the overview: {}",
        browser.current_url().await
    );
    assert!(browser.text("header.top .me").await.starts_with(user));
}

/// Click what `css` matches and wait until the next page has loaded: WebDriver's click
/// does not always wait for a form's navigation, and a page that answers with a redirect
/// to itself has the same URL, so the old page is marked and its disappearance awaited.
async fn follow(browser: &Browser, css: &str) {
    browser.execute("window.__leaving = true;", vec![]).await;
    browser.click(css).await;
    let loaded = eventually(Duration::from_secs(10), || async move {
        browser
            .execute(
                "return window.__leaving !== true && document.readyState === 'complete';",
                vec![],
            )
            .await
            == Value::Bool(true)
    })
    .await;
    assert!(loaded, "clicking {css:?} loads no new page");
}

/// The status the job page shows.
async fn job_status(browser: &Browser) -> String {
    browser.text("dl.cards div:first-child dd").await
}

#[tokio::test]
async fn an_operator_finds_a_dead_lettered_job_by_its_key_and_replays_it_to_done() {
    let env = TestEnv::new().await;
    // Refused once for good, then the provider is fixed.
    let llm = Arc::new(FakeLlm::with(
        vec![Step::Fail(refused())],
        Step::Ok(String::new()),
    ));
    let mailer = Arc::new(FakeMailer::new());
    let services = env
        .services()
        .llm(llm.clone())
        .mailer(mailer.clone())
        .build();
    let app = ConsoleApp::start(&env, api_only()).await;
    let accepted: Value = app
        .http
        .post(format!("{}/v1/summaries", app.main))
        .header("Idempotency-Key", "browser-key-000001")
        .header("X-Tenant-Id", "acme")
        .json(&json!({"text": "Revenue grew. Costs fell.", "notify": "lead@example.com"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = accepted["job_id"].as_str().unwrap().to_owned();
    let mut consumer = Consumer::new(services.worker(), "w-1");
    consumer.ensure_group().await.unwrap();
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(env.dead_letters().await, 1);

    let browser = Browser::start().await;
    sign_in(&browser, &app, "alice").await;

    // The Jobs page's second form finds the job by tenant and key.
    follow(&browser, "nav a[href='/console/jobs']").await;
    browser.fill("#s-tenant", "acme").await;
    browser.fill("#s-key", "browser-key-000001").await;
    follow(&browser, "form:has(#s-key) button[type=submit]").await;
    let job_url = browser.current_url().await;
    assert!(
        job_url.ends_with(&format!("/console/jobs/{job_id}")),
        "{job_url}"
    );
    assert_eq!(job_status(&browser).await, "failed");
    assert!(
        browser.text("main").await.contains("model_refused"),
        "the dead letter's class is shown"
    );

    // Replay from the job's page: the job is back on the stream, the dead letter gone.
    let replay = browser.find("form[action$='/replay'] button").await;
    assert_eq!(replay.text().await.unwrap(), "Replay this job");
    follow(&browser, "form[action$='/replay'] button").await;
    assert_eq!(
        browser.current_url().await,
        job_url,
        "back on the job's page"
    );
    assert_eq!(job_status(&browser).await, "queued");
    assert!(!browser.exists("form[action$='/replay']").await);
    assert_eq!(env.dead_letters().await, 0);
    let on_stream: Vec<String> = crate::shared::api_requests::stream_messages(&env)
        .await
        .into_iter()
        .map(|j| j.job_id.to_string())
        .collect();
    assert_eq!(on_stream, vec![job_id.clone()]);

    // The worker summarises it and the relay sends its email; a reload shows it done.
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    relay_once(&services.relay()).await.unwrap();
    browser.goto(&job_url).await;
    assert_eq!(job_status(&browser).await, "done");
    assert!(browser.exists("dd.status-done").await);
    let sent = mailer.sent();
    assert_eq!(sent.len(), 1, "one email");
    assert_eq!(sent[0].0.to.as_str(), "lead@example.com");
    let page = browser.text("main").await;
    assert!(
        page.contains("status_400"),
        "the refused call stays in the history"
    );
    assert!(page.contains("email.summary_ready"), "its email row");
    assert!(
        browser.exists("pre.summary").await,
        "an operator sees the summary"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_viewer_sees_no_action_and_a_post_forged_in_the_viewers_browser_is_refused() {
    let env = TestEnv::new().await;
    let services = env
        .services()
        .llm(Arc::new(FakeLlm::failing(refused())))
        .build();
    let dead = job("acme", 1, "The launch slipped a week.");
    dead_letter(&services, std::slice::from_ref(&dead)).await;
    assert_eq!(env.dead_letters().await, 1);
    let app = ConsoleApp::start(&env, api_only()).await;
    let browser = Browser::start().await;
    sign_in(&browser, &app, "vera").await;

    let job_url = app.url(&format!("/console/jobs/{}", dead.job_id));
    browser.goto(&job_url).await;
    assert_eq!(job_status(&browser).await, "failed");
    assert!(browser.text("main").await.contains("Dead letter"));
    assert!(!browser.exists("form[action$='/replay']").await);
    assert!(
        !browser.text("main").await.contains("Replay"),
        "no replay button for a viewer"
    );

    browser.goto(&app.url("/console/dead-letters")).await;
    assert!(
        browser
            .text("main")
            .await
            .contains(&dead.job_id.to_string())
    );
    assert!(
        !browser.exists("input[type=checkbox]").await,
        "no checkboxes"
    );
    assert!(!browser.exists("button[name=do]").await, "no bulk buttons");

    // A fetch from the viewer's page, with the session cookie and the page's own CSRF
    // token: signed in, not forged, and still refused for the role.
    let status = browser
        .execute(
            r#"
            const csrf = document.querySelector('input[name=csrf]').value;
            return fetch(arguments[0], {
                method: 'POST',
                credentials: 'same-origin',
                headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
                body: new URLSearchParams({ csrf }),
                redirect: 'manual',
            }).then((r) => r.status);
            "#,
            vec![json!(format!("/console/jobs/{}/replay", dead.job_id))],
        )
        .await;
    assert_eq!(status, json!(403));

    // The form the operator's page would have had, built in the viewer's page and
    // submitted by the browser itself.
    browser
        .execute(
            r#"
            const form = document.createElement('form');
            form.method = 'post';
            form.action = arguments[0];
            const csrf = document.createElement('input');
            csrf.type = 'hidden';
            csrf.name = 'csrf';
            csrf.value = document.querySelector('input[name=csrf]').value;
            form.append(csrf);
            document.body.append(form);
            form.submit();
            "#,
            vec![json!(format!("/console/jobs/{}/replay", dead.job_id))],
        )
        .await;
    let b = &browser;
    assert!(
        eventually(Duration::from_secs(5), || async move {
            b.title().await.starts_with("Forbidden")
        })
        .await,
        "the browser shows the refusal: {}",
        browser.title().await
    );
    assert!(browser.text("h1").await.starts_with("403"));

    // Nothing changed: the dead letter is there and nothing went back on the stream.
    assert_eq!(env.dead_letters().await, 1);
    assert!(
        crate::shared::api_requests::stream_messages(&env)
            .await
            .is_empty()
    );
    browser.goto(&job_url).await;
    assert_eq!(job_status(&browser).await, "failed");
    app.stop().await;
}

/// A picture of the whole page, 1280 px wide: the window grows to the page's height for
/// the shot (capped, so a long page stays a small file) and returns to 1280×900.
async fn full_page_screenshot(browser: &Browser, path: &std::path::Path) {
    let sizes = browser
        .execute(
            "return [document.documentElement.scrollHeight, \
             window.outerHeight - window.innerHeight];",
            vec![],
        )
        .await;
    let page = sizes[0].as_u64().unwrap_or(900) as u32;
    let chrome = sizes[1].as_u64().unwrap_or(0) as u32;
    let client = browser.client();
    client
        .set_window_size(1280, (page + chrome).clamp(600, 1600))
        .await
        .unwrap();
    browser.screenshot_png(path).await;
    client.set_window_size(1280, 900).await.unwrap();
}

/// One page of the tour: what Tab must reach, checked with axe-core, photographed.
struct Tour<'a> {
    browser: &'a Browser,
    shots: PathBuf,
}

impl Tour<'_> {
    /// [`Tour::reachable_and_accessible`], then the page saved as `name`.png.
    async fn check(&self, name: &str, wanted: &[&str]) {
        self.reachable_and_accessible(name, wanted).await;
        // Tab leaves a focus ring behind; the picture shows the page as it loads.
        self.browser
            .execute(
                "document.activeElement && document.activeElement.blur();",
                vec![],
            )
            .await;
        full_page_screenshot(self.browser, &self.shots.join(format!("{name}.png"))).await;
    }

    /// From the top of the page, Tab alone reaches every control on it (links, buttons,
    /// fields, checkboxes) and among them the actions named `wanted`; and axe-core finds
    /// nothing serious or critical.
    async fn reachable_and_accessible(&self, name: &str, wanted: &[&str]) {
        let b = self.browser;
        // Every control the page has, marked as focus reaches it.
        b.execute(
            r#"
            window.__controls = Array.from(document.querySelectorAll(
                'a[href], button, input:not([type=hidden]), select, textarea'));
            document.addEventListener('focusin', (e) => { e.target.dataset.tabbed = '1'; });
            "#,
            vec![],
        )
        .await;
        let order = b.tab_order(120).await;
        let missed = b
            .execute(
                r#"
                return window.__controls
                    .filter((c) => c.dataset.tabbed !== '1')
                    .map((c) => c.outerHTML.slice(0, 120));
                "#,
                vec![],
            )
            .await;
        assert_eq!(
            missed,
            json!([]),
            "{name}: controls Tab never reaches; order: {order:?}"
        );
        let labels: Vec<&str> = order.iter().map(|f| f.label.as_str()).collect();
        for action in FRAME_ACTIONS.iter().chain(wanted) {
            assert!(
                labels.contains(action),
                "{name}: Tab does not reach {action:?}; it reaches {labels:?}"
            );
        }
        let violations = b.axe_check().await;
        let (serious, lesser): (Vec<_>, Vec<_>) = violations.iter().partition(|v| v.is_serious());
        // Minor and moderate findings are reported, not failed on.
        for v in &lesser {
            eprintln!("{name}: axe-core: {v}");
        }
        assert!(
            serious.is_empty(),
            "axe-core finds serious or critical violations on the {name} page:\n{}",
            serious
                .iter()
                .map(|v| format!("  - {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[tokio::test]
async fn every_page_is_reachable_by_keyboard_accessible_and_photographed() {
    let env = TestEnv::new().await;
    let (shots, _tmp) = screenshot_dir();

    // A small, realistic world: jobs finished over the last hour (two tenants), their
    // emails sent but one refused for good (a stuck outbox row), and dead letters of two
    // tenants.
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::Fail(|| MailError::SmtpReply {
            server: "mx.example.net:25".into(),
            code: 550,
            message: "550 5.1.1 mailbox unavailable".into(),
        })],
        MailStep::Deliver,
    ));
    let services = env
        .services()
        .llm(Arc::new(FakeLlm::failing(refused())))
        .mailer(mailer.clone())
        .build();
    let pg = env.pg().await;
    let texts = [
        (
            "acme",
            "Quarterly revenue grew 12 % while support costs fell.",
        ),
        ("acme", "The launch slipped a week; the beta stays open."),
        ("acme", "Churn held at 2 % and two enterprise deals closed."),
        ("globex", "The warehouse move finishes on Friday."),
        ("globex", "Invoices over 30 days fell by a third."),
        ("acme", "Hiring paused for the platform team until March."),
        ("globex", "The audit found no material weakness."),
        ("acme", "The status page moves to the new provider."),
        ("globex", "Two suppliers raised prices by 4 %."),
    ];
    // Minutes ago each finished: a few busy minutes in a quiet hour.
    let minutes_ago: [i32; 9] = [52, 51, 51, 37, 24, 24, 24, 9, 2];
    for (n, (tenant, text)) in texts.iter().enumerate() {
        let done = job(tenant, 100 + n as u32, text);
        let summary = ModelSummary {
            usage: Some(TokenUsage::new(40 + 3 * text.len() as u32, 25 + n as u32)),
            ..model_summary(text)
        };
        summaryd::db::summaries::commit_with_outbox(&services.pg, &done, &summary)
            .await
            .unwrap();
        // Spread over the hour, so the chart has a shape.
        pg.execute(
            "UPDATE summaries SET completed_at = now() - make_interval(mins => $2), \
             created_at = now() - make_interval(mins => $2) - interval '3 seconds' \
             WHERE job_id::text = $1",
            &[&done.job_id.to_string(), &minutes_ago[n]],
        )
        .await
        .unwrap();
    }
    while relay_once(&services.relay()).await.unwrap() > 0 {}
    relay_once(&services.relay()).await.unwrap();
    let stuck: i64 = pg
        .query_one(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stuck, 1, "one email refused for good");
    let dead = [
        job("acme", 1, "A contract in a language the model refuses."),
        job("acme", 2, "Another refused document."),
        job("globex", 3, "A refused memo."),
    ];
    dead_letter(&services, &dead).await;
    assert_eq!(env.dead_letters().await, 3);

    let app = ConsoleApp::start(&env, api_only()).await;
    let browser = Browser::start().await;
    let tour = Tour {
        browser: &browser,
        shots: shots.clone(),
    };

    // The sign-in page has no frame: checked on its own.
    browser.goto(&app.url("/console/sign-in")).await;
    let order = browser.tab_order(20).await;
    let ids: Vec<Option<&str>> = order.iter().map(|f| f.id.as_deref()).collect();
    assert_eq!(ids[..2], [Some("user"), Some("password")], "{order:?}");
    assert_eq!(order[2].label, "Sign in", "{order:?}");
    browser
        .assert_no_serious_violations("the sign-in page")
        .await;
    full_page_screenshot(&browser, &shots.join("sign-in.png")).await;
    sign_in(&browser, &app, "alice").await;

    // The overview and its chart: an SVG with a bar per minute, laid out with a real size.
    let chart = browser
        .execute(
            r#"
            const svg = document.querySelector('svg#throughput');
            if (!svg) return null;
            const box = svg.getBoundingClientRect();
            const bars = Array.from(svg.querySelectorAll('rect.bar'));
            return {
                width: box.width,
                height: box.height,
                bars: bars.length,
                tallest: Math.max(...bars.map((b) => b.getBoundingClientRect().height)),
            };
            "#,
            vec![],
        )
        .await;
    assert_ne!(chart, Value::Null, "no svg#throughput on the overview");
    assert_eq!(chart["bars"], 60, "{chart}");
    assert!(chart["width"].as_f64().unwrap() > 300.0, "{chart}");
    assert!(chart["height"].as_f64().unwrap() > 50.0, "{chart}");
    assert!(
        chart["tallest"].as_f64().unwrap() > 10.0,
        "bars are drawn: {chart}"
    );
    assert!(
        browser
            .text("figure.chart figcaption")
            .await
            .contains(&format!("({} in all)", texts.len()))
    );
    tour.check("overview", &[]).await;

    follow(&browser, "nav a[href='/console/jobs']").await;
    tour.check("jobs", &["Find by id", "Find by key"]).await;

    // A dead-lettered job's page: its refused model call, the dead letter, Replay.
    browser
        .goto(&app.url(&format!("/console/jobs/{}", dead[0].job_id)))
        .await;
    assert_eq!(job_status(&browser).await, "failed");
    tour.check("job", &["Replay this job", "Find another job"])
        .await;

    follow(&browser, "nav a[href='/console/dead-letters']").await;
    assert_eq!(browser.find_all("tbody input[name=id]").await.len(), 3);
    tour.check(
        "dead-letters",
        &[
            "Filter",
            "Replay selected",
            "Purge selected",
            "Replay all 3 matching",
            "Purge all 3 matching",
            "Select every dead letter on this page",
            &format!("Select job {}", dead[2].job_id),
        ],
    )
    .await;

    // Filter by tenant, tick one, replay it: the confirmation, then the run.
    browser.fill("#f-tenant", "globex").await;
    follow(&browser, "form.filters button[type=submit]").await;
    assert_eq!(browser.find_all("tbody input[name=id]").await.len(), 1);
    browser.click("tbody input[name=id]").await;
    follow(&browser, "button[value=replay-selected]").await;
    assert!(
        browser
            .text("main")
            .await
            .contains("the 1 selected dead letter(s)")
    );
    tour.check("confirm", &["Confirm: Replay 1", "Cancel"])
        .await;
    follow(&browser, "main form button[type=submit]").await;
    assert!(browser.current_url().await.contains("/console/runs/"));
    let b = &browser;
    assert!(
        eventually_every(
            Duration::from_secs(10),
            Duration::from_millis(200),
            || async move {
                // The page reloads itself when the run finishes; reloading here as well keeps
                // the wait short whatever the timing.
                let text = b.text("[data-run-text]").await;
                if !text.contains("(finished)") {
                    b.goto(&b.current_url().await).await;
                }
                text.contains("1 done, 0 already gone, 0 failed of 1 (finished)")
            }
        )
        .await,
        "the run finishes"
    );
    assert_eq!(env.dead_letters().await, 2);
    tour.check("run", &["Back to the dead letters"]).await;

    follow(&browser, "nav a[href='/console/outbox']").await;
    assert!(
        browser
            .text("main")
            .await
            .contains("550 5.1.1 mailbox unavailable")
    );
    tour.check(
        "outbox",
        &["Filter", "Retry selected", "Retry all 1 matching"],
    )
    .await;

    follow(&browser, "nav a[href='/console/tenants']").await;
    assert!(browser.text("main table").await.contains("globex"));
    tour.check("tenants", &["Show", "acme", "globex"]).await;

    follow(&browser, "nav a[href='/console/pause']").await;
    tour.reachable_and_accessible("pause (running)", &["Pause consumption"])
        .await;
    // Paused: the banner on every page, and Resume where Pause was.
    browser.fill("#reason", "Model provider incident").await;
    follow(&browser, "button.danger[type=submit]").await;
    assert!(
        browser
            .text(".banner")
            .await
            .starts_with("Consumption is paused by console:alice")
    );
    tour.check("pause", &["Resume consumption", "(Pause page)"])
        .await;
    app.stop().await;
}
