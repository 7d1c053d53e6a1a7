//! Slow heads after the first request: sockets that send one complete request, read the
//! answer, then trickle the next head a byte at a time, faster than any timer between bytes
//! but never finishing it. Against a real API process with a small connection cap, twice as
//! many of them as the cap must not keep ordinary clients out: each is closed within the
//! request deadline of its last answer (or earlier, to make room for a newcomer).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::latencies::Latencies;
use crate::harness::{World, WorldOptions};
use crate::shared::http_request::read_response;

/// `SUMMARYD_API_MAX_CONNECTIONS` of the process under attack.
const CAP: usize = 8;
/// Attacking sockets open at once: twice the cap.
const ATTACKERS: usize = 2 * CAP;
/// `SUMMARYD_API_REQUEST_TIMEOUT_MS` of the process under attack.
const DEADLINE: Duration = Duration::from_millis(2_000);
/// An attacker's pace: well inside the deadline, so only the per-head deadline (not a gap
/// between bytes) can end its connection.
const TRICKLE: Duration = Duration::from_millis(500);
/// How long the attack lasts; ordinary clients run inside it.
const ATTACK: Duration = Duration::from_secs(9);
/// What is allowed between an attacker's last answer and its connection's end.
const CLOSE_SLACK: Duration = Duration::from_secs(1);
/// Ordinary requests: every one succeeds, the 99th percentile within this.
const P99_GOAL: Duration = Duration::from_millis(50);
/// How long the ordinary clients run alone first, for the yardstick.
const BASELINE: Duration = Duration::from_secs(2);

/// How one attacking connection ended.
#[derive(Debug)]
struct Attack {
    /// From the answer to its first request until the server closed the connection;
    /// `None` when it was still open when the attacker gave up.
    held: Option<Duration>,
    /// The status the server answered the slow head with before closing, if any.
    answer: Option<u16>,
}

/// One attacking connection: a complete first request, its answer, then the next head a
/// byte per [`TRICKLE`] until the server closes the connection.
async fn attack_once(port: u16, running: &AtomicBool) -> Option<Attack> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    // A probe anyone may send: no authentication is needed to hold a connection.
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .ok()?;
    // The first request may be refused at the cap (closed unanswered): not an attack yet.
    read_response(&mut conn).await?;
    let answered = Instant::now();
    let (mut rd, mut wr) = conn.into_split();
    let trickle = async move {
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if wr.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(TRICKLE).await;
        }
    };
    let until_closed = async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let held = answered.elapsed();
        let answer = std::str::from_utf8(got.get(9..12).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse().ok());
        (held, answer)
    };
    let ended = tokio::select! {
        ended = until_closed => Some(ended),
        () = trickle => None,
        // Held as long as the server lets it while the attack lasts; after that, given
        // well past the deadline before it counts as still open.
        () = async {
            while running.load(Ordering::SeqCst) || answered.elapsed() < DEADLINE + CLOSE_SLACK * 3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } => None,
    };
    Some(match ended {
        Some((held, answer)) => Attack {
            held: Some(held),
            answer,
        },
        None => Attack {
            held: None,
            answer: None,
        },
    })
}

/// An attacker that reconnects (at its trickle pace) for as long as the attack lasts.
async fn attacker(port: u16, running: Arc<AtomicBool>) -> Vec<Attack> {
    let mut attacks = Vec::new();
    while running.load(Ordering::SeqCst) {
        if let Some(a) = attack_once(port, &running).await {
            attacks.push(a);
        }
        tokio::time::sleep(TRICKLE).await;
    }
    attacks
}

/// One ordinary request on a new connection: `(status, latency, job id of a 202)`.
async fn ordinary(
    http: &reqwest::Client,
    base: &str,
    lane: usize,
    i: usize,
) -> (u16, Duration, Option<String>) {
    let t = Instant::now();
    let res = if i.is_multiple_of(2) {
        http.get(format!("{base}/healthz")).send().await
    } else {
        http.post(format!("{base}/v1/summaries"))
            .header("X-Tenant-Id", "acme")
            .header(
                "Idempotency-Key",
                format!("slow-heads-{}-{lane}-{i:06}", crate::run_id()),
            )
            .json(&serde_json::json!({
                "text": "Q3 call notes: renewal agreed, pricing to follow next week.",
                "notify": "am@example.com"
            }))
            .send()
            .await
    };
    let Ok(res) = res else {
        return (0, t.elapsed(), None);
    };
    let status = res.status().as_u16();
    let body: serde_json::Value = res.json().await.unwrap_or_default();
    let elapsed = t.elapsed();
    let job_id = body["job_id"].as_str().map(str::to_owned);
    (status, elapsed, job_id)
}

