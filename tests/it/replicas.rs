//! `SUMMARYD_REDIS_MIN_REPLICAS_ACK`: a 202 means the replica has the accept, an accept the
//! replica does not confirm is a 503 whose retry is a replay of the same job, the worker's
//! finishing writes are confirmed the same way (and kept when they are not), and with 0 no
//! WAIT is ever sent. Each test runs its own primary and replica, and reads the effects on
//! the replica itself.

use std::sync::Arc;
use std::time::Duration;

use actix_web::test;
use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use summaryd::api;
use summaryd::config::roles::Roles;
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::keys::GROUP;
use summaryd::llm::LlmError;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::ensure_group;
use summaryd::stream::enqueue;
use summaryd::worker::Consumer;

use crate::shared::api_requests::*;
use crate::shared::replicas::{ReplicaPair, wait_calls};
use crate::shared::servers::{RedisProc, test_dir};
use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, TestEnv, eventually};

const KEY: &str = "replicated-accept-0001";

/// A test's world: its primary (and replica), an env whose Redis is that primary.
struct World {
    env: TestEnv,
    services: Services,
    llm: Arc<FakeLlm>,
}

impl World {
    async fn on(primary: &RedisProc, min_replicas_ack: u32, ack_timeout: Duration) -> World {
        Self::with_llm(primary, min_replicas_ack, ack_timeout, FakeLlm::ok()).await
    }

    async fn with_llm(
        primary: &RedisProc,
        min_replicas_ack: u32,
        ack_timeout: Duration,
        llm: FakeLlm,
    ) -> World {
        let mut env = TestEnv::new().await;
        env.settings.redis_url = primary.url().into();
        env.settings.redis.min_replicas_ack = min_replicas_ack;
        env.settings.redis.ack_timeout = ack_timeout;
        let llm = Arc::new(llm);
        let services = env.services().llm(llm.clone()).build();
        World { env, services, llm }
    }

    fn refused(&self) -> u64 {
        timeouts(&self.services, "accept")
    }
}

fn timeouts(services: &Services, op: &str) -> u64 {
    services
        .metrics
        .replica_ack_timeouts
        .with_label_values(&[op])
        .get()
}

fn job(key: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Quarterly report {key}. Revenue grew. Costs fell.").into(),
        notify: Some(Email::parse("team@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now(),
    }
}

/// What the accept of `job_id` left on `conn`'s server: (record, job state fields, lane
/// entries).
async fn accept_on(
    conn: &mut MultiplexedConnection,
    services: &Services,
    job_id: &str,
) -> (Option<String>, usize, usize) {
    let record: Option<String> = conn.get(record_key(services, "acme", KEY)).await.unwrap();
    let state: std::collections::HashMap<String, String> = conn
        .hgetall(services.keys.get(0).job(job_id.parse().unwrap()))
        .await
        .unwrap();
    let lane: usize = conn.xlen(services.keys.get(0).lane("acme")).await.unwrap();
    (record, state.len(), lane)
}

#[actix_web::test]
async fn a_202_is_answered_only_once_the_replica_has_the_record_the_state_and_the_entry() {
    let pair = ReplicaPair::start("replica-accept").await;
    // Long enough to see the request wait; below the API connection's response timeout.
    let w = World::on(&pair.primary, 1, Duration::from_millis(1500)).await;
    let app = test::init_service(api::app(w.services.api(), Roles::all(), Shutdown::new())).await;
    let mut replica = pair.replica.connection().await;
    let mut primary = pair.primary.connection().await;

    pair.freeze_replica();
    let call = test::call_service(&app, post("acme", KEY, BODY).to_request());
    tokio::pin!(call);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut call)
            .await
            .is_err(),
        "answered before the replica confirmed the accept"
    );
    pair.thaw_replica();
    let res = call.await;
    assert_eq!(res.status().as_u16(), 202);
    let job_id = json_body(res).await["job_id"].as_str().unwrap().to_owned();

    // At once, no polling: the 202 came after the replica confirmed it.
    let (record, state_fields, lane) = accept_on(&mut replica, &w.services, &job_id).await;
    assert!(record.unwrap().contains(&job_id));
    assert!(state_fields > 0, "job state on the replica");
    assert_eq!(lane, 1, "the job's entry on the replica");
    assert!(wait_calls(&mut primary).await >= 1);
    assert_eq!(w.refused(), 0);
}

