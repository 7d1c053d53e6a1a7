//! A consumer hands its delivery's commit and acknowledgement to a finisher and takes its
//! next job meanwhile (`src/worker/finishing.rs`): the next job's model call runs while the
//! last one's commit waits, each entry is acknowledged only after its own row is
//! committed, and a shutdown waits for the finisher, refunding a delivery whose commit it
//! cut short. Real Redis and Postgres; a commit is held up by a lock on the summaries
//! table that a test transaction takes and lets go.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redis::aio::MultiplexedConnection;
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::keys::{GROUP, RedisKeys};
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::{delivery_count, ensure_group};
use summaryd::stream::enqueue;
use summaryd::stream::job_state::REFUNDS;
use summaryd::worker::{Consumer, run};

use crate::shared::{FakeLlm, TestEnv, eventually};

fn job(key: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Call notes {key}.").into(),
        notify: Some(Email::parse("am@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// A transaction that keeps every commit of a summary waiting until it ends: SHARE mode
/// lets the pre-check's reads through and blocks inserts.
async fn hold_up_commits(env: &TestEnv) -> tokio_postgres::Client {
    let blocker = env.pg().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE summaries IN SHARE MODE")
        .await
        .unwrap();
    blocker
}

/// The entries of the stream pending for some consumer, and those for `consumer`.
async fn pending(
    redis: &mut MultiplexedConnection,
    keys: &RedisKeys,
    consumer: &str,
) -> (usize, usize) {
    let reply: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(keys.stream())
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(redis)
        .await
        .unwrap();
    let own = reply.ids.iter().filter(|p| p.consumer == consumer).count();
    (reply.ids.len(), own)
}

#[tokio::test]
async fn a_consumer_runs_its_next_job_while_the_last_one_commits_and_acks_each_after_its_commit() {
    let env = TestEnv::new().await;
    let model = Arc::new(FakeLlm::ok());
    let services = env.services().llm(model.clone()).build();
    let keys = services.keys.get(0).clone();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, &keys).await.unwrap();
    for key in ["first", "second"] {
        enqueue(&mut redis, &keys, &job(key)).await.unwrap();
    }
    let blocker = hold_up_commits(&env).await;
    let mut consumer = Consumer::new(services.worker(), "w-pipe");

    // The first job: its summary is written and handed over; the commit waits.
    let taken = tokio::time::timeout(Duration::from_secs(10), consumer.pass())
        .await
        .expect("the pass ends without waiting for its commit")
        .unwrap();
    assert_eq!(taken, 1);
    assert_eq!(model.calls(), 1);
    assert_eq!(
        env.count("summaries").await,
        0,
        "its commit is still waiting"
    );
    assert_eq!(
        pending(&mut redis, &keys, "w-pipe").await,
        (1, 1),
        "not acknowledged before its commit"
    );

    // The second job runs (its model is called) while the first one's commit still waits.
    let second = tokio::spawn(async move {
        let taken = consumer.pass().await.unwrap();
        (consumer, taken)
    });
    assert!(
        eventually(Duration::from_secs(10), || async { model.calls() == 2 }).await,
        "the next job runs while the last one commits"
    );
    assert_eq!(env.count("summaries").await, 0);
    assert_eq!(pending(&mut redis, &keys, "w-pipe").await, (2, 2));

    // Let the commits through: the second pass ends once the first job is settled.
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let (mut consumer, taken) = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second pass ends once the first commit is through")
        .unwrap();
    assert_eq!(taken, 1);
    consumer.finish().await.unwrap();

    assert_eq!(env.count("summaries").await, 2);
    assert_eq!(env.count("outbox").await, 2, "one email each");
    assert_eq!(pending(&mut redis, &keys, "w-pipe").await, (0, 0));
    let left: usize = redis::cmd("XLEN")
        .arg(keys.stream())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(left, 0, "both entries acknowledged and deleted");
    assert_eq!(model.calls(), 2, "each job paid once");
}

#[tokio::test]
async fn a_shutdown_waits_for_the_last_commit_and_refunds_it_when_cut_short() {
    let env = TestEnv::new().await;
    let model = Arc::new(FakeLlm::ok());
    let mut settings = env.settings.clone();
    settings.shutdown.grace = Duration::from_secs(2);
    let services = env.services().settings(settings).llm(model.clone()).build();
    let keys = services.keys.get(0).clone();
    let mut redis = env.redis().await;
    ensure_group(&mut redis, &keys).await.unwrap();
    let held_up = job("held-up");
    let id = enqueue(&mut redis, &keys, &held_up).await.unwrap();
    let blocker = hold_up_commits(&env).await;

    let shutdown = Shutdown::new();
    let consumer = tokio::spawn(run(services.worker(), "w-stop".into(), shutdown.clone()));
    assert!(eventually(Duration::from_secs(10), || async { model.calls() == 1 }).await);
    assert_eq!(pending(&mut redis, &keys, "w-stop").await, (1, 1));

    // The consumer's loop ends at once; its finisher goes on until the grace is nearly over.
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), consumer)
        .await
        .expect("the consumer stops within the grace period")
        .unwrap()
        .unwrap();
    assert_eq!(
        delivery_count(&mut redis, &keys, &id).await.unwrap(),
        Some(0),
        "still pending, and the delivery whose commit was cut short does not count"
    );
    let refunds: Option<u64> = redis::cmd("HGET")
        .arg(keys.job(held_up.job_id))
        .arg(REFUNDS)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(refunds, Some(1));

    // The commit request was already queued: it goes through once the lock is gone, and
    // the next delivery finds the row and acknowledges the job without the model.
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.count("summaries").await == 1
        })
        .await
    );
    let mut settings = env.settings.clone();
    settings.worker.claim_idle = Duration::from_millis(10);
    let services = env.services().settings(settings).llm(model.clone()).build();
    let mut next = Consumer::new(services.worker(), "w-next");
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    // Taken over once idle past `claim_idle`.
    while next.run_once().await.unwrap() == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the entry is taken over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pending(&mut redis, &keys, "w-next").await, (0, 0));
    assert_eq!(model.calls(), 1, "the job was paid once");
    assert_eq!(env.count("outbox").await, 1, "and emails once");
}
