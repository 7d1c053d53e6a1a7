//! Beyond the design's test list, because the guarantees (docs/reference.md) say "kill -9 of
//! any process": the API process is SIGKILLed mid-burst (possibly between claiming a key,
//! enqueueing and storing the answer) and restarted on the same port; clients retry with
//! the same key.

use std::time::Duration;

use crate::harness::client::ApiClient;
use crate::harness::load::Load;
use crate::harness::{World, WorldOptions, free_port};

const JOBS: usize = 120;
const KILLS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_api_loses_no_accepted_job_and_retries_get_the_same_job_id() {
    let world = World::new("kill-api", WorldOptions::default()).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let mut api = world.spawn_on("api", "api", &listen, &[]).await;
    let _worker = world.spawn("worker", "worker", &["--consumers", "2"]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let client = ApiClient::new(api.base_url());

    let load = Load::start(
        &client,
        &format!("api-{}", crate::run_id()),
        JOBS,
        Duration::from_secs(6),
        10,
    );
    for _ in 0..KILLS {
        // Real time on purpose: each kill -9 lands mid-burst, at an instant the process
        // does not choose.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        api.kill9();
        api = world.spawn_on("api", "api", &listen, &[]).await;
    }
    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    println!("kill -9 api: {KILLS} kills; {report}");
}
