//! The outbox relay against real Postgres with a scriptable mail provider: every committed
//! email intent is handed to the provider until it is accepted, always with the row's
//! dedupe key; leases keep concurrent and crashed relays from double-sending.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sha2::Digest;
use summaryd::config::{MailProvider, Settings};
use summaryd::db::outbox::{self, StuckRow};
use summaryd::db::summaries::{self, CommitOutcome};
use summaryd::domain::{Email, Job, JobId, SummaryReady, TenantId};
use summaryd::infra::log_key::{DeploymentKey, LogKey};
use summaryd::mail::{
    LogMailer, MailError, Mailer, OutgoingEmail, SUMMARY_READY_SUBJECT, summary_ready_email,
};
use summaryd::relay::{RelayServices, relay_once, relay_pass, run};
use summaryd::shutdown::Shutdown;

use crate::shared::fabricate::expire_leases;
use crate::shared::fakes::MailStep;
use crate::shared::log_capture::Captured;
use crate::shared::smtp_sink::SmtpSink;
use crate::shared::{FakeMailer, TestEnv, eventually};

const NOTIFY: &str = "team@example.com";

/// Fast, deterministic relay settings: no backoff between attempts, a long lease (tests that
/// need it expired say so), and a mail timeout far above any fake's latency.
fn fast_settings(env: &TestEnv) -> Settings {
    let mut s = env.settings.clone();
    s.relay.backoff = Duration::ZERO;
    s.relay.max_backoff = Duration::ZERO;
    s.relay.lease = Duration::from_secs(60);
    s.relay.batch = 10;
    s.mail.timeout = Duration::from_secs(5);
    s
}

fn services(env: &TestEnv, settings: Settings, mailer: &Arc<FakeMailer>) -> RelayServices {
    env.services()
        .settings(settings)
        .mailer(mailer.clone())
        .build()
        .relay()
}

fn summary_text(n: u32) -> String {
    format!("Summary number {n}: revenue is up, churn is down.")
}

/// What the worker does when a job finishes: the summary and its outbox row, committed together.
async fn commit_job(services: &RelayServices, n: u32) -> JobId {
    let msg = Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:relay-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: "A long report.".into(),
        notify: Some(Email::parse(NOTIFY).unwrap()),
        webhook: None,
        created_at: Utc::now(),
    };
    let outcome = summaries::commit_with_outbox(
        &services.pg,
        &msg,
        &crate::shared::model_summary(&summary_text(n)),
    )
    .await
    .expect("commit");
    assert_eq!(outcome, CommitOutcome::Inserted);
    msg.job_id
}

fn key(job: JobId) -> String {
    format!("summary_ready:{job}")
}

#[derive(Debug)]
struct OutboxState {
    id: i64,
    attempts: i32,
    last_error: Option<String>,
    sent: bool,
    failed: bool,
    leased: bool,
}

async fn outbox_row(env: &TestEnv, job: JobId) -> OutboxState {
    let row = env
        .pg()
        .await
        .query_one(
            "SELECT id, attempts, last_error, sent_at IS NOT NULL, failed_at IS NOT NULL, \
                    claimed_until IS NOT NULL AND claimed_until > now() \
               FROM outbox WHERE dedupe_key = $1",
            &[&key(job)],
        )
        .await
        .expect("outbox row");
    OutboxState {
        id: row.get(0),
        attempts: row.get(1),
        last_error: row.get(2),
        sent: row.get(3),
        failed: row.get(4),
        leased: row.get(5),
    }
}

fn sent_keys(mailer: &FakeMailer) -> Vec<String> {
    mailer.sent().into_iter().map(|(_, k)| k).collect()
}

#[tokio::test]
async fn provider_down_then_up_sends_exactly_one_email_with_the_dedupe_key() {
    let env = TestEnv::new().await;
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::Fail(|| MailError::Status {
            status: 503,
            message: "from provider".into(),
        })],
        MailStep::Deliver,
    ));
    let svc = services(&env, fast_settings(&env), &mailer);
    let job = commit_job(&svc, 1).await;

    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    let row = outbox_row(&env, job).await;
    assert_eq!(row.attempts, 1);
    assert!(
        row.last_error.as_deref().unwrap_or("").contains("503"),
        "{row:?}"
    );
    assert!(!row.sent && !row.failed && !row.leased, "{row:?}");
    assert!(mailer.sent().is_empty());

    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert!(outbox_row(&env, job).await.sent);
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
    assert_eq!(svc.metrics.outbox_sent.get(), 1);

    // A sent row is never handed to the provider again.
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 2);
}

