//! End-to-end throughput: N jobs through worker (model of latency L, C consumers) and relay,
//! from the first enqueue until every summary is committed and every email sent.
//!
//! Reports jobs/s against the ideal C / L. `bench/run.sh` runs it for several C; alone:
//! `cargo bench --bench e2e_jobs` (env: BENCH_JOBS, BENCH_LATENCY_MS, BENCH_CONSUMERS,
//! BENCH_PG_URL, BENCH_PG_SSLMODE, BENCH_RETENTION_S, BENCH_REDIS_URL, BENCH_COMMIT_BATCH:
//! the worker's `commit_batch`). Uses its own database and key prefix, removed afterwards.
//! The last line (`BENCH ...`) is for the scripts: `summarised_s` is when the last summary
//! was committed (the worker's part; the rest of `elapsed_s` is the relay catching up),
//! `cpu_ms_per_job` this process's CPU per job, a figure a noisy machine changes less than
//! the rate, `retention_deleted` the sent outbox rows retention removed during the run,
//! and `peak_rss_kib` this process's VmHWM, i.e. worker + relay roles with C consumers,
//! under this load.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use futures_util::{StreamExt, TryStreamExt};
use summaryd::app::Application;
use summaryd::config::Settings;
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::log_key::{DeploymentKey, LogKey};
use summaryd::llm::{BuiltinSummariser, Completion, Llm, LlmError};
use summaryd::mail::LogMailer;
use summaryd::shutdown::Shutdown;
use summaryd::stream::enqueue;
use support::{cpu_seconds, env_or};

// The allocator of the summaryd binary (src/main.rs), so the process measured here allocates
// as the service does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Enqueues the producer keeps in flight.
const PRODUCER_IN_FLIGHT: usize = 64;

/// The builtin summariser behind a fixed delay: a stand-in for a hosted model's latency.
struct DelayedModel {
    latency: Duration,
    inner: BuiltinSummariser,
}

#[async_trait]
impl Llm for DelayedModel {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        tokio::time::sleep(self.latency).await;
        self.inner.summarise(text).await
    }
}

