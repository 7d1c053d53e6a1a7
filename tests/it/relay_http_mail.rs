//! The relay with the real HTTP mail provider against an email API stub on loopback: the
//! provider's answers decide whether a row is resent, parked for a person, or done.

use std::time::Duration;

use chrono::Utc;
use summaryd::config::MailProvider;
use summaryd::db::summaries::commit_with_outbox;
use summaryd::domain::{Email, Job, JobId, SummaryReady, TenantId};
use summaryd::ops;
use summaryd::relay::{RelayServices, relay_once};

use crate::shared::TestEnv;
use crate::shared::http_stub::{HttpStub, Reply};

fn job(n: u32) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:mail-relay-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: "Renewal agreed.".into(),
        notify: Email::parse("am@example.com").unwrap(),
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
    let mailer = summaryd::mail::from_settings(&settings.mail).unwrap();
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
