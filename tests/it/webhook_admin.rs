//! The operator's webhook commands against real Postgres: `webhook deliveries` shows each
//! row's state with exactly the contract's fields, `webhook replay` makes rows due again
//! with the same webhook-id (never a row a relay holds), `webhook enable` re-enables an
//! endpoint for its tenant only, and the endpoint bookkeeping the relay relies on
//! (`db::webhooks::note_failure`) disables an endpoint once, and only after a whole run of
//! failures. One test drives the real relay against a receiver that answered 410 Gone.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Parser as _;
use serde_json::Value;
use summaryd::cli::{Cli, Command};
use summaryd::config::Settings;
use summaryd::db::outbox::{self, Failure, OutboxRow};
use summaryd::db::webhooks::{self, Selection};
use summaryd::domain::{Email, EventType, Job, JobId, TenantId, WebhookEvent, WebhookUrl};
use summaryd::ops::{self, AdminCommand, AdminError};
use summaryd::relay::relay_once;

use crate::shared::http_stub::{HttpStub, Reply};
use crate::shared::standard_webhooks::verify_all;
use crate::shared::{TestEnv, model_summary};

const URL: &str = "https://hooks.example.com/summaryd";
const FIELDS: [&str; 9] = [
    "id",
    "job_id",
    "type",
    "url",
    "attempts",
    "last_status",
    "last_error",
    "next_at",
    "delivered_at",
];
const LEASE: Duration = Duration::from_secs(60);
const GIVE_UP: Duration = Duration::from_secs(3_600);

fn acme() -> TenantId {
    TenantId::parse("acme").unwrap()
}

fn job(name: &str, url: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{name}")),
        tenant: acme(),
        text: "The launch slipped a week. Support volume doubled.".into(),
        notify: None,
        webhook: Some(WebhookUrl::from_stored(url).unwrap()),
        created_at: Utc::now(),
    }
}

/// The job's `summary.completed` row, committed with its summary as the worker does.
async fn completed(pg: &deadpool_postgres::Pool, job: &Job) {
    summaryd::db::summaries::commit_with_outbox(pg, job, &model_summary("Support doubled."))
        .await
        .unwrap();
}

/// The job's `summary.failed` row, recorded as the worker does before the dead letter.
async fn failed(pg: &deadpool_postgres::Pool, job: &Job) {
    let url = job.webhook.clone().unwrap();
    let event = WebhookEvent::failed(job, url, "the text could not be summarised", Utc::now());
    outbox::record_event(pg, &event).await.unwrap();
}

/// Lease every due webhook row, as a relay's claim does.
async fn claim(pg: &deadpool_postgres::Pool) -> Vec<OutboxRow> {
    outbox::claim_due(pg, WebhookEvent::TOPIC, 100, LEASE)
        .await
        .unwrap()
}

fn failure(error: &str, status: Option<i32>) -> Failure<'_> {
    Failure { error, status }
}

/// A `summaryd webhook …` command line, parsed as the binary parses it and run as the
/// binary runs it; its standard output.
async fn run_with(settings: &Settings, args: &[&str]) -> Result<String, AdminError> {
    let mut argv = vec!["summaryd", "webhook"];
    argv.extend_from_slice(args);
    let Command::Webhook(command) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a webhook command: {args:?}")
    };
    let mut out = Vec::new();
    ops::run(settings, AdminCommand::Webhook(command), &mut out).await?;
    Ok(String::from_utf8(out).unwrap())
}

async fn run(env: &TestEnv, args: &[&str]) -> String {
    run_with(&env.settings, args).await.unwrap()
}

/// `webhook deliveries … --json`, one object per line, each with exactly the contract's
/// fields, keyed by row id.
async fn deliveries(env: &TestEnv, args: &[&str]) -> Vec<Value> {
    let mut argv = vec!["deliveries", "--json"];
    argv.extend_from_slice(args);
    let text = run(env, &argv).await;
    text.lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            let keys: Vec<&str> = row
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(
                keys.iter().copied().collect::<BTreeSet<_>>(),
                FIELDS.into_iter().collect(),
                "{line}"
            );
            row
        })
        .collect()
}

fn ids(rows: &[Value]) -> Vec<i64> {
    rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
}

fn time(value: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value.as_str().unwrap_or_else(|| panic!("{value}")))
        .unwrap()
        .with_timezone(&Utc)
}

