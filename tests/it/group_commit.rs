//! The worker's group commit against real Postgres: many finished jobs in one transaction,
//! each keeping its own decision (inserted, or a duplicate that adds no effect), and a
//! batch Postgres refuses committed again job by job so only the refused job fails.

use std::time::Duration;

use chrono::Utc;
use summaryd::db::summaries::{self, CommitOutcome, Finished};
use summaryd::domain::{Email, Job, JobId, ModelCall, ModelSummary, TenantId};
use summaryd::resilience::failure::{Classify, Disposition};
use summaryd::worker::{Batching, CHECKS_IN_FLIGHT, Checker, Committer};

use crate::shared::test_env::Services;
use crate::shared::{TestEnv, model_summary};

fn job(n: u32, webhook: bool) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:group-{n}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: "A long report.".into(),
        notify: Some(Email::parse("team@example.com").unwrap()),
        webhook: webhook.then(|| {
            summaryd::domain::WebhookUrl::from_stored("https://hooks.example.com/in").unwrap()
        }),
        created_at: Utc::now(),
    }
}

fn with_call(text: &str) -> ModelSummary {
    let mut summary = model_summary(text);
    summary.calls.push(ModelCall {
        delivery: 2,
        seq: 1,
        provider: "builtin".into(),
        model: "builtin".into(),
        prompt_tokens: Some(10),
        completion_tokens: Some(3),
        duration_ms: 5,
        error_class: None,
        at: Utc::now(),
    });
    summary
}