/// Four ordinary clients at an ordinary client's pace until `until`: status, time taken,
/// and the job id of each request.
async fn ordinary_lanes(
    http: &reqwest::Client,
    base: &str,
    until: Instant,
) -> Vec<(u16, Duration, Option<String>)> {
    let lanes: Vec<_> = (0..4)
        .map(|lane| {
            let (http, base) = (http.clone(), base.to_owned());
            tokio::spawn(async move {
                let mut results = Vec::new();
                let mut i = 0;
                while Instant::now() < until {
                    results.push(ordinary(&http, &base, lane, i).await);
                    i += 1;
                    // An ordinary client's pace, not a flood of its own.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                results
            })
        })
        .collect();
    let mut results = Vec::new();
    for lane in lanes {
        results.extend(lane.await.unwrap());
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_second_heads_from_twice_the_cap_neither_hold_connections_nor_block_ordinary_requests()
{
    let world = World::new(
        "slow-heads",
        WorldOptions {
            env: vec![
                ("SUMMARYD_API_MAX_CONNECTIONS", CAP.to_string()),
                (
                    "SUMMARYD_API_REQUEST_TIMEOUT_MS",
                    DEADLINE.as_millis().to_string(),
                ),
            ],
            ..Default::default()
        },
    )
    .await;
    let api = world.spawn("api", "api", &[]).await;
    // Ordinary clients: a new connection per request (no pooling), so each must get a slot.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // The same clients without an attack first: what this machine, as loaded right now,
    // makes of them is the yardstick the attack's figures are held to.
    let baseline = ordinary_lanes(&http, &api.base_url(), Instant::now() + BASELINE).await;
    let running = Arc::new(AtomicBool::new(true));
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|_| tokio::spawn(attacker(api.port, running.clone())))
        .collect();
    // Let the attackers take every slot before ordinary clients arrive.
    tokio::time::sleep(Duration::from_millis(1_000)).await;

    let ordinary_until = Instant::now() + ATTACK - Duration::from_secs(2);
    let results = ordinary_lanes(&http, &api.base_url(), ordinary_until).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.store(false, Ordering::SeqCst);
    let mut attacks = Vec::new();
    for a in attackers {
        attacks.extend(a.await.unwrap());
    }

    let calm_p99 = Latencies::new(baseline.iter().map(|(_, d, _)| *d)).quantile(0.99);
    // The goal is a p99 under 50 ms; on a machine busy with other work (CI runs tests side
    // by side) the same requests without any attack can take longer than that, and the
    // attack must not add more than the machine's own noise.
    let p99_bound = P99_GOAL.max(calm_p99 * 3);
    let failed: Vec<_> = results
        .iter()
        .filter(|(s, _, _)| !matches!(s, 200 | 202))
        .map(|(s, d, _)| (*s, *d))
        .collect();
    let latencies = Latencies::new(results.iter().map(|(_, d, _)| *d));
    let p = |q: f64| latencies.quantile(q);
    let mut held: Vec<Duration> = attacks.iter().filter_map(|a| a.held).collect();
    held.sort();
    let still_open = attacks.iter().filter(|a| a.held.is_none()).count();
    let answered_408 = attacks.iter().filter(|a| a.answer == Some(408)).count();
    let longest_hold = held.last().copied().unwrap_or_default();
    println!(
        "slow heads: cap {CAP}, {ATTACKERS} attackers, deadline {DEADLINE:?}; attacking \
         connections {} (408 {answered_408}, closed unanswered {}, still open {still_open}), \
         held after their answer p50 {:?} max {longest_hold:?}; ordinary requests {} ok / {} \
         (p50 {:?}, p99 {:?}, max {:?}); without the attack p99 {calm_p99:?}",
        attacks.len(),
        held.len() - answered_408,
        held.get(held.len() / 2).copied().unwrap_or_default(),
        results.len() - failed.len(),
        results.len(),
        p(0.50),
        p(0.99),
        latencies.max(),
    );

    assert!(failed.is_empty(), "ordinary requests failed: {failed:?}");
    assert!(
        results.len() >= 40,
        "too few ordinary requests ran: {}",
        results.len()
    );
    assert!(
        baseline.iter().all(|(s, _, _)| matches!(s, 200 | 202)),
        "ordinary requests without an attack failed"
    );
    assert!(
        p(0.99) <= p99_bound,
        "ordinary p99 {:?} over {p99_bound:?} (without the attack: {calm_p99:?})",
        p(0.99)
    );
    assert!(
        attacks.len() >= ATTACKERS,
        "every attacker held a connection at least once: {}",
        attacks.len()
    );
    assert!(
        still_open == 0 && longest_hold <= DEADLINE + CLOSE_SLACK,
        "every attacking connection closed within {:?} of its answer: {still_open} still open, \
         longest {longest_hold:?}",
        DEADLINE + CLOSE_SLACK
    );

    // The effect: every accepted ordinary job is on the stream, and nothing else is.
    let accepted: std::collections::BTreeSet<String> = results
        .iter()
        .chain(&baseline)
        .filter_map(|(_, _, j)| j.clone())
        .collect();
    assert!(!accepted.is_empty(), "some ordinary jobs were posted");
    let entries = world.queued_entries().await;
    let on_stream: std::collections::BTreeSet<String> = entries
        .iter()
        .filter_map(|e| e.get::<String>("job_id"))
        .collect();
    assert_eq!(
        on_stream, accepted,
        "the stream holds exactly the accepted jobs"
    );
    drop(api);
}
