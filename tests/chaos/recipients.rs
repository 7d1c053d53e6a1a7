//! The recipient policy of the real binary, on the wire: a tenant's `notify_domains` and
//! the intake's address rules refuse with 422 before anything is stored, `notify_per_hour`
//! refuses the next email to one recipient with 429 while a replay is still answered, and
//! the one email that goes out says whose text it summarises.

use std::time::Duration;

use serde_json::{Value, json};
use summaryd::api::auth::token_sha256;

use crate::harness::model_server::{marked_text, summary_for};
use crate::harness::{World, WorldOptions, eventually};

async fn post(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    key: &str,
    notify: &str,
    marker: &str,
) -> (u16, Option<String>, Value) {
    let res = http
        .post(format!("{base}/v1/summaries"))
        .header("Authorization", format!("Bearer {token}"))
        .header("Idempotency-Key", key)
        .json(&json!({"text": marked_text(marker), "notify": notify}))
        .send()
        .await
        .expect("POST");
    let status = res.status().as_u16();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipient_policy_holds_on_the_wire_and_the_email_names_the_tenant() {
    let token = format!("recipients-{}", crate::run_id());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    std::fs::write(
        &file,
        format!(
            "[tenants.acme]\ntoken_sha256 = \"{}\"\nnotify_domains = [\"example.com\"]\nnotify_per_hour = 1\n",
            token_sha256(&token)
        ),
    )
    .unwrap();
    let world = World::new("recipients", WorldOptions::tokens_file(&file)).await;
    let all = world.spawn("all", "api,worker,relay", &[]).await;
    let (http, base) = (reqwest::Client::new(), all.base_url());
    let run = crate::run_id();
    let key = |n: u32| format!("recipients-{run}-{n:04}");

    // Refused before anything is stored: the sending machine, an internal address, a
    // domain outside the tenant's policy, an address with a bidi override.
    for (n, bad) in [
        "root@localhost",
        "x@10.0.0.5",
        "a@evil.example.net",
        "a@example.com\u{202E}",
    ]
    .into_iter()
    .enumerate()
    {
        let (status, _, problem) = post(&http, &base, &token, &key(n as u32), bad, "refused").await;
        assert_eq!(status, 422, "{bad:?}: {problem}");
        assert_eq!(problem["field"], "notify", "{bad:?}: {problem}");
    }
    assert_eq!(world.count("SELECT count(*) FROM summaries").await, 0);

    // One email per hour to this recipient: the first is accepted and delivered.
    let (status, _, first) = post(&http, &base, &token, &key(10), "am@example.com", "r1").await;
    assert_eq!(status, 202, "{first}");
    let (status, retry_after, problem) =
        post(&http, &base, &token, &key(11), "am@example.com", "r2").await;
    assert_eq!(status, 429, "{problem}");
    let wait: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!(wait > 3_500, "{wait}");
    // Its replay is answered, never refused; another recipient is not held back.
    let (status, _, replayed) = post(&http, &base, &token, &key(10), "am@example.com", "r1").await;
    assert_eq!((status, &replayed), (202, &first));
    let (status, _, _) = post(&http, &base, &token, &key(12), "cfo@example.com", "r3").await;
    assert_eq!(status, 202);

    assert!(
        eventually(Duration::from_secs(20), || async {
            world.mail.sent().len() >= 2
        })
        .await,
        "two emails sent:\n{}",
        all.tail()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = world.mail.sent();
    assert_eq!(sent.len(), 2, "only the accepted jobs are emailed");
    let mut to: Vec<&str> = sent
        .iter()
        .map(|s| s.body["to"].as_str().unwrap())
        .collect();
    to.sort_unstable();
    assert_eq!(to, ["am@example.com", "cfo@example.com"]);
    for s in &sent {
        let text = s.body["text"].as_str().unwrap();
        assert!(
            text.contains("automated summary of text submitted by tenant \"acme\""),
            "{text}"
        );
    }
    let am = sent
        .iter()
        .find(|s| s.body["to"] == "am@example.com")
        .unwrap();
    assert!(
        am.body["text"]
            .as_str()
            .unwrap()
            .contains(&summary_for("r1"))
    );
    assert_eq!(world.count("SELECT count(*) FROM summaries").await, 2);
}