/// Every job of `jobs` handed to `committer` at the same moment, with the summary text
/// `text(i)`; the answers in the order of `jobs`.
async fn commit_at_once(
    committer: &Committer,
    jobs: &[Job],
    text: impl Fn(usize) -> &'static str,
) -> Vec<summaryd::worker::Committed> {
    // Every job is in hand before any is handed over, as deliveries running together are.
    let joining: Vec<_> = jobs.iter().map(|_| committer.joining()).collect();
    let tasks: Vec<_> = jobs
        .iter()
        .zip(joining)
        .enumerate()
        .map(|(i, (j, joining))| {
            let (committer, j, text) = (committer.clone(), j.clone(), text(i));
            tokio::spawn(async move { committer.commit(joining, &j, model_summary(text)).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("commit task"));
    }
    answers
}

/// A committer on `env`'s Postgres and metrics, gathering batches of at most `max` jobs
/// and waiting at most `wait` for a batch that is not full.
fn committer(services: &Services, max: usize, wait: Duration) -> Committer {
    Committer::start(
        services.pg.clone(),
        Batching { max, wait },
        services.metrics.clone(),
    )
}

/// How many batches the committer gathered and how many jobs they held together (the
/// `summaryd_worker_commit_batch_jobs` histogram's count and sum).
fn batches(services: &Services) -> (u64, u64) {
    let metrics = services.metrics.render();
    let read = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in the metrics"))
    };
    (
        read("summaryd_worker_commit_batch_jobs_count "),
        read("summaryd_worker_commit_batch_jobs_sum "),
    )
}

async fn rows(env: &TestEnv, sql: &str, job: &Job) -> i64 {
    env.pg()
        .await
        .query_one(sql, &[&job.job_id.as_uuid()])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_batch_keeps_each_jobs_own_decision_and_adds_one_effect_per_new_job() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let (a, b, c) = (job(1, false), job(2, true), job(3, false));
    // c was committed by an earlier delivery.
    let earlier = summaries::commit_with_outbox(&services.pg, &c, &model_summary("c, first"))
        .await
        .unwrap();
    assert_eq!(earlier, CommitOutcome::Inserted);

    let (sa, sb, sa_again, sc) = (
        model_summary("a"),
        model_summary("b"),
        with_call("a, second delivery"),
        with_call("c, second delivery"),
    );
    let outcomes = summaries::commit_batch(
        &services.pg,
        &[
            Finished {
                job: &a,
                summary: &sa,
                trace: None,
            },
            Finished {
                job: &b,
                summary: &sb,
                trace: None,
            },
            // The same job twice in one batch (two deliveries of one process): once.
            Finished {
                job: &a,
                summary: &sa_again,
                trace: None,
            },
            Finished {
                job: &c,
                summary: &sc,
                trace: None,
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        outcomes,
        [
            CommitOutcome::Inserted,
            CommitOutcome::Inserted,
            CommitOutcome::Duplicate,
            CommitOutcome::Duplicate
        ]
    );
    assert_eq!(env.count("summaries").await, 3);
    let summary_of = |j: &Job| {
        let id = j.job_id.as_uuid();
        let env = &env;
        async move {
            env.pg()
                .await
                .query_one("SELECT summary FROM summaries WHERE job_id = $1", &[&id])
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    assert_eq!(summary_of(&a).await, "a", "the first entry of a job wins");
    assert_eq!(
        summary_of(&c).await,
        "c, first",
        "a committed job is never rewritten"
    );
    // One email per job with notify, one webhook for b; the duplicates add none.
    let email = "SELECT count(*) FROM outbox WHERE dedupe_key = 'summary_ready:' || $1::uuid::text";
    assert_eq!(rows(&env, email, &a).await, 1);
    assert_eq!(rows(&env, email, &b).await, 1);
    assert_eq!(rows(&env, email, &c).await, 1);
    assert_eq!(env.count("outbox").await, 4);
    let webhook = "SELECT count(*) FROM outbox WHERE topic = 'webhook' \
                   AND strpos(payload::text, $1::uuid::text) > 0";
    assert_eq!(rows(&env, webhook, &b).await, 1);
    // The duplicates' calls are kept as rows of their own.
    let calls = "SELECT count(*) FROM model_calls WHERE job_id = $1";
    assert_eq!(rows(&env, calls, &a).await, 1);
    assert_eq!(rows(&env, calls, &c).await, 1);
    assert_eq!(rows(&env, calls, &b).await, 0);
}

#[tokio::test]
async fn a_batch_of_duplicates_only_writes_nothing_but_their_calls() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let a = job(10, false);
    summaries::commit_with_outbox(&services.pg, &a, &model_summary("a"))
        .await
        .unwrap();
    let again = model_summary("a, again");
    let outcomes = summaries::commit_batch(
        &services.pg,
        &[
            Finished {
                job: &a,
                summary: &again,
                trace: None,
            },
            Finished {
                job: &a,
                summary: &again,
                trace: None,
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        outcomes,
        [CommitOutcome::Duplicate, CommitOutcome::Duplicate]
    );
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(env.count("outbox").await, 1);
    assert_eq!(env.count("model_calls").await, 0);
}

/// Jobs committed through one committer at once share a transaction; one whose data
/// Postgres refuses (a NUL in the summary) fails the batch, and the committer commits the
/// others one by one, so it fails alone and is the only one without a row.
#[tokio::test]
async fn a_refused_job_fails_alone_and_the_rest_of_its_batch_is_committed() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    // The wait is long enough that the five requests below always meet in one batch.
    let committer = committer(&services, 8, Duration::from_millis(500));
    let jobs: Vec<Job> = (20..25).map(|n| job(n, n == 21)).collect();
    let answers = commit_at_once(&committer, &jobs, |i| {
        if i == 2 { "bad\0summary" } else { "fine" }
    })
    .await;
    for (i, answer) in answers.iter().enumerate() {
        match (i, &answer.result) {
            (2, Err(e)) => assert_eq!(e.disposition(), Disposition::Permanent, "{e}"),
            (2, other) => panic!("the refused job was answered {other:?}"),
            (_, Ok(outcome)) => assert_eq!(*outcome, CommitOutcome::Inserted),
            (_, Err(e)) => panic!("job {i} failed with its batch: {e}"),
        }
        assert!(
            answer.summary.is_some(),
            "each summary comes back to its delivery"
        );
    }
    assert_eq!(env.count("summaries").await, 4);
    assert_eq!(
        rows(
            &env,
            "SELECT count(*) FROM summaries WHERE job_id = $1",
            &jobs[2]
        )
        .await,
        0
    );
    assert_eq!(env.count("outbox").await, 5, "4 emails and 1 webhook");
    // One batch was gathered: five jobs in one transaction (refused, then one by one).
    assert_eq!(batches(&services), (1, 5));
}

/// Under load the committer's batches grow by themselves: 40 jobs handed over at once
/// take far fewer transactions than jobs, and every one is committed once.
#[tokio::test]
async fn jobs_finishing_together_share_transactions() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let committer = committer(&services, 16, Duration::from_millis(50));
    let jobs: Vec<Job> = (100..140).map(|n| job(n, false)).collect();
    let answers = commit_at_once(&committer, &jobs, |_| "fine").await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a.result, Ok(CommitOutcome::Inserted)))
    );
    assert_eq!(env.count("summaries").await, 40);
    assert_eq!(env.count("outbox").await, 40);
    let (count, jobs_in_batches) = batches(&services);
    assert_eq!(jobs_in_batches, 40);
    assert!(
        (3..=10).contains(&count),
        "{count} transactions for 40 jobs, at most 16 each"
    );
}

/// A batch of 1 asks for no committer: each job is its own transaction, as before group
/// commit, and nothing is gathered.
#[tokio::test]
async fn a_batch_of_one_commits_each_job_alone() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let committer = committer(&services, 1, Duration::from_millis(500));
    let jobs: Vec<Job> = (200..203).map(|n| job(n, false)).collect();
    let answers = commit_at_once(&committer, &jobs, |_| "fine").await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a.result, Ok(CommitOutcome::Inserted)))
    );
    assert_eq!(env.count("summaries").await, 3);
    assert_eq!(batches(&services), (0, 0), "no batch was gathered");
}