#[tokio::test]
async fn crash_between_send_and_commit_resends_with_the_same_dedupe_key() {
    let env = TestEnv::new().await;
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::DeliverThenCrash],
        MailStep::Deliver,
    ));
    let svc = services(&env, fast_settings(&env), &mailer);
    let job = commit_job(&svc, 1).await;

    // The panic inside send stands in for SIGKILL after the provider accepted the email.
    let crashed = {
        let svc = svc.clone();
        tokio::spawn(async move { relay_once(&svc).await }).await
    };
    assert!(crashed.is_err(), "the relay pass should have crashed");
    let row = outbox_row(&env, job).await;
    assert!(!row.sent && row.attempts == 0 && row.leased, "{row:?}");

    // The crashed pass's lease still holds the row: no other pass sends it meanwhile.
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.sent().len(), 1);
    expire_leases(&env.pg().await).await;
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(job), key(job)]);
    let row = outbox_row(&env, job).await;
    assert!(row.sent && row.attempts == 0, "{row:?}");
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.sent().len(), 2);
}

#[tokio::test]
async fn two_relays_at_once_deliver_each_row_exactly_once() {
    let env = TestEnv::new().await;
    let mut settings = fast_settings(&env);
    settings.relay.batch = 2;
    // Slow sends keep each relay's claim open while the other one claims.
    let mailer = Arc::new(FakeMailer::with(
        vec![],
        MailStep::DelayThenDeliver(Duration::from_millis(200)),
    ));
    let svc = services(&env, settings, &mailer);
    let mut jobs = Vec::new();
    for n in 0..6 {
        jobs.push(commit_job(&svc, n).await);
    }

    let drain = |svc: RelayServices| async move {
        let mut sent = 0;
        loop {
            match relay_once(&svc).await.unwrap() {
                0 => return sent,
                n => sent += n,
            }
        }
    };
    let (a, b) = tokio::join!(drain(svc.clone()), drain(svc.clone()));

    assert_eq!(a + b, 6);
    assert!(
        a > 0 && b > 0,
        "both relays should have sent rows: {a} / {b}"
    );
    let keys = sent_keys(&mailer);
    assert_eq!(keys.len(), 6, "{keys:?}");
    let expected: HashSet<String> = jobs.iter().map(|j| key(*j)).collect();
    assert_eq!(keys.into_iter().collect::<HashSet<_>>(), expected);
    for job in jobs {
        let row = outbox_row(&env, job).await;
        assert!(row.sent && row.attempts == 0, "{row:?}");
    }
    assert_eq!(svc.metrics.outbox_sent.get(), 6);
}

#[tokio::test]
async fn a_dead_relays_rows_wait_for_its_lease_then_go_out_once() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings.clone(), &mailer);
    let held = [commit_job(&svc, 1).await, commit_job(&svc, 2).await];

    // The "dead" relay claims and never records anything.
    let claimed = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, settings.relay.lease)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let lease_ok: bool = env
        .pg()
        .await
        .query_one(
            "SELECT bool_and(claimed_until > now() + interval '50 seconds' \
                         AND claimed_until <= now() + interval '60 seconds') FROM outbox",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        lease_ok,
        "the claim should lease the rows for relay.lease_ms"
    );
    let fresh = commit_job(&svc, 3).await;

    // Before the lease ends another relay only sends what nobody holds.
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(fresh)]);
    for job in held {
        let row = outbox_row(&env, job).await;
        assert!(!row.sent && row.leased && row.attempts == 0, "{row:?}");
    }

    expire_leases(&env.pg().await).await;
    assert_eq!(relay_once(&svc).await.unwrap(), 2);
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    let mut keys = sent_keys(&mailer);
    keys.sort();
    let mut expected = vec![key(fresh), key(held[0]), key(held[1])];
    expected.sort();
    assert_eq!(keys, expected);
}

