//! Operators' filtered and bulk actions against real Redis and Postgres: dead letters are
//! found by tenant, reason class and age; a bulk replay or purge touches exactly the dead
//! letters selected when it was confirmed, once each, however often it is started or
//! resumed; stuck outbox rows are paged and retried by topic.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamRangeReply;
use serde_json::Value;
use summaryd::domain::{Email, Job, JobId, ReasonClass, TenantId};
use summaryd::infra::keys::RedisKeys;
use summaryd::llm::LlmError;
use summaryd::stream::bulk::{self, BulkAction, BulkError, RunState, Selection};
use summaryd::stream::dead_letters::{self, DeadLetterFilter, ReplayOutcome};
use summaryd::stream::enqueue;
use summaryd::stream::job_state::{self, Status};
use summaryd::worker::Consumer;

use crate::shared::fabricate;
use crate::shared::fakes::Step;
use crate::shared::{FakeLlm, TestEnv};

const MINUTE_MS: u64 = 60_000;

fn job(tenant: &str, n: u32) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:{tenant}:POST:/v1/summaries:bulk-{n}")),
        tenant: TenantId::parse(tenant).unwrap(),
        text: "The launch slipped a week. Support volume doubled.".into(),
        notify: Some(Email::parse("lead@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

fn now_ms() -> u64 {
    u64::try_from(Utc::now().timestamp_millis()).unwrap()
}

fn keys(env: &TestEnv) -> RedisKeys {
    RedisKeys::new(env.settings.key_prefix.clone())
}

fn run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A dead letter of `job`, dead-lettered at `at_ms` (Unix milliseconds).
async fn dead(
    redis: &mut MultiplexedConnection,
    keys: &RedisKeys,
    job: &Job,
    class: Option<ReasonClass>,
    at_ms: u64,
) -> String {
    fabricate::dead_letter(
        redis,
        keys,
        &format!("{at_ms}-0"),
        job,
        class.map(ReasonClass::as_str),
    )
    .await
}

/// The job ids queued (a replay goes in its tenant's lane, ahead of the job stream), one per
/// entry: the job stream's, then each active lane's, in order.
async fn queued_job_ids(redis: &mut MultiplexedConnection, keys: &RedisKeys) -> Vec<String> {
    let reply: StreamRangeReply = redis.xrange_all(keys.stream()).await.unwrap();
    let mut entries = reply.ids;
    let tenants: Vec<String> = redis.zrange(keys.lanes(), 0, -1).await.unwrap();
    for tenant in tenants {
        let lane: StreamRangeReply = redis.xrange_all(keys.lane(&tenant)).await.unwrap();
        entries.extend(lane.ids);
    }
    entries
        .iter()
        .map(|e| e.get::<String>("job_id").unwrap())
        .collect()
}

/// The dead-letter entry ids left, oldest first.
async fn dead_ids(redis: &mut MultiplexedConnection, keys: &RedisKeys) -> Vec<String> {
    let reply: StreamRangeReply = redis.xrange_all(keys.dead_letters()).await.unwrap();
    reply.ids.into_iter().map(|e| e.id).collect()
}

fn ids(found: &[dead_letters::DeadLetter]) -> Vec<&String> {
    found.iter().map(|d| &d.id).collect()
}

fn filter(tenant: Option<&str>, class: Option<ReasonClass>) -> DeadLetterFilter {
    DeadLetterFilter {
        tenant: tenant.map(str::to_owned),
        class,
        ..DeadLetterFilter::default()
    }
}

#[tokio::test]
async fn dead_letters_are_found_by_tenant_class_and_age_page_by_page() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let now = now_ms();
    let a1 = dead(
        &mut r,
        &keys,
        &job("acme", 1),
        Some(ReasonClass::TooLong),
        now - 120 * MINUTE_MS,
    )
    .await;
    let b1 = dead(
        &mut r,
        &keys,
        &job("beta", 1),
        Some(ReasonClass::TooLong),
        now - 90 * MINUTE_MS,
    )
    .await;
    // Written before dead letters had a class.
    let a2 = dead(&mut r, &keys, &job("acme", 2), None, now - 30 * MINUTE_MS).await;
    let a3 = dead(
        &mut r,
        &keys,
        &job("acme", 3),
        Some(ReasonClass::TooLong),
        now - 5 * MINUTE_MS,
    )
    .await;
    let a4 = dead(
        &mut r,
        &keys,
        &job("acme", 4),
        Some(ReasonClass::MaxDeliveries),
        now - MINUTE_MS,
    )
    .await;

    let all = |f: DeadLetterFilter| {
        let keys = keys.clone();
        let mut r = r.clone();
        async move {
            let (found, next) = dead_letters::list_matching(&mut r, &keys, &f, None, 100)
                .await
                .unwrap();
            assert_eq!(next, None, "read to the end");
            found
        }
    };

    let everything = all(DeadLetterFilter::default()).await;
    assert_eq!(ids(&everything), [&a1, &b1, &a2, &a3, &a4]);
    assert_eq!(everything[0].class, ReasonClass::TooLong);
    assert_eq!(everything[0].tenant, "acme");
    assert_eq!(everything[0].job_id, job("acme", 1).job_id.to_string());
    assert_eq!(everything[2].class, ReasonClass::Unknown, "no class stored");
    assert_eq!(everything[4].class, ReasonClass::MaxDeliveries);

    assert_eq!(
        ids(&all(filter(Some("acme"), None)).await),
        [&a1, &a2, &a3, &a4]
    );
    assert_eq!(
        ids(&all(filter(None, Some(ReasonClass::TooLong))).await),
        [&a1, &b1, &a3]
    );
    assert_eq!(
        ids(&all(filter(Some("acme"), Some(ReasonClass::TooLong))).await),
        [&a1, &a3]
    );
    assert_eq!(
        ids(&all(filter(None, Some(ReasonClass::Unknown))).await),
        [&a2]
    );
    assert!(all(filter(Some("gamma"), None)).await.is_empty());
    let older = DeadLetterFilter {
        older_than: Some(Duration::from_secs(60 * 60)),
        ..DeadLetterFilter::default()
    };
    assert_eq!(ids(&all(older.clone()).await), [&a1, &b1]);
    let recent = DeadLetterFilter {
        tenant: Some("acme".into()),
        newer_than: Some(Duration::from_secs(60 * 60)),
        ..DeadLetterFilter::default()
    };
    assert_eq!(ids(&all(recent.clone()).await), [&a2, &a3, &a4]);

    // Page by page: the cursor goes on after the last dead letter returned.
    let acme = filter(Some("acme"), None);
    let (page1, next) = dead_letters::list_matching(&mut r, &keys, &acme, None, 3)
        .await
        .unwrap();
    assert_eq!(ids(&page1), [&a1, &a2, &a3]);
    assert_eq!(next.as_deref(), Some(a3.as_str()));
    let (page2, next) = dead_letters::list_matching(&mut r, &keys, &acme, next.as_deref(), 3)
        .await
        .unwrap();
    assert_eq!(ids(&page2), [&a4]);
    assert_eq!(next, None);
    let (none, next) = dead_letters::list_matching(&mut r, &keys, &acme, Some(&a1), 0)
        .await
        .unwrap();
    assert!(none.is_empty());
    assert_eq!(
        next.as_deref(),
        Some(a1.as_str()),
        "a limit of 0 keeps the cursor"
    );

    // Counts stop at the snapshot: a dead letter added after it is not counted.
    let newest = dead_letters::newest_id(&mut r, &keys)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(newest, a4);
    let late = fabricate::dead_letter(&mut r, &keys, "*", &job("acme", 5), Some("too_long")).await;
    let count = |f: DeadLetterFilter, upto: String| {
        let keys = keys.clone();
        let mut r = r.clone();
        async move {
            dead_letters::count_matching(&mut r, &keys, &f, &upto)
                .await
                .unwrap()
        }
    };
    assert_eq!(count(DeadLetterFilter::default(), newest.clone()).await, 5);
    assert_eq!(count(DeadLetterFilter::default(), late.clone()).await, 6);
    assert_eq!(count(acme.clone(), newest.clone()).await, 4);
    assert_eq!(count(older, newest.clone()).await, 2);
    assert_eq!(count(recent, newest.clone()).await, 3);
    assert_eq!(count(acme, a2.clone()).await, 2);
}

#[tokio::test]
async fn a_job_dead_lettered_by_the_worker_carries_its_class_but_dlq_list_json_is_unchanged() {
    let env = TestEnv::new().await;
    let llm = Arc::new(FakeLlm::with(
        vec![Step::Fail(LlmError::Status {
            status: 400,
            retry_after: None,
            message: "bad request".into(),
        })],
        Step::Ok(String::new()),
    ));
    let services = env.services().llm(llm).build();
    let mut conn = services.redis.get().await.unwrap();
    let msg = job("acme", 1);
    enqueue(&mut conn, services.keys.get(0), &msg)
        .await
        .unwrap();
    let mut consumer = Consumer::new(services.worker(), "w-1");
    consumer.ensure_group().await.unwrap();
    assert_eq!(consumer.run_once().await.unwrap(), 1);

    let (refused, _) = dead_letters::list_matching(
        &mut conn,
        services.keys.get(0),
        &filter(None, Some(ReasonClass::ModelRefused)),
        None,
        10,
    )
    .await
    .unwrap();
    let (all, _) = dead_letters::list_matching(
        &mut conn,
        services.keys.get(0),
        &DeadLetterFilter::default(),
        None,
        10,
    )
    .await
    .unwrap();
    assert_eq!(refused.len(), 1, "{all:?}");
    assert_eq!(refused[0].job_id, msg.job_id.to_string());
    assert!(refused[0].reason.contains("400"), "{}", refused[0].reason);

    let mut out = Vec::new();
    summaryd::ops::dlq::list(&services.redis, &services.keys, 10, true, &mut out)
        .await
        .unwrap();
    let row: Value = serde_json::from_slice(&out).unwrap();
    let fields: BTreeSet<&str> = row
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        BTreeSet::from(["id", "job_id", "tenant", "reason", "failed_at"]),
        "the contract fixes these fields"
    );
}

