//! The relay with the real HTTP mail provider against an email API stub on loopback: the
//! provider's answers decide whether a row is resent, parked for a person, or done.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::test as actix_test;
use chrono::Utc;
use summaryd::config::MailProvider;
use summaryd::config::roles::{Role, Roles};
use summaryd::db::summaries::commit_with_outbox;
use summaryd::domain::{Email, Job, JobId, SummaryReady, TenantId};
use summaryd::ops;
use summaryd::relay::{RelayServices, relay_once};
use summaryd::shutdown::Shutdown;

use crate::shared::http_stub::{HttpStub, Reply};
use crate::shared::test_env::Services;
use crate::shared::{TestEnv, eventually};

fn job(n: u32) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:mail-relay-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: "Renewal agreed.".into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// Services whose mailer is the real `http` provider pointed at `sink`, with no backoff
/// between a transient failure and the next pass.
fn services(env: &TestEnv, sink: &HttpStub) -> RelayServices {
    let mut settings = env.settings.clone();
    settings.mail.provider = MailProvider::Http;
    settings.mail.http_url = Some(sink.url("/v1/emails").into());
    settings.relay.backoff = Duration::ZERO;
    let mailer = summaryd::mail::from_settings(&settings.mail, crate::shared::log_key()).unwrap();
    env.services()
        .settings(settings)
        .mailer(mailer)
        .build()
        .relay()
}

#[tokio::test]
async fn a_503_then_200_sends_once_on_the_second_pass_with_the_same_idempotency_key() {
    let env = TestEnv::new().await;
    let sink = HttpStub::start(Reply::json(200, serde_json::json!({"id": "m-1"}))).await;
    sink.script(vec![Reply::text(503, "maintenance")]);
    let services = services(&env, &sink);
    let msg = job(1);
    commit_with_outbox(
        &services.pg,
        &msg,
        &crate::shared::model_summary("Renewal agreed; pricing next week."),
    )
    .await
    .unwrap();

    assert_eq!(relay_once(&services).await.unwrap(), 0, "503 is not a send");
    assert_eq!(
        env.count("outbox WHERE attempts = 1 AND sent_at IS NULL")
            .await,
        1
    );
    assert_eq!(relay_once(&services).await.unwrap(), 1);
    assert_eq!(
        relay_once(&services).await.unwrap(),
        0,
        "nothing left to send"
    );

    let requests = sink.requests();
    assert_eq!(requests.len(), 2, "one failed attempt, one delivery");
    let key = SummaryReady::dedupe_key(msg.job_id);
    for r in &requests {
        assert_eq!(r.header("Idempotency-Key"), Some(key.as_str()));
    }
    assert_eq!(
        requests[0].body, requests[1].body,
        "the resend is the same email"
    );
    let email = requests[1].json();
    assert_eq!(email["to"], "am@example.com");
    assert!(
        email["text"]
            .as_str()
            .unwrap()
            .contains(&msg.job_id.to_string())
    );
    assert!(
        email["text"]
            .as_str()
            .unwrap()
            .contains("pricing next week")
    );
    assert_eq!(env.count("outbox WHERE sent_at IS NOT NULL").await, 1);
}

