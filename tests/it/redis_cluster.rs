//! The Redis connection layer against a real local Redis Cluster (three masters, one replica
//! each): what the crate's pooled and shared connections do with the command shapes the
//! service uses (transactions, scripts, blocking reads, SCAN, WAIT), each checked on the
//! node that owns the keys; the startup durability report per master; and the failover
//! helpers other tests rely on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use summaryd::app::{Application, Handles};
use summaryd::config::roles::{Role, Roles};
use summaryd::config::{FlagOverrides, Settings};
use summaryd::infra::redis::routed::{scan_every_master, scan_keys, wait_replicas};

use crate::shared::certs::TestCa;
use crate::shared::log_capture::Captured;
use crate::shared::redis_cluster::RedisCluster;
use crate::shared::{FakeLlm, FakeMailer, TestEnv};

fn handles(cluster: &RedisCluster, block: Duration) -> Handles {
    let mut settings = Settings {
        redis_url: cluster.url().into(),
        ..Settings::default()
    };
    settings.worker.block = block;
    Handles::new(settings).expect("handles for a cluster URL")
}

async fn get_on(cluster: &RedisCluster, port: u16, key: &str) -> Option<String> {
    let mut node = cluster.node(port).await;
    // READONLY lets a replica answer for the slots of its master.
    let _: () = redis::cmd("READONLY")
        .query_async(&mut node)
        .await
        .expect("READONLY");
    node.get(key).await.expect("GET on the node")
}

#[tokio::test]
async fn atomic_pipelines_under_one_hash_tag_run_on_the_owning_master() {
    let cluster = RedisCluster::start();
    let h = handles(&cluster, Duration::from_secs(1));
    let key_a = "{job:1}a";
    let key_b = "{job:1}b";

    let mut pooled = h.redis.get().await.expect("pooled cluster connection");
    assert!(pooled.is_cluster());
    let (set, incr): (String, i64) = redis::pipe()
        .atomic()
        .set(key_a, "x")
        .incr(key_b, 5)
        .query_async(&mut pooled)
        .await
        .expect("MULTI/EXEC under one hash tag");
    assert_eq!((set.as_str(), incr), ("OK", 5));

    let mut shared = h
        .redis_shared
        .get()
        .await
        .expect("shared cluster connection");
    let (incr,): (i64,) = redis::pipe()
        .atomic()
        .incr(key_b, 1)
        .query_async(&mut shared)
        .await
        .expect("MULTI/EXEC on the shared connection");
    assert_eq!(incr, 6);

    let master = cluster.master_of_key(key_a).await;
    assert_eq!(get_on(&cluster, master, key_a).await.as_deref(), Some("x"));
    assert_eq!(get_on(&cluster, master, key_b).await.as_deref(), Some("6"));

    // Keys of different slots cannot share a transaction: refused, and nothing written.
    let cross: redis::RedisResult<()> = redis::pipe()
        .atomic()
        .set("{one}k", 1)
        .set("{two}k", 2)
        .query_async(&mut pooled)
        .await;
    assert!(cross.is_err(), "a cross-slot transaction must fail");
    let master_one = cluster.master_of_key("{one}k").await;
    let master_two = cluster.master_of_key("{two}k").await;
    assert_eq!(get_on(&cluster, master_one, "{one}k").await, None);
    assert_eq!(get_on(&cluster, master_two, "{two}k").await, None);
}

#[tokio::test]
async fn scripts_are_loaded_on_the_owning_master_after_noscript() {
    let cluster = RedisCluster::start();
    let h = handles(&cluster, Duration::from_secs(1));
    for port in cluster.ports() {
        let mut node = cluster.node(port).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node)
            .await
            .expect("SCRIPT FLUSH");
    }
    let script = redis::Script::new(
        "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])",
    );
    for (i, conn) in [
        h.redis.get().await.expect("pooled"),
        h.redis_shared.get().await.expect("shared"),
    ]
    .iter_mut()
    .enumerate()
    {
        let n: i64 = script
            .key("{s}value")
            .key("{s}count")
            .arg(format!("v{i}"))
            .invoke_async(conn)
            .await
            .expect("EVALSHA, SCRIPT LOAD on NOSCRIPT, EVALSHA");
        assert_eq!(n, i as i64 + 1);
    }
    let master = cluster.master_of_key("{s}value").await;
    assert_eq!(
        get_on(&cluster, master, "{s}value").await.as_deref(),
        Some("v1")
    );
    assert_eq!(
        get_on(&cluster, master, "{s}count").await.as_deref(),
        Some("2")
    );
}