#[tokio::test]
async fn replaying_all_matching_replays_exactly_those_selected_when_confirmed() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let start_ms = now_ms() - 60 * MINUTE_MS;
    let mut chosen = Vec::new();
    let mut others = Vec::new();
    for n in 0..5u32 {
        let at = start_ms + u64::from(n) * 2 * MINUTE_MS;
        let j = job("acme", n);
        dead(&mut r, &keys, &j, Some(ReasonClass::TooLong), at).await;
        chosen.push(j.job_id.to_string());
        let other = if n % 2 == 0 {
            job("beta", n)
        } else {
            job("acme", 100 + n)
        };
        let class = if n % 2 == 0 {
            ReasonClass::TooLong
        } else {
            ReasonClass::MaxDeliveries
        };
        others.push(dead(&mut r, &keys, &other, Some(class), at + MINUTE_MS).await);
    }
    let selection = Selection::Matching {
        filter: filter(Some("acme"), Some(ReasonClass::TooLong)),
        upto: None,
    };
    let id = run_id();
    let run = bulk::start(&mut r, &keys, &id, BulkAction::Replay, selection, "alice")
        .await
        .unwrap();
    assert_eq!(run.total, 5);
    assert_eq!(run.state, RunState::Running);
    assert_eq!(run.started_by, "alice");
    assert_eq!(run.snapshot.as_deref(), others.last().map(String::as_str));
    // Dead-lettered after the operator confirmed: not this run's to touch.
    let late = fabricate::dead_letter(&mut r, &keys, "*", &job("acme", 50), Some("too_long")).await;

    let done = bulk::run_to_end(&mut r, &keys, &id, 2).await.unwrap();
    assert_eq!(done.state, RunState::Finished);
    assert!(done.finished_at.is_some());
    assert_eq!(
        (done.total, done.done, done.skipped, done.failed),
        (5, 5, 0, 0)
    );
    assert_eq!(
        bulk::get(&mut r, &keys, &id).await.unwrap(),
        Some(done.clone())
    );

    assert_eq!(
        queued_job_ids(&mut r, &keys).await,
        chosen,
        "same job ids, once each"
    );
    let mut left = others.clone();
    left.push(late);
    assert_eq!(
        dead_ids(&mut r, &keys).await,
        left,
        "others and the late one untouched"
    );
    let state = job_state::get(&mut r, &keys, job("acme", 0).job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        state.status,
        Status::Queued,
        "replayed jobs read as queued again"
    );

    // Stepping a finished run changes nothing; the record expires within its TTL.
    let again = bulk::step(&mut r, &keys, &id, 10).await.unwrap();
    assert_eq!(again, done);
    let ttl: i64 = r.pttl(keys.bulk_run(&id)).await.unwrap();
    assert!(ttl > 0 && ttl <= 7 * 24 * 3600 * 1000, "{ttl}");
    assert!(bulk::get(&mut r, &keys, &run_id()).await.unwrap().is_none());
}