#[tokio::test]
async fn permanent_failure_parks_the_row_until_an_operator_retries_it() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::Fail(|| MailError::Status {
            status: 422,
            message: "recipient rejected".into(),
        })],
        MailStep::Deliver,
    ));
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;

    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    let row = outbox_row(&env, job).await;
    assert!(row.failed && !row.sent && row.attempts == 1, "{row:?}");
    assert!(
        row.last_error.as_deref().unwrap_or("").contains("422"),
        "{row:?}"
    );

    let stuck = outbox::stuck(&svc.pg).await.unwrap();
    assert_eq!(stuck.len(), 1);
    let StuckRow {
        id,
        job_id,
        topic,
        dedupe_key,
        attempts,
        last_error,
        ..
    } = stuck[0].clone();
    assert_eq!(id, row.id);
    assert_eq!(job_id, Some(job.to_string()));
    assert_eq!(topic, SummaryReady::TOPIC);
    assert_eq!(dedupe_key, key(job));
    assert_eq!(attempts, 1);
    assert_eq!(last_error, row.last_error);

    // No futile attempts: the provider is not called again.
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 1);

    assert_eq!(outbox::retry(&svc.pg, Some(&[row.id])).await.unwrap(), 1);
    let row = outbox_row(&env, job).await;
    assert!(!row.failed && row.attempts == 0, "{row:?}");
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
    // Retrying a sent row never resends it.
    assert_eq!(outbox::retry(&svc.pg, Some(&[row.id])).await.unwrap(), 0);
    assert_eq!(outbox::retry(&svc.pg, None).await.unwrap(), 0);
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 2);
}

#[tokio::test]
async fn a_payload_that_cannot_be_composed_fails_permanently_without_calling_the_provider() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    env.pg()
        .await
        .execute(
            "INSERT INTO outbox (topic, dedupe_key, payload) VALUES ($1, 'summary_ready:broken', \
             '{\"job_id\": \"not-a-uuid\", \"to\": \"team@example.com\"}')",
            &[&SummaryReady::TOPIC],
        )
        .await
        .unwrap();
    let healthy = commit_job(&svc, 1).await;

    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(healthy)]);
    assert_eq!(
        mailer.attempts(),
        1,
        "the broken row never reached the provider"
    );
    let stuck = outbox::stuck(&svc.pg).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].dedupe_key, "summary_ready:broken");
    assert_eq!(stuck[0].job_id.as_deref(), Some("not-a-uuid"));
    assert!(
        stuck[0]
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("job_id"),
        "{:?}",
        stuck[0]
    );
}

#[tokio::test]
async fn transient_failures_never_park_a_row_before_the_give_up_horizon() {
    let env = TestEnv::new().await;
    let mut settings = fast_settings(&env);
    // Accepted, and without effect: the old attempt budget no longer parks rows.
    settings.relay.max_attempts = 3;
    let mailer = Arc::new(FakeMailer::with(
        vec![],
        MailStep::Fail(|| MailError::SmtpConnection {
            server: "mx.test:25".into(),
            message: "Connection error: connection refused".into(),
        }),
    ));
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;

    for attempt in 1..=12 {
        assert_eq!(relay_once(&svc).await.unwrap(), 0);
        assert_eq!(outbox_row(&env, job).await.attempts, attempt);
    }
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
    assert_eq!(mailer.attempts(), 12);

    // The row has been failing for longer than the horizon since its first failure: the
    // next failure parks it for a person.
    env.pg()
        .await
        .execute(
            "UPDATE outbox SET first_failed_at = now() - interval '2 days'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 13, "tried once more, and failed again");
    let row = outbox_row(&env, job).await;
    assert!(!row.sent && row.failed && !row.leased, "{row:?}");
    let stuck = outbox::stuck(&svc.pg).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].attempts, 13);
    assert!(
        stuck[0]
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("connection refused")
    );
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 13, "a parked row is not sent");

    // `outbox retry` restarts the horizon: the row is sent again and keeps retrying.
    assert_eq!(outbox::retry(&svc.pg, None).await.unwrap(), 1);
    assert_eq!(outbox_row(&env, job).await.attempts, 0);
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 15, "retried rows are claimed again");
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_row_never_tried_is_sent_however_old_it_is() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings.clone(), &mailer);
    let job = commit_job(&svc, 1).await;
    // The relay was down for longer than the horizon; nothing was ever attempted.
    env.pg()
        .await
        .execute(
            "UPDATE outbox SET created_at = now() - interval '3 days'",
            &[],
        )
        .await
        .unwrap();
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
}

#[tokio::test]
async fn a_provider_that_does_not_answer_in_time_is_a_transient_failure() {
    let env = TestEnv::new().await;
    let mut settings = fast_settings(&env);
    settings.mail.timeout = Duration::from_millis(50);
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::DelayThenDeliver(Duration::from_secs(30))],
        MailStep::Deliver,
    ));
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;

    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    let row = outbox_row(&env, job).await;
    assert!(!row.sent && !row.failed && row.attempts == 1, "{row:?}");
    assert!(
        row.last_error.as_deref().unwrap_or("").contains("50 ms"),
        "{row:?}"
    );
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
}