/// One MULTI/EXEC acknowledges a batch: every entry acknowledged and deleted, every job
/// state dropped and every in-flight count released, as one by one; an entry of another
/// job stays.
#[tokio::test]
async fn one_step_acknowledges_a_batch_of_finished_jobs() {
    use redis::AsyncCommands;
    use summaryd::stream::consumer_group::{self as group, Ack};

    let env = TestEnv::new().await;
    let services = env.services().build();
    let keys = services.keys.get(0);
    let mut redis = env.redis().await;
    group::ensure_group(&mut redis, keys).await.unwrap();
    let jobs: Vec<Job> = (300..304).map(|n| job(n, false)).collect();
    for j in &jobs {
        summaryd::stream::enqueue(&mut redis, keys, j)
            .await
            .unwrap();
    }
    let taken = group::read_new(&mut redis, keys, "c", 4, Duration::from_millis(10))
        .await
        .unwrap();
    assert_eq!(taken.len(), 4);
    let in_flight = |redis: &mut redis::aio::MultiplexedConnection| {
        let key = keys.in_flight("acme");
        let mut redis = redis.clone();
        async move { redis.scard::<_, usize>(key).await.unwrap() }
    };
    assert_eq!(in_flight(&mut redis).await, 4);

    let finished: Vec<Ack<'_>> = taken[..3]
        .iter()
        .zip(&jobs)
        .map(|(d, j)| Ack {
            msg_id: &d.id,
            job: j,
            settle: None,
        })
        .collect();
    group::ack_many(&mut redis, keys, &finished).await.unwrap();

    let pending: redis::streams::StreamPendingReply = redis
        .xpending(keys.stream(), summaryd::infra::keys::GROUP)
        .await
        .unwrap();
    assert_eq!(pending.count(), 1, "the fourth entry is still pending");
    let left: usize = redis.xlen(keys.stream()).await.unwrap();
    assert_eq!(left, 1, "acknowledged entries are deleted with their ack");
    for j in &jobs[..3] {
        let state: bool = redis.exists(keys.job(j.job_id)).await.unwrap();
        assert!(!state, "the job state of a finished job is gone");
    }
    let state: bool = redis.exists(keys.job(jobs[3].job_id)).await.unwrap();
    assert!(state, "the unfinished job keeps its state");
    assert_eq!(in_flight(&mut redis).await, 1);
}

