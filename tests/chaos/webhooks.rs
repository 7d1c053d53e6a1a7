//! Signed webhooks with the real binary: a relay SIGKILLed between its send and its mark
//! leaves the event to the next relay, which sends it again under the same webhook-id once
//! the lease has run out; and the intake refuses, before anything is stored, a webhook to
//! an internal address or one nothing could sign.

use std::time::Duration;

use serde_json::json;

use crate::harness::client::ApiClient;
use crate::harness::model_server::marked_text;
use crate::harness::process::{output_text, serve_expecting_exit};
use crate::harness::{World, WorldOptions, eventually, webhook_id};
use crate::shared::standard_webhooks::verify_all;

/// Short, so the resend comes soon; above the world's 1 s webhook (and mail) timeout, as
/// the configuration requires.
const LEASE_MS: &str = "1500";
/// Far longer than the test takes: the held request is never answered before the kill.
const HOLD: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_between_send_and_mark_leaves_the_resend_to_the_next_under_the_same_id() {
    let world = World::new(
        "webhook-kill-relay",
        WorldOptions {
            env: vec![("SUMMARYD_RELAY_LEASE_MS", LEASE_MS.into())],
            ..Default::default()
        },
    )
    .await;
    let api = world.spawn("api", "api,worker", &[]).await;
    let mut relay_a = world.spawn("relay-a", "relay", &[]).await;
    let client = ApiClient::new(api.base_url()).with_webhook(world.webhooks.url());
    world.webhooks.set_hold(Some(HOLD));

    let key = format!("webhook-kill-{}", crate::run_id());
    let accepted = client.submit(&key, &key).await;
    let id = webhook_id(&accepted.job_id, "summary_completed");
    assert!(
        eventually(Duration::from_secs(20), || async {
            !world.webhooks.received().is_empty()
        })
        .await,
        "relay A never sent the webhook:\n{}",
        relay_a.tail()
    );
    // Relay A is waiting for the receiver's answer: it has sent, and not marked.
    relay_a.kill9();
    world.webhooks.set_hold(None);
    let held = world.webhooks.received();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].webhook_id(), Some(id.as_str()));
    assert_eq!(held[0].status, None, "the first request was never answered");
    let row = world
        .pg()
        .await
        .query_one(
            "SELECT sent_at IS NULL, attempts, claimed_until > now() \
               FROM outbox WHERE dedupe_key = $1",
            &[&id],
        )
        .await
        .expect("the webhook's outbox row");
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, i32>(1),
            row.get::<_, bool>(2)
        ),
        (true, 0, true),
        "unsent, no failure recorded, still leased to the dead relay"
    );

    let _relay_b = world.spawn("relay-b", "relay", &[]).await;
    let report = world
        .assert_exactly_once(std::slice::from_ref(&accepted), &client)
        .await;

    // Sent again once the lease ran out, under the same id, with the same body; the
    // exactly-once check verified every request with the reference library, and this
    // does so for the two that matter here.
    let received = world.webhooks.received();
    assert!(received.len() >= 2, "{received:?}");
    assert!(
        received.iter().all(|r| r.webhook_id() == Some(id.as_str())),
        "every request under {id}: {received:?}"
    );
    assert!(received.last().is_some_and(|r| r.accepted()));
    assert_eq!(received[0].request.body, received[1].request.body);
    let payloads = verify_all(world.webhooks.secret(), &world.webhooks.requests()).await;
    assert!(
        payloads
            .iter()
            .all(|p| p["data"]["job_id"] == accepted.job_id)
    );
    let row = world
        .pg()
        .await
        .query_one(
            "SELECT sent_at IS NOT NULL, last_status FROM outbox WHERE dedupe_key = $1",
            &[&id],
        )
        .await
        .expect("the webhook's outbox row");
    assert_eq!(
        (row.get::<_, bool>(0), row.get::<_, Option<i32>>(1)),
        (true, Some(200))
    );
    println!("webhook after kill -9 of the relay: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intake_refuses_an_internal_or_unsignable_webhook_before_storing_anything() {
    let world = World::new("webhook-intake", WorldOptions::default()).await;
    let text = marked_text("refused");
    let run = crate::run_id();

    // Without SUMMARYD_WEBHOOK_ALLOW_PRIVATE: a loopback address is refused by name, and
    // the key stays free for the client's corrected request.
    let public_only = world
        .spawn_with_env(
            "api-public-only",
            "api",
            &world.env_without(&["SUMMARYD_WEBHOOK_ALLOW_PRIVATE"]),
        )
        .await;
    let client = ApiClient::new(public_only.base_url());
    let key = format!("webhook-intake-{run}-loopback");
    let body = json!({
        "text": text,
        "notify": "ops@example.com",
        "webhook": {"url": "https://127.0.0.1:1/"}
    });
    let (status, _, problem) = client.post_once(&key, &body).await.expect("POST");
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "webhook.url", "{problem}");
    assert_eq!(world.stream_length().await, 0, "nothing enqueued");
    let (status, _, answer) = client
        .post_once(&key, &json!({"text": text, "notify": "ops@example.com"}))
        .await
        .expect("POST");
    assert_eq!(
        status, 202,
        "the refused body did not take the key: {answer}"
    );
    assert_eq!(world.stream_length().await, 1);

    // Header mode without SUMMARYD_WEBHOOK_SECRETS_FILE: nothing could sign the webhook.
    let unsigned = world
        .spawn_with_env(
            "api-no-secrets",
            "api",
            &world.env_without(&["SUMMARYD_WEBHOOK_SECRETS_FILE"]),
        )
        .await;
    let client = ApiClient::new(unsigned.base_url());
    let key = format!("webhook-intake-{run}-unsigned");
    let body = json!({
        "text": text,
        "notify": "ops@example.com",
        "webhook": {"url": world.webhooks.url()}
    });
    let (status, _, problem) = client.post_once(&key, &body).await.expect("POST");
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "webhook", "{problem}");
    assert_eq!(world.stream_length().await, 1, "nothing more enqueued");

    // A secrets file that is not there stops the start instead, naming the setting.
    let missing = world.dir.join("no-such-secrets-file");
    let env = world.env_with(&[(
        "SUMMARYD_WEBHOOK_SECRETS_FILE",
        missing.display().to_string(),
    )]);
    let out = serve_expecting_exit("api", "127.0.0.1:0", &env).await;
    let output = output_text(&out);
    assert_eq!(out.status.code(), Some(2), "{output}");
    assert!(output.contains("SUMMARYD_WEBHOOK_SECRETS_FILE"), "{output}");
    assert!(world.webhooks.received().is_empty());
}