/// One outbox row as the relay sees it.
#[derive(Debug)]
struct Stored {
    dedupe_key: String,
    attempts: i32,
    sent: bool,
    parked: bool,
    skipped: bool,
    leased: bool,
    first_failed: bool,
    due: bool,
}

async fn stored(env: &TestEnv, id: i64) -> Stored {
    let row = env
        .pg()
        .await
        .query_one(
            "SELECT dedupe_key, attempts, sent_at IS NOT NULL, failed_at IS NOT NULL, \
                    skipped_at IS NOT NULL, claim_token IS NOT NULL, first_failed_at IS NOT NULL, \
                    next_attempt_at <= now() \
               FROM outbox WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    Stored {
        dedupe_key: row.get(0),
        attempts: row.get(1),
        sent: row.get(2),
        parked: row.get(3),
        skipped: row.get(4),
        leased: row.get(5),
        first_failed: row.get(6),
        due: row.get(7),
    }
}

fn completed_id(job: &Job) -> String {
    WebhookEvent::webhook_id(job.job_id, EventType::Completed)
}

/// Rows in every state a webhook can be in, made with the relay's own marks.
struct States {
    delivered: (Job, i64),
    retrying: (Job, i64),
    parked: (Job, i64),
    skipped: (Job, i64),
    /// Committed after the claim: never attempted.
    fresh: (Job, i64),
}

async fn rows_in_every_state(env: &TestEnv, pg: &deadpool_postgres::Pool) -> States {
    let names = ["delivered", "retrying", "parked", "skipped"];
    let jobs = names.map(|name| job(name, URL));
    for job in &jobs {
        completed(pg, job).await;
    }
    // Oldest first: the rows in the order their jobs committed.
    let claimed = claim(pg).await;
    assert_eq!(claimed.len(), 4);
    for (job, row) in jobs.iter().zip(&claimed) {
        assert_eq!(stored(env, row.id).await.dedupe_key, completed_id(job));
    }
    let [delivered, retrying, parked, skipped] = [0, 1, 2, 3].map(|i| &claimed[i]);
    assert!(
        outbox::mark_delivered(pg, delivered.id, Some(204))
            .await
            .unwrap()
    );
    outbox::mark_attempt_failed(
        pg,
        retrying.id,
        retrying.claim_token,
        failure("503 Service Unavailable", Some(503)),
        Duration::from_secs(300),
        GIVE_UP,
    )
    .await
    .unwrap()
    .expect("our claim");
    let refused = failure("the payload is not a webhook event", None);
    assert!(
        outbox::mark_attempt_refused(pg, parked.id, parked.claim_token, refused)
            .await
            .unwrap()
    );
    let gone = failure("410 Gone", Some(410));
    assert!(
        outbox::mark_skipped(pg, skipped.id, skipped.claim_token, gone)
            .await
            .unwrap()
    );
    let fresh = job("fresh", URL);
    completed(pg, &fresh).await;
    let fresh_id = row_id(env, &completed_id(&fresh)).await;
    let [a, b, c, d] = jobs;
    States {
        delivered: (a, delivered.id),
        retrying: (b, retrying.id),
        parked: (c, parked.id),
        skipped: (d, skipped.id),
        fresh: (fresh, fresh_id),
    }
}

async fn row_id(env: &TestEnv, dedupe_key: &str) -> i64 {
    env.pg()
        .await
        .query_one(
            "SELECT id FROM outbox WHERE dedupe_key = $1",
            &[&dedupe_key],
        )
        .await
        .unwrap()
        .get(0)
}