/// VmHWM (peak resident set) of this process, from /proc.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes --bench; this binary takes its parameters from the environment.
    let jobs: usize = env_or("BENCH_JOBS", 400);
    let latency_ms: u64 = env_or("BENCH_LATENCY_MS", 200);
    let consumers: usize = env_or("BENCH_CONSUMERS", 8);
    let pg_base: String = env_or(
        "BENCH_PG_URL",
        "postgres://postgres@127.0.0.1:5432".to_string(),
    );
    let redis_url: String = env_or("BENCH_REDIS_URL", "redis://127.0.0.1:6379".to_string());
    // Cleartext by default, as the figures in bench/results were measured: a local Postgres
    // with `ssl = on` (Debian's default) would otherwise get TLS from summaryd's default
    // `sslmode=prefer`. BENCH_PG_SSLMODE=require measures what TLS to Postgres costs.
    let sslmode: String = env_or("BENCH_PG_SSLMODE", "disable".to_string());
    // Retention at work during the run: sent outbox rows older than this many seconds are
    // deleted by the maintenance task, which then runs every second. 0 = the defaults (a
    // week; nothing a run this short would delete).
    let retention_s: u64 = env_or("BENCH_RETENTION_S", 0);
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let db_name = format!("summaryd_bench_{}", &run_id[..12]);

    let mut settings = Settings {
        database_url: format!("{pg_base}/{db_name}?sslmode={sslmode}").into(),
        redis_url: redis_url.clone().into(),
        key_prefix: format!("bench:{run_id}:"),
        listen: "127.0.0.1:0".parse()?,
        ..Settings::default()
    };
    settings.worker.consumers = consumers;
    settings.worker.commit_batch = env_or("BENCH_COMMIT_BATCH", settings.worker.commit_batch);
    settings.relay.tasks = 2;
    settings.relay.poll = Duration::from_millis(10);
    settings.relay.batch = 50;
    settings.worker.block = Duration::from_millis(100);
    if retention_s > 0 {
        settings.retention.outbox_sent_s = retention_s;
        settings.maintenance.interval = Duration::from_secs(1);
    }

    let llm = Arc::new(DelayedModel {
        latency: Duration::from_millis(latency_ms),
        inner: BuiltinSummariser,
    });
    let roles = Roles::of(&[Role::Worker, Role::Relay]);
    let mailer = LogMailer::new(Arc::new(DeploymentKey::Fixed(LogKey::random())));
    let app = Application::build(settings.clone(), roles, llm, Arc::new(mailer), true).await?;
    let services = app.handles().clone();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(app.run(shutdown.clone()));

    // The producer stands in for API processes, which would run elsewhere: one multiplexed
    // connection with many enqueues in flight keeps its share of this process's CPU small
    // (one by one, 6,400 round trips took about a third of a C = 256 run, beside the
    // consumers it measures).
    let producer = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let keys = services.keys.get(0).clone();
    let text = "Revenue grew eleven percent in the quarter. Churn fell to two percent. \
                The team paused hiring until the new plan lands. Support tickets halved.";
    let tenant = TenantId::parse("bench")?;
    let notify = Email::parse("bench@example.com")?;
    let cpu_before = cpu_seconds().unwrap_or(0.0);
    let started = Instant::now();
    futures_util::stream::iter(0..jobs)
        .map(|i| {
            let msg = Job {
                job_id: JobId::from_scoped_key(&format!("bench:{run_id}:{i}")),
                tenant: tenant.clone(),
                text: text.into(),
                notify: Some(notify.clone()),
                webhook: None,
                created_at: Utc::now(),
            };
            let (mut conn, keys) = (producer.clone(), &keys);
            async move { enqueue(&mut conn, keys, &msg).await }
        })
        .buffered(PRODUCER_IN_FLIGHT)
        .try_for_each(|_| std::future::ready(Ok(())))
        .await?;
    let enqueued = started.elapsed();
    let pg = services.pg.get().await?;
    // Bounds a run that cannot finish (e.g. Postgres refusing connections); the sweep in
    // bench/run.sh takes seconds per point.
    let limit = Duration::from_secs(300);
    // When the last summary was committed: the worker's part, apart from the relay's.
    let mut summarised = None;
    loop {
        // Done when every job has its summary and no outbox row is left unsent: counting
        // sent rows would miss those retention already deleted.
        let row = pg
            .query_one(
                "SELECT (SELECT count(*) FROM summaries), \
                        (SELECT count(*) FROM outbox WHERE sent_at IS NULL)",
                &[],
            )
            .await?;
        let (done, unsent): (i64, i64) = (row.get(0), row.get(1));
        if summarised.is_none() && done as usize >= jobs {
            summarised = Some(started.elapsed());
        }
        if (summarised.is_some() && unsent == 0) || started.elapsed() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds().unwrap_or(0.0) - cpu_before;
    let summarised = summarised.unwrap_or(elapsed);
    let summaries: i64 = pg
        .query_one("SELECT count(*) FROM summaries", &[])
        .await?
        .get(0);
    // Every summary has one outbox row: the rows missing were sent and then deleted.
    let outbox = pg
        .query_one(
            "SELECT count(*) FILTER (WHERE sent_at IS NOT NULL), \
                    count(*) FILTER (WHERE sent_at IS NULL) FROM outbox",
            &[],
        )
        .await?;
    let (sent_kept, unsent): (i64, i64) = (outbox.get(0), outbox.get(1));
    let deleted = summaries - sent_kept - unsent;
    let sent = summaries - unsent;
    drop(pg);
    // Jobs per group-commit transaction and per batched acknowledgement, from the
    // process's own histograms.
    let rendered = services.metrics.render();
    let per_batch = |name: &str| {
        let read = |suffix: &str| {
            rendered
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}_{suffix} ")))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        match (read("sum"), read("count")) {
            (Some(sum), Some(count)) if count > 0.0 => sum / count,
            _ => 0.0,
        }
    };
    let commit_batch = per_batch("summaryd_worker_commit_batch_jobs");
    let ack_batch = per_batch("summaryd_worker_ack_batch_jobs");
    shutdown.trigger();
    let _ = running.await;

    let rate = jobs as f64 / elapsed.as_secs_f64();
    let ideal = consumers as f64 / (latency_ms as f64 / 1000.0);
    println!("jobs={jobs} consumers={consumers} latency_ms={latency_ms} summaries={summaries}");
    println!(
        "elapsed_s={:.2} jobs_per_s={rate:.1} ideal_c_over_l={ideal:.1} ratio={:.3}",
        elapsed.as_secs_f64(),
        rate / ideal
    );
    println!(
        "BENCH jobs={jobs} consumers={consumers} latency_ms={latency_ms} summaries={summaries} \
         sent={sent} retention_deleted={deleted} elapsed_s={:.3} jobs_per_s={rate:.1} ideal={ideal:.1} ratio={:.3} \
         peak_rss_kib={} enqueued_s={:.3} summarised_s={:.3} cpu_s={cpu:.2} cpu_ms_per_job={:.3} \
         commit_batch_jobs={commit_batch:.1} ack_batch_jobs={ack_batch:.1}",
        elapsed.as_secs_f64(),
        rate / ideal,
        peak_rss_kib().unwrap_or(0),
        enqueued.as_secs_f64(),
        summarised.as_secs_f64(),
        cpu * 1000.0 / jobs as f64
    );

    // Clean up: the bench database and keys.
    drop(services);
    support::clean_up(&pg_base, &db_name, &redis_url, &settings.key_prefix).await
}