#[tokio::test]
async fn two_concurrent_starts_and_runs_with_one_run_id_enqueue_each_job_once() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let base = now_ms() - 60 * MINUTE_MS;
    let mut jobs = Vec::new();
    for n in 0..7u32 {
        let j = job("acme", n);
        dead(
            &mut r,
            &keys,
            &j,
            Some(ReasonClass::ModelRefused),
            base + u64::from(n),
        )
        .await;
        jobs.push(j.job_id.to_string());
    }
    let id = run_id();
    let click = |by: &'static str| {
        let keys = keys.clone();
        let id = id.clone();
        let env_redis = env.redis();
        async move {
            let mut conn = env_redis.await;
            let selection = Selection::Matching {
                filter: DeadLetterFilter::default(),
                upto: None,
            };
            let started = bulk::start(&mut conn, &keys, &id, BulkAction::Replay, selection, by)
                .await
                .unwrap();
            let finished = bulk::run_to_end(&mut conn, &keys, &id, 1).await.unwrap();
            (started, finished)
        }
    };
    let ((s1, f1), (s2, f2)) = tokio::join!(click("alice"), click("bob"));
    assert_eq!(s1.started_at, s2.started_at, "one run");
    assert_eq!(s1.started_by, s2.started_by);
    assert_eq!(f1, f2);
    assert_eq!((f1.total, f1.done, f1.skipped, f1.failed), (7, 7, 0, 0));
    assert_eq!(
        queued_job_ids(&mut r, &keys).await,
        jobs,
        "each job enqueued once"
    );
    assert!(dead_ids(&mut r, &keys).await.is_empty());
    assert!(
        !bulk::is_worked(&mut r, &keys, &id).await.unwrap(),
        "lease given up"
    );
}