/// Move the start of the endpoint's run of failures `secs` into the past.
async fn failing_for(env: &TestEnv, secs: i64) {
    let n = env
        .pg()
        .await
        .execute(
            "UPDATE webhook_endpoints SET failing_since = now() - $1::bigint * interval '1 second'",
            &[&secs],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn deliveries_show_every_state_with_exactly_the_contract_s_fields() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let s = rows_in_every_state(&env, pg).await;
    // A dead-lettered job's summary.failed; and a job with an email too, which is no webhook.
    let dead = job("dead", URL);
    failed(pg, &dead).await;
    let dead_id = row_id(
        &env,
        &WebhookEvent::webhook_id(dead.job_id, EventType::Failed),
    )
    .await;
    let mut emailed = job("emailed", URL);
    emailed.notify = Some(Email::parse("lead@example.com").unwrap());
    completed(pg, &emailed).await;
    let emailed_id = row_id(&env, &completed_id(&emailed)).await;
    assert_eq!(env.count("outbox WHERE topic <> 'webhook'").await, 1);

    let all = deliveries(&env, &[]).await;
    let (delivered, retrying, parked, skipped, fresh) = (
        s.delivered.1,
        s.retrying.1,
        s.parked.1,
        s.skipped.1,
        s.fresh.1,
    );
    assert_eq!(
        ids(&all),
        [
            delivered, retrying, parked, skipped, fresh, dead_id, emailed_id
        ],
        "every webhook row, oldest first, and no email"
    );
    let row = |id: i64| all.iter().find(|r| r["id"] == id).unwrap().clone();

    let r = row(delivered);
    assert_eq!(r["job_id"], s.delivered.0.job_id.to_string());
    assert_eq!(r["type"], "summary.completed");
    assert_eq!(r["url"], URL);
    assert_eq!(
        (r["attempts"].clone(), r["last_status"].clone()),
        (0.into(), 204.into())
    );
    assert!(r["last_error"].is_null() && r["next_at"].is_null(), "{r}");
    time(&r["delivered_at"]);

    let r = row(retrying);
    assert_eq!(
        (r["attempts"].clone(), r["last_status"].clone()),
        (1.into(), 503.into())
    );
    assert_eq!(r["last_error"], "503 Service Unavailable");
    assert!(
        time(&r["next_at"]) > Utc::now(),
        "waiting out its backoff: {r}"
    );
    assert!(r["delivered_at"].is_null(), "{r}");

    let r = row(parked);
    assert_eq!(
        (r["attempts"].clone(), r["last_status"].clone()),
        (1.into(), Value::Null)
    );
    assert_eq!(r["last_error"], "the payload is not a webhook event");
    assert!(
        r["next_at"].is_null() && r["delivered_at"].is_null(),
        "parked: {r}"
    );

    let r = row(skipped);
    assert_eq!(
        (r["attempts"].clone(), r["last_status"].clone()),
        (0.into(), 410.into())
    );
    assert_eq!(r["last_error"], "410 Gone");
    assert!(
        r["next_at"].is_null() && r["delivered_at"].is_null(),
        "skipped: {r}"
    );

    let r = row(fresh);
    assert_eq!(r["attempts"], 0);
    assert!(
        r["last_status"].is_null() && r["last_error"].is_null(),
        "{r}"
    );
    time(&r["next_at"]);
    assert!(r["delivered_at"].is_null(), "{r}");

    let r = row(dead_id);
    assert_eq!(r["type"], "summary.failed");
    assert_eq!(r["job_id"], dead.job_id.to_string());

    // --failed: not delivered, last attempt failed (retrying, parked or skipped).
    assert_eq!(
        ids(&deliveries(&env, &["--failed"]).await),
        [retrying, parked, skipped]
    );
    // --job, alone and with --failed.
    let of = |job: &Job| job.job_id.to_string();
    assert_eq!(
        ids(&deliveries(&env, &["--job", &of(&s.delivered.0)]).await),
        [delivered]
    );
    assert_eq!(
        ids(&deliveries(&env, &["--job", &of(&dead)]).await),
        [dead_id]
    );
    let failed_of = |job: &Job| ["--job".to_owned(), of(job), "--failed".to_owned()];
    let args = failed_of(&s.retrying.0);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(ids(&deliveries(&env, &args).await), [retrying]);
    let args = failed_of(&s.delivered.0);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(deliveries(&env, &args).await.is_empty());

    // Without --json: a table, one line per row under the column names.
    let table = run(&env, &["deliveries"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, FIELDS);
    assert_eq!(lines.count(), 7, "{table}");
    assert!(table.contains("503 Service Unavailable"), "{table}");
    let none = run(
        &env,
        &["deliveries", "--failed", "--job", &of(&s.delivered.0)],
    )
    .await;
    assert!(none.ends_with("(none)\n"), "{none}");

    // `outbox stuck` lists the given-up webhook too, with its job id (from the event's data).
    let mut stuck = Vec::new();
    ops::outbox::stuck(pg, true, &mut stuck).await.unwrap();
    let stuck: Value = serde_json::from_slice(&stuck).unwrap();
    assert_eq!(stuck["id"], parked);
    assert_eq!(stuck["topic"], "webhook");
    assert_eq!(stuck["job_id"], s.parked.0.job_id.to_string());
}

#[tokio::test]
async fn replay_makes_rows_due_again_with_the_same_webhook_id_and_leaves_leased_rows_alone() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let s = rows_in_every_state(&env, pg).await;
    let mut emailed = job("emailed", URL);
    emailed.notify = Some(Email::parse("lead@example.com").unwrap());
    emailed.webhook = None;
    completed(pg, &emailed).await;
    let email_id = row_id(
        &env,
        &summaryd::domain::SummaryReady::dedupe_key(emailed.job_id),
    )
    .await;
    // A relay is sending the fresh row right now (the email is not a webhook row).
    let leased = claim(pg).await;
    assert_eq!(leased.iter().map(|r| r.id).collect::<Vec<_>>(), [s.fresh.1]);
    let (delivered, parked, skipped, fresh) = (s.delivered.1, s.parked.1, s.skipped.1, s.fresh.1);
    let before: Vec<Stored> =
        futures_util::future::join_all([delivered, parked, skipped].map(|id| stored(&env, id)))
            .await;

    let list = [delivered, parked, skipped, fresh, email_id].map(|id| id.to_string());
    let mut args = vec!["replay"];
    args.extend(list.iter().map(String::as_str));
    assert_eq!(run(&env, &args).await, "3 webhook(s) will be sent again\n");

    for (id, before) in [delivered, parked, skipped].into_iter().zip(before) {
        let after = stored(&env, id).await;
        assert_eq!(after.dedupe_key, before.dedupe_key, "the same webhook-id");
        assert_eq!(after.attempts, 0, "{after:?}");
        assert!(
            after.due && !after.sent && !after.parked && !after.skipped,
            "{after:?}"
        );
        assert!(!after.leased && !after.first_failed, "{after:?}");
    }
    let fresh_after = stored(&env, fresh).await;
    assert!(
        fresh_after.leased,
        "a row a relay holds is left alone: {fresh_after:?}"
    );
    let retrying_after = stored(&env, s.retrying.1).await;
    assert_eq!(
        retrying_after.attempts, 1,
        "not selected: {retrying_after:?}"
    );
    assert!(!retrying_after.due);
    let email = stored(&env, email_id).await;
    assert!(
        email.due && !email.leased && email.attempts == 0,
        "{email:?}"
    );

    // The relay's own claim now takes exactly the replayed rows.
    let again = claim(pg).await;
    assert_eq!(
        again.iter().map(|r| r.id).collect::<Vec<_>>(),
        [delivered, parked, skipped]
    );
    let shown = deliveries(&env, &["--job", &s.delivered.0.job_id.to_string()]).await;
    assert!(
        shown[0]["delivered_at"].is_null() && shown[0]["attempts"] == 0,
        "{shown:?}"
    );
    time(&shown[0]["next_at"]);
}

#[tokio::test]
async fn replay_by_job_takes_both_of_its_events_delivered_or_not() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    // Dead-lettered, replayed by the operator, then completed: both events were sent.
    let both = job("both", URL);
    failed(pg, &both).await;
    completed(pg, &both).await;
    let other = job("other", URL);
    completed(pg, &other).await;
    for row in claim(pg).await {
        assert!(outbox::mark_delivered(pg, row.id, Some(200)).await.unwrap());
    }
    let out = run(&env, &["replay", "--job", &both.job_id.to_string()]).await;
    assert_eq!(out, "2 webhook(s) will be sent again\n");
    let due: Vec<i64> = claim(pg).await.iter().map(|r| r.id).collect();
    let expected = [
        row_id(
            &env,
            &WebhookEvent::webhook_id(both.job_id, EventType::Failed),
        )
        .await,
        row_id(&env, &completed_id(&both)).await,
    ];
    assert_eq!(due, expected);
    assert!(
        stored(&env, row_id(&env, &completed_id(&other)).await)
            .await
            .sent
    );
    // A job without webhooks: nothing to do, and that is no error.
    let none = JobId::from_scoped_key("idem:acme:POST:/v1/summaries:none").to_string();
    assert_eq!(
        run(&env, &["replay", "--job", &none]).await,
        "0 webhook(s) will be sent again\n"
    );
}

