//! Fair scheduling between tenants: how long a small tenant's jobs take behind a large
//! tenant's backlog, against the same jobs alone, and what the lanes cost a tenant alone.
//!
//! Worker role with C consumers (BENCH_CONSUMERS, 8) and a fake model of latency L
//! (BENCH_LATENCY_MS, 200). Four scenarios, each with its own database and key prefix:
//!
//! 1. `b_alone`: tenant b's N_B jobs (BENCH_B_JOBS, 10) accepted into its lane; the time
//!    until the last one's summary is committed.
//! 2. `b_behind_a`: tenant a's N_A jobs (BENCH_A_JOBS, 2000) accepted, then b's N_B; the time
//!    from b's first acceptance until b's last summary. The ratio to (1) is the figure fair
//!    scheduling is about (first in, first out it would be about N_A / C × L).
//! 3. `a_lanes`: a's N_A jobs alone, through the lane and dispatch: jobs/s.
//! 4. `a_stream`: the same jobs put straight on the job stream, the path before lanes (the
//!    dispatch script reads them first): jobs/s. The ratio (3)/(4) is what the lanes cost.
//!
//! `bench/fairness.sh` builds and runs it. Nothing here asserts a time.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use summaryd::app::Application;
use summaryd::config::Settings;
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, TenantId};
use summaryd::infra::log_key::{DeploymentKey, LogKey};
use summaryd::llm::{BuiltinSummariser, Completion, Llm, LlmError};
use summaryd::mail::LogMailer;
use summaryd::shutdown::Shutdown;
use summaryd::stream::{Admit, IdempotencyRecord, TenantLimits, enqueue, enqueue_once};
use support::{cpu_seconds, env_or};

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

struct Params {
    consumers: usize,
    latency_ms: u64,
    pg_base: String,
    redis_url: String,
}

/// How a scenario puts its jobs in.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// The API's accept script: the tenant's lane.
    Lane,
    /// Straight onto the job stream (the path before lanes).
    Stream,
}

/// One world: a worker process's roles on a fresh database and key prefix.
struct World {
    app: Option<tokio::task::JoinHandle<Result<(), summaryd::app::StartError>>>,
    shutdown: Shutdown,
    services: summaryd::app::Handles,
    db_name: String,
    key_prefix: String,
    run_id: String,
}

impl World {
    async fn start(p: &Params) -> Result<Self, Box<dyn std::error::Error>> {
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("summaryd_bench_{}", &run_id[..12]);
        let mut settings = Settings {
            database_url: format!("{}/{db_name}?sslmode=disable", p.pg_base).into(),
            redis_url: p.redis_url.clone().into(),
            key_prefix: format!("bench:{run_id}:"),
            listen: "127.0.0.1:0".parse()?,
            ..Settings::default()
        };
        settings.worker.consumers = p.consumers;
        settings.worker.block = Duration::from_millis(100);
        let llm = Arc::new(DelayedModel {
            latency: Duration::from_millis(p.latency_ms),
            inner: BuiltinSummariser,
        });
        let mailer = LogMailer::new(Arc::new(DeploymentKey::Fixed(LogKey::random())));
        let app = Application::build(
            settings.clone(),
            Roles::of(&[Role::Worker]),
            llm,
            Arc::new(mailer),
            true,
        )
        .await?;
        let services = app.handles().clone();
        let shutdown = Shutdown::new();
        let running = tokio::spawn(app.run(shutdown.clone()));
        Ok(Self {
            app: Some(running),
            shutdown,
            services,
            db_name,
            key_prefix: settings.key_prefix.clone(),
            run_id,
        })
    }