#[tokio::test]
async fn replaying_one_dead_letter_twice_at_once_enqueues_it_once() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let j = job("acme", 1);
    let id = dead(&mut r, &keys, &j, None, now_ms() - MINUTE_MS).await;
    let (mut c1, mut c2) = (env.redis().await, env.redis().await);
    let (a, b) = tokio::join!(
        dead_letters::replay(&mut c1, &keys, &id),
        dead_letters::replay(&mut c2, &keys, &id)
    );
    let outcomes = [a.unwrap(), b.unwrap()];
    let replayed = outcomes
        .iter()
        .filter(|o| matches!(o, ReplayOutcome::Replayed { .. }))
        .count();
    assert_eq!(replayed, 1, "{outcomes:?}");
    assert!(outcomes.contains(&ReplayOutcome::NotFound));
    assert_eq!(queued_job_ids(&mut r, &keys).await, [j.job_id.to_string()]);
}

#[tokio::test]
async fn a_run_interrupted_after_a_page_resumes_from_its_cursor_with_correct_counts() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let base = now_ms() - 60 * MINUTE_MS;
    let mut ids = Vec::new();
    let mut jobs = Vec::new();
    for n in 0..6u32 {
        let j = job("acme", n);
        ids.push(
            dead(
                &mut r,
                &keys,
                &j,
                Some(ReasonClass::TooLong),
                base + u64::from(n),
            )
            .await,
        );
        jobs.push(j.job_id.to_string());
    }
    let id = run_id();
    let selection = Selection::Matching {
        filter: filter(Some("acme"), None),
        upto: None,
    };
    bulk::start(&mut r, &keys, &id, BulkAction::Replay, selection, "alice")
        .await
        .unwrap();
    let first = bulk::step(&mut r, &keys, &id, 2).await.unwrap();
    assert_eq!(first.state, RunState::Running);
    assert_eq!(first.cursor.as_deref(), Some(ids[1].as_str()));
    assert_eq!((first.done, first.skipped), (2, 0));
    assert_eq!(queued_job_ids(&mut r, &keys).await, jobs[..2]);

    // The process working the next page dies after replaying its first dead letter and
    // before saving: it still holds the lease, for a short while.
    let crashed = dead_letters::replay(&mut r, &keys, &ids[2]).await.unwrap();
    assert!(matches!(crashed, ReplayOutcome::Replayed { .. }));
    let _: () = redis::cmd("SET")
        .arg(keys.bulk_lease(&id))
        .arg("a-process-that-died")
        .arg("PX")
        .arg(400)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(bulk::is_worked(&mut r, &keys, &id).await.unwrap());
    assert!(matches!(
        bulk::step(&mut r, &keys, &id, 2).await,
        Err(BulkError::Leased(_))
    ));
    let unchanged = bulk::get(&mut r, &keys, &id).await.unwrap().unwrap();
    assert_eq!(
        unchanged, first,
        "nothing moved while another holds the lease"
    );

    // Once its lease expires, anyone finishes the run from the saved cursor; the dead letter
    // the dead process replayed is gone, so it is skipped, not replayed again.
    let done = tokio::time::timeout(
        Duration::from_secs(10),
        bulk::run_to_end(&mut r, &keys, &id, 2),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(done.state, RunState::Finished);
    assert_eq!(
        (done.total, done.done, done.skipped, done.failed),
        (6, 5, 1, 0)
    );
    assert_eq!(done.cursor.as_deref(), ids.last().map(String::as_str));
    assert_eq!(queued_job_ids(&mut r, &keys).await, jobs, "each job once");
    assert!(dead_ids(&mut r, &keys).await.is_empty());
}