#[tokio::test]
async fn a_stale_relay_cannot_undo_a_newer_claim() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let (max, lease) = (settings.relay.give_up(), settings.relay.lease);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;

    let stale = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, lease)
        .await
        .unwrap();
    expire_leases(&env.pg().await).await;
    let fresh = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, lease)
        .await
        .unwrap();
    assert_eq!((stale.len(), fresh.len()), (1, 1));
    let (stale, fresh) = (&stale[0], &fresh[0]);
    assert_eq!(stale.id, fresh.id);
    assert_ne!(stale.claim_token, fresh.claim_token);

    // The stale relay's failure marks change nothing: the row stays with the new claimant.
    let lost = outbox::mark_failed_transient(
        &svc.pg,
        stale.id,
        stale.claim_token,
        "late timeout",
        Duration::ZERO,
        max,
    )
    .await
    .unwrap();
    assert_eq!(lost, None);
    assert!(
        !outbox::mark_failed_permanent(&svc.pg, stale.id, stale.claim_token, "late 4xx")
            .await
            .unwrap()
    );
    let row = outbox_row(&env, job).await;
    assert!(row.leased && !row.failed && row.attempts == 0, "{row:?}");
    assert_eq!(row.last_error, None);
    // With the lease intact no third relay can take the row.
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 0);

    // The current claimant's marks do apply.
    let mark = outbox::mark_failed_transient(
        &svc.pg,
        fresh.id,
        fresh.claim_token,
        "503",
        Duration::ZERO,
        max,
    )
    .await
    .unwrap();
    assert_eq!(mark.map(|m| (m.attempts, m.past_give_up)), Some((1, false)));
    assert!(!outbox_row(&env, job).await.leased);
}

#[tokio::test]
async fn a_stale_relays_successful_send_is_still_recorded() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let (max, lease) = (settings.relay.give_up(), settings.relay.lease);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;

    let stale = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, lease)
        .await
        .unwrap();
    expire_leases(&env.pg().await).await;
    let fresh = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, lease)
        .await
        .unwrap();

    // The provider accepted the stale relay's send: recording it prevents further sends.
    assert!(outbox::mark_sent(&svc.pg, stale[0].id).await.unwrap());
    // The new claimant's late failure cannot make the delivered row due again.
    let late = outbox::mark_failed_transient(
        &svc.pg,
        fresh[0].id,
        fresh[0].claim_token,
        "503",
        Duration::ZERO,
        max,
    )
    .await
    .unwrap();
    assert_eq!(late, None);
    assert!(!outbox::mark_sent(&svc.pg, fresh[0].id).await.unwrap());
    let row = outbox_row(&env, job).await;
    assert!(row.sent && row.attempts == 0 && !row.leased, "{row:?}");
    expire_leases(&env.pg().await).await;
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 0);
}

/// A pass records its sent rows in one statement; a row another relay recorded already is
/// left as it is and not reported as recorded again.
#[tokio::test]
async fn a_pass_records_its_sent_rows_together_and_each_only_once() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let lease = settings.relay.lease;
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let jobs = [
        commit_job(&svc, 21).await,
        commit_job(&svc, 22).await,
        commit_job(&svc, 23).await,
    ];
    let rows = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, lease)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    assert!(outbox::mark_sent(&svc.pg, rows[1].id).await.unwrap());
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let mut recorded = outbox::mark_sent_many(&svc.pg, &ids).await.unwrap();
    recorded.sort_unstable();
    assert_eq!(recorded, vec![rows[0].id, rows[2].id]);
    for job in jobs {
        let row = outbox_row(&env, job).await;
        assert!(row.sent && !row.leased, "{row:?}");
    }
    assert!(
        outbox::mark_sent_many(&svc.pg, &ids)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        outbox::mark_sent_many(&svc.pg, &[])
            .await
            .unwrap()
            .is_empty()
    );
    // And the relay's own pass: three more rows, sent and recorded, none sent twice.
    let more = [
        commit_job(&svc, 24).await,
        commit_job(&svc, 25).await,
        commit_job(&svc, 26).await,
    ];
    assert_eq!(relay_once(&svc).await.unwrap(), 3);
    assert_eq!(mailer.attempts(), 3);
    for job in more {
        assert!(outbox_row(&env, job).await.sent);
    }
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 3);
}