#[tokio::test]
async fn a_blocked_read_holds_up_no_other_pooled_connection_and_ends_at_its_timeout() {
    let cluster = RedisCluster::start();
    // The pool's response timeout is block + margin, so a 2 s BLOCK is answered, not cut.
    let h = handles(&cluster, Duration::from_secs(2));
    let stream = "{q}stream";
    let list = "{q}list";
    let mut setup = h.redis.get().await.expect("pooled");
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("g")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut setup)
        .await
        .expect("XGROUP CREATE");
    drop(setup);

    let pool = h.redis.clone();
    let blocked_stream = tokio::spawn(async move {
        let mut conn = pool.get().await.expect("pooled");
        let started = Instant::now();
        let reply: Option<StreamReadReply> = conn
            .xread_options(
                &[stream],
                &[">"],
                &StreamReadOptions::default()
                    .group("g", "c1")
                    .block(2000)
                    .count(1),
            )
            .await
            .expect("XREADGROUP BLOCK");
        (reply.map(|r| r.keys.len()).unwrap_or(0), started.elapsed())
    });
    let pool = h.redis.clone();
    let blocked_list = tokio::spawn(async move {
        let mut conn = pool.get().await.expect("pooled");
        let started = Instant::now();
        let popped: Option<(String, String)> = conn.blpop(list, 1.5).await.expect("BLPOP");
        (popped, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Both readers are blocked on the masters owning their keys (the same master, one hash
    // tag); other pooled and shared connections are answered at once meanwhile.
    let started = Instant::now();
    let mut other = h.redis.get().await.expect("pooled");
    let _: () = other.set("{q}other", 1).await.expect("SET");
    let mut shared = h.redis_shared.get().await.expect("shared");
    let _: i64 = shared.incr("{q}other", 1).await.expect("INCR");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "commands waited {:?} behind blocked readers",
        started.elapsed()
    );

    let (entries, waited) = blocked_stream.await.expect("join");
    assert_eq!(entries, 0);
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(4),
        "XREADGROUP BLOCK 2000 returned after {waited:?}"
    );
    let (popped, waited) = blocked_list.await.expect("join");
    assert_eq!(popped, None);
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(4),
        "BLPOP 1.5 returned after {waited:?}"
    );

    // A blocked BLPOP is woken by a push from another connection.
    let pool = h.redis.clone();
    let woken = tokio::spawn(async move {
        let mut conn = pool.get().await.expect("pooled");
        let popped: Option<(String, String)> = conn.blpop(list, 5.0).await.expect("BLPOP");
        popped
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: i64 = other.rpush(list, "job").await.expect("RPUSH");
    assert_eq!(
        woken.await.expect("join"),
        Some((list.to_owned(), "job".to_owned()))
    );
}

#[tokio::test]
async fn wait_counts_the_replica_of_the_keys_master_and_the_write_is_on_it() {
    let cluster = RedisCluster::start();
    let h = handles(&cluster, Duration::from_secs(1));
    let key = "{acked}job";
    for mut conn in [
        h.redis.get().await.expect("pooled"),
        h.redis_shared.get().await.expect("shared"),
    ] {
        let _: () = conn.set(key, "accepted").await.expect("SET");
        let acked = wait_replicas(&mut conn, key, 1, Duration::from_secs(2))
            .await
            .expect("WAIT");
        assert_eq!(acked, 1, "each master has one replica");
    }
    let master = cluster.master_of_key(key).await;
    let replicas = cluster.replicas_of(master).await;
    assert_eq!(replicas.len(), 1);
    assert_eq!(
        get_on(&cluster, replicas[0], key).await.as_deref(),
        Some("accepted"),
        "WAIT said the replica had it"
    );

    // Asking for more replicas than exist ends at the timeout with the count that acked.
    let mut conn = h.redis.get().await.expect("pooled");
    let _: () = conn.set(key, "again").await.expect("SET");
    let started = Instant::now();
    let acked = wait_replicas(&mut conn, key, 2, Duration::from_millis(200))
        .await
        .expect("WAIT");
    assert_eq!(acked, 1);
    assert!(started.elapsed() >= Duration::from_millis(190));
}

#[tokio::test]
async fn scan_keys_lists_every_key_of_a_hash_tag_from_its_master() {
    let cluster = RedisCluster::start();
    let h = handles(&cluster, Duration::from_secs(1));
    let mut conn = h.redis.get().await.expect("pooled");
    for i in 0..60 {
        let _: () = conn.set(format!("{{scan}}k{i}"), i).await.expect("SET");
        // Keys of other slots (other masters, mostly) must not appear.
        let _: () = conn.set(format!("{{other{i}}}k"), i).await.expect("SET");
    }
    let mut keys = scan_keys(&mut conn, "{scan}", "{scan}k*", 7)
        .await
        .expect("SCAN");
    keys.sort();
    keys.dedup();
    let mut expected: Vec<String> = (0..60).map(|i| format!("{{scan}}k{i}")).collect();
    expected.sort();
    assert_eq!(keys, expected);

    // Keys under many hash tags, spread over every master, are found by scanning each.
    let mut everywhere = scan_every_master(&mut conn, "{other*}k", Some("string"), 5)
        .await
        .expect("SCAN on every master");
    everywhere.sort();
    everywhere.dedup();
    let mut expected: Vec<String> = (0..60).map(|i| format!("{{other{i}}}k")).collect();
    expected.sort();
    assert_eq!(everywhere, expected);
    let none = scan_every_master(&mut conn, "{other*}k", Some("set"), 5)
        .await
        .expect("SCAN TYPE set");
    assert!(none.is_empty(), "{none:?}");

    let mut shared = h.redis_shared.get().await.expect("shared");
    let keys = scan_keys(&mut shared, "{scan}", "{scan}k1*", 100)
        .await
        .expect("SCAN");
    assert_eq!(keys.len(), 11, "{keys:?}"); // k1, k10..k19
}

#[tokio::test]
async fn startup_reports_each_masters_durability_settings() {
    let env = TestEnv::new().await;
    let cluster = RedisCluster::start();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut settings = env.settings.clone();
    settings.redis_url = cluster.url().into();
    let _app = Application::build(
        settings,
        Roles::of(&[Role::Api]),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
        false,
    )
    .await
    .expect("an API on a cluster starts");
    let text = logs.text();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("redis_setting=\"appendonly\""))
        .collect();
    assert_eq!(warned.len(), 3, "one warning per master:\n{text}");
    let masters: Vec<u16> = cluster
        .nodes()
        .await
        .into_iter()
        .filter(|n| n.master)
        .map(|n| n.port)
        .collect();
    for port in masters {
        assert_eq!(
            warned
                .iter()
                .filter(|l| l.contains(&format!("redis_node=\"127.0.0.1:{port}\"")))
                .count(),
            1,
            "master {port}:\n{text}"
        );
    }
}

#[tokio::test]
async fn after_a_failover_the_pool_writes_to_the_promoted_replica() {
    let cluster = RedisCluster::start();
    let h = handles(&cluster, Duration::from_secs(1));
    let key = "{failover}job";
    let mut conn = h.redis.get().await.expect("pooled");
    let _: () = conn.set(key, "before").await.expect("SET");
    let acked = wait_replicas(&mut conn, key, 1, Duration::from_secs(2))
        .await
        .expect("WAIT");
    assert_eq!(acked, 1);
    drop(conn);

    let old = cluster.master_of_key(key).await;
    let new = cluster.fail_over(old).await;
    assert_ne!(new, old);
    assert_eq!(cluster.master_of_key(key).await, new);

    // The cluster connection refreshes its slot map and carries on, on the new master.
    let ok = crate::shared::eventually(Duration::from_secs(10), || async {
        let Ok(mut conn) = h.redis.get().await else {
            return false;
        };
        conn.set::<_, _, ()>(key, "after").await.is_ok()
    })
    .await;
    assert!(ok, "no write succeeded after the failover");
    assert_eq!(get_on(&cluster, new, key).await.as_deref(), Some("after"));

    // The killed node comes back as a replica of the new master. Its gossip takes a few
    // cluster-node timeouts, longer on a CI machine running other suites beside this one.
    cluster.restart_node(old).await;
    let rejoined = crate::shared::eventually(Duration::from_secs(45), || async {
        cluster.replicas_of(new).await.contains(&old)
    })
    .await;
    assert!(rejoined, "{old} did not rejoin as a replica of {new}");
}

#[tokio::test]
async fn a_tls_cluster_is_reached_with_the_ca_file_on_every_node() {
    let certs = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(certs.path(), "cluster");
    let cluster = RedisCluster::start_tls(&ca);
    assert!(cluster.url().starts_with("rediss+cluster://"));
    // The CA as an operator gives it: through the configuration file.
    let config = certs.path().join("summaryd.toml");
    std::fs::write(
        &config,
        format!(
            "redis_url = \"{}\"\n[redis]\nca_file = \"{}\"\n",
            cluster.url(),
            ca.ca_file.display()
        ),
    )
    .expect("write config");
    let settings =
        Settings::load(Some(&config), &FlagOverrides::default()).expect("load the settings");
    let h = Handles::new(settings).expect("handles");
    // Keys on each of the three masters, so every node is reached over TLS.
    let keys = ["{a}k", "{b}k", "{c}k", "{d}k", "{e}k", "{f}k"];
    let mut conn = h.redis.get().await.expect("pooled TLS cluster connection");
    let mut shared = h
        .redis_shared
        .get()
        .await
        .expect("shared TLS cluster connection");
    for key in keys {
        let _: () = conn.set(key, "tls").await.expect("SET over TLS");
        let got: String = shared.get(key).await.expect("GET over TLS");
        assert_eq!(got, "tls");
    }
    let mut masters: Vec<u16> = Vec::new();
    for key in keys {
        let master = cluster.master_of_key(key).await;
        assert_eq!(get_on(&cluster, master, key).await.as_deref(), Some("tls"));
        masters.push(master);
    }
    masters.sort();
    masters.dedup();
    assert!(
        masters.len() >= 2,
        "the keys should span masters: {masters:?}"
    );

    // Without the CA the nodes' certificates are not trusted: startup stops and says so.
    let env = TestEnv::new().await;
    let mut untrusted = env.settings.clone();
    untrusted.redis_url = cluster.url().into();
    let err = Application::build(
        untrusted,
        Roles::of(&[Role::Api]),
        Arc::new(FakeLlm::ok()),
        Arc::new(FakeMailer::new()),
        false,
    )
    .await
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("TLS to Redis"), "{err}");
}

#[tokio::test]
async fn the_routed_commands_work_unchanged_on_a_single_server() {
    let env = TestEnv::new().await;
    let h = Handles::new(env.settings.clone()).expect("handles");
    let prefix = env.settings.key_prefix.clone();
    let mut conn = h.redis.get().await.expect("pooled");
    assert!(!conn.is_cluster());
    for i in 0..25 {
        let _: () = conn
            .set(format!("{prefix}routed:{i}"), i)
            .await
            .expect("SET");
    }
    let pattern = format!("{prefix}routed:*");
    let mut keys = scan_keys(&mut conn, "ignored on one server", &pattern, 4)
        .await
        .expect("SCAN");
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 25);
    let mut all = scan_every_master(&mut conn, &pattern, Some("string"), 4)
        .await
        .expect("SCAN");
    all.sort();
    all.dedup();
    assert_eq!(all, keys);
    // The shared test server has no replica: WAIT answers 0 at its timeout.
    let mut shared = h.redis_shared.get().await.expect("shared");
    let acked = wait_replicas(&mut shared, &keys[0], 1, Duration::from_millis(20))
        .await
        .expect("WAIT");
    assert_eq!(acked, 0);
}