#[tokio::test]
async fn a_run_over_chosen_ids_handles_each_once_and_reports_what_it_could_not_do() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let base = now_ms() - 60 * MINUTE_MS;
    let a = dead(&mut r, &keys, &job("acme", 1), None, base).await;
    let b = dead(&mut r, &keys, &job("acme", 2), None, base + 1).await;
    let keep = dead(&mut r, &keys, &job("acme", 3), None, base + 2).await;
    // A dead letter that is no job cannot be replayed; it stays.
    let not_a_job: String = r
        .xadd(
            keys.dead_letters(),
            format!("{}-0", base + 3),
            &[("reason", "garbage")],
        )
        .await
        .unwrap();
    let gone = format!("{}-0", base - 5);

    let invalid = bulk::start(
        &mut r,
        &keys,
        &run_id(),
        BulkAction::Replay,
        Selection::Ids(vec![a.clone(), "not-an-id".into()]),
        "alice",
    )
    .await;
    assert!(matches!(invalid, Err(BulkError::InvalidEntryId(id)) if id == "not-an-id"));
    assert!(matches!(
        bulk::start(
            &mut r,
            &keys,
            "run-1",
            BulkAction::Replay,
            Selection::Ids(vec![]),
            "alice"
        )
        .await,
        Err(BulkError::InvalidRunId(_))
    ));

    let id = run_id();
    // Given newest first, with a repeat and an id that is not there.
    let chosen = vec![
        not_a_job.clone(),
        b.clone(),
        a.clone(),
        gone.clone(),
        b.clone(),
    ];
    let run = bulk::start(
        &mut r,
        &keys,
        &id,
        BulkAction::Replay,
        Selection::Ids(chosen),
        "alice",
    )
    .await
    .unwrap();
    assert_eq!(run.total, 4);
    assert_eq!(
        run.selection,
        Selection::Ids(vec![gone, a, b, not_a_job.clone()])
    );
    let done = bulk::run_to_end(&mut r, &keys, &id, 3).await.unwrap();
    assert_eq!((done.done, done.skipped, done.failed), (2, 1, 1));
    assert_eq!(
        queued_job_ids(&mut r, &keys).await,
        [
            job("acme", 1).job_id.to_string(),
            job("acme", 2).job_id.to_string()
        ]
    );
    assert_eq!(dead_ids(&mut r, &keys).await, [keep, not_a_job]);

    // Nothing selected: the run is finished as it starts.
    let empty = bulk::start(
        &mut r,
        &keys,
        &run_id(),
        BulkAction::Purge,
        Selection::Ids(vec![]),
        "alice",
    )
    .await
    .unwrap();
    assert_eq!((empty.state, empty.total), (RunState::Finished, 0));
}

