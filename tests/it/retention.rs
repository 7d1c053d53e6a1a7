//! Bounded storage and the visible backlog: finished jobs leave Redis, retention removes
//! exactly what is past its horizon, maintenance is safe on many replicas at once, and the
//! backlog metrics move as a known sequence of jobs says they must.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::test as http;
use chrono::{DateTime, SubsecRound, Utc};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamRangeReply};
use summaryd::api;
use summaryd::config::Settings;
use summaryd::config::roles::Roles;
use summaryd::db;
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::keys::GROUP;
use summaryd::llm::LlmError;
use summaryd::maintenance::{Maintenance, Report};
use summaryd::relay::relay_once;
use summaryd::shutdown::Shutdown;
use summaryd::stream::consumer_group::{self as group, ensure_group};
use summaryd::stream::job_state::{self, Status};
use summaryd::stream::{dead_letters, enqueue, job_entry};
use summaryd::worker::Consumer;

use crate::shared::api_requests::{BODY, get, header, json_body, post, record_key};
use crate::shared::fakes::Step;
use crate::shared::test_env::Services;
use crate::shared::{FakeLlm, FakeMailer, TestEnv, eventually};

struct World {
    env: TestEnv,
    services: Services,
    redis: MultiplexedConnection,
    llm: Arc<FakeLlm>,
    mailer: Arc<FakeMailer>,
}

impl World {
    async fn new(llm: FakeLlm, adjust: impl FnOnce(&mut Settings)) -> Self {
        let env = TestEnv::new().await;
        let mut settings = env.settings.clone();
        settings.llm.max_attempts = 1;
        adjust(&mut settings);
        let llm = Arc::new(llm);
        let mailer = Arc::new(FakeMailer::new());
        let services = env
            .services()
            .settings(settings)
            .llm(llm.clone())
            .mailer(mailer.clone())
            .build();
        let mut redis = env.redis().await;
        ensure_group(&mut redis, services.keys.get(0))
            .await
            .unwrap();
        Self {
            env,
            services,
            redis,
            llm,
            mailer,
        }
    }

    fn maintenance(&self) -> Maintenance {
        self.services.maintenance(Roles::all())
    }

    async fn enqueue(&mut self, job: &Job) -> String {
        enqueue(&mut self.redis, self.services.keys.get(0), job)
            .await
            .unwrap()
    }

    async fn stream_ids(&mut self) -> Vec<String> {
        let reply: StreamRangeReply = self
            .redis
            .xrange_all(self.services.keys.get(0).stream())
            .await
            .unwrap();
        reply.ids.into_iter().map(|e| e.id).collect()
    }

    async fn dead_ids(&mut self) -> Vec<String> {
        let reply: StreamRangeReply = self
            .redis
            .xrange_all(self.services.keys.get(0).dead_letters())
            .await
            .unwrap();
        reply.ids.into_iter().map(|e| e.id).collect()
    }

    async fn state(&mut self, job_id: JobId) -> Option<Status> {
        job_state::get(&mut self.redis, self.services.keys.get(0), job_id)
            .await
            .unwrap()
            .map(|s| s.status)
    }

    /// Dead-letter `job` the way the worker does: delivered to a consumer, then buried by
    /// it. Its state says failed and its job-stream entry is gone.
    async fn dead_letter(&mut self, job: &Job) -> String {
        let msg_id = self.enqueue(job).await;
        assert_eq!(self.read_as("dead-letterer").await, msg_id);
        let fields: HashMap<String, redis::Value> = job_entry::to_fields(job)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), redis::Value::BulkString(v.into_bytes())))
            .collect();
        dead_letters::add(
            &mut self.redis,
            self.services.keys.get(0),
            "dead-letterer",
            &msg_id,
            &fields,
            dead_letters::Why {
                reason: "test",
                class: summaryd::domain::ReasonClass::ModelFailed,
                tenant_error: "test",
            },
        )
        .await
        .unwrap();
        assert!(!self.stream_ids().await.contains(&msg_id));
        let ids = self.dead_ids().await;
        ids.last().cloned().unwrap()
    }

    async fn read_as(&mut self, consumer: &str) -> String {
        let reply: Vec<group::Delivery> = group::read_new(
            &mut self.redis,
            self.services.keys.get(0),
            consumer,
            1,
            Duration::from_millis(10),
        )
        .await
        .unwrap();
        reply[0].id.clone()
    }
}

fn job(key: &str) -> Job {
    Job {
        job_id: JobId::from_scoped_key(&format!("idem:acme:POST:/v1/summaries:{key}")),
        tenant: TenantId::parse("acme").unwrap(),
        text: format!("Quarterly report {key}. Revenue grew. Costs fell.").into(),
        notify: Some(Email::parse("team@example.com").unwrap()),
        webhook: None,
        created_at: Utc::now().trunc_subsecs(6),
    }
}

/// The distinct ids a query's first column holds, sorted.
async fn distinct_ids(pg: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    let mut ids: Vec<String> = pg
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The job ids of `keys` (as [`job`] makes them), sorted.
fn sorted_job_ids(keys: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = keys.iter().map(|k| job(k).job_id.to_string()).collect();
    ids.sort();
    ids
}

fn status(code: u16) -> LlmError {
    LlmError::Status {
        status: code,
        retry_after: None,
        message: format!("HTTP {code}"),
    }
}

/// The value of one series in a Prometheus text exposition, e.g.
/// `summaryd_jobs_total{outcome="done"}`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
        .parse()
        .unwrap()
}

