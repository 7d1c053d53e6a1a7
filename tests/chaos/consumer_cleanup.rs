//! Consumer cleanup on a quiet system: two worker processes idle for ten cleanup periods
//! after a burst of jobs; one is kill -9'd. The live one's consumers are never removed
//! (their idle time grows past `SUMMARYD_WORKER_CONSUMER_GC_MS` all the same: on Redis 7.0
//! an empty read does not reset it), and the killed one's are.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::streams::StreamInfoConsumersReply;
use summaryd::infra::keys::{GROUP, RedisKeys};

use crate::harness::client::ApiClient;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions};

const GC_MS: u64 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_keeps_a_quiet_live_workers_consumers_and_removes_a_killed_ones() {
    let world = World::new(
        "consumer-gc",
        WorldOptions {
            model: ModelBehavior::slow(200),
            env: vec![("SUMMARYD_WORKER_CONSUMER_GC_MS", GC_MS.to_string())],
            ..Default::default()
        },
    )
    .await;
    let api = world.spawn("api", "api", &[]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let mut killed = world
        .spawn("worker-killed", "worker", &["--consumers", "2"])
        .await;
    let live = world
        .spawn("worker-live", "worker", &["--consumers", "2"])
        .await;
    let client = ApiClient::new(api.base_url());
    let run = crate::run_id();
    let mut accepted = Vec::new();
    for i in 0..12 {
        let key = format!("gc-{run}-{i:03}");
        accepted.push(client.submit(&key, &key).await);
    }
    let report = world.assert_exactly_once(&accepted, &client).await;

    let keys = RedisKeys::new(world.key_prefix.clone());
    let mut redis = world.redis_conn().await;
    let consumers = |pid: u32, info: &StreamInfoConsumersReply| -> Vec<(String, u64)> {
        info.consumers
            .iter()
            .filter(|c| {
                c.name.ends_with(&format!("-{pid}-0")) || c.name.ends_with(&format!("-{pid}-1"))
            })
            .map(|c| (c.name.clone(), c.idle as u64))
            .collect()
    };
    let info: StreamInfoConsumersReply = redis.xinfo_consumers(keys.stream(), GROUP).await.unwrap();
    let live_names: Vec<String> = consumers(live.pid(), &info)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let killed_pid = killed.pid();
    assert!(
        !live_names.is_empty() && !consumers(killed_pid, &info).is_empty(),
        "both workers took jobs: {:?}",
        info.consumers.iter().map(|c| &c.name).collect::<Vec<_>>()
    );

    killed.kill9();
    let mut killed_gone_after = None;
    let mut max_live_idle = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(GC_MS * 10) {
        let info: StreamInfoConsumersReply =
            redis.xinfo_consumers(keys.stream(), GROUP).await.unwrap();
        let present = consumers(live.pid(), &info);
        for name in &live_names {
            let idle = present.iter().find(|(n, _)| n == name).map(|(_, i)| *i);
            let idle = idle.unwrap_or_else(|| {
                panic!("live consumer {name} removed after {:?}", started.elapsed())
            });
            max_live_idle = max_live_idle.max(idle);
        }
        if killed_gone_after.is_none() && consumers(killed_pid, &info).is_empty() {
            killed_gone_after = Some(started.elapsed());
        }
        // A real window, sampled: the live consumers' idle time (Redis's clock; nothing
        // fabricates it) must pass GC_MS while nothing removes them.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        max_live_idle > GC_MS,
        "the live consumers looked idle ({max_live_idle} ms): idle time alone would remove them"
    );
    let gone = killed_gone_after.expect("the killed worker's consumers were removed");
    println!(
        "consumer cleanup: killed worker's consumers removed {gone:?} after kill -9; live ones \
         kept at up to {max_live_idle} ms idle; {report}"
    );
}
