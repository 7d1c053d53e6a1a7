//! SIGTERM a worker mid-job.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::client::ApiClient;
use crate::harness::model_server::ModelBehavior;
use crate::harness::{World, WorldOptions, eventually};

/// The worker's drain grace in these tests.
const GRACE_MS: u64 = 3_000;
/// Exit must come within the grace plus process teardown; generous for a loaded CI box.
const EXIT_SLACK: Duration = Duration::from_secs(3);

fn options(model: ModelBehavior) -> WorldOptions {
    WorldOptions {
        model,
        env: vec![
            ("SUMMARYD_SHUTDOWN_GRACE_MS", GRACE_MS.to_string()),
            ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "3000".into()),
        ],
        ..Default::default()
    }
}

/// A job in hand finishes within the grace period; no new job is read after the signal;
/// the process exits 0 and a new worker does the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_jobs_in_hand_stops_reading_and_exits_0() {
    let world = World::new("sigterm-finish", options(ModelBehavior::slow(1_500))).await;
    let api = world.spawn("api", "api", &[]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let mut worker = world.spawn("worker", "worker", &["--consumers", "2"]).await;
    let client = ApiClient::new(api.base_url());

    let run = crate::run_id();
    let mut accepted = Vec::new();
    for i in 0..5 {
        let key = format!("term-{run}-{i:03}");
        accepted.push(client.submit(&key, &key).await);
    }
    assert!(
        eventually(Duration::from_secs(15), || async {
            world.model.in_flight() == 2
        })
        .await,
        "the worker never held two jobs"
    );
    let in_hand: BTreeSet<String> = world.model.calls().keys().cloned().collect();
    assert_eq!(in_hand.len(), 2);

    let signalled = Instant::now();
    worker.sigterm();
    let status = worker
        .wait_exit(Duration::from_millis(GRACE_MS) + EXIT_SLACK)
        .await
        .expect("worker exits within the grace period after SIGTERM");
    assert!(status.success(), "exit status {status}");
    println!(
        "worker exited {status} {:?} after SIGTERM",
        signalled.elapsed()
    );

    // The two jobs in hand were finished before exit (committed and acknowledged), and no
    // new job was taken after the signal.
    let pg = world.pg().await;
    let done: BTreeSet<String> = pg
        .query("SELECT job_id::text FROM summaries", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let in_hand_ids: BTreeSet<String> = accepted
        .iter()
        .filter(|a| in_hand.contains(&a.key))
        .map(|a| a.job_id.clone())
        .collect();
    assert_eq!(done, in_hand_ids, "exactly the jobs in hand were finished");
    assert_eq!(world.model.calls().len(), 2, "no job started after SIGTERM");
    assert_eq!(world.stream_pending().await, 0, "nothing left pending");

    let _next = world
        .spawn("worker-2", "worker", &["--consumers", "2"])
        .await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    assert_eq!(report.model_calls, 5, "each job paid for once");
    println!("SIGTERM (finish in hand): {report}");
}

/// A job that cannot finish within the grace period (the model hangs) is cut short just
/// before it ends and refunded, not lost: the process still exits 0 on time, the entry stays
/// pending with its delivery not counted, and another worker reclaims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_hung_model_exits_0_on_time_and_the_job_is_reclaimed() {
    let hang = ModelBehavior {
        hang: true,
        ..ModelBehavior::fast()
    };
    let mut opts = options(hang);
    // Longer than the grace period, so only the drain deadline can end the call.
    opts.env
        .push(("SUMMARYD_LLM_CALL_TIMEOUT_MS", "20000".into()));
    let world = World::new("sigterm-hang", opts).await;
    let api = world.spawn("api", "api", &[]).await;
    let _relay = world.spawn("relay", "relay", &[]).await;
    let mut worker = world.spawn("worker", "worker", &["--consumers", "1"]).await;
    let client = ApiClient::new(api.base_url());

    let key = format!("hang-{}-000", crate::run_id());
    let accepted = vec![client.submit(&key, &key).await];
    assert!(
        eventually(Duration::from_secs(15), || async {
            world.model.total_calls() == 1
        })
        .await,
        "the worker never called the model"
    );

    let signalled = Instant::now();
    worker.sigterm();
    let status = worker
        .wait_exit(Duration::from_millis(GRACE_MS) + EXIT_SLACK)
        .await
        .expect("worker exits within the grace period even with a hung call");
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took >= Duration::from_millis(GRACE_MS) - Duration::from_secs(1),
        "it waited for the job in hand before giving up ({took:?})"
    );
    assert_eq!(world.count("SELECT count(*) FROM summaries").await, 0);
    assert_eq!(
        world.stream_pending().await,
        1,
        "the abandoned job is still pending"
    );
    assert_eq!(
        world.delivery_counts().await,
        vec![0],
        "the delivery shutdown cut short does not count"
    );

    world.model.set_behavior(ModelBehavior::fast());
    let _next = world
        .spawn("worker-2", "worker", &["--consumers", "1"])
        .await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    assert_eq!(
        report.model_calls, 2,
        "the hung call, then the reclaimed one"
    );
    println!("SIGTERM (hung model): exited after {took:?}; {report}");
}
