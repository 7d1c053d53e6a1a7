//! A private Redis with an fsync-always append-only file is SIGKILLed and
//! restarted mid-run. While it is down the API answers 503 with Retry-After (never 500);
//! afterwards every process reconnects by itself and every accepted job completes.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::client::ApiClient;
use crate::harness::load::Load;
use crate::harness::{World, WorldOptions};

const JOBS: usize = 80;
const OUTAGE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_means_503_while_down_and_nothing_lost_after() {
    let mut world = World::new(
        "redis-restart",
        WorldOptions {
            private_redis: true,
            ..Default::default()
        },
    )
    .await;
    let api = world.spawn("api", "api", &[]).await;
    let _worker = world.spawn("worker", "worker", &["--consumers", "2"]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let client = ApiClient::new(api.base_url());
    let run = crate::run_id();

    let load = Load::start(
        &client,
        &format!("redis-{run}"),
        JOBS,
        Duration::from_secs(7),
        10,
    );
    // Real time on purpose: Redis dies while the load is in full flow.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let redis = world.redis.as_mut().expect("private redis");
    redis.kill9();

    // Probe with fresh keys while Redis is down: each must be a 503 with Retry-After.
    let mut probes = Vec::new();
    let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
    let down_until = tokio::time::Instant::now() + OUTAGE;
    while tokio::time::Instant::now() < down_until {
        let key = format!("probe-{run}-{:03}", probes.len());
        let (status, retry_after, body) = client
            .post_once(&key, &ApiClient::body(&key))
            .await
            .expect("the API answers while Redis is down");
        *answers.entry(status).or_default() += 1;
        assert_eq!(status, 503, "POST while Redis is down: {body}");
        assert!(retry_after.is_some(), "503 without Retry-After");
        assert_eq!(body["status"], 503, "problem+json body: {body}");
        probes.push(key);
        // Probes spread over the whole outage, as clients' requests would be.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    redis.restart().await;

    // The refused probes were not stored: the client's retry with the same key is a new job.
    let mut accepted = Vec::new();
    for key in &probes {
        accepted.push(client.submit(key, key).await);
    }
    accepted.extend(load.finish().await);
    let report = world.assert_exactly_once(&accepted, &client).await;
    println!(
        "redis restart: {} probes during the {OUTAGE:?} outage answered {answers:?}; {report}",
        probes.len()
    );
}