#[tokio::test]
async fn replay_failed_since_selects_by_the_last_failure_of_rows_not_delivered() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let names = ["recent", "old", "recovered", "skipped"];
    let jobs = names.map(|name| job(name, URL));
    for job in &jobs {
        completed(pg, job).await;
    }
    let rows = claim(pg).await;
    let [recent, old, recovered, skipped] = [0, 1, 2, 3].map(|i| &rows[i]);
    for row in [recent, old, recovered] {
        let wait = if row.id == recovered.id {
            Duration::ZERO
        } else {
            Duration::from_secs(300)
        };
        outbox::mark_attempt_failed(
            pg,
            row.id,
            row.claim_token,
            failure("timed out", None),
            wait,
            GIVE_UP,
        )
        .await
        .unwrap()
        .expect("our claim");
    }
    assert!(
        outbox::mark_skipped(
            pg,
            skipped.id,
            skipped.claim_token,
            failure("disabled", None)
        )
        .await
        .unwrap()
    );
    // The recovered row failed once, then went through.
    let retried = claim(pg).await;
    assert_eq!(
        retried.iter().map(|r| r.id).collect::<Vec<_>>(),
        [recovered.id]
    );
    assert!(
        outbox::mark_delivered(pg, recovered.id, Some(200))
            .await
            .unwrap()
    );
    env.pg()
        .await
        .execute(
            "UPDATE outbox SET last_failed_at = now() - interval '3 hours' WHERE id = $1",
            &[&old.id],
        )
        .await
        .unwrap();
    let never = job("never", URL);
    completed(pg, &never).await;

    assert_eq!(
        ids(&deliveries(&env, &["--failed"]).await),
        [recent.id, old.id, skipped.id],
        "undelivered rows with a failure, however old"
    );
    let out = run(&env, &["replay", "--failed-since", "1h"]).await;
    assert_eq!(out, "2 webhook(s) will be sent again\n");
    for id in [recent.id, skipped.id] {
        let row = stored(&env, id).await;
        assert!(row.due && row.attempts == 0 && !row.skipped, "{row:?}");
    }
    let old_after = stored(&env, old.id).await;
    assert!(
        !old_after.due && old_after.attempts == 1,
        "failed before the window: {old_after:?}"
    );
    assert!(
        stored(&env, recovered.id).await.sent,
        "a delivered row is not resent"
    );
    // A window longer than anything stored selects every failed row; it is not an error.
    let out = run(&env, &["replay", "--failed-since", "99999999w"]).await;
    assert_eq!(out, "3 webhook(s) will be sent again\n");
}

