//! The operator console over real HTTP on the ops listener, against real Redis and
//! Postgres: who may sign in and change what, that a forged or viewer's change changes
//! nothing, and that each action has its effect (stream entries, dead letters, outbox rows,
//! the pause key, emails) exactly once.

use std::sync::Arc;

use chrono::Utc;
use redis::AsyncCommands;
use serde_json::Value;
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::mail::MailError;
use summaryd::relay::relay_once;
use summaryd::worker::Consumer;

use crate::shared::console::{ConsoleApp, PASSWORD, dead_letter, field_in, refused, set_cookie};
use crate::shared::fakes::{MailStep, Step};
use crate::shared::{FakeLlm, FakeMailer, TestEnv};

fn job(tenant: &str, n: u32) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:{tenant}:POST:/v1/summaries:console-{n}")),
        tenant: TenantId::parse(tenant).unwrap(),
        text: "The launch slipped a week. Support volume doubled.".into(),
        notify: Some(Email::parse("lead@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

async fn dead_letter_count(env: &TestEnv) -> u64 {
    env.dead_letters().await
}

/// The job ids on the job stream, one per entry.
async fn stream_job_ids(env: &TestEnv) -> Vec<String> {
    crate::shared::api_requests::stream_messages(env)
        .await
        .into_iter()
        .map(|j| j.job_id.to_string())
        .collect()
}

fn api_app(env: &TestEnv) -> impl std::future::Future<Output = ConsoleApp> + '_ {
    ConsoleApp::start(env, Roles::of(&[Role::Api]))
}

#[tokio::test]
async fn without_an_ops_listener_there_is_no_console() {
    let env = TestEnv::new().await;
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    std::fs::write(&users, crate::shared::console::users_toml()).unwrap();
    let mut settings = env.settings.clone();
    settings.console.users_file = Some(users);
    let app = env
        .services()
        .settings(settings)
        .application(Roles::of(&[Role::Api]))
        .await;
    let base = format!("http://127.0.0.1:{}", app.port());
    let running = crate::shared::running::Running::start(app);
    let res = reqwest::get(format!("{base}/console")).await.unwrap();
    assert_eq!(res.status().as_u16(), 404);
    let res = reqwest::get(format!("{base}/console/sign-in"))
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
    running.stop().await;
}

#[tokio::test]
async fn an_invalid_users_file_stops_the_start_as_a_configuration_error() {
    let env = TestEnv::new().await;
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    std::fs::write(
        &users,
        "[users.a]\nrole = \"admin\"\npassword_sha256 = \"00\"\n",
    )
    .unwrap();
    let mut settings = env.settings.clone();
    settings.ops.listen = Some("127.0.0.1:0".parse().unwrap());
    settings.console.users_file = Some(users);
    let err = summaryd::app::Application::build(
        settings,
        Roles::of(&[Role::Api]),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
        false,
    )
    .await
    .err()
    .expect("refused");
    assert!(err.is_configuration(), "{err}");
    assert!(
        err.to_string().contains("SUMMARYD_CONSOLE_USERS_FILE"),
        "{err}"
    );
}

#[tokio::test]
async fn signing_in_opens_a_strict_session_and_every_answer_carries_the_security_headers() {
    let env = TestEnv::new().await;
    let app = api_app(&env).await;

    // Not signed in: pages send the browser to the form, the API answers 401.
    let res = app.http.get(app.url("/console")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 303);
    assert_eq!(res.headers()["location"], "/console/sign-in");
    let res = app
        .http
        .get(app.url("/console/api/overview"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("problem+json")
    );

    let wrong = app.try_sign_in("alice", "not the password").await;
    assert_eq!(wrong.status().as_u16(), 401);
    assert!(set_cookie(&wrong, "summaryd_console").is_none());
    assert!(
        wrong
            .text()
            .await
            .unwrap()
            .contains("Wrong user name or password")
    );

    // A sign-in POST without the form's own token (another site's form) opens nothing.
    let forged = app
        .http
        .post(app.url("/console/sign-in"))
        .form(&[("user", "olga"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    assert!(set_cookie(&forged, "summaryd_console").is_none());

    // argon2 and SHA-256 passwords both work.
    let res = app.try_sign_in("alice", PASSWORD).await;
    assert_eq!(res.status().as_u16(), 303);
    let cookie_line = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("summaryd_console="))
        .unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(cookie_line.contains(attribute), "{cookie_line}");
    }
    assert!(!cookie_line.contains("Secure"), "plain HTTP: {cookie_line}");
    let olga = app.sign_in("olga").await;

    // The session lives in Redis under the SHA-256 of the cookie, never the cookie itself.
    let mut redis = env.redis().await;
    let sessions: Vec<String> = redis
        .keys(format!("{}console:session:*", env.settings.key_prefix))
        .await
        .unwrap();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert!(sessions.iter().all(|k| !k.contains(&olga.cookie)));

    for path in [
        "/console",
        "/console/jobs",
        "/console/dead-letters",
        "/console/outbox",
        "/console/tenants",
        "/console/pause",
        "/console/static/console.css",
        "/console/sign-in",
    ] {
        let res = olga.get(&app, path).await;
        assert_eq!(res.status().as_u16(), 200, "{path}");
        let h = res.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["cache-control"], "no-store", "{path}");
    }
    let page = olga.get(&app, "/console").await.text().await.unwrap();
    assert!(page.contains("olga (operator)"), "{page}");
    assert!(!page.contains("<script>"), "no inline script");
    assert!(!page.contains(" style="), "no inline style");

    // Signing out ends the session in Redis: the same cookie no longer opens a page.
    let res = olga.post(&app, "/console/sign-out", &[]).await;
    assert_eq!(res.status().as_u16(), 303);
    let res = olga.get(&app, "/console").await;
    assert_eq!(res.status().as_u16(), 303, "signed out");
    app.stop().await;
}

#[tokio::test]
async fn failed_sign_ins_are_limited_per_user_name() {
    let env = TestEnv::new().await;
    let app = api_app(&env).await;
    for _ in 0..5 {
        let res = app.try_sign_in("olga", "guess").await;
        assert_eq!(res.status().as_u16(), 401);
    }
    // Locked: even the right password is refused until the window ends.
    let res = app.try_sign_in("olga", PASSWORD).await;
    assert_eq!(res.status().as_u16(), 429);
    let retry_after: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=900).contains(&retry_after), "{retry_after}");
    assert!(set_cookie(&res, "summaryd_console").is_none());
    // Another name from the same address is not locked by olga's failures.
    let res = app.try_sign_in("vera", PASSWORD).await;
    assert_eq!(res.status().as_u16(), 303);
    app.stop().await;
}