#[tokio::test]
async fn purging_all_matching_removes_exactly_those_and_their_job_state() {
    let env = TestEnv::new().await;
    let keys = keys(&env);
    let mut r = env.redis().await;
    let now = now_ms();
    let old = acme_dead_letters(&mut r, &keys, now - 120 * MINUTE_MS, 5).await;
    let young = dead(&mut r, &keys, &job("acme", 90), None, now - MINUTE_MS).await;
    // A dead letter with its job state, as the worker leaves one.
    let purged_job = job("acme", 0).job_id;
    let _: () = r
        .hset_multiple(
            keys.job(purged_job),
            &[("tenant", "acme"), ("status", Status::Failed.as_str())],
        )
        .await
        .unwrap();
    assert!(
        job_state::get(&mut r, &keys, purged_job)
            .await
            .unwrap()
            .is_some()
    );

    let id = run_id();
    let selection = Selection::Matching {
        filter: DeadLetterFilter {
            older_than: Some(Duration::from_secs(3600)),
            ..DeadLetterFilter::default()
        },
        upto: None,
    };
    let run = bulk::start(&mut r, &keys, &id, BulkAction::Purge, selection, "bob")
        .await
        .unwrap();
    assert_eq!(run.total, 5);
    let done = bulk::run_to_end(&mut r, &keys, &id, 2).await.unwrap();
    assert_eq!((done.done, done.skipped, done.failed), (5, 0, 0));
    assert_eq!(dead_ids(&mut r, &keys).await, [young]);
    assert!(
        queued_job_ids(&mut r, &keys).await.is_empty(),
        "purge enqueues nothing"
    );
    assert!(
        job_state::get(&mut r, &keys, purged_job)
            .await
            .unwrap()
            .is_none(),
        "the purged job's state is gone"
    );
    assert_eq!(old.len(), 5);
}

/// `n` dead letters of tenant acme, one millisecond apart from `from_ms`.
async fn acme_dead_letters(
    r: &mut MultiplexedConnection,
    keys: &RedisKeys,
    from_ms: u64,
    n: u32,
) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            dead(
                r,
                keys,
                &job("acme", i),
                Some(ReasonClass::TooLong),
                from_ms + u64::from(i),
            )
            .await,
        );
    }
    ids
}

