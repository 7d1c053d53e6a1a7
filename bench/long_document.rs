//! One long document through the worker: a 500,000-character text, summarised in parts by
//! a fake model of latency L with P parts at once. Reports the wall time against the ideal
//! `calls × L / P` (the time the calls take when P of them are always in flight), as
//! `ratio = ideal / wall` (1.0: no time lost to anything but the model; the goal is ≥ 0.8),
//! and the process's CPU per model call (splitting, hashing, storing each part).
//!
//! `cargo bench --bench long_document` (env: BENCH_CHARS, BENCH_LATENCY_MS,
//! BENCH_PARALLEL_PARTS, BENCH_CONTEXT_TOKENS, BENCH_PG_URL, BENCH_REDIS_URL). Uses its own
//! database and key prefix, removed afterwards. The last line (`BENCH ...`) is for scripts.
//!
//! The combinations cannot start before their parts are back, so the last few calls of a
//! job run with fewer than P in flight: that tail, not the service, is most of what keeps
//! the ratio under 1.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use summaryd::app::Application;
use summaryd::config::Settings;
use summaryd::config::roles::{Role, Roles};
use summaryd::domain::{Email, Job, JobId, JobText, TenantId};
use summaryd::infra::log_key::{DeploymentKey, LogKey};
use summaryd::llm::{BuiltinSummariser, Completion, Llm, LlmError};
use summaryd::mail::LogMailer;
use summaryd::shutdown::Shutdown;
use summaryd::stream::enqueue;
use support::{cpu_seconds, env_or};

/// The builtin summariser behind a fixed delay, counting its calls.
struct DelayedModel {
    latency: Duration,
    calls: AtomicUsize,
}

#[async_trait]
impl Llm for DelayedModel {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        BuiltinSummariser.summarise(text).await
    }
}

/// A document of `chars` characters: paragraphs of distinct sentences, as a transcript.
fn document(chars: usize) -> String {
    let mut text = String::with_capacity(chars + 200);
    let mut n = 0;
    while text.len() < chars {
        n += 1;
        text.push_str(&format!(
            "Speaker {} raised item {n}: the renewal for account {} is at risk unless pricing \
             moves by {} percent. The team agreed to follow up by day {}. ",
            n % 7,
            n * 13 % 997,
            n % 23,
            n % 30
        ));
        if n % 6 == 0 {
            text.push_str("\n\n");
        }
    }
    text.truncate(chars);
    text
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let chars: usize = env_or("BENCH_CHARS", 500_000);
    let latency_ms: u64 = env_or("BENCH_LATENCY_MS", 200);
    let parallel: usize = env_or("BENCH_PARALLEL_PARTS", 4);
    let context: u32 = env_or("BENCH_CONTEXT_TOKENS", 4_096);
    let pg_base: String = env_or(
        "BENCH_PG_URL",
        "postgres://postgres@127.0.0.1:5432".to_string(),
    );
    let redis_url: String = env_or("BENCH_REDIS_URL", "redis://127.0.0.1:6379".to_string());
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let db_name = format!("summaryd_bench_{}", &run_id[..12]);

    let mut settings = Settings {
        database_url: format!("{pg_base}/{db_name}?sslmode=disable").into(),
        redis_url: redis_url.clone().into(),
        key_prefix: format!("bench:{run_id}:"),
        listen: "127.0.0.1:0".parse()?,
        ..Settings::default()
    };
    settings.worker.consumers = 1;
    settings.worker.block = Duration::from_millis(100);
    settings.llm.context_tokens = context;
    settings.llm.parallel_parts = parallel;
    // The job budget bounds each part's attempts, not the whole job.
    settings.job_budget = Duration::from_secs(60);

    let model = Arc::new(DelayedModel {
        latency: Duration::from_millis(latency_ms),
        calls: AtomicUsize::new(0),
    });
    let roles = Roles::of(&[Role::Worker]);
    let mailer = LogMailer::new(Arc::new(DeploymentKey::Fixed(LogKey::random())));
    let app = Application::build(
        settings.clone(),
        roles,
        model.clone(),
        Arc::new(mailer),
        true,
    )
    .await?;
    let services = app.handles().clone();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(app.run(shutdown.clone()));

    let text = document(chars);
    let job = Job {
        job_id: JobId::from_scoped_key(&format!("bench:{run_id}:long")),
        tenant: TenantId::parse("bench")?,
        text: JobText::Stored,
        notify: Some(Email::parse("bench@example.com")?),
        webhook: None,
        created_at: Utc::now(),
    };
    let pg = services.pg.get().await?;
    pg.execute(
        "INSERT INTO job_texts (job_id, tenant, text) VALUES ($1, 'bench', $2)",
        &[&job.job_id.as_uuid(), &text],
    )
    .await?;
    let mut redis = services.redis.get().await?;
    let cpu_before = cpu_seconds().unwrap_or(0.0);
    let started = Instant::now();
    enqueue(&mut redis, services.keys.get(0), &job).await?;
    drop(redis);
    let limit = Duration::from_secs(600);
    loop {
        let done: i64 = pg
            .query_one("SELECT count(*) FROM summaries", &[])
            .await?
            .get(0);
        if done == 1 || started.elapsed() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let wall = started.elapsed();
    let cpu = cpu_seconds().unwrap_or(0.0) - cpu_before;
    let parts: Option<i32> = pg
        .query_one("SELECT parts FROM summaries", &[])
        .await?
        .get(0);
    let stored: i64 = pg
        .query_one("SELECT count(*) FROM summary_parts", &[])
        .await?
        .get(0);
    drop(pg);
    shutdown.trigger();
    let _ = running.await;

    let calls = model.calls.load(Ordering::Relaxed);
    let ideal = calls as f64 * latency_ms as f64 / 1000.0 / parallel as f64;
    let ratio = ideal / wall.as_secs_f64();
    println!(
        "chars={chars} context_tokens={context} latency_ms={latency_ms} parallel_parts={parallel}"
    );
    println!(
        "calls={calls} parts={} stored_parts={stored} wall_s={:.2} ideal_s={ideal:.2} ratio={ratio:.3}",
        parts.unwrap_or(1),
        wall.as_secs_f64()
    );
    println!(
        "BENCH chars={chars} calls={calls} wall_s={:.3} ideal_s={ideal:.3} ratio={ratio:.3} \
         cpu_s={cpu:.3} cpu_ms_per_call={:.3}",
        wall.as_secs_f64(),
        cpu * 1000.0 / calls.max(1) as f64
    );

    drop(services);
    support::clean_up(&pg_base, &db_name, &redis_url, &settings.key_prefix).await
}