#[tokio::test]
async fn the_email_names_the_job_and_carries_the_summary() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let from = settings.mail.from.clone();
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 7).await;

    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    let sent = mailer.sent();
    let (email, dedupe_key) = &sent[0];
    assert_eq!(dedupe_key, &key(job));
    assert_eq!(email.from, from);
    assert_eq!(email.to, NOTIFY);
    assert_eq!(email.subject, SUMMARY_READY_SUBJECT);
    assert!(email.text.contains(&summary_text(7)), "{}", email.text);
    assert!(email.text.contains(&job.to_string()), "{}", email.text);
}

/// The deployment key's one row, as the first process to need it stored it.
async fn stored_log_key(env: &TestEnv) -> Vec<Vec<u8>> {
    env.pg()
        .await
        .query("SELECT log_hmac_key FROM deployment_key", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn the_log_mailer_logs_the_email_with_the_recipient_hmac_and_the_text_as_a_length() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let job = JobId::from_scoped_key("log-mailer");
    let event = SummaryReady {
        job_id: job,
        tenant: TenantId::parse("acme").unwrap(),
        to: Email::parse(NOTIFY).unwrap(),
        summary: "Churn fell by 3 %.".into(),
        accepted_at: None,
    };
    let email: OutgoingEmail = summary_ready_email("summaryd@localhost", &event);
    assert!(
        stored_log_key(&env).await.is_empty(),
        "no key before it is needed"
    );
    // Two processes of one deployment, racing to create the key.
    let other = DeploymentKey::from_postgres(services.pg.clone());
    let (mine, theirs) = tokio::join!(services.log_key.get(), other.get());
    assert_eq!(mine.unwrap(), theirs.unwrap(), "one key per deployment");
    let stored = stored_log_key(&env).await;
    assert_eq!(stored.len(), 1);
    let db_key = LogKey::from_bytes(stored[0].as_slice().try_into().unwrap());

    let result = {
        // The test runtime is single-threaded, so the thread-local default sees the send.
        let _guard = tracing::subscriber::set_default(subscriber);
        LogMailer::new(services.log_key.clone())
            .send(&email, &key(job))
            .await
    };
    assert!(result.is_ok());
    let log = captured.text();
    let to_hmac = format!("to_hmac={}", db_key.recipient_tag(NOTIFY));
    let text_chars = format!("text_chars={}", email.text.chars().count());
    for needle in [
        SUMMARY_READY_SUBJECT,
        key(job).as_str(),
        &job.to_string(),
        &to_hmac,
        &text_chars,
    ] {
        assert!(log.contains(needle), "{needle:?} missing from {log}");
    }
    // Logs are no place for personal data: neither the address, nor the summary, nor an
    // unkeyed hash of the address that anyone could compute from a guess.
    let unkeyed = hex::encode(sha2::Sha256::digest(NOTIFY.as_bytes()));
    for absent in [NOTIFY, "Churn fell by 3 %.", &unkeyed[..12]] {
        assert!(!log.contains(absent), "{absent:?} in {log}");
    }
    assert!(log.contains("INFO"), "{log}");
}

#[tokio::test]
async fn run_sends_rows_committed_while_it_runs_and_stops_on_shutdown() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env); // poll_ms = 20 from the harness
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let shutdown = Shutdown::new();
    let task = tokio::spawn(run(svc.clone(), "relay-test".into(), shutdown.clone()));

    let jobs = [commit_job(&svc, 1).await, commit_job(&svc, 2).await];
    assert!(
        eventually(Duration::from_secs(10), || async {
            mailer.sent().len() >= 2
        })
        .await,
        "both rows sent: {:?}",
        sent_keys(&mailer)
    );
    let mut keys = sent_keys(&mailer);
    keys.sort();
    let mut expected: Vec<String> = jobs.iter().map(|j| key(*j)).collect();
    expected.sort();
    assert_eq!(keys, expected);

    shutdown.trigger();
    let stopped = tokio::time::timeout(Duration::from_secs(2), task).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    for job in jobs {
        assert!(outbox_row(&env, job).await.sent);
    }
    assert_eq!(mailer.sent().len(), 2);
}

#[tokio::test]
async fn run_wakes_from_its_idle_wait_on_shutdown() {
    let env = TestEnv::new().await;
    let mut settings = fast_settings(&env);
    // An idle wait far longer than the test: only the shutdown signal can end it.
    settings.relay.poll = Duration::from_secs(600);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;
    let shutdown = Shutdown::new();
    let task = tokio::spawn(run(svc.clone(), "relay-test".into(), shutdown.clone()));

    assert!(
        eventually(Duration::from_secs(10), || async {
            !mailer.sent().is_empty()
        })
        .await,
        "the row committed before the start is sent"
    );
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
    shutdown.trigger();
    let stopped = tokio::time::timeout(Duration::from_secs(2), task).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}

