//! The providers' shared state in a real Redis (`llm/shared.rs`): the limiter takes a
//! request slot and a call's tokens together or not at all and says how long to wait; a
//! 429's cool-until only ever moves later; the fleet's probe and the open breaker's record
//! belong to whoever took them first. Two `ProviderShare`s of one label stand for two
//! processes.

use std::time::Duration;

use redis::AsyncCommands;
use summaryd::infra::keys::RedisKeys;
use summaryd::llm::OpenRecord;
use summaryd::llm::{Admission, Limits, ProbeLease, ProviderShare, SharedLimits, WaitReason};

use crate::shared::test_env::{FreshNames, redis_url};

struct Fleet {
    keys: RedisKeys,
    shared: SharedLimits,
    conn: redis::aio::MultiplexedConnection,
}

async fn fleet() -> Fleet {
    let prefix = FreshNames::new("limits").key_prefix;
    let pool = deadpool_redis::Config::from_url(redis_url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let keys = RedisKeys::new(prefix);
    let conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    Fleet {
        shared: SharedLimits::new(pool.into(), keys.clone()),
        keys,
        conn,
    }
}

impl Fleet {
    fn process(&self, label: &str, rpm: Option<u32>, tpm: Option<u32>) -> ProviderShare {
        self.shared.provider(label, Limits::new(rpm, tpm))
    }

    async fn field(&mut self, key: &str, field: &str) -> Option<String> {
        self.conn.hget(key, field).await.unwrap()
    }
}

fn waits(admission: Admission) -> (WaitReason, Duration) {
    match admission {
        Admission::Wait { after, reason } => (reason, after),
        Admission::Go => panic!("admitted"),
    }
}

#[tokio::test]
async fn the_limiter_admits_a_burst_then_makes_every_process_wait_for_its_slot() {
    let fleet = fleet().await;
    // 60 a minute: a burst of 6, then one a second, whichever process asks.
    let (a, b) = (
        fleet.process("openai:m", Some(60), None),
        fleet.process("openai:m", Some(60), None),
    );
    for i in 0..6 {
        let process = if i % 2 == 0 { &a } else { &b };
        assert_eq!(process.admit(100).await.unwrap(), Admission::Go, "call {i}");
    }
    for process in [&a, &b] {
        let (reason, after) = waits(process.admit(100).await.unwrap());
        assert_eq!(reason, WaitReason::Requests);
        assert!(
            after > Duration::ZERO && after <= Duration::from_secs(1),
            "the next slot is within one interval: {after:?}"
        );
    }
    // Another provider has its own limiter.
    let other = fleet.process("openai:other", Some(60), None);
    assert_eq!(other.admit(100).await.unwrap(), Admission::Go);
}

#[tokio::test]
async fn a_call_takes_its_request_slot_and_its_tokens_together_or_neither() {
    let mut fleet = fleet().await;
    let key = fleet.keys.llm_limit("openai:m");
    // Plenty of requests, 1,000 tokens a minute.
    let p = fleet.process("openai:m", Some(600), Some(1_000));
    assert_eq!(p.admit(900).await.unwrap(), Admission::Go);
    let requests = fleet.field(&key, "req").await;
    let tokens = fleet.field(&key, "tok").await;
    assert!(requests.is_some() && tokens.is_some());
    let (reason, after) = waits(p.admit(900).await.unwrap());
    assert_eq!(reason, WaitReason::Tokens);
    assert!(
        after > Duration::from_secs(40),
        "{after:?}: 800 tokens at 1,000/min"
    );
    assert_eq!(
        fleet.field(&key, "req").await,
        requests,
        "a call refused for its tokens took no request slot"
    );
    assert_eq!(fleet.field(&key, "tok").await, tokens);
    // A call larger than the whole minute is charged the minute, and fits an empty bucket.
    let big = fleet.process("openai:big", None, Some(1_000));
    assert_eq!(big.admit(50_000).await.unwrap(), Admission::Go);
}

#[tokio::test]
async fn a_retry_after_holds_every_process_and_the_cool_until_only_moves_later() {
    let mut fleet = fleet().await;
    let key = fleet.keys.llm_cool_until("openai:m");
    let (a, b) = (
        fleet.process("openai:m", None, None),
        fleet.process("openai:m", None, None),
    );
    assert_eq!(b.admit(1).await.unwrap(), Admission::Go);
    a.cool_for(Duration::from_secs(5)).await.unwrap();
    let (reason, after) = waits(b.admit(1).await.unwrap());
    assert_eq!(reason, WaitReason::Cool);
    assert!(
        after > Duration::from_secs(4) && after <= Duration::from_secs(5),
        "{after:?}"
    );
    let until: u64 = fleet.conn.get(&key).await.unwrap();
    b.cool_for(Duration::from_secs(1)).await.unwrap();
    let kept: u64 = fleet.conn.get(&key).await.unwrap();
    assert_eq!(kept, until, "a shorter wait never moves it earlier");
    b.cool_for(Duration::from_secs(10)).await.unwrap();
    let later: u64 = fleet.conn.get(&key).await.unwrap();
    assert!(later >= until + 4_000, "{later} vs {until}");
}

#[tokio::test]
async fn the_first_opener_and_the_first_prober_win_and_a_passed_probe_clears_both() {
    let mut fleet = fleet().await;
    let (a, b) = (
        fleet.process("openai:m", None, None),
        fleet.process("openai:m", None, None),
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let record = |reason: &str| OpenRecord {
        since_ms: now_ms,
        probe_at_ms: now_ms + 30_000,
        probes_failed: 0,
        reason: reason.into(),
    };
    let ttl = Duration::from_secs(60);
    a.publish_open(&record("503 in a"), true, ttl)
        .await
        .unwrap();
    b.publish_open(&record("503 in b"), true, ttl)
        .await
        .unwrap();
    assert_eq!(b.read_open().await.unwrap(), Some(record("503 in a")));
    // The cooldown holds the fleet's probe: nobody probes before it is over.
    let held = b.take_probe(Duration::from_secs(5)).await.unwrap();
    assert!(
        matches!(held, ProbeLease::Held(left) if left > Duration::from_secs(25)),
        "{held:?}"
    );
    a.clear_open().await.unwrap();
    assert_eq!(b.read_open().await.unwrap(), None);
    let probe_key = fleet.keys.llm_probe("openai:m");
    let exists: bool = fleet.conn.exists(&probe_key).await.unwrap();
    assert!(!exists);
    assert_eq!(
        a.take_probe(Duration::from_secs(5)).await.unwrap(),
        ProbeLease::Won
    );
    assert!(matches!(
        b.take_probe(Duration::from_secs(5)).await.unwrap(),
        ProbeLease::Held(_)
    ));
    // A failed probe's new schedule replaces the old one.
    a.publish_open(&record("probe failed"), false, ttl)
        .await
        .unwrap();
    assert_eq!(b.read_open().await.unwrap(), Some(record("probe failed")));
}

/// A chain of one provider called `openai:m`, answered by `llm`, sharing through `fleet`.
fn chain(
    fleet: &Fleet,
    rpm: Option<u32>,
    llm: std::sync::Arc<crate::shared::fakes::FakeLlm>,
) -> summaryd::llm::ModelChain {
    let mut settings = summaryd::config::Settings::default().llm;
    settings.provider = summaryd::config::LlmProvider::Openai;
    settings.model = "m".into();
    settings.rpm = rpm;
    summaryd::llm::ModelChain::single(&settings, llm, None).shared(&fleet.shared)
}

/// A call that waits for the provider's cool-until is sent once it is over, even when the
/// wait is longer than the whole budget it was given: waiting is no attempt and spends none
/// of the delivery's time.
#[tokio::test]
async fn a_call_waits_out_the_fleets_cool_until_without_spending_its_budget() {
    let fleet = fleet().await;
    let llm = std::sync::Arc::new(crate::shared::fakes::FakeLlm::ok());
    let chain = chain(&fleet, None, llm.clone());
    // Another process met a 429 asking for 3 s.
    fleet
        .process("openai:m", None, None)
        .cool_for(Duration::from_secs(3))
        .await
        .unwrap();
    let budget = summaryd::llm::retry::Deadline::after(Duration::from_millis(1_500));
    let summary = chain.summarise("a text", budget).await;
    assert!(summary.is_ok(), "{summary:?}");
    assert_eq!(llm.calls(), 1);
}

/// With Redis gone, a provider with limits is not called (the attempt fails as transient);
/// one without limits is, since only the cool-until was to be read.
#[tokio::test]
async fn without_redis_a_limited_provider_is_not_called_and_an_unlimited_one_is() {
    let port = crate::shared::http_stub::free_port();
    let pool = deadpool_redis::Config::from_url(format!("redis://127.0.0.1:{port}"))
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let gone = Fleet {
        shared: SharedLimits::new(pool.into(), RedisKeys::new("gone:")),
        ..fleet().await
    };
    let deadline = || summaryd::llm::retry::Deadline::after(Duration::from_secs(10));
    let llm = std::sync::Arc::new(crate::shared::fakes::FakeLlm::ok());
    let limited = chain(&gone, Some(60), llm.clone());
    let err = limited.summarise("a text", deadline()).await.unwrap_err();
    assert!(
        matches!(
            err,
            summaryd::llm::ChainError::Transient(summaryd::llm::retry::RetryError::Limiter(_))
        ),
        "{err:?}"
    );
    assert_eq!(llm.calls(), 0, "no call sent without asking the limiter");
    let unlimited = chain(&gone, None, llm.clone());
    assert!(unlimited.summarise("a text", deadline()).await.is_ok());
    assert_eq!(llm.calls(), 1);
}