/// An outbox row of `topic`: stuck (failed), or not, and leased to a relay or not.
async fn outbox_row(
    pg: &tokio_postgres::Client,
    topic: &str,
    n: u32,
    stuck: bool,
    leased: bool,
) -> i64 {
    pg.query_one(
        "INSERT INTO outbox (topic, dedupe_key, payload, attempts, last_error, failed_at, claimed_until) \
         VALUES ($1, $2, $3, 3, 'refused', \
                 CASE WHEN $4 THEN now() END, CASE WHEN $5 THEN now() + interval '1 hour' END) \
         RETURNING id",
        &[&topic, &format!("{topic}-{n}"), &serde_json::json!({"job_id": format!("job-{n}")}), &stuck, &leased],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn stuck_outbox_rows_are_paged_counted_and_retried_by_topic() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let pg = env.pg().await;
    let mut emails = Vec::new();
    for n in 0..3 {
        emails.push(outbox_row(&pg, "email.summary_ready", n, true, false).await);
    }
    let hooks = [
        outbox_row(&pg, "webhook", 10, true, false).await,
        outbox_row(&pg, "webhook", 11, true, false).await,
    ];
    let leased = outbox_row(&pg, "email.summary_ready", 20, true, true).await;
    let _due = outbox_row(&pg, "email.summary_ready", 21, false, false).await;

    use summaryd::db::outbox;
    assert_eq!(outbox::count_stuck(&services.pg, None).await.unwrap(), 6);
    assert_eq!(
        outbox::count_stuck(&services.pg, Some("webhook"))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        outbox::count_stuck(&services.pg, Some("email.summary_ready"))
            .await
            .unwrap(),
        4
    );
    assert_eq!(
        outbox::count_stuck(&services.pg, Some("nothing"))
            .await
            .unwrap(),
        0
    );
    let page = |topic: Option<&'static str>, limit, offset| {
        let pool = services.pg.clone();
        async move {
            outbox::stuck_matching(&pool, topic, limit, offset)
                .await
                .unwrap()
                .into_iter()
                .map(|row| row.id)
                .collect::<Vec<_>>()
        }
    };
    let mut email_ids = emails.clone();
    email_ids.push(leased);
    assert_eq!(
        page(Some("email.summary_ready"), 2, 0).await,
        email_ids[..2]
    );
    assert_eq!(
        page(Some("email.summary_ready"), 2, 2).await,
        email_ids[2..]
    );
    assert!(page(Some("email.summary_ready"), 2, 4).await.is_empty());
    assert_eq!(page(Some("webhook"), 10, 0).await, hooks);
    assert_eq!(page(None, 100, 0).await.len(), 6);
    let first = &outbox::stuck_matching(&services.pg, Some("webhook"), 1, 0)
        .await
        .unwrap()[0];
    assert_eq!(first.job_id.as_deref(), Some("job-10"));
    assert_eq!(first.topic, "webhook");

    // Every stuck webhook row is retried; no email row is, and the leased row stays leased.
    assert_eq!(
        outbox::retry_matching(&services.pg, Some("webhook"))
            .await
            .unwrap(),
        2
    );
    let parked: Vec<i64> = pg
        .query(
            "SELECT id FROM outbox WHERE failed_at IS NOT NULL ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(parked, email_ids);
    let retried: Vec<(i32, bool)> = pg
        .query(
            "SELECT attempts, retry_from IS NOT NULL FROM outbox WHERE topic = 'webhook'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(retried, [(0, true), (0, true)]);
    assert_eq!(
        outbox::count_stuck(&services.pg, Some("webhook"))
            .await
            .unwrap(),
        0
    );
    // All topics: the unleased email rows only.
    assert_eq!(outbox::retry_matching(&services.pg, None).await.unwrap(), 3);
    assert_eq!(page(None, 100, 0).await, [leased]);
}