#[tokio::test]
async fn run_rides_out_database_errors_and_still_stops_on_shutdown() {
    let env = TestEnv::new().await;
    let mut settings = fast_settings(&env);
    settings.database_url = format!(
        "{}/summaryd_no_such_db",
        crate::shared::test_env::pg_base_url()
    )
    .into();
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let shutdown = Shutdown::new();
    let task = tokio::spawn(run(svc.clone(), "relay-test".into(), shutdown.clone()));

    // Enough failed passes in a row to count against readiness, each one backed off from.
    assert!(
        eventually(Duration::from_secs(10), || async {
            svc.metrics
                .failing_loops()
                .iter()
                .any(|(role, _, _)| *role == "relay")
        })
        .await,
        "the relay's passes fail against the missing database"
    );
    assert!(
        !task.is_finished(),
        "a database error must not end the relay"
    );
    shutdown.trigger();
    let stopped = tokio::time::timeout(Duration::from_secs(2), task).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}

/// The row's give-up horizon, as `first_failed_at` says (`None` = it has not failed yet).
async fn first_failed_age(env: &TestEnv, job: JobId) -> Option<f64> {
    env.pg()
        .await
        .query_one(
            "SELECT extract(epoch FROM now() - first_failed_at)::float8 \
               FROM outbox WHERE dedupe_key = $1",
            &[&key(job)],
        )
        .await
        .expect("outbox row")
        .get(0)
}

#[tokio::test]
async fn a_backlog_row_older_than_the_horizon_is_not_parked_by_its_first_429() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::Fail(|| MailError::Status {
            status: 429,
            message: "slow down".into(),
        })],
        MailStep::Deliver,
    ));
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;
    // The relay worked through a backlog for longer than the horizon (a day) before it got
    // to this row.
    env.pg()
        .await
        .execute(
            "UPDATE outbox SET created_at = now() - interval '3 days'",
            &[],
        )
        .await
        .unwrap();

    let report = relay_pass(&svc).await.unwrap();
    assert_eq!((report.retrying, report.stuck), (1, 0), "{report:?}");
    let row = outbox_row(&env, job).await;
    assert!(!row.sent && !row.failed && row.attempts == 1, "{row:?}");
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
    let age = first_failed_age(&env, job)
        .await
        .expect("the horizon started");
    assert!(age < 3600.0, "from this failure, not the creation: {age} s");

    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
    assert!(outbox_row(&env, job).await.sent);
    assert!(
        first_failed_age(&env, job).await.is_some(),
        "a send keeps the record of the trouble"
    );
    assert_eq!(relay_once(&svc).await.unwrap(), 0);
    assert_eq!(mailer.attempts(), 2, "sent once");
}