/// A batch waits only for deliveries that may still send it a summary: a lone job is
/// committed at once even with a long wait, and a job whose batch waits for another job
/// in hand is committed with that job, in one transaction, once it arrives.
#[tokio::test]
async fn a_batch_waits_for_jobs_in_hand_and_for_nothing_else() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    // A wait far longer than the test: a batch that waited it out would fail it.
    let committer = committer(&services, 8, Duration::from_secs(600));

    let lone = job(300, false);
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        committer.commit(committer.joining(), &lone, model_summary("lone")),
    )
    .await
    .expect("a lone job is committed without waiting for company");
    assert!(matches!(answer.result, Ok(CommitOutcome::Inserted)));
    assert_eq!(env.count("summaries").await, 1);
    assert_eq!(batches(&services), (1, 1));

    // One job is handed over while another is still in hand (its model call running).
    let (first, second) = (job(301, false), job(302, true));
    let in_hand = committer.joining();
    let waiting = {
        let (committer, first) = (committer.clone(), first.clone());
        tokio::spawn(async move {
            committer
                .commit(committer.joining(), &first, model_summary("first"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the batch waits for the job in hand"
    );
    assert_eq!(
        env.count("summaries").await,
        1,
        "nothing committed meanwhile"
    );
    let answer = committer
        .commit(in_hand, &second, model_summary("second"))
        .await;
    assert!(matches!(answer.result, Ok(CommitOutcome::Inserted)));
    let answer = waiting.await.expect("commit task");
    assert!(matches!(answer.result, Ok(CommitOutcome::Inserted)));
    assert_eq!(env.count("summaries").await, 3);
    assert_eq!(env.count("outbox").await, 4, "3 emails and 1 webhook");
    assert_eq!(
        batches(&services),
        (2, 3),
        "the two were committed together"
    );

    // A job in hand that ends without a summary (its model call failed) frees the batch.
    let third = job(303, false);
    let failing = committer.joining();
    let waiting = {
        let (committer, third) = (committer.clone(), third.clone());
        tokio::spawn(async move {
            committer
                .commit(committer.joining(), &third, model_summary("third"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    drop(failing);
    let answer = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the batch closes when no job in hand is left")
        .expect("commit task");
    assert!(matches!(answer.result, Ok(CommitOutcome::Inserted)));
    assert_eq!(env.count("summaries").await, 4);
    assert_eq!(batches(&services), (3, 4));
}

/// Batches of one process commit side by side. Two that share their jobs, listed in
/// opposite orders (deliveries of the same jobs in two batches), neither deadlock nor
/// write a job twice: each job is inserted by one of them and a duplicate in the other.
#[tokio::test]
async fn batches_sharing_jobs_commit_side_by_side_without_deadlock() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let summary = model_summary("shared");
    for round in 0..3u32 {
        let jobs: Vec<Job> = (0..300)
            .map(|n| job(1_000 * (round + 1) + n, false))
            .collect();
        let finished = |job| Finished {
            job,
            summary: &summary,
            trace: None,
        };
        let forward: Vec<Finished<'_>> = jobs.iter().map(finished).collect();
        let backward: Vec<Finished<'_>> = jobs.iter().rev().map(finished).collect();
        let (a, b) = tokio::join!(
            summaries::commit_batch(&services.pg, &forward),
            summaries::commit_batch(&services.pg, &backward)
        );
        let (a, b) = (a.expect("first batch"), b.expect("second batch"));
        for (i, (a, b)) in a.iter().zip(b.iter().rev()).enumerate() {
            assert!(
                matches!(
                    (a, b),
                    (CommitOutcome::Inserted, CommitOutcome::Duplicate)
                        | (CommitOutcome::Duplicate, CommitOutcome::Inserted)
                ),
                "round {round}, job {i}: {a:?} and {b:?}"
            );
        }
    }
    assert_eq!(env.count("summaries").await, 900);
    assert_eq!(env.count("outbox").await, 900, "one email per job");
}

/// Queries of the pre-check waiting on a lock, in this test's database, whose text starts
/// with `sql`.
async fn waiting(env: &TestEnv, sql: &str) -> i64 {
    env.pg()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND starts_with(query, $1)",
            &[&sql],
        )
        .await
        .unwrap()
        .get(0)
}

const ALONE: &str = "SELECT 1 FROM summaries WHERE job_id = $1";
const TOGETHER: &str = "SELECT job_id FROM summaries WHERE job_id = ANY($1)";

/// Wait (at most 10 s) until `n` queries starting with `sql` wait on the lock.
async fn waiting_for(env: &TestEnv, sql: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while waiting(env, sql).await < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pre-checks of jobs asking together share queries: while Postgres holds up the
/// first `CHECKS_IN_FLIGHT`, each asked alone, the rest wait in line, not in queries of
/// their own; once those queries end (here: cancelled), the rest go in one query, and
/// each job gets its own answer from it. When Postgres is gone, every job gets an error.
#[tokio::test]
async fn pre_checks_asked_together_share_queries_and_each_gets_its_own_answer() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let jobs: Vec<Job> = (200..250).map(|n| job(n, false)).collect();
    let alone = CHECKS_IN_FLIGHT;
    // Ten of the jobs that will wait in line are finished.
    let committer = committer(&services, 16, Duration::ZERO);
    let done = commit_at_once(&committer, &jobs[alone..alone + 10], |_| "done").await;
    assert!(done.iter().all(|a| a.result.is_ok()));
    let checker = Checker::start(services.pg.clone(), 64);

    // A writer's lock holds every read of the table up.
    let mut locker = env.pg().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE summaries IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let ask = |job: &Job| {
        let (checker, id) = (checker.clone(), job.job_id);
        tokio::spawn(async move { checker.finished(id).await })
    };
    // The first jobs each find a query free, ask alone and wait in it.
    let mut first = Vec::new();
    for (n, job) in (1..).zip(&jobs[..alone]) {
        first.push(ask(job));
        waiting_for(&env, ALONE, n).await;
    }
    // The others wait in line, not in queries of their own.
    let rest: Vec<_> = jobs[alone..].iter().map(ask).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(waiting(&env, ALONE).await, alone as i64);
    assert_eq!(waiting(&env, TOGETHER).await, 0);
    assert!(rest.iter().all(|ask| !ask.is_finished()));

    // The first queries end (cancelled: those jobs get the error); the line goes in one.
    let cancelled: i64 = env
        .pg()
        .await
        .query_one(
            "SELECT count(*) FROM (SELECT pg_cancel_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND query = $1) c",
            &[&ALONE],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(cancelled, alone as i64);
    for ask in first {
        assert!(ask.await.unwrap().is_err());
    }
    waiting_for(&env, TOGETHER, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        (waiting(&env, TOGETHER).await, waiting(&env, ALONE).await),
        (1, 0),
        "the {} jobs in line are asked about in one query",
        rest.len()
    );
    lock.rollback().await.unwrap();
    let mut answers = Vec::new();
    for ask in rest {
        answers.push(ask.await.unwrap().unwrap());
    }
    let want: Vec<bool> = (0..jobs.len() - alone).map(|i| i < 10).collect();
    assert_eq!(answers, want, "the first ten in line are finished");

    services.pg.close();
    let asks: Vec<_> = jobs.iter().take(2 * alone).map(ask).collect();
    for ask in asks {
        let e = ask.await.unwrap().unwrap_err();
        assert_eq!(e.disposition(), Disposition::Unavailable, "{e}");
    }
}

/// With batches of one (`SUMMARYD_WORKER_COMMIT_BATCH=1`) there is no checker: every job
/// asks alone, however many ask at once.
#[tokio::test]
async fn with_batches_of_one_every_pre_check_asks_alone() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let checker = Checker::start(services.pg.clone(), 1);
    let mut locker = env.pg().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE summaries IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let n = CHECKS_IN_FLIGHT + 4;
    let asks: Vec<_> = (300..300 + n as u32)
        .map(|i| {
            let (checker, id) = (checker.clone(), job(i, false).job_id);
            tokio::spawn(async move { checker.finished(id).await })
        })
        .collect();
    waiting_for(&env, ALONE, n as i64).await;
    assert_eq!(waiting(&env, ALONE).await, n as i64);
    lock.rollback().await.unwrap();
    for ask in asks {
        assert!(!ask.await.unwrap().unwrap());
    }
}