#[tokio::test]
async fn a_viewer_sees_no_action_and_a_viewers_or_forged_post_changes_nothing() {
    let env = TestEnv::new().await;
    let services = env
        .services()
        .llm(Arc::new(FakeLlm::failing(refused())))
        .build();
    let dead = job("acme", 1);
    dead_letter(&services, std::slice::from_ref(&dead)).await;
    assert_eq!(dead_letter_count(&env).await, 1);
    let app = api_app(&env).await;
    let vera = app.sign_in("vera").await;
    let alice = app.sign_in("alice").await;
    let paused_key = format!("{}paused", env.settings.key_prefix);
    let mut redis = env.redis().await;

    let page = vera
        .get(&app, &format!("/console/jobs/{}", dead.job_id))
        .await;
    let page = page.text().await.unwrap();
    assert!(page.contains("Dead letter"), "{page}");
    assert!(
        !page.contains("Replay this job"),
        "a viewer gets no replay button"
    );
    let list = vera
        .get(&app, "/console/dead-letters")
        .await
        .text()
        .await
        .unwrap();
    assert!(list.contains(&dead.job_id.to_string()), "{list}");
    assert!(!list.contains("Replay selected"), "{list}");
    assert!(!list.contains("name=\"id\""), "no checkboxes for a viewer");

    // A viewer's POST, with a valid CSRF token, is refused and changes nothing.
    let res = vera
        .post(&app, &format!("/console/jobs/{}/replay", dead.job_id), &[])
        .await;
    assert_eq!(res.status().as_u16(), 403);
    let res = vera.post(&app, "/console/pause", &[("reason", "x")]).await;
    assert_eq!(res.status().as_u16(), 403);
    let res = app
        .http
        .post(app.url("/console/api/pause"))
        .bearer_auth("vera-token")
        .json(&serde_json::json!({"reason": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(dead_letter_count(&env).await, 1);
    assert!(stream_job_ids(&env).await.is_empty());
    assert!(!redis.exists::<_, bool>(&paused_key).await.unwrap());

    // An operator's POST without the token, or with another session's, is forged.
    let res = alice
        .post_raw(&app, &format!("/console/jobs/{}/replay", dead.job_id), &[])
        .await;
    assert_eq!(res.status().as_u16(), 403);
    let res = alice
        .post_raw(&app, "/console/pause", &[("csrf", &vera.csrf)])
        .await;
    assert_eq!(res.status().as_u16(), 403);
    // A page's script sending the wrong header is refused too.
    let res = app
        .http
        .post(app.url("/console/api/pause"))
        .header("Cookie", format!("summaryd_console={}", alice.cookie))
        .header("X-CSRF-Token", "wrong")
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(dead_letter_count(&env).await, 1);
    assert!(stream_job_ids(&env).await.is_empty());
    assert!(!redis.exists::<_, bool>(&paused_key).await.unwrap());
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("summaryd_console_actions_total{action=\"replay\"} 0"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn pausing_from_the_console_is_shown_everywhere_and_resuming_clears_it() {
    let env = TestEnv::new().await;
    let app = api_app(&env).await;
    let alice = app.sign_in("alice").await;
    let res = alice
        .post(
            &app,
            "/console/pause",
            &[("reason", "model provider incident")],
        )
        .await;
    assert_eq!(res.status().as_u16(), 303);
    let mut redis = env.redis().await;
    let stored: String = redis
        .get(format!("{}paused", env.settings.key_prefix))
        .await
        .unwrap();
    let stored: Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored["by"], "console:alice");
    assert_eq!(stored["reason"], "model provider incident");

    // Every page shows the banner, to viewers too; the API says who and why.
    let vera = app.sign_in("vera").await;
    for path in ["/console", "/console/dead-letters", "/console/tenants"] {
        let page = vera.get(&app, path).await.text().await.unwrap();
        assert!(page.contains("Consumption is paused"), "{path}: {page}");
        assert!(page.contains("console:alice"), "{path}");
    }
    let api: Value = app
        .http
        .get(app.url("/console/api/pause"))
        .bearer_auth("vera-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(api["paused"]["reason"], "model provider incident");

    let res = alice.post(&app, "/console/resume", &[]).await;
    assert_eq!(res.status().as_u16(), 303);
    assert!(
        !redis
            .exists::<_, bool>(format!("{}paused", env.settings.key_prefix))
            .await
            .unwrap()
    );
    let page = vera.get(&app, "/console").await.text().await.unwrap();
    assert!(!page.contains("Consumption is paused"));
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("summaryd_console_actions_total{action=\"pause\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("summaryd_console_actions_total{action=\"resume\"} 1"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn replaying_all_matching_is_one_run_under_two_concurrent_clicks_and_touches_only_the_match()
{
    let env = TestEnv::new().await;
    let services = env
        .services()
        .llm(Arc::new(FakeLlm::failing(refused())))
        .build();
    let acme: Vec<Job> = (1..=3).map(|n| job("acme", n)).collect();
    let beta: Vec<Job> = (4..=5).map(|n| job("beta", n)).collect();
    dead_letter(&services, &acme).await;
    dead_letter(&services, &beta).await;
    assert_eq!(dead_letter_count(&env).await, 5);
    let app = api_app(&env).await;
    let alice = app.sign_in("alice").await;

    let list = alice
        .get(
            &app,
            "/console/dead-letters?tenant=acme&class=model_refused",
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(
        list.contains("<strong>3</strong> dead letter(s) match"),
        "{list}"
    );
    let upto = field_in(&list, "upto").expect("snapshot in the form");
    let confirm = alice
        .post(
            &app,
            "/console/dead-letters/confirm",
            &[("do", "replay-all"), ("tenant", "acme"), ("upto", &upto)],
        )
        .await;
    assert_eq!(confirm.status().as_u16(), 200);
    let confirm = confirm.text().await.unwrap();
    assert!(
        confirm.contains("all 3 dead letter(s) matching tenant = acme"),
        "{confirm}"
    );
    let run_id = field_in(&confirm, "run_id").unwrap();
    // A dead letter arriving after the confirmation is not part of the run.
    let late = job("acme", 6);
    dead_letter(&services, std::slice::from_ref(&late)).await;

    let form = [
        ("run_id", run_id.as_str()),
        ("action", "replay"),
        ("all", "1"),
        ("tenant", "acme"),
        ("upto", upto.as_str()),
    ];
    let (first, second) = tokio::join!(
        alice.post(&app, "/console/runs", &form),
        alice.post(&app, "/console/runs", &form)
    );
    for res in [&first, &second] {
        assert_eq!(res.status().as_u16(), 303);
        assert_eq!(
            res.headers()["location"],
            format!("/console/runs/{run_id}").as_str()
        );
    }
    let mut run = Value::Null;
    for _ in 0..200 {
        run = app
            .http
            .get(app.url(&format!("/console/api/runs/{run_id}")))
            .bearer_auth("alice-token")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if run["finished"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(run["finished"], true, "{run}");
    assert_eq!(
        (run["total"].as_u64(), run["done"].as_u64()),
        (Some(3), Some(3)),
        "{run}"
    );

    // Each acme job is back on the stream exactly once; beta's and the late one stay dead.
    let mut on_stream = stream_job_ids(&env).await;
    on_stream.sort();
    let mut expected: Vec<String> = acme.iter().map(|j| j.job_id.to_string()).collect();
    expected.sort();
    assert_eq!(on_stream, expected);
    assert_eq!(dead_letter_count(&env).await, 3);
    let page = alice
        .get(&app, &format!("/console/runs/{run_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("3 done, 0 already gone, 0 failed of 3"),
        "{page}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_dead_lettered_job_found_by_its_key_shows_its_history_and_replays_to_done() {
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
    let app = api_app(&env).await;
    let accepted: Value = app
        .http
        .post(format!("{}/v1/summaries", app.main))
        .header("Idempotency-Key", "console-key-000001")
        .header("X-Tenant-Id", "acme")
        .json(
            &serde_json::json!({"text": "Revenue grew. Costs fell.", "notify": "lead@example.com"}),
        )
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
    assert_eq!(dead_letter_count(&env).await, 1);

    let alice = app.sign_in("alice").await;
    let found = alice
        .get(&app, "/console/jobs?tenant=acme&key=console-key-000001")
        .await;
    assert_eq!(found.status().as_u16(), 303);
    assert_eq!(
        found.headers()["location"],
        format!("/console/jobs/{job_id}").as_str()
    );
    let missing = alice
        .get(&app, "/console/jobs?tenant=acme&key=no-such-key-0001")
        .await;
    assert!(
        missing
            .text()
            .await
            .unwrap()
            .contains("No job of tenant acme")
    );

    let detail: Value = app
        .http
        .get(app.url(&format!("/console/api/jobs/{job_id}")))
        .bearer_auth("alice-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["status"], "failed", "{detail}");
    assert_eq!(detail["dead_letter"]["class"], "model_refused", "{detail}");
    let calls = detail["model_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{detail}");
    assert_eq!(calls[0]["error_class"], "status_400", "{detail}");
    assert_eq!(calls[0]["delivery"], 1);

    let res = alice
        .post(&app, &format!("/console/jobs/{job_id}/replay"), &[])
        .await;
    assert_eq!(res.status().as_u16(), 303);
    // A second click finds nothing left to replay.
    alice
        .post(&app, &format!("/console/jobs/{job_id}/replay"), &[])
        .await;
    assert_eq!(stream_job_ids(&env).await, vec![job_id.clone()]);
    assert_eq!(dead_letter_count(&env).await, 0);
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    relay_once(&services.relay()).await.unwrap();
    assert_eq!(mailer.sent().len(), 1, "one email");

    let page = alice
        .get(&app, &format!("/console/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("status-done"), "{page}");
    assert!(
        page.contains("status_400"),
        "the failed call stays in the history: {page}"
    );
    assert!(
        page.contains("email.summary_ready"),
        "its email row: {page}"
    );
    assert!(
        page.contains("<pre class=\"summary\">"),
        "operators see the summary"
    );
    let vera = app.sign_in("vera").await;
    let page = vera
        .get(&app, &format!("/console/jobs/{job_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(!page.contains("<pre class=\"summary\">"), "viewers do not");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("summaryd_console_actions_total{action=\"replay\"} 1"),
        "{metrics}"
    );
    app.stop().await;
}

async fn stuck(pg: &tokio_postgres::Client) -> i64 {
    pg.query_one(
        "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NOT NULL",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn stuck_outbox_rows_of_a_topic_are_retried_all_at_once() {
    let env = TestEnv::new().await;
    let mailer = Arc::new(FakeMailer::with(
        vec![
            MailStep::Fail(|| MailError::SmtpReply {
                server: "mx.test:25".into(),
                code: 550,
                message: "550 mailbox unavailable".into(),
            }),
            MailStep::Fail(|| MailError::SmtpReply {
                server: "mx.test:25".into(),
                code: 550,
                message: "550 mailbox unavailable".into(),
            }),
        ],
        MailStep::Deliver,
    ));
    let services = env.services().mailer(mailer.clone()).build();
    for n in 1..=2 {
        summaryd::db::summaries::commit_with_outbox(
            &services.pg,
            &job("acme", n),
            &crate::shared::model_summary("The summary."),
        )
        .await
        .unwrap();
    }
    while relay_once(&services.relay()).await.unwrap() > 0 {}
    relay_once(&services.relay()).await.unwrap();
    let pg = env.pg().await;
    assert_eq!(stuck(&pg).await, 2);

    let app = api_app(&env).await;
    let olga = app.sign_in("olga").await;
    let page = olga
        .get(&app, "/console/outbox?topic=email.summary_ready")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("<strong>2</strong> stuck row(s)"), "{page}");
    assert!(page.contains("550 mailbox unavailable"), "{page}");
    let confirm = olga
        .post(
            &app,
            "/console/outbox/confirm",
            &[("do", "retry-all"), ("topic", "email.summary_ready")],
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(
        confirm.contains("Retry <strong>2</strong> stuck row(s)"),
        "{confirm}"
    );
    let res = olga
        .post(
            &app,
            "/console/outbox/retry",
            &[("all", "1"), ("topic", "email.summary_ready")],
        )
        .await;
    assert_eq!(res.status().as_u16(), 303);
    assert_eq!(stuck(&pg).await, 0);
    while relay_once(&services.relay()).await.unwrap() > 0 {}
    assert_eq!(mailer.sent().len(), 2, "both emails sent after the retry");
    let bad = olga.get(&app, "/console/outbox?topic=nonsense").await;
    assert_eq!(bad.status().as_u16(), 400);
    assert!(bad.text().await.unwrap().contains("unknown topic"));
    app.stop().await;
}

#[tokio::test]
async fn the_json_api_answers_tokens_and_the_tenants_page_counts_jobs() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    summaryd::db::summaries::commit_with_outbox(
        &services.pg,
        &job("acme", 1),
        &crate::shared::model_summary("The summary."),
    )
    .await
    .unwrap();
    let app = api_app(&env).await;
    let get = |path: &str, token: &str| app.http.get(app.url(path)).bearer_auth(token).send();
    assert_eq!(
        get("/console/api/overview", "nobody")
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    let overview: Value = get("/console/api/overview", "vera-token")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let minutes = overview["finished_per_minute"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    assert_eq!(
        minutes
            .iter()
            .map(|m| m["jobs"].as_i64().unwrap())
            .sum::<i64>(),
        1
    );
    let tenants: Value = get("/console/api/tenants?window=1h", "vera-token")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tenants["window"], "1h");
    assert_eq!(tenants["tenants"][0]["tenant"], "acme", "{tenants}");
    assert_eq!(tenants["tenants"][0]["jobs"], 1, "{tenants}");
    let bad = get("/console/api/tenants?window=soon", "vera-token")
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    let problem: Value = bad.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("window"),
        "{problem}"
    );
    let dl = get("/console/api/dead-letters?class=nope", "vera-token")
        .await
        .unwrap();
    assert_eq!(dl.status().as_u16(), 400);
    // The page renders the chart as SVG with a bar per minute.
    let vera = app.sign_in("vera").await;
    let page = vera.get(&app, "/console").await.text().await.unwrap();
    assert_eq!(page.matches("<rect").count(), 60, "{page}");
    app.stop().await;
}

#[tokio::test]
async fn a_job_with_no_trace_is_404_and_a_malformed_id_is_400() {
    let env = TestEnv::new().await;
    let app = api_app(&env).await;
    let vera = app.sign_in("vera").await;
    let unknown = JobId::from_scoped_key("idem:acme:POST:/v1/summaries:never-sent");
    let res = vera.get(&app, &format!("/console/jobs/{unknown}")).await;
    assert_eq!(res.status().as_u16(), 404);
    assert!(res.text().await.unwrap().contains("no trace of job"));
    let res = vera.get(&app, "/console/jobs/not-a-uuid").await;
    assert_eq!(res.status().as_u16(), 400);
    assert!(res.text().await.unwrap().contains("is not a job id"));
    let res = vera.get(&app, "/console/jobs?job_id=nope").await;
    assert!(res.text().await.unwrap().contains("is not a job id"));
    app.stop().await;
}