#[tokio::test]
async fn enable_clears_the_tenant_s_disabled_endpoint_and_says_whether_it_was_disabled() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let other = TenantId::parse("globex").unwrap();
    assert!(
        webhooks::disable(pg, &acme(), URL, "410 Gone")
            .await
            .unwrap()
    );
    assert!(
        webhooks::disable(pg, &other, URL, "410 Gone")
            .await
            .unwrap()
    );

    // As an operator may type it: the scheme and host in capitals.
    let typed = "HTTPS://Hooks.EXAMPLE.com/summaryd";
    let out = run(&env, &["enable", "--tenant", "acme", "--url", typed]).await;
    assert!(
        out.contains("it was disabled") && out.contains("webhook replay"),
        "{out}"
    );
    assert_eq!(webhooks::disabled(pg, &acme(), URL).await.unwrap(), None);
    let row = env
        .pg()
        .await
        .query_one(
            "SELECT disabled_at IS NULL AND disabled_reason IS NULL AND failing_since IS NULL                FROM webhook_endpoints WHERE tenant = 'acme'",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "enable clears the endpoint's state");
    let still = webhooks::disabled(pg, &other, URL).await.unwrap().unwrap();
    assert_eq!(
        still.reason, "410 Gone",
        "another tenant's endpoint stays disabled"
    );

    let again = run(&env, &["enable", "--tenant", "acme", "--url", URL]).await;
    assert!(again.contains("was not disabled"), "{again}");
    let unknown = run(
        &env,
        &[
            "enable",
            "--tenant",
            "acme",
            "--url",
            "https://new.example.com",
        ],
    )
    .await;
    assert!(
        unknown.contains("https://new.example.com/ was not disabled"),
        "{unknown}"
    );
}