#[tokio::test]
async fn a_400_parks_the_row_for_a_person_and_outbox_retry_sends_it_to_a_healthy_sink() {
    let env = TestEnv::new().await;
    let sink = HttpStub::start(Reply::json(200, serde_json::json!({"id": "m-2"}))).await;
    sink.script(vec![Reply::json(
        400,
        serde_json::json!({"error": "recipient domain not verified"}),
    )]);
    let services = services(&env, &sink);
    let msg = job(2);
    commit_with_outbox(
        &services.pg,
        &msg,
        &crate::shared::model_summary("Summary."),
    )
    .await
    .unwrap();

    assert_eq!(relay_once(&services).await.unwrap(), 0);
    let mut stuck = Vec::new();
    ops::outbox::stuck(&services.pg, true, &mut stuck)
        .await
        .unwrap();
    let stuck = String::from_utf8(stuck).unwrap();
    let row: serde_json::Value = serde_json::from_str(stuck.trim()).unwrap();
    assert_eq!(row["dedupe_key"], SummaryReady::dedupe_key(msg.job_id));
    assert!(row["last_error"].as_str().unwrap().contains("400"), "{row}");
    // Parked: further passes do not call the provider.
    assert_eq!(relay_once(&services).await.unwrap(), 0);
    assert_eq!(sink.requests().len(), 1);

    let n = ops::outbox::retry(&services.pg, &[], true, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(relay_once(&services).await.unwrap(), 1);
    assert_eq!(sink.requests().len(), 2);
    assert_eq!(env.count("outbox WHERE sent_at IS NOT NULL").await, 1);
}

/// `/readyz` of a process with `roles` sharing `services`' metrics: (status, body).
async fn readyz(services: &Services, roles: Roles) -> (StatusCode, serde_json::Value) {
    let app =
        actix_test::init_service(summaryd::api::app(services.api(), roles, Shutdown::new())).await;
    let res = actix_test::call_service(
        &app,
        actix_test::TestRequest::get().uri("/readyz").to_request(),
    )
    .await;
    let status = res.status();
    (status, actix_test::read_body_json(res).await)
}

#[tokio::test]
async fn an_expired_mail_token_parks_nothing_pauses_the_relay_and_every_row_goes_out_once_fixed() {
    let env = TestEnv::new().await;
    let sink = HttpStub::start(Reply::json(
        401,
        serde_json::json!({"error": "api key expired"}),
    ))
    .await;
    let mut settings = env.settings.clone();
    settings.mail.provider = MailProvider::Http;
    settings.mail.http_url = Some(sink.url("/v1/emails?token=tk-secret-0123456789").into());
    // The probe's cooldown grows like a row's backoff: 50 ms doubling to 400 ms.
    settings.relay.backoff = Duration::from_millis(50);
    settings.relay.max_backoff = Duration::from_millis(400);
    let mailer = summaryd::mail::from_settings(&settings.mail, crate::shared::log_key()).unwrap();
    let services = env.services().settings(settings).mailer(mailer).build();
    let relay = services.relay();
    let jobs: Vec<Job> = (10..15).map(job).collect();
    for j in &jobs {
        commit_with_outbox(&relay.pg, j, &crate::shared::model_summary("Summary."))
            .await
            .unwrap();
    }
    let shutdown = Shutdown::new();
    let task = tokio::spawn(summaryd::relay::run(
        relay.clone(),
        "relay-test".into(),
        shutdown.clone(),
    ));

    assert!(
        eventually(Duration::from_secs(10), || async {
            relay.metrics.mail_misconfigured().is_some()
        })
        .await,
        "the 401s open the mail breaker"
    );
    let opened_at = sink.requests().len();
    assert_eq!(opened_at, jobs.len(), "the first batch, then the breaker");
    // A window in which the paused relay must not send every row again and again: with
    // each row due every ~50 ms and a 20 ms poll, an unpaused relay would make about 70
    // requests in it; the paused one probes with one row per cooldown (50, 100, 200, 400 …
    // ms, jittered to half of each at least): at most 7.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = sink.requests().len() - opened_at;
    assert!((1..=8).contains(&during), "{during} requests in the window");
    assert!(ops_stuck(&relay).await.is_empty(), "no row parked");
    assert_eq!(env.count("outbox WHERE attempts > 0").await, 0);
    assert_eq!(
        env.count("outbox WHERE first_failed_at IS NOT NULL").await,
        0
    );
    assert_eq!(env.count("outbox WHERE sent_at IS NOT NULL").await, 0);

    // A relay-only process is unready and says why; one that also serves the API stays
    // ready and says it in its body.
    let (status, body) = readyz(&services, Roles::of(&[Role::Relay])).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("mail provider misconfigured") && detail.contains("401"),
        "{body}"
    );
    assert!(!detail.contains("tk-secret"), "no credentials: {body}");
    let (status, body) = readyz(&services, Roles::all()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mail = body["checks"]["mail"].as_str().unwrap_or_default();
    assert!(mail.contains("mail provider misconfigured"), "{body}");
    assert!(
        relay
            .metrics
            .render()
            .contains("summaryd_mail_breaker_open 1"),
        "the gauge says so"
    );

    // The token is renewed: the next probe passes and the rest follow.
    sink.set_reply(Reply::json(200, serde_json::json!({"id": "m"})));
    let fixed_at = sink.requests().len();
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.count("outbox WHERE sent_at IS NOT NULL").await == 5
        })
        .await,
        "every row sent after the fix"
    );
    shutdown.trigger();
    task.await.unwrap().unwrap();
    let after: Vec<String> = sink.requests()[fixed_at..]
        .iter()
        .filter_map(|r| r.header("Idempotency-Key").map(str::to_owned))
        .collect();
    let distinct: std::collections::HashSet<&String> = after.iter().collect();
    assert!(
        after.len() <= jobs.len() && distinct.len() == after.len(),
        "each row at most once after the fix: {after:?}"
    );
    assert_eq!(
        relay.metrics.outbox_sent.get(),
        5,
        "each row recorded sent once"
    );
    assert_eq!(relay.metrics.mail_misconfigured(), None);
    assert!(
        relay
            .metrics
            .render()
            .contains("summaryd_mail_breaker_open 0")
    );
    let (status, body) = readyz(&services, Roles::of(&[Role::Relay])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(ops_stuck(&relay).await.is_empty());
}

async fn ops_stuck(relay: &RelayServices) -> String {
    let mut out = Vec::new();
    ops::outbox::stuck(&relay.pg, true, &mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

/// Mail APIs echo the recipient in error bodies; the stored `last_error` keeps the status
/// and loses the address.
#[tokio::test]
async fn an_error_body_echoing_the_recipient_is_stored_without_it() {
    let env = TestEnv::new().await;
    let sink = HttpStub::start(Reply::json(
        422,
        serde_json::json!({"error": "recipient AM@Example.com is suppressed", "to": "<am@example.com>"}),
    ))
    .await;
    let services = services(&env, &sink);
    let msg = job(1);
    commit_with_outbox(
        &services.pg,
        &msg,
        &crate::shared::model_summary("Renewal agreed."),
    )
    .await
    .unwrap();

    assert_eq!(relay_once(&services).await.unwrap(), 0, "422 is not a send");
    let row = env
        .pg()
        .await
        .query_one("SELECT last_error FROM outbox", &[])
        .await
        .unwrap();
    let last_error: String = row.get(0);
    assert!(last_error.contains("422"), "{last_error}");
    assert!(last_error.contains("<recipient>"), "{last_error}");
    assert!(
        !last_error.to_ascii_lowercase().contains("am@example.com"),
        "{last_error}"
    );
}