#[actix_web::test]
async fn an_unconfirmed_accept_is_a_503_and_its_retry_is_the_same_job_once_the_replica_is_back() {
    let pair = ReplicaPair::start("replica-refused").await;
    let w = World::on(&pair.primary, 1, Duration::from_millis(100)).await;
    let app = test::init_service(api::app(w.services.api(), Roles::all(), Shutdown::new())).await;

    pair.freeze_replica();
    let res = test::call_service(&app, post("acme", KEY, BODY).to_request()).await;
    assert_eq!(header(&res, "retry-after").as_deref(), Some("2"));
    let p = assert_problem(res, 503).await;
    assert_eq!(p["type"], "tag:summaryd,2025:problems/not-replicated");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("SUMMARYD_REDIS_MIN_REPLICAS_ACK"),
        "{p}"
    );
    assert_eq!(w.refused(), 1);
    // The accept stands on the primary: one job, recorded.
    assert_eq!(stream_len(&w.env).await, 1);
    let mut primary = pair.primary.connection().await;
    let job_id = job_id_for("acme", KEY, BODY);
    assert!(
        accept_on(&mut primary, &w.services, &job_id)
            .await
            .0
            .is_some()
    );

    // Another API process, whose connections have written nothing: its replay must still
    // wait for the replica, not find a connected replica and answer at once.
    let other = w.env.services().build();
    let other_app = test::init_service(api::app(other.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&other_app, post("acme", KEY, BODY).to_request()).await;
    let p = assert_problem(res, 503).await;
    assert_eq!(p["type"], "tag:summaryd,2025:problems/not-replicated");
    assert_eq!(timeouts(&other, "accept"), 1);

    pair.thaw_replica();
    // The client retries as told until it is answered.
    let mut answer = None;
    for _ in 0..50 {
        let res = test::call_service(&other_app, post("acme", KEY, BODY).to_request()).await;
        if res.status().as_u16() == 202 {
            answer = Some(res);
            break;
        }
        assert_eq!(res.status().as_u16(), 503);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res = answer.expect("the retry was never accepted");
    assert_eq!(header(&res, "idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(json_body(res).await["job_id"], job_id.as_str());
    assert_eq!(stream_len(&w.env).await, 1, "one job, never enqueued twice");
    let mut replica = pair.replica.connection().await;
    let (record, state_fields, lane) = accept_on(&mut replica, &w.services, &job_id).await;
    assert!(record.unwrap().contains(&job_id));
    assert!(state_fields > 0);
    assert_eq!(lane, 1);
}

#[actix_web::test]
async fn without_replica_acks_no_wait_is_sent() {
    let dir = test_dir("replica-none");
    let primary = RedisProc::start(dir.path(), &[]);
    let w = World::on(&primary, 0, Duration::from_millis(100)).await;
    let app = test::init_service(api::app(w.services.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&app, post("acme", KEY, BODY).to_request()).await;
    assert_eq!(res.status().as_u16(), 202);
    let res = test::call_service(&app, post("acme", KEY, BODY).to_request()).await;
    assert_eq!(res.status().as_u16(), 202, "the replay too");

    let mut conn = primary.connection().await;
    ensure_group(&mut conn, w.services.keys.get(0))
        .await
        .unwrap();
    enqueue(&mut conn, w.services.keys.get(0), &job("no-acks"))
        .await
        .unwrap();
    let mut c = Consumer::new(w.services.worker(), "w-none");
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(w.env.count("summaries").await, 1);

    assert_eq!(wait_calls(&mut conn).await, 0);
    // No replica is attached at all, and nothing was refused for it.
    assert_eq!(w.refused(), 0);
}

#[tokio::test]
async fn a_finished_job_is_acknowledged_on_the_replica_and_an_unconfirmed_ack_is_kept() {
    let pair = ReplicaPair::start("replica-ack").await;
    let w = World::on(&pair.primary, 1, Duration::from_millis(100)).await;
    let mut primary = pair.primary.connection().await;
    let mut replica = pair.replica.connection().await;
    let keys = w.services.keys.get(0);
    ensure_group(&mut primary, keys).await.unwrap();
    let mut c = Consumer::new(w.services.worker(), "w-ack");

    let first = job("acked");
    enqueue(&mut primary, keys, &first).await.unwrap();
    assert_eq!(c.run_once().await.unwrap(), 1);
    // At once: the consumer returned after the replica confirmed the ack.
    assert_eq!(pending_on(&mut replica, keys.stream()).await, 0);
    let len: usize = replica.xlen(keys.stream()).await.unwrap();
    assert_eq!(len, 0, "the finished entry is gone on the replica");
    let state: bool = replica.exists(keys.job(first.job_id)).await.unwrap();
    assert!(!state, "the job state is gone on the replica");
    assert_eq!(timeouts(&w.services, "ack"), 0);
    assert!(wait_calls(&mut primary).await >= 1);

    // A replica that does not answer: the ack stands, is counted, and the job is not
    // done again.
    pair.freeze_replica();
    let second = job("unconfirmed");
    enqueue(&mut primary, keys, &second).await.unwrap();
    assert_eq!(c.run_once().await.unwrap(), 1);
    assert_eq!(timeouts(&w.services, "ack"), 1);
    assert_eq!(pending_on(&mut primary, keys.stream()).await, 0);
    assert_eq!(w.env.count("summaries").await, 2);
    assert_eq!(c.run_once().await.unwrap(), 0, "nothing left to redo");
    assert_eq!(w.llm.calls(), 2);
    pair.thaw_replica();
    assert!(
        eventually(Duration::from_secs(5), || {
            let mut replica = replica.clone();
            async move { pending_on(&mut replica, keys.stream()).await == 0 }
        })
        .await
    );
}

#[tokio::test]
async fn a_dead_letter_is_on_the_replica_when_the_consumer_moves_on() {
    let pair = ReplicaPair::start("replica-dead").await;
    let refused = LlmError::Status {
        status: 400,
        retry_after: None,
        message: "HTTP 400".into(),
    };
    let w = World::with_llm(
        &pair.primary,
        1,
        Duration::from_millis(100),
        FakeLlm::failing(refused),
    )
    .await;
    let mut primary = pair.primary.connection().await;
    let mut replica = pair.replica.connection().await;
    let keys = w.services.keys.get(0);
    ensure_group(&mut primary, keys).await.unwrap();
    enqueue(&mut primary, keys, &job("dead")).await.unwrap();
    let mut c = Consumer::new(w.services.worker(), "w-dead");
    assert_eq!(c.run_once().await.unwrap(), 1);

    let dead: usize = replica.xlen(keys.dead_letters()).await.unwrap();
    assert_eq!(dead, 1, "the dead letter is on the replica");
    assert_eq!(pending_on(&mut replica, keys.stream()).await, 0);
    assert_eq!(timeouts(&w.services, "dead_letter"), 0);
}

/// Entries of the job stream pending in the group, as `conn`'s server has them.
async fn pending_on(conn: &mut MultiplexedConnection, stream: String) -> usize {
    let reply: redis::streams::StreamPendingReply = conn.xpending(stream, GROUP).await.unwrap();
    reply.count()
}

#[tokio::test]
async fn a_record_rewritten_unchanged_keeps_its_value_and_ttl_and_is_waited_for() {
    use summaryd::stream::replicas::{self, NotReplicated, ReplicaAcks};
    let pair = ReplicaPair::start("replica-rewrite").await;
    let mut writer = pair.primary.connection().await;
    let _: () = writer.set_ex("record", "v1", 600).await.unwrap();
    let ttl_before: i64 = writer.pttl("record").await.unwrap();

    pair.freeze_replica();
    // A connection that has not written the record: after the rewrite its WAIT covers it.
    let mut reader = pair.primary.connection().await;
    assert!(
        replicas::rewrite_unchanged(&mut reader, "record", "v1")
            .await
            .unwrap()
    );
    assert!(
        !replicas::rewrite_unchanged(&mut reader, "record", "v0")
            .await
            .unwrap(),
        "a value that changed is left alone"
    );
    let value: String = reader.get("record").await.unwrap();
    assert_eq!(value, "v1");
    let ttl_after: i64 = reader.pttl("record").await.unwrap();
    assert!(ttl_after > 0 && ttl_after <= ttl_before, "{ttl_after}");
    let acks = ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let refused = replicas::confirm(&mut reader, "record", acks).await;
    assert!(
        matches!(
            refused,
            Err(NotReplicated::TimedOut {
                acked: 0,
                wanted: 1,
                ..
            })
        ),
        "{refused:?}"
    );

    pair.thaw_replica();
    let confirmed = eventually(Duration::from_secs(5), || {
        let mut reader = reader.clone();
        async move { replicas::confirm(&mut reader, "record", acks).await.is_ok() }
    })
    .await;
    assert!(confirmed, "confirmed once the replica runs");
    let mut replica = pair.replica.connection().await;
    let on_replica: Option<String> = replica.get("record").await.unwrap();
    assert_eq!(on_replica.as_deref(), Some("v1"));
}

#[tokio::test]
async fn a_confirmation_travels_with_its_write_and_a_record_gone_is_never_confirmed() {
    use summaryd::stream::replicas::{self, NotReplicated, ReplicaAcks};
    let pair = ReplicaPair::start("replica-pipelined").await;
    let mut conn = pair.primary.connection().await;
    let acks = ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_millis(500),
    };
    let _: () = conn.set_ex("record", "v1", 600).await.unwrap();
    replicas::confirm_unchanged(&mut conn, "record", "v1", acks)
        .await
        .expect("the record is there and the replica runs");

    // What a failover to a replica that never received the record looks like from here:
    // the copy read before is no longer on the primary. Not confirmed, and not recreated.
    let _: () = conn.del("record").await.unwrap();
    let gone = replicas::confirm_unchanged(&mut conn, "record", "v1", acks).await;
    assert!(
        matches!(gone, Err(NotReplicated::Changed { wanted: 1 })),
        "{gone:?}"
    );
    let exists: bool = conn.exists("record").await.unwrap();
    assert!(!exists, "a record gone stays gone");
    let _: () = conn.set_ex("record", "v2", 600).await.unwrap();
    let changed = replicas::confirm_unchanged(&mut conn, "record", "v1", acks).await;
    assert!(
        matches!(changed, Err(NotReplicated::Changed { .. })),
        "{changed:?}"
    );
    let value: String = conn.get("record").await.unwrap();
    assert_eq!(value, "v2", "a record written anew is left as it is");

    // A node whose script cache is empty (restarted, or a replica just promoted) answers the
    // pipeline's EVALSHA with NOSCRIPT: the script is loaded and the pipeline sent again.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    replicas::confirm_unchanged(&mut conn, "record", "v2", acks)
        .await
        .expect("confirmed after loading the script again");

    // With the replica frozen the write is made and the WAIT behind it counts no one.
    // (A WAIT shorter than the test connection's own response timeout.)
    pair.freeze_replica();
    let _: () = conn.set_ex("record", "v3", 600).await.unwrap();
    let short = ReplicaAcks {
        timeout: Duration::from_millis(100),
        ..acks
    };
    let refused = replicas::confirm_unchanged(&mut conn, "record", "v3", short).await;
    assert!(
        matches!(
            refused,
            Err(NotReplicated::TimedOut {
                acked: 0,
                wanted: 1,
                timeout_ms: 100
            })
        ),
        "{refused:?}"
    );
    pair.thaw_replica();
}

#[actix_web::test]
async fn the_replay_of_a_stored_text_is_confirmed_too() {
    let pair = ReplicaPair::start("replica-stored-text").await;
    let mut env = TestEnv::new().await;
    env.settings.redis_url = pair.primary.url().into();
    env.settings.redis.min_replicas_ack = 1;
    env.settings.redis.ack_timeout = Duration::from_millis(100);
    // Every text goes to Postgres first, and its replays answer before storing anything.
    env.settings.api.inline_text_bytes = 8;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

    pair.freeze_replica();
    let res = test::call_service(&app, post("acme", KEY, BODY).to_request()).await;
    assert_eq!(
        assert_problem(res, 503).await["type"],
        "tag:summaryd,2025:problems/not-replicated"
    );
    let other = env.services().build();
    let other_app = test::init_service(api::app(other.api(), Roles::all(), Shutdown::new())).await;
    let res = test::call_service(&other_app, post("acme", KEY, BODY).to_request()).await;
    assert_eq!(
        assert_problem(res, 503).await["type"],
        "tag:summaryd,2025:problems/not-replicated"
    );

    pair.thaw_replica();
    let mut accepted = None;
    for _ in 0..50 {
        let res = test::call_service(&other_app, post("acme", KEY, BODY).to_request()).await;
        if res.status().as_u16() == 202 {
            accepted = Some(json_body(res).await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = accepted.expect("the retry was never accepted");
    assert_eq!(body["job_id"], job_id_for("acme", KEY, BODY).as_str());
    assert_eq!(stream_len(&env).await, 1);
    assert_eq!(env.count("job_texts").await, 1);
}
