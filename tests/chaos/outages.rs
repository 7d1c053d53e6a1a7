//! Outage phases: a private Postgres stopped for several claim-idle periods while jobs keep
//! arriving, and the mail provider answering 503 to everything for longer than ten relay
//! backoffs. Neither outage may dead-letter a job, park an outbox row, or cost a second
//! summary or email; once it ends, everything finishes (`docs/delivery.md`).

use std::time::{Duration, Instant};

use crate::harness::client::ApiClient;
use crate::harness::load::Load;
use crate::harness::process::run_to_completion;
use crate::harness::{World, WorldOptions, eventually_every};

const JOBS: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_of_several_claim_idle_periods_dead_letters_nothing() {
    let world = World::new(
        "pg-outage",
        WorldOptions {
            private_postgres: true,
            env: vec![
                // Two deliveries and a short claim-idle: an outage that spent deliveries
                // would dead-letter every job it met within a few seconds.
                ("SUMMARYD_WORKER_MAX_DELIVERIES", "2".into()),
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "1000".into()),
            ],
            ..Default::default()
        },
    )
    .await;
    let deployment = world.spawn_split(2, 2).await;
    let client = &deployment.client;

    let load = Load::start(
        client,
        &format!("pgo-{}", crate::run_id()),
        JOBS,
        Duration::from_secs(8),
        10,
    );
    // Real time on purpose, here and below: the processes run on their own clocks, and the
    // outage must meet jobs mid-flight. (tests/it/outages.rs proves the same with
    // fabricated idleness.)
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let pg = world.postgres.as_ref().expect("private postgres");
    pg.stop();
    // Six claim-idle periods; POSTs keep being accepted (they need only Redis).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        world.dead_letters().await,
        0,
        "nothing dead-lettered during the outage"
    );
    pg.start();
    let back = Instant::now();

    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, client).await;
    let recovery = back.elapsed();
    assert_eq!(report.jobs, JOBS);
    assert_eq!(report.distinct_sends, JOBS);
    assert!(
        report.model_calls >= JOBS,
        "every job was summarised: {report}"
    );
    println!("postgres outage: 6 s down; all done {recovery:?} after it returned; {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_outage_longer_than_ten_backoffs_parks_no_row_and_sends_each_email_once() {
    let world = World::new("mail-outage", WorldOptions::default()).await;
    let api = world.spawn("api", "api", &[]).await;
    let _worker = world.spawn("worker", "worker", &["--consumers", "2"]).await;
    let _relay = world.spawn("relay", "relay", &["--relays", "2"]).await;
    let client = ApiClient::new(api.base_url());

    world.mail.set_down(true);
    let load = Load::start(
        &client,
        &format!("mailo-{}", crate::run_id()),
        JOBS,
        Duration::from_secs(3),
        10,
    );
    // Relay backoff 20 ms doubling to 300 ms: ten backoffs take about 2 s. The outage lasts
    // until every job's row has been refused and rows have failed more than ten times.
    let outage = Instant::now();
    let refused = || world.count("SELECT count(*) FROM outbox WHERE attempts > 0");
    let past_ten = || world.count("SELECT count(*) FROM outbox WHERE attempts > 10");
    assert!(
        eventually_every(
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async { refused().await == JOBS as i64 && past_ten().await > 0 }
        )
        .await,
        "every row refused, and rows failed more than ten times during the outage: {} refused, \
         {} past ten",
        refused().await,
        past_ten().await
    );
    let past_ten = past_ten().await;
    assert_eq!(
        world
            .count("SELECT count(*) FROM outbox WHERE failed_at IS NOT NULL OR sent_at IS NOT NULL")
            .await,
        0,
        "no row parked, none sent while the provider was down"
    );
    let stuck = run_to_completion(&["outbox", "stuck", "--json"], &world.env_with(&[]));
    assert!(stuck.status.success());
    assert!(
        stuck.stdout.is_empty(),
        "outbox stuck lists nothing: {}",
        String::from_utf8_lossy(&stuck.stdout)
    );
    world.mail.set_down(false);
    let outage_lasted = outage.elapsed();

    let accepted = load.finish().await;
    let report = world.assert_exactly_once(&accepted, &client).await;
    assert_eq!(report.jobs, JOBS);
    assert_eq!(report.distinct_sends, JOBS);
    assert!(report.rejected_sends >= JOBS, "{report}");
    println!(
        "mail outage: {:?} of 503s, {past_ten} rows past ten attempts; {report}",
        outage_lasted
    );
}