/// The operator's whole path: a receiver answers 410, the relay disables the endpoint and
/// skips its webhooks, the operator finds them, enables the endpoint and replays them, and
/// the receiver gets each event with its original webhook-id, signed.
#[tokio::test]
async fn a_receiver_that_answered_410_gets_its_webhooks_after_enable_and_replay() {
    let env = TestEnv::new().await;
    let secret = summaryd::domain::WebhookSecret::generate();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "{secret}").unwrap();
    let mut settings = env.settings.clone();
    settings.webhook.secrets_file = Some(file.path().to_owned());
    settings.webhook.allow_private = true;
    settings.webhook.allow_http = true;
    let services = env.services().settings(settings).build();
    let pg = &services.pg;
    let stub = HttpStub::start(Reply::text(200, "ok")).await;
    stub.script(vec![Reply::text(410, "gone")]);
    let url = stub.url("/hook");

    let first = job("first", &url);
    completed(pg, &first).await;
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 0);
    assert_eq!(stub.requests().len(), 1);
    let endpoint = WebhookUrl::from_stored(&url).unwrap();
    let gone = webhooks::disabled(pg, &acme(), endpoint.as_str())
        .await
        .unwrap();
    assert_eq!(gone.map(|d| d.reason).as_deref(), Some("410 Gone"));
    // A later event to the disabled endpoint is skipped, not sent.
    let second = job("second", &url);
    completed(pg, &second).await;
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 0);
    assert_eq!(stub.requests().len(), 1);

    let not_delivered = deliveries(&env, &["--failed"]).await;
    assert_eq!(not_delivered.len(), 2, "{not_delivered:?}");
    assert_eq!(not_delivered[0]["last_status"], 410);
    assert_eq!(not_delivered[0]["url"], endpoint.as_str());
    assert!(
        not_delivered[1]["last_error"]
            .as_str()
            .unwrap()
            .contains("disabled"),
        "{not_delivered:?}"
    );
    assert!(
        not_delivered
            .iter()
            .all(|r| r["next_at"].is_null() && r["delivered_at"].is_null())
    );

    // Replayed while the endpoint is still disabled: skipped again, nothing sent.
    let out = run(&env, &["replay", "--job", &first.job_id.to_string()]).await;
    assert_eq!(out, "1 webhook(s) will be sent again\n");
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 0);
    assert_eq!(stub.requests().len(), 1);

    let out = run(&env, &["enable", "--tenant", "acme", "--url", &url]).await;
    assert!(out.contains("it was disabled"), "{out}");
    let out = run(&env, &["replay", "--failed-since", "1h"]).await;
    assert_eq!(out, "2 webhook(s) will be sent again\n");
    assert_eq!(relay_once(&services.relay()).await.unwrap(), 2);

    let requests = stub.requests();
    assert_eq!(requests.len(), 3);
    let payloads = verify_all(&secret, &requests).await;
    let webhook_ids: Vec<&str> = requests
        .iter()
        .map(|r| r.header("webhook-id").unwrap())
        .collect();
    assert_eq!(webhook_ids[0], completed_id(&first));
    let mut resent: Vec<&str> = webhook_ids[1..].to_vec();
    resent.sort_unstable();
    let mut expected = [completed_id(&first), completed_id(&second)];
    expected.sort_unstable();
    assert_eq!(
        resent, expected,
        "each event once more, with its own webhook-id"
    );
    assert!(payloads.iter().all(|p| p["type"] == "summary.completed"));

    let shown = deliveries(&env, &["--job", &first.job_id.to_string()]).await;
    assert_eq!(shown[0]["last_status"], 200);
    assert_eq!(shown[0]["attempts"], 0);
    time(&shown[0]["delivered_at"]);
    assert!(deliveries(&env, &["--failed"]).await.is_empty());
    assert_eq!(
        webhooks::disabled(pg, &acme(), endpoint.as_str())
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn an_endpoint_is_disabled_once_and_only_after_a_whole_run_of_failures() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let hour = Duration::from_secs(3_600);
    // The first failure of a run never disables, however short the limit.
    assert_eq!(
        webhooks::note_failure(pg, &acme(), URL, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    assert_eq!(webhooks::disabled(pg, &acme(), URL).await.unwrap(), None);
    // Failing for less than the limit: still enabled.
    failing_for(&env, 1_800).await;
    assert_eq!(
        webhooks::note_failure(pg, &acme(), URL, hour)
            .await
            .unwrap(),
        None
    );
    assert_eq!(webhooks::disabled(pg, &acme(), URL).await.unwrap(), None);
    // A failure once the run has lasted the limit disables it, and says so once.
    failing_for(&env, 7_200).await;
    let reason = webhooks::note_failure(pg, &acme(), URL, hour)
        .await
        .unwrap();
    let expected = "every delivery failed for 3600 s (SUMMARYD_WEBHOOK_DISABLE_AFTER_S)";
    assert_eq!(reason.as_deref(), Some(expected));
    let disabled = webhooks::disabled(pg, &acme(), URL).await.unwrap().unwrap();
    assert_eq!(disabled.reason, expected);
    assert_eq!(
        webhooks::note_failure(pg, &acme(), URL, hour)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        webhooks::disabled(pg, &acme(), URL).await.unwrap(),
        Some(disabled)
    );
    let globex = TenantId::parse("globex").unwrap();
    assert_eq!(
        webhooks::disabled(pg, &globex, URL).await.unwrap(),
        None,
        "per tenant"
    );
}

#[tokio::test]
async fn a_delivery_ends_the_run_of_failures() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let hour = Duration::from_secs(3_600);
    assert_eq!(
        webhooks::note_failure(pg, &acme(), URL, hour)
            .await
            .unwrap(),
        None
    );
    failing_for(&env, 7_200).await;
    webhooks::note_success(pg, &acme(), URL).await.unwrap();
    let failing: Option<DateTime<Utc>> = env
        .pg()
        .await
        .query_one("SELECT failing_since FROM webhook_endpoints", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(failing, None);
    // The next failure starts a new run: nothing is disabled for the old one.
    assert_eq!(
        webhooks::note_failure(pg, &acme(), URL, hour)
            .await
            .unwrap(),
        None
    );
    assert_eq!(webhooks::disabled(pg, &acme(), URL).await.unwrap(), None);
}

/// The failures of one relay pass are noted concurrently; when they cross the limit
/// together, one of them reports the disabling (and logs it), not each.
#[tokio::test]
async fn concurrent_failures_crossing_the_limit_report_the_disabling_once() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let hour = Duration::from_secs(3_600);
    for round in 0..5 {
        let url = format!("https://hooks.example.com/{round}");
        assert_eq!(
            webhooks::note_failure(&services.pg, &acme(), &url, hour)
                .await
                .unwrap(),
            None
        );
        env.pg()
            .await
            .execute(
                "UPDATE webhook_endpoints SET failing_since = now() - interval '2 hours'                   WHERE url = $1",
                &[&url],
            )
            .await
            .unwrap();
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..12 {
            let (pg, url) = (services.pg.clone(), url.clone());
            set.spawn(async move { webhooks::note_failure(&pg, &acme(), &url, hour).await });
        }
        let reported = set
            .join_all()
            .await
            .into_iter()
            .filter(|r| r.as_ref().unwrap().is_some())
            .count();
        assert_eq!(reported, 1, "round {round}");
    }
}

#[tokio::test]
async fn a_disable_limit_longer_than_anything_stored_is_not_an_error() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = &services.pg;
    let forever = Duration::from_secs(u64::MAX);
    for _ in 0..2 {
        assert_eq!(
            webhooks::note_failure(pg, &acme(), URL, forever)
                .await
                .unwrap(),
            None
        );
    }
    let n = webhooks::replay(pg, &Selection::FailedSince(forever))
        .await
        .unwrap();
    assert_eq!(n, 0);
}

/// Like every admin command, the webhook commands open only what they use: Postgres, and
/// `secret new` nothing at all.
#[tokio::test]
async fn webhook_commands_open_only_postgres_and_secret_new_nothing() {
    let env = TestEnv::new().await;
    let mut no_redis = env.settings.clone();
    no_redis.redis_url = "not a url".into();
    let out = run_with(&no_redis, &["deliveries"]).await.unwrap();
    assert!(out.ends_with("(none)\n"), "{out}");
    let mut no_postgres = env.settings.clone();
    no_postgres.database_url = "not a url".into();
    let err = run_with(&no_postgres, &["deliveries"]).await;
    assert!(matches!(err, Err(AdminError::Setup(_))), "{err:?}");
    let out = run_with(&no_postgres, &["secret", "new"]).await.unwrap();
    let secret = out.lines().find(|l| l.starts_with("whsec_")).unwrap();
    summaryd::domain::WebhookSecret::parse(secret).unwrap();
}
