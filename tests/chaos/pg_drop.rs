//! Postgres sessions of every process are terminated mid-run
//! (`pg_terminate_backend`); the pools must reconnect by themselves and lose no job.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::load::Load;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions, db};

const JOBS: usize = 120;
const TERMINATIONS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_postgres_sessions_are_replaced_and_no_job_is_lost() {
    let world = World::new(
        "pg-drop",
        WorldOptions {
            model: ModelBehavior {
                latency_ms: 20..60,
                ..ModelBehavior::fast()
            },
            ..Default::default()
        },
    )
    .await;
    let deployment = world.spawn_split(2, 2).await;
    let client = &deployment.client;

    let load = Load::start(
        client,
        &format!("pg-{}", crate::run_id()),
        JOBS,
        Duration::from_secs(8),
        10,
    );
    let mut terminated = Vec::new();
    let mut gets: BTreeMap<u16, usize> = BTreeMap::new();
    for _ in 0..TERMINATIONS {
        // Real time on purpose: each drop meets the load mid-flight, with the pools refilled
        // since the last one.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        terminated.push(db::terminate_sessions(&world.db_name).await);
        // Right after the drop, reads through the API's pool: 200 or 503, never 500.
        let pg = world.pg().await;
        let done: Vec<String> = pg
            .query("SELECT job_id::text FROM summaries LIMIT 3", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        for id in done {
            let (status, body) = client.get(&id).await;
            assert!(
                matches!(status, 200 | 503),
                "GET after a drop: {status} {body}"
            );
            *gets.entry(status).or_default() += 1;
        }
    }
    assert!(
        terminated.iter().sum::<usize>() >= TERMINATIONS,
        "the service's sessions were terminated: {terminated:?}"
    );
    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, client).await;
    println!(
        "pg drop: sessions terminated per round {terminated:?}; GETs right after: {gets:?}; {report}"
    );
}