/// The lease fields of one row: (claimed_until in ms since the epoch, claim_token).
async fn lease_of(env: &TestEnv, job: JobId) -> (Option<f64>, Option<uuid::Uuid>) {
    let row = env
        .pg()
        .await
        .query_one(
            "SELECT (extract(epoch FROM claimed_until) * 1000)::float8, claim_token \
               FROM outbox WHERE dedupe_key = $1",
            &[&key(job)],
        )
        .await
        .expect("outbox row");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn outbox_retry_leaves_a_row_a_relay_is_sending_alone() {
    let env = TestEnv::new().await;
    let settings = fast_settings(&env);
    let (give_up, lease) = (settings.relay.give_up(), settings.relay.lease);
    let mailer = Arc::new(FakeMailer::new());
    let svc = services(&env, settings, &mailer);
    let job = commit_job(&svc, 1).await;

    // A relay has just claimed the row, which has been failing for two days: this send is
    // its last chance before the horizon parks it.
    let claimed = outbox::claim_due(&svc.pg, SummaryReady::TOPIC, 10, lease)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    env.pg()
        .await
        .execute(
            "UPDATE outbox SET attempts = 40, last_error = 'mail API answered 503: busy', \
                    created_at = now() - interval '2 days', \
                    first_failed_at = now() - interval '2 days'",
            &[],
        )
        .await
        .unwrap();
    let held = lease_of(&env, job).await;
    assert!(held.0.is_some() && held.1 == Some(claimed[0].claim_token));

    // An operator retries everything that looks stuck, and this row by id.
    assert_eq!(outbox::retry(&svc.pg, None).await.unwrap(), 0);
    assert_eq!(
        outbox::retry(&svc.pg, Some(&[claimed[0].id]))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        lease_of(&env, job).await,
        held,
        "the relay's lease is intact"
    );
    let row = outbox_row(&env, job).await;
    assert!(row.leased && row.attempts == 40, "{row:?}");
    assert_eq!(
        relay_once(&svc).await.unwrap(),
        0,
        "nobody else can take it"
    );
    assert_eq!(mailer.attempts(), 0);

    // The relay's own outcome still lands: it fails again, past the horizon, and is parked.
    let mark = outbox::mark_failed_transient(
        &svc.pg,
        claimed[0].id,
        claimed[0].claim_token,
        "mail API answered 503: busy",
        Duration::ZERO,
        give_up,
    )
    .await
    .unwrap();
    assert_eq!(mark.map(|m| (m.attempts, m.past_give_up)), Some((41, true)));
    assert_eq!(outbox::stuck(&svc.pg).await.unwrap().len(), 1);

    // However a parked row came to carry a live lease, a retry leaves it until it runs out.
    env.pg()
        .await
        .execute(
            "UPDATE outbox SET claimed_until = now() + interval '1 minute', \
                    claim_token = gen_random_uuid()",
            &[],
        )
        .await
        .unwrap();
    let held = lease_of(&env, job).await;
    assert_eq!(outbox::retry(&svc.pg, None).await.unwrap(), 0);
    assert_eq!(lease_of(&env, job).await, held);
    expire_leases(&env.pg().await).await;
    assert_eq!(outbox::retry(&svc.pg, None).await.unwrap(), 1);
    let row = outbox_row(&env, job).await;
    assert!(!row.failed && !row.leased && row.attempts == 0, "{row:?}");
    assert_eq!(
        first_failed_age(&env, job).await,
        None,
        "the horizon restarts"
    );
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(sent_keys(&mailer), vec![key(job)]);
}

#[tokio::test]
async fn a_misconfigured_mail_provider_parks_nothing_and_pauses_the_relay_until_a_probe_passes() {
    let env = TestEnv::new().await;
    // No backoff and no probe cooldown (both come from relay.backoff_ms): every pass may
    // probe, so the passes alone show what the relay does.
    let settings = fast_settings(&env);
    let refused = || MailError::Status {
        status: 401,
        message: "invalid api key".into(),
    };
    // Three rows refused in the first pass, then two refused probes, then the key works.
    let mailer = Arc::new(FakeMailer::with(
        vec![MailStep::Fail(refused); 5],
        MailStep::Deliver,
    ));
    let svc = services(&env, settings, &mailer);
    let jobs = [
        commit_job(&svc, 1).await,
        commit_job(&svc, 2).await,
        commit_job(&svc, 3).await,
    ];

    let first = relay_pass(&svc).await.unwrap();
    assert_eq!(
        (first.claimed, first.waiting, first.stuck),
        (3, 3, 0),
        "{first:?}"
    );
    let reason = svc
        .metrics
        .mail_misconfigured()
        .expect("the breaker is open");
    assert!(reason.contains("401"), "{reason}");
    assert!(
        svc.metrics
            .render()
            .contains("summaryd_mail_breaker_open 1")
    );
    for job in jobs {
        let row = outbox_row(&env, job).await;
        // Not the row's failure: no attempt counted, no horizon started, nothing parked.
        assert!(
            !row.sent && !row.failed && !row.leased && row.attempts == 0,
            "{row:?}"
        );
        assert!(
            row.last_error.as_deref().unwrap_or("").contains("401"),
            "{row:?}"
        );
        assert_eq!(first_failed_age(&env, job).await, None);
    }

    // Paused: each pass sends one row, the probe, while the provider keeps refusing.
    for _ in 0..2 {
        let probe = relay_pass(&svc).await.unwrap();
        assert_eq!((probe.claimed, probe.waiting), (1, 1), "{probe:?}");
        assert!(svc.metrics.mail_misconfigured().is_some());
    }
    assert_eq!(mailer.attempts(), 5, "3 rows, then one probe per pass");
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());

    // Fixed: the probe is sent, the breaker closes, and the rest go out in the next pass.
    let probe = relay_pass(&svc).await.unwrap();
    assert_eq!((probe.claimed, probe.sent), (1, 1), "{probe:?}");
    assert_eq!(svc.metrics.mail_misconfigured(), None);
    assert!(
        svc.metrics
            .render()
            .contains("summaryd_mail_breaker_open 0")
    );
    let rest = relay_pass(&svc).await.unwrap();
    assert_eq!((rest.claimed, rest.sent), (2, 2), "{rest:?}");
    let mut keys = sent_keys(&mailer);
    keys.sort();
    let mut expected: Vec<String> = jobs.iter().map(|j| key(*j)).collect();
    expected.sort();
    assert_eq!(keys, expected, "each row sent exactly once");
    for job in jobs {
        let row = outbox_row(&env, job).await;
        assert!(row.sent && row.attempts == 0, "{row:?}");
    }
}