/// Redis's clock, in ms since the epoch: the clock stream ids and the backlog's age are on.
async fn redis_now_ms(redis: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(redis).await.unwrap();
    secs * 1_000 + micros / 1_000
}

fn ms(id: &str) -> u64 {
    group::entry_millis(id).unwrap()
}

fn at_ms(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(ms).unwrap()).unwrap()
}

/// One job of each fate: done, dead-lettered, failing transiently (pending), not yet
/// delivered. Finished entries are gone at once; the unfinished two survive maintenance,
/// the pending one is still claimable with its body; every metric says so.
#[tokio::test]
async fn finished_entries_leave_redis_and_unfinished_ones_survive_maintenance() {
    let llm = FakeLlm::with(
        vec![Step::Ok("summary".into()), Step::Fail(status(400))],
        Step::Fail(status(503)),
    );
    let mut w = World::new(llm, |_| {}).await;
    let (done, dead, retrying, waiting) = (job("done"), job("dead"), job("retry"), job("wait"));
    let mut consumer = Consumer::new(w.services.worker(), "c1");
    for j in [&done, &dead, &retrying] {
        w.enqueue(j).await;
        assert_eq!(consumer.run_once().await.unwrap(), 1);
    }
    let retrying_id = w.stream_ids().await[0].clone();
    let waiting_id = w.enqueue(&waiting).await;

    assert_eq!(
        w.stream_ids().await,
        vec![retrying_id.clone(), waiting_id.clone()],
        "done and dead-lettered entries were deleted with their acknowledgement"
    );
    assert_eq!(w.state(done.job_id).await, None, "done: state dropped");
    assert_eq!(w.state(dead.job_id).await, Some(Status::Failed));
    assert_eq!(w.state(retrying.job_id).await, Some(Status::Queued));
    assert_eq!(w.dead_ids().await.len(), 1);
    relay_once(&w.services.relay()).await.unwrap();

    // The oldest unfinished entry is the pending one. Its age is taken on Redis's clock
    // against the millisecond in its id: once that clock has passed it, the age is not 0.
    let born = ms(&retrying_id);
    assert!(
        eventually(Duration::from_secs(1), || async {
            redis_now_ms(&mut w.redis.clone()).await > born
        })
        .await
    );
    let measured_from = redis_now_ms(&mut w.redis).await;
    for _ in 0..2 {
        let report = w.maintenance().run_once().await.unwrap();
        assert_eq!(
            report.stream_entries, 0,
            "nothing finished was left to trim"
        );
    }
    let measured_to = redis_now_ms(&mut w.redis).await;
    assert_eq!(
        w.stream_ids().await,
        vec![retrying_id.clone(), waiting_id.clone()]
    );

    let text = w.services.metrics.render();
    for (series, want) in [
        (r#"summaryd_jobs_total{outcome="done"}"#, 1.0),
        (r#"summaryd_jobs_total{outcome="dead_lettered"}"#, 1.0),
        (r#"summaryd_jobs_total{outcome="retry"}"#, 1.0),
        (
            r#"summaryd_job_latency_seconds_count{stage="summarised"}"#,
            1.0,
        ),
        (
            r#"summaryd_job_latency_seconds_count{stage="emailed"}"#,
            1.0,
        ),
        ("summaryd_stream_lag", 1.0),
        ("summaryd_stream_pending", 1.0),
        ("summaryd_dead_letters", 1.0),
        ("summaryd_outbox_unsent", 0.0),
        ("summaryd_outbox_sent_total", 1.0),
        (r#"summaryd_maintenance_runs_total{outcome="done"}"#, 2.0),
    ] {
        assert_eq!(sample(&text, series), want, "{series}");
    }
    // The gauge is whole milliseconds in seconds: the pending entry's age at the last pass.
    let age_ms = (sample(&text, "summaryd_oldest_queued_age_seconds") * 1000.0).round() as u64;
    let expected = measured_from - born..=measured_to - born;
    assert!(
        age_ms > 0 && expected.contains(&age_ms),
        "oldest queued age {age_ms} ms, the pending entry's age during the passes {expected:?}"
    );
    assert!(sample(&text, "summaryd_gauges_refreshed_timestamp_seconds") > 0.0);

    // The pending entry is still claimable, body and all.
    let claimed: StreamAutoClaimReply = w
        .redis
        .xautoclaim_options(
            w.services.keys.get(0).stream(),
            GROUP,
            "c2",
            0,
            "0-0",
            StreamAutoClaimOptions::default().count(10),
        )
        .await
        .unwrap();
    assert!(claimed.deleted_ids.is_empty());
    let [entry] = claimed.claimed.try_into().unwrap();
    assert_eq!(entry.id, retrying_id);
    assert_eq!(job_entry::from_fields(&entry.map).unwrap(), retrying);
}

/// Entries an acknowledgement left behind (an older version acked without deleting) are
/// trimmed, and only those; with nothing pending or waiting, the stream ends empty. The lag
/// stays exact where Redis itself cannot tell it.
#[tokio::test]
async fn maintenance_trims_only_finished_entries_and_keeps_the_lag_exact() {
    let mut w = World::new(FakeLlm::ok(), |_| {}).await;
    let stream = w.services.keys.get(0).stream();
    let ids = [
        w.enqueue(&job("a")).await,
        w.enqueue(&job("b")).await,
        w.enqueue(&job("c")).await,
        w.enqueue(&job("d")).await,
    ];
    for _ in 0..3 {
        w.read_as("old").await;
    }
    // a: acknowledged but left in the stream; b: pending; c: finished by today's ack
    // (deleted with it, so Redis's own lag becomes unknown); d: not delivered yet.
    let _: i64 = w.redis.xack(&stream, GROUP, &[&ids[0]]).await.unwrap();
    group::ack_done(&mut w.redis, w.services.keys.get(0), &ids[2], &job("c"))
        .await
        .unwrap();
    let backlog = group::backlog_and_trim(&mut w.redis, w.services.keys.get(0))
        .await
        .unwrap();
    assert_eq!(backlog.trimmed, 1);
    assert_eq!(backlog.lag, Some(1), "d is the one entry not delivered");
    assert_eq!(backlog.pending, 1);
    assert_eq!(w.stream_ids().await, vec![ids[1].clone(), ids[3].clone()]);

    // Finish everything with acks that leave the entries behind: all of them go.
    w.read_as("old").await;
    let _: i64 = w
        .redis
        .xack(&stream, GROUP, &[&ids[1], &ids[3]])
        .await
        .unwrap();
    let backlog = group::backlog_and_trim(&mut w.redis, w.services.keys.get(0))
        .await
        .unwrap();
    assert_eq!(
        (backlog.trimmed, backlog.pending, backlog.lag),
        (2, 0, Some(0))
    );
    assert_eq!(backlog.oldest_age_ms, 0);
    assert!(w.stream_ids().await.is_empty());
}

/// Each horizon removes exactly what is older; what sits exactly at it survives, and so do
/// rows retention does not cover (unsent outbox rows), and job state of other jobs.
#[tokio::test]
async fn retention_removes_exactly_what_is_older_than_its_horizon() {
    const DEAD_S: u64 = 3_600;
    const SENT_S: u64 = 7_200;
    const SUMMARIES_S: u64 = 100_000;
    let mut w = World::new(FakeLlm::ok(), |s| {
        s.retention.dead_letters_s = DEAD_S;
        s.retention.outbox_sent_s = SENT_S;
        s.retention.summaries_s = SUMMARIES_S;
    })
    .await;
    let (old_dead, young_dead) = (job("old-dead"), job("young-dead"));
    let old_id = w.dead_letter(&old_dead).await;
    // A real wait: the two ids need different milliseconds, and only Redis's clock sets an
    // entry's id.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let young_id = w.dead_letter(&young_dead).await;
    assert!(ms(&old_id) < ms(&young_id));
    // Horizons end exactly at the younger dead letter's time.
    let now = at_ms(ms(&young_id)) + chrono::Duration::seconds(DEAD_S as i64);

    let pg = w.env.pg().await;
    let keys = ["old", "edge", "unsent"];
    for k in keys {
        db::summaries::commit_with_outbox(
            &w.services.pg,
            &job(k),
            &crate::shared::model_summary(&format!("Summary of {k}.")),
        )
        .await
        .unwrap();
    }
    let sent_cutoff = (now - chrono::Duration::seconds(SENT_S as i64)).trunc_subsecs(6);
    let done_cutoff = (now - chrono::Duration::seconds(SUMMARIES_S as i64)).trunc_subsecs(6);
    let micro = chrono::Duration::microseconds(1);
    for (k, sent_at, completed_at) in [
        ("old", Some(sent_cutoff - micro), done_cutoff - micro),
        ("edge", Some(sent_cutoff), done_cutoff),
        ("unsent", None, done_cutoff - chrono::Duration::days(30)),
    ] {
        let job_id = job(k).job_id.as_uuid();
        pg.execute(
            "UPDATE outbox SET sent_at = $2 WHERE payload->>'job_id' = $1::uuid::text",
            &[&job_id, &sent_at],
        )
        .await
        .unwrap();
        pg.execute(
            "UPDATE summaries SET completed_at = $2 WHERE job_id = $1",
            &[&job_id, &completed_at],
        )
        .await
        .unwrap();
    }

    let report = w.maintenance().run_at(now).await.unwrap();
    assert_eq!(
        report,
        Report {
            led: true,
            dead_letters: 1,
            outbox_sent: 1,
            summaries: 2,
            ..Report::default()
        }
    );
    assert_eq!(w.dead_ids().await, vec![young_id]);
    assert_eq!(w.state(old_dead.job_id).await, None, "state went with it");
    assert_eq!(w.state(young_dead.job_id).await, Some(Status::Failed));
    let outbox: Vec<String> = pg
        .query("SELECT payload->>'job_id' FROM outbox ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want =
        |ks: &[&str]| -> Vec<String> { ks.iter().map(|k| job(k).job_id.to_string()).collect() };
    assert_eq!(
        outbox,
        want(&["edge", "unsent"]),
        "unsent rows are never removed"
    );
    // The email still to send carries its own text, so expiring the summary's cost it
    // nothing.
    assert_eq!(relay_once(&w.services.relay()).await.unwrap(), 1);
    let sent = w.mailer.sent();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].0.text.contains("Summary of unsent."),
        "{:?}",
        sent[0].0
    );
    assert_eq!(
        distinct_ids(&pg, "SELECT job_id::text FROM summaries").await,
        sorted_job_ids(&["old", "edge", "unsent"]),
        "a summary's row outlives its text"
    );
    assert_eq!(
        distinct_ids(
            &pg,
            "SELECT job_id::text FROM summaries WHERE summary IS NOT NULL"
        )
        .await,
        want(&["edge"])
    );

    // A second pass at the same time finds nothing more.
    let again = w.maintenance().run_at(now).await.unwrap();
    assert_eq!(
        (again.dead_letters, again.outbox_sent, again.summaries),
        (0, 0, 0)
    );
}

/// A long job's stored text and parts: the parts go when retention removes the summary's
/// text (and stay while it has it), the text and parts of a job that never finished go
/// once they are as old as a dead letter would be kept, and younger ones stay.
#[tokio::test]
async fn stored_texts_and_parts_go_with_their_job_under_retention() {
    const DEAD_S: u64 = 3_600;
    const SUMMARIES_S: u64 = 100_000;
    let w = World::new(FakeLlm::ok(), |s| {
        s.retention.dead_letters_s = DEAD_S;
        s.retention.summaries_s = SUMMARIES_S;
    })
    .await;
    let pg = w.env.pg().await;
    let now = Utc::now();
    for k in ["kept", "expired"] {
        db::summaries::commit_with_outbox(
            &w.services.pg,
            &job(k),
            &crate::shared::model_summary(&format!("Summary of {k}.")),
        )
        .await
        .unwrap();
    }
    pg.execute(
        "UPDATE summaries SET completed_at = $2 WHERE job_id = $1",
        &[
            &job("expired").job_id.as_uuid(),
            &(now - chrono::Duration::seconds(SUMMARIES_S as i64 + 1)),
        ],
    )
    .await
    .unwrap();
    let old = now - chrono::Duration::seconds(DEAD_S as i64 + 1);
    let young = now - chrono::Duration::seconds(10);
    // Three parts each: two finished jobs, an unfinished old one and an unfinished young one.
    for (k, created_at) in [
        ("kept", old),
        ("expired", young),
        ("old-unfinished", old),
        ("young-unfinished", young),
    ] {
        for part in 0..3_i32 {
            pg.execute(
                "INSERT INTO summary_parts (job_id, input_sha256, level, part, model, summary, created_at) \
                 VALUES ($1, $2, 0, $3, 'builtin', 'a part', $4)",
                &[&job(k).job_id.as_uuid(), &vec![part as u8; 32], &part, &created_at],
            )
            .await
            .unwrap();
        }
    }
    for (k, created_at) in [("old-unfinished", old), ("young-unfinished", young)] {
        pg.execute(
            "INSERT INTO job_texts (job_id, tenant, text, created_at) VALUES ($1, 'acme', 'long', $2)",
            &[&job(k).job_id.as_uuid(), &created_at],
        )
        .await
        .unwrap();
    }

    let report = w.maintenance().run_at(now).await.unwrap();
    assert_eq!(
        (report.summaries, report.job_texts, report.summary_parts),
        (1, 1, 6)
    );
    assert_eq!(
        distinct_ids(&pg, "SELECT job_id::text FROM summary_parts").await,
        sorted_job_ids(&["kept", "young-unfinished"]),
        "a done job's parts stay with its text, however old; a young unfinished job's stay"
    );
    assert_eq!(
        distinct_ids(&pg, "SELECT job_id::text FROM job_texts").await,
        sorted_job_ids(&["young-unfinished"])
    );
    let again = w.maintenance().run_at(now).await.unwrap();
    assert_eq!((again.job_texts, again.summary_parts), (0, 0));
}

/// `dlq purge`: by id, by age, or both; a replayed job's state is left alone.
#[tokio::test]
async fn dlq_purge_removes_the_chosen_dead_letters_and_their_state() {
    let mut w = World::new(FakeLlm::ok(), |_| {}).await;
    let jobs: Vec<Job> = (0..4).map(|i| job(&format!("p{i}"))).collect();
    let mut ids = Vec::new();
    for j in &jobs {
        ids.push(w.dead_letter(j).await);
        // A real wait: each id needs its own millisecond (the purge cuts by time), and only
        // Redis's clock sets an entry's id.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let mut out = Vec::new();
    let n = summaryd::ops::dlq::purge(
        &w.services.redis,
        &w.services.keys,
        &[ids[3].clone()],
        None,
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(n, 1);
    assert_eq!(w.state(jobs[3].job_id).await, None);
    // By id, but only if old enough: nothing is that old.
    let n = summaryd::ops::dlq::purge(
        &w.services.redis,
        &w.services.keys,
        &[ids[0].clone()],
        Some(Duration::from_secs(3_600)),
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(n, 0);
    // Everything before the third one, by cutoff.
    let n = dead_letters::purge_before(&mut w.redis, w.services.keys.get(0), ms(&ids[2]))
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(w.dead_ids().await, vec![ids[2].clone()]);
    assert_eq!(w.state(jobs[0].job_id).await, None);
    assert_eq!(w.state(jobs[2].job_id).await, Some(Status::Failed));
    assert!(
        String::from_utf8(out)
            .unwrap()
            .contains("1 dead letters purged")
    );
}

/// Eight replicas' maintenance at once: no error, and every row and dead letter removed
/// exactly once in total. The deletes are exact even without the lock.
#[tokio::test]
async fn concurrent_maintenance_never_double_deletes_or_errors() {
    const DEAD: usize = 300;
    const SENT: i64 = 2_600;
    let mut w = World::new(FakeLlm::ok(), |s| {
        s.retention.dead_letters_s = 60;
        s.retention.outbox_sent_s = 60;
    })
    .await;
    let pg = w.env.pg().await;
    pg.batch_execute(&format!(
        "INSERT INTO outbox (topic, dedupe_key, payload, sent_at) \
         SELECT 't', 'a' || g, '{{}}', now() - interval '1 hour' FROM generate_series(1, {SENT}) g"
    ))
    .await
    .unwrap();
    for i in 0..DEAD {
        w.dead_letter(&job(&format!("c{i}"))).await;
    }
    let later = Utc::now() + chrono::Duration::hours(1);
    let passes = futures_util::future::join_all((0..8).map(|_| {
        let m = w.maintenance();
        async move { m.run_at(later).await }
    }))
    .await;
    let reports: Vec<Report> = passes.into_iter().map(|r| r.unwrap()).collect();
    assert!(reports.iter().any(|r| r.led));
    assert_eq!(
        reports.iter().map(|r| r.outbox_sent).sum::<u64>(),
        SENT as u64
    );
    assert_eq!(
        reports.iter().map(|r| r.dead_letters).sum::<u64>(),
        DEAD as u64
    );
    assert_eq!(w.env.count("outbox").await, 0);
    assert!(w.dead_ids().await.is_empty());

    // The same without the lock: the deletes themselves never count a row twice.
    pg.batch_execute(&format!(
        "INSERT INTO outbox (topic, dedupe_key, payload, sent_at) \
         SELECT 't', 'b' || g, '{{}}', now() - interval '1 hour' FROM generate_series(1, {SENT}) g"
    ))
    .await
    .unwrap();
    for i in 0..DEAD {
        w.dead_letter(&job(&format!("d{i}"))).await;
    }
    let cutoff_ms = u64::try_from(later.timestamp_millis()).unwrap();
    let deletes = (0..8).map(|_| {
        let services = w.services.clone();
        async move {
            let mut rows = 0;
            loop {
                let n = db::outbox::delete_sent_before(&services.pg, later, 100)
                    .await
                    .unwrap();
                rows += n;
                if n == 0 {
                    break;
                }
            }
            let mut conn = services.redis.get().await.unwrap();
            let dead = dead_letters::purge_before(&mut conn, services.keys.get(0), cutoff_ms)
                .await
                .unwrap();
            (rows, dead)
        }
    });
    let totals = futures_util::future::join_all(deletes).await;
    assert_eq!(totals.iter().map(|t| t.0).sum::<u64>(), SENT as u64);
    assert_eq!(totals.iter().map(|t| t.1).sum::<u64>(), DEAD as u64);
    for i in 0..DEAD {
        assert_eq!(w.state(job(&format!("d{i}")).job_id).await, None);
    }
}

/// The outbox backlog gauge's query reads the partial index, not the table.
#[tokio::test]
async fn outbox_backlog_count_uses_its_index() {
    let env = TestEnv::new().await;
    let pg = env.pg().await;
    pg.batch_execute(
        "INSERT INTO outbox (topic, dedupe_key, payload, sent_at) \
         SELECT 't', 'k' || g, '{}', CASE WHEN g % 100 = 0 THEN NULL ELSE now() END \
           FROM generate_series(1, 20000) g; ANALYZE outbox;",
    )
    .await
    .unwrap();
    let plan: Vec<String> = pg
        .query(
            &format!("EXPLAIN {}", summaryd::db::outbox::UNSENT_BY_TOPIC),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("outbox_unsent"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

/// Expired rows are the oldest and stay for good: retention's search for texts to expire
/// reads the index of the rows that still have one, not every row before the cutoff.
#[tokio::test]
async fn summary_retention_reads_only_rows_that_still_have_text() {
    let env = TestEnv::new().await;
    let pg = env.pg().await;
    pg.batch_execute(
        "INSERT INTO summaries (job_id, tenant, summary, summary_expired_at, created_at, completed_at) \
         SELECT gen_random_uuid(), 'acme', CASE WHEN g % 100 = 0 THEN 's' END, \
                CASE WHEN g % 100 = 0 THEN NULL ELSE now() END, now(), \
                now() - (20001 - g) * interval '1 second' \
           FROM generate_series(1, 20000) g; ANALYZE summaries;",
    )
    .await
    .unwrap();
    let plan: Vec<String> = pg
        .query(
            "EXPLAIN SELECT job_id FROM summaries WHERE summary IS NOT NULL AND completed_at < now() \
              ORDER BY completed_at LIMIT 500 FOR UPDATE SKIP LOCKED",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("summaries_text_completed_at"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

/// Memory of the data, without what connected clients hold.
async fn data_memory(redis: &mut MultiplexedConnection) -> i64 {
    crate::shared::servers::redis_memory(redis)
        .await
        .used_less_clients
}

/// Posts `n` jobs, 32 at a time, as a client should: it drops pooled connections before
/// the server's keep-alive (5 s) can close them under it, and resends a request whose
/// connection failed with the same `Idempotency-Key` (a reused connection the server
/// closed at that very moment is reset; the key makes the resend safe).
async fn post_jobs(base: &str, tag: &str, n: usize, text: &str) {
    use futures_util::StreamExt;
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let url = format!("{base}/v1/summaries");
    futures_util::stream::iter(0..n)
        .map(|i| {
            let req = client
                .post(&url)
                .header("Idempotency-Key", format!("{tag}-key-{i:08}"))
                .header("X-Tenant-Id", "acme")
                .json(&serde_json::json!({"text": text, "notify": "team@example.com"}));
            async move {
                let mut tries = 0;
                loop {
                    let attempt = req.try_clone().unwrap().send().await;
                    match attempt {
                        Ok(response) => break response.status().as_u16(),
                        Err(e) if tries < 3 && (e.is_connect() || e.is_request()) => tries += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        })
        .buffer_unordered(32)
        .for_each(|status| async move { assert_eq!(status, 202) })
        .await;
}

/// 20,000 jobs through one process with the builtin model: afterwards the job stream is
/// empty (the acks deleted every entry; the trim found nothing), no job state is left, and
/// Redis holds the idempotency records and nothing else: its memory is back to where it
/// was plus those records. Prints the figures the README's arithmetic uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_jobs_leave_only_their_idempotency_records_in_redis() {
    const QUEUED: usize = 1_000;
    const JOBS: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    // A private Redis: other tests' keys would move the shared one's memory.
    let redis_server = crate::shared::servers::RedisProc::start(dir.path(), &[]);
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.redis_url = redis_server.url().into();
    settings.worker.consumers = 8;
    settings.maintenance.interval = Duration::from_millis(500);
    let text = "Revenue grew eleven percent in the third quarter. ".repeat(20);
    let mut redis = redis_server.connection().await;
    let start = |roles: Roles| {
        env.services()
            .settings(settings.clone())
            .llm(Arc::new(summaryd::llm::BuiltinSummariser))
            .application(roles)
    };

    // Queued jobs: only the api runs, so every job waits in the stream.
    let api = start(Roles::of(&[summaryd::config::roles::Role::Api])).await;
    let base = format!("http://127.0.0.1:{}", api.port());
    let shutdown = summaryd::shutdown::Shutdown::new();
    let task = tokio::spawn(api.run(shutdown.clone()));
    post_jobs(&base, "warm", 10, &text).await;
    let before_queue = data_memory(&mut redis).await;
    post_jobs(&base, "queued", QUEUED, &text).await;
    let queued_bytes = (data_memory(&mut redis).await - before_queue) / QUEUED as i64;
    shutdown.trigger();
    task.await.unwrap().unwrap();

    // Everything: drain the queued jobs, then measure, run 20,000 more, measure again.
    let app = start(Roles::all()).await;
    let base = format!("http://127.0.0.1:{}", app.port());
    let metrics = app.handles().metrics.clone();
    let pg = env.pg().await;
    let shutdown = summaryd::shutdown::Shutdown::new();
    let task = tokio::spawn(app.run(shutdown.clone()));
    let stream = summaryd::infra::keys::RedisKeys::new(settings.key_prefix.clone()).stream();
    let watcher = redis.clone();
    let all_sent = |n: i64| {
        let (pg, stream) = (&pg, &stream);
        let mut redis = watcher.clone();
        async move {
            let sent: i64 = pg
                .query_one("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL", &[])
                .await
                .unwrap()
                .get(0);
            let len: i64 = redis.xlen(stream).await.unwrap();
            sent == n && len == 0
        }
    };
    let drained = (QUEUED + 10) as i64;
    assert!(crate::shared::eventually(Duration::from_secs(120), || all_sent(drained)).await);
    let before = data_memory(&mut redis).await;
    let started = std::time::Instant::now();
    post_jobs(&base, "bulk", JOBS, &text).await;
    let total = drained + JOBS as i64;
    assert!(
        crate::shared::eventually(Duration::from_secs(600), || all_sent(total)).await,
        "all jobs summarised and emailed"
    );
    let elapsed = started.elapsed();
    shutdown.trigger();
    task.await.unwrap().unwrap();
    let after = data_memory(&mut redis).await;

    // No finished entry is left, and the acks removed them, not the trim.
    let len: i64 = redis.xlen(&stream).await.unwrap();
    assert_eq!(len, 0);
    let trimmed = metrics
        .maintenance_removed
        .with_label_values(&["stream_entries"])
        .get();
    assert_eq!(trimmed, 0, "acks deleted every entry themselves");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut redis)
        .await
        .unwrap();
    let idem_prefix = format!("{}idem:", settings.key_prefix);
    // The scheduler's two fixed keys stay (its virtual time and the short doorbell list);
    // every lane and the active-lanes set are gone with the last dispatch.
    let names = summaryd::infra::keys::RedisKeys::new(settings.key_prefix.clone());
    let fixed = [names.lanes_clock(), names.doorbell()];
    let others: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with(&idem_prefix) && **k != stream && !fixed.contains(k))
        .collect();
    assert!(
        others.is_empty(),
        "only idempotency records remain: {others:?}"
    );
    let fixed_left = keys.iter().filter(|k| fixed.contains(k)).count();
    assert_eq!(keys.len(), total as usize + 1 + fixed_left);

    let mut usage = 0;
    let sample: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with(&idem_prefix))
        .take(500)
        .collect();
    for k in &sample {
        let n: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut redis)
            .await
            .unwrap();
        usage += n;
    }
    let per_record = usage / sample.len() as i64;
    let grown = after - before;
    let per_job_left = grown / JOBS as i64;
    let row_bytes = |table: &str| {
        let pg = &pg;
        let sql = format!("SELECT pg_total_relation_size('{table}') / count(*) FROM {table}");
        async move { pg.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    println!(
        "text {} bytes; Redis per queued job {queued_bytes} B; per idempotency record: \
         MEMORY USAGE {per_record} B, used_memory growth {per_job_left} B; \
         Postgres per summaries row {} B, per outbox row {} B; {JOBS} jobs in {:.1} s",
        text.len(),
        row_bytes("summaries").await,
        row_bytes("outbox").await,
        elapsed.as_secs_f64(),
    );
    // The growth is the records (MEMORY USAGE counts the key, value and main-dictionary
    // entry) plus what the keyspace spends per key outside them: the expiry dictionary's
    // entry and a slot in each of the two hash tables, which double as keys are added
    // (about 80 B a key here). Nothing that scales with the jobs' text (1,000 B) is left.
    assert!(
        grown <= JOBS as i64 * (per_record + 128),
        "grew {grown} B for {JOBS} records of {per_record} B"
    );
    assert!(grown >= JOBS as i64 * per_record, "grew {grown} B");
}

/// A relay-only process has no Redis: its maintenance keeps the outbox gauge and
/// retention going without one. With the worker role, Redis being down fails the pass
/// (counted as an error) but the Postgres gauge is still refreshed.
#[tokio::test]
async fn maintenance_works_with_what_its_roles_have() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.redis_url = crate::shared::http_stub::closed_port_url("")
        .replace("http://", "redis://")
        .into();
    let services = env.services().settings(settings).build();
    db::summaries::commit_with_outbox(&services.pg, &job("r1"), &crate::shared::model_summary("s"))
        .await
        .unwrap();
    let relay = services.maintenance(Roles::of(&[summaryd::config::roles::Role::Relay]));
    assert!(relay.run_once().await.unwrap().led);
    assert_eq!(services.metrics.outbox_unsent.get(), Some(1.0));

    db::summaries::commit_with_outbox(&services.pg, &job("r2"), &crate::shared::model_summary("s"))
        .await
        .unwrap();
    let worker = services.maintenance(Roles::of(&[summaryd::config::roles::Role::Worker]));
    assert!(worker.run_once().await.is_err(), "Redis is down");
    assert_eq!(services.metrics.outbox_unsent.get(), Some(2.0));
    let text = services.metrics.render();
    assert_eq!(
        sample(&text, r#"summaryd_maintenance_runs_total{outcome="error"}"#),
        1.0
    );
}

/// Summaries retention on, a job done and emailed, its text expired, its idempotency record
/// gone (as after its TTL): the same key and body sent again is the same job id, and the
/// worker finds it finished by its identity row: no model call, no email, no dead letter;
/// GET says `done` with `summary_expired`. Once retention has removed the sent outbox row
/// too, a further resend is still a duplicate.
#[actix_web::test]
async fn a_resend_after_retention_is_the_same_finished_job() {
    const SUMMARIES_S: i64 = 2 * 86_400;
    let mut w = World::new(FakeLlm::ok(), |s| {
        s.retention.summaries_s = SUMMARIES_S as u64;
    })
    .await;
    let app = http::init_service(api::app(w.services.api(), Roles::all(), Shutdown::new())).await;
    let key = "resend-after-retention-1";
    let mut consumer = Consumer::new(w.services.worker(), "w-1");

    let first = http::call_service(&app, post("acme", key, BODY).to_request()).await;
    assert_eq!(first.status().as_u16(), 202);
    let job_id = json_body(first).await["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(relay_once(&w.services.relay()).await.unwrap(), 1);
    assert_eq!((w.llm.calls(), w.mailer.sent().len()), (1, 1));
    let res = http::call_service(&app, get("acme", &job_id).to_request()).await;
    let done = json_body(res).await;
    assert!(done["summary"].is_string(), "{done}");
    assert!(done.get("summary_expired").is_none(), "{done}");
    let model = done["model"].as_str().unwrap().to_owned();

    // The summary's horizon has passed; the sent outbox row's (7 days) has not.
    let later = Utc::now() + chrono::Duration::seconds(SUMMARIES_S + 1);
    let report = w.maintenance().run_at(later).await.unwrap();
    assert_eq!((report.summaries, report.outbox_sent), (1, 0));

    let pg = w.env.pg().await;
    let record = record_key(&w.services, "acme", key);
    for (round, pass_at) in [(1, None), (2, Some(later + chrono::Duration::days(7)))] {
        if let Some(at) = pass_at {
            let report = w.maintenance().run_at(at).await.unwrap();
            assert_eq!(
                (report.summaries, report.outbox_sent),
                (0, 1),
                "round {round}"
            );
        }
        // The record's TTL has run out.
        let deleted: u64 = w.redis.del(&record).await.unwrap();
        assert_eq!(deleted, 1, "round {round}");

        let again = http::call_service(&app, post("acme", key, BODY).to_request()).await;
        assert_eq!(again.status().as_u16(), 202, "round {round}");
        assert!(header(&again, "idempotent-replayed").is_none());
        assert_eq!(json_body(again).await["job_id"], job_id.as_str());
        assert_eq!(consumer.run_once().await.unwrap(), 1, "round {round}");
        assert_eq!(relay_once(&w.services.relay()).await.unwrap(), 0);

        assert_eq!(
            w.env.dead_letters().await,
            0,
            "round {round}: not dead-lettered"
        );
        assert_eq!(w.llm.calls(), 1, "round {round}: no second model call");
        assert_eq!(w.mailer.sent().len(), 1, "round {round}: no second email");
        assert_eq!(w.env.count("summaries").await, 1, "round {round}");
        assert_eq!(
            w.env.count("outbox").await,
            if pass_at.is_none() { 1 } else { 0 },
            "round {round}"
        );
        assert!(
            w.stream_ids().await.is_empty(),
            "round {round}: acknowledged"
        );

        let res = http::call_service(&app, get("acme", &job_id).to_request()).await;
        assert_eq!(res.status().as_u16(), 200, "round {round}");
        let view = json_body(res).await;
        assert_eq!(view["status"], "done", "{view}");
        assert_eq!(view["summary_expired"], true, "{view}");
        assert!(view.get("summary").is_none(), "{view}");
        assert_eq!(view["model"], model.as_str(), "{view}");
        assert_eq!(view["completed_at"], done["completed_at"], "{view}");
    }
    // What the identity row keeps: who, when, which model and what it cost.
    let row = pg
        .query_one(
            "SELECT summary, summary_expired_at IS NOT NULL, tenant, model FROM summaries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), None);
    assert!(row.get::<_, bool>(1));
    assert_eq!(row.get::<_, String>(2), "acme");
    assert_eq!(row.get::<_, Option<String>>(3), Some(model));
    let usage = db::summaries::usage(&w.services.pg, None, None)
        .await
        .unwrap();
    assert_eq!(usage.len(), 1, "the job still counts in `summaryd usage`");
    assert_eq!(
        sample(
            &w.services.metrics.render(),
            r#"summaryd_jobs_total{outcome="duplicate"}"#
        ),
        2.0
    );
}

/// A summary row removed while its outbox row stayed (by hand, or by the retention of an
/// older version, which deleted rows): a delivery of that job stores the summary again,
/// and the outbox row already there stands for its email; no conflict, no dead letter,
/// no second email.
#[tokio::test]
async fn a_commit_finding_its_email_already_intended_adds_no_second_one() {
    let mut w = World::new(FakeLlm::ok(), |_| {}).await;
    let j = job("row-removed");
    let mut consumer = Consumer::new(w.services.worker(), "w-1");
    w.enqueue(&j).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(relay_once(&w.services.relay()).await.unwrap(), 1);
    let pg = w.env.pg().await;
    pg.execute("DELETE FROM summaries", &[]).await.unwrap();

    w.enqueue(&j).await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(w.env.dead_letters().await, 0, "not dead-lettered");
    assert_eq!(w.env.count("summaries").await, 1, "the job is done again");
    assert_eq!(w.env.count("outbox").await, 1);
    assert_eq!(relay_once(&w.services.relay()).await.unwrap(), 0);
    assert_eq!(w.mailer.sent().len(), 1, "one email");
    assert_eq!(
        w.llm.calls(),
        2,
        "without its row the job had to be summarised again"
    );
    assert!(w.stream_ids().await.is_empty(), "acknowledged");

    // The same straight through the commit: stored, and no outbox row added.
    pg.execute("DELETE FROM summaries", &[]).await.unwrap();
    let outcome =
        db::summaries::commit_with_outbox(&w.services.pg, &j, &crate::shared::model_summary("s"))
            .await
            .unwrap();
    assert_eq!(outcome, db::summaries::CommitOutcome::Inserted);
    assert_eq!(w.env.count("outbox").await, 1);
}

/// `serve` refuses a horizon a replay could outlive before it connects anywhere: exit 2,
/// naming the horizon and the idempotency TTL it must exceed.
#[test]
fn serve_refuses_a_retention_horizon_shorter_than_the_idempotency_records() {
    for (setting, value) in [
        ("SUMMARYD_RETENTION_DEAD_LETTERS_S", "3600"),
        ("SUMMARYD_RETENTION_SUMMARIES_S", "86400"),
    ] {
        // Backends nobody listens on, so a build without the check cannot start a server
        // on anything shared; it is killed below if it runs instead of refusing.
        let closed = crate::shared::http_stub::closed_port_url("");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_summaryd"))
            .args([
                "serve",
                "--roles",
                "api",
                "--no-migrate",
                "--listen",
                "127.0.0.1:0",
            ])
            .env_clear()
            .env("SUMMARYD_REDIS_URL", closed.replace("http://", "redis://"))
            .env(
                "SUMMARYD_DATABASE_URL",
                closed.replace("http://", "postgres://postgres@") + "/none",
            )
            .env(setting, value)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A bound on a refusal that takes milliseconds, not a timing assertion.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(2),
            "{setting}: {stderr}"
        );
        assert!(stderr.contains(setting), "{stderr}");
        assert!(
            stderr.contains("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S"),
            "{stderr}"
        );
    }
}