    /// Accept `n` jobs of `tenant` by `path`; their ids.
    async fn put(
        &self,
        tenant: &str,
        n: usize,
        path: Path,
    ) -> Result<Vec<JobId>, Box<dyn std::error::Error>> {
        let mut redis = self.services.redis.get().await?;
        let text = "Revenue grew eleven percent in the quarter. Churn fell to two percent. \
                    The team paused hiring until the new plan lands. Support tickets halved.";
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let scoped = format!("idem:{tenant}:POST:/v1/summaries:bench-{}-{i}", self.run_id);
            let job = Job {
                job_id: JobId::from_scoped_key(&scoped),
                tenant: TenantId::parse(tenant)?,
                text: text.into(),
                notify: Some(Email::parse("bench@example.com")?),
                webhook: None,
                created_at: Utc::now(),
            };
            match path {
                Path::Lane => {
                    let record_key = format!("{}{scoped}", self.key_prefix);
                    enqueue_once(
                        &mut redis,
                        self.services.keys.get(0),
                        &job,
                        IdempotencyRecord {
                            key: &record_key,
                            value: "{}",
                            ttl_s: 600,
                        },
                        Admit {
                            limits: &TenantLimits::default(),
                            budget: None,
                        },
                    )
                    .await?;
                }
                Path::Stream => {
                    enqueue(&mut redis, self.services.keys.get(0), &job).await?;
                }
            }
            ids.push(job.job_id);
        }
        Ok(ids)
    }

    /// Wait until every one of `ids` has its summary; when that happened, from `since`.
    async fn done(
        &self,
        ids: &[JobId],
        since: Instant,
    ) -> Result<Duration, Box<dyn std::error::Error>> {
        let pg = self.services.pg.get().await?;
        let ids: Vec<uuid::Uuid> = ids
            .iter()
            .map(|id| id.to_string().parse())
            .collect::<Result<_, _>>()?;
        let limit = Duration::from_secs(900);
        loop {
            let n: i64 = pg
                .query_one(
                    "SELECT count(*) FROM summaries WHERE job_id = ANY($1)",
                    &[&ids],
                )
                .await?
                .get(0);
            if n as usize >= ids.len() || since.elapsed() > limit {
                return Ok(since.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(mut self, p: &Params) -> Result<(), Box<dyn std::error::Error>> {
        self.shutdown.trigger();
        if let Some(app) = self.app.take() {
            let _ = app.await;
        }
        let (db, prefix) = (self.db_name.clone(), self.key_prefix.clone());
        drop(self);
        support::clean_up(&p.pg_base, &db, &p.redis_url, &prefix).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let p = Params {
        consumers: env_or("BENCH_CONSUMERS", 8),
        latency_ms: env_or("BENCH_LATENCY_MS", 200),
        pg_base: env_or(
            "BENCH_PG_URL",
            "postgres://postgres@127.0.0.1:5432".to_string(),
        ),
        redis_url: env_or("BENCH_REDIS_URL", "redis://127.0.0.1:6379".to_string()),
    };
    let a_jobs: usize = env_or("BENCH_A_JOBS", 2000);
    let b_jobs: usize = env_or("BENCH_B_JOBS", 10);

    // 1. b alone.
    let w = World::start(&p).await?;
    let started = Instant::now();
    let b = w.put("b", b_jobs, Path::Lane).await?;
    let b_alone = w.done(&b, started).await?;
    w.stop(&p).await?;

    // 2. b behind a's backlog.
    let w = World::start(&p).await?;
    w.put("a", a_jobs, Path::Lane).await?;
    let started = Instant::now();
    let b = w.put("b", b_jobs, Path::Lane).await?;
    let b_behind = w.done(&b, started).await?;
    w.stop(&p).await?;

    // 3. and 4. a alone, through its lane and straight on the stream.
    let (mut rates, mut cpu_ms) = (Vec::new(), Vec::new());
    for path in [Path::Lane, Path::Stream] {
        let w = World::start(&p).await?;
        let cpu_before = cpu_seconds().unwrap_or(0.0);
        let started = Instant::now();
        let a = w.put("a", a_jobs, path).await?;
        let took = w.done(&a, started).await?;
        rates.push(a_jobs as f64 / took.as_secs_f64());
        cpu_ms.push((cpu_seconds().unwrap_or(0.0) - cpu_before) * 1000.0 / a_jobs as f64);
        w.stop(&p).await?;
    }
    let fifo_estimate =
        (a_jobs + b_jobs) as f64 / p.consumers as f64 * p.latency_ms as f64 / 1000.0;
    println!(
        "consumers={} latency_ms={} a_jobs={a_jobs} b_jobs={b_jobs}",
        p.consumers, p.latency_ms
    );
    println!(
        "b_alone_s={:.3} b_behind_a_s={:.3} ratio={:.2} (first in, first out would be about {fifo_estimate:.1} s)",
        b_alone.as_secs_f64(),
        b_behind.as_secs_f64(),
        b_behind.as_secs_f64() / b_alone.as_secs_f64()
    );
    println!(
        "a_lanes_jobs_per_s={:.1} a_stream_jobs_per_s={:.1} ratio={:.3} (CPU ms per job {:.3} and {:.3})",
        rates[0],
        rates[1],
        rates[0] / rates[1],
        cpu_ms[0],
        cpu_ms[1]
    );
    println!(
        "BENCH consumers={} latency_ms={} a_jobs={a_jobs} b_jobs={b_jobs} b_alone_s={:.3} \
         b_behind_a_s={:.3} b_ratio={:.3} a_lanes_jobs_per_s={:.1} a_stream_jobs_per_s={:.1} \
         a_ratio={:.3} a_lanes_cpu_ms_per_job={:.3} a_stream_cpu_ms_per_job={:.3}",
        p.consumers,
        p.latency_ms,
        b_alone.as_secs_f64(),
        b_behind.as_secs_f64(),
        b_behind.as_secs_f64() / b_alone.as_secs_f64(),
        rates[0],
        rates[1],
        rates[0] / rates[1],
        cpu_ms[0],
        cpu_ms[1]
    );
    Ok(())
}