#[tokio::test]
async fn smtp_535_is_a_misconfigured_provider_and_the_row_waits_for_new_credentials() {
    let env = TestEnv::new().await;
    let sink = SmtpSink::start().await;
    sink.reject_auth_with("535 5.7.8 Authentication credentials invalid");
    let mut settings = fast_settings(&env);
    settings.mail.provider = MailProvider::Smtp;
    settings.mail.smtp_url = Some(format!("smtp://relay:hunter2-secret@{}", sink.addr).into());
    let mailer = summaryd::mail::from_settings(&settings.mail, crate::shared::log_key()).unwrap();
    let svc = env
        .services()
        .settings(settings)
        .mailer(mailer)
        .build()
        .relay();
    let job = commit_job(&svc, 1).await;

    let report = relay_pass(&svc).await.unwrap();
    assert_eq!((report.waiting, report.stuck), (1, 0), "{report:?}");
    let row = outbox_row(&env, job).await;
    assert!(!row.sent && !row.failed && row.attempts == 0, "{row:?}");
    let reason = svc
        .metrics
        .mail_misconfigured()
        .expect("the breaker is open");
    assert!(reason.contains("535"), "{reason}");
    assert!(!reason.contains("hunter2"), "no credentials: {reason}");
    assert!(outbox::stuck(&svc.pg).await.unwrap().is_empty());
    assert!(sink.messages().is_empty());

    // The password is renewed on the server's side: the next probe gets through.
    sink.accept_auth();
    assert_eq!(relay_once(&svc).await.unwrap(), 1);
    assert_eq!(svc.metrics.mail_misconfigured(), None);
    let messages = sink.messages();
    assert_eq!(messages.len(), 1, "sent once");
    assert_eq!(messages[0].rcpt_to, vec![NOTIFY.to_owned()]);
    assert!(outbox_row(&env, job).await.sent);
}

/// SMTP servers quote the recipient in a rejection; the row's `last_error` and the relay's
/// log keep the code and lose the address, in every spelling the server used.
#[tokio::test]
async fn an_smtp_rejection_echoing_the_recipient_is_stored_and_logged_without_it() {
    let env = TestEnv::new().await;
    let sink = SmtpSink::start().await;
    let upper = NOTIFY.to_ascii_uppercase();
    let local = NOTIFY.split('@').next().unwrap();
    sink.reject_rcpt_with(&format!(
        "550 5.1.1 <{{rcpt}}>: Recipient address rejected: {upper} unknown (user {local})"
    ));
    let mut settings = fast_settings(&env);
    settings.mail.provider = MailProvider::Smtp;
    settings.mail.smtp_url = Some(sink.url().into());
    let mailer = summaryd::mail::from_settings(&settings.mail, crate::shared::log_key()).unwrap();
    let svc = env
        .services()
        .settings(settings)
        .mailer(mailer)
        .build()
        .relay();
    let job = commit_job(&svc, 1).await;

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let report = {
        // The test runtime is single-threaded, so the thread-local default sees the pass.
        let _guard = tracing::subscriber::set_default(subscriber);
        relay_pass(&svc).await.unwrap()
    };
    assert_eq!(report.stuck, 1, "550 is permanent: {report:?}");
    let row = outbox_row(&env, job).await;
    let last_error = row.last_error.clone().unwrap_or_default();
    let log = captured.text();
    assert!(log.contains("outbox send failed permanently"), "{log}");
    for (what, text) in [("last_error", &last_error), ("log", &log)] {
        assert!(text.contains("550"), "{what} keeps the SMTP code: {text}");
        assert!(text.contains("<recipient>"), "{what}: {text}");
        let lower = text.to_ascii_lowercase();
        assert!(!lower.contains(NOTIFY), "{what} holds the address: {text}");
        assert!(!lower.contains(&format!("user {local}")), "{what}: {text}");
    }
    assert!(sink.messages().is_empty());
}
