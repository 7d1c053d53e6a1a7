//! The chaos harness: one isolated world per test (its own Postgres database, Redis key
//! prefix or private Redis, fake model API, mail sink, webhook receiver and log directory),
//! real `summaryd` processes started in it, and the exactly-once check every test ends with.

pub mod client;
pub mod db;
pub mod latencies;
pub mod load;
pub mod mail_sink;
pub mod model_server;
pub mod process;
pub mod redis_server;
pub mod webhook_sink;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use summaryd::infra::keys::{GROUP, RedisKeys, Shards};

use client::{Accepted, ApiClient};
use mail_sink::{MailBehavior, MailSink};
use model_server::{ModelBehavior, ModelServer, summary_for};
use process::Proc;
use redis_server::RedisServer;
use webhook_sink::{WebhookBehavior, WebhookSink};

use crate::shared::cleanup;
pub use crate::shared::http_stub::free_port;
use crate::shared::redis_cluster::RedisCluster;
use crate::shared::servers::PgCluster;
use crate::shared::standard_webhooks;
use crate::shared::test_env::{FreshNames, pg_base_url, pg_connect, redis_url};
pub use crate::shared::{eventually, eventually_every};

/// After the last fault, everything accepted must be summarised and mailed within this
/// long; the slowest path is a job held by a killed worker (claim idle) whose email is
/// held by a killed relay (lease), plus the workers' Redis error backoff (≤ 10 s).
const QUIESCENCE: Duration = Duration::from_secs(90);

pub struct WorldOptions {
    pub model: ModelBehavior,
    pub mail: MailBehavior,
    pub webhook: WebhookBehavior,
    /// Run a private, restartable `redis-server` instead of using the shared one.
    pub private_redis: bool,
    /// Run a private Postgres the test can stop and start instead of using the shared one.
    pub private_postgres: bool,
    /// Extra or overriding `SUMMARYD_*` settings for every process of this world.
    pub env: Vec<(&'static str, String)>,
    /// The Redis the harness itself inspects, when the processes reach it another way
    /// (e.g. they use its TLS port through `env`, the harness its plain port).
    pub harness_redis_url: Option<String>,
    /// Run a private Redis Cluster (three primaries with a replica each) and give the
    /// processes its `redis+cluster://` URL; the harness then inspects every shard of
    /// `SUMMARYD_STREAM_SHARDS` through a cluster connection.
    pub cluster: bool,
}

impl Default for WorldOptions {
    fn default() -> Self {
        Self {
            model: ModelBehavior::fast(),
            mail: MailBehavior::ok(),
            webhook: WebhookBehavior::ok(),
            private_redis: false,
            private_postgres: false,
            env: Vec::new(),
            harness_redis_url: None,
            cluster: false,
        }
    }
}

impl WorldOptions {
    /// Token mode: every process authenticates clients with the tokens file at `path`.
    pub fn tokens_file(path: &std::path::Path) -> Self {
        Self {
            env: vec![("SUMMARYD_AUTH_TOKENS_FILE", path.display().to_string())],
            ..Default::default()
        }
    }
}

pub struct World {
    pub name: String,
    pub db_name: String,
    pub database_url: String,
    pub redis_url: String,
    pub key_prefix: String,
    pub dir: PathBuf,
    pub model: ModelServer,
    pub mail: MailSink,
    /// Where jobs that ask for a webhook ([`ApiClient::with_webhook`]) send it; the
    /// processes sign with its secret (header mode).
    pub webhooks: WebhookSink,
    pub redis: Option<RedisServer>,
    pub postgres: Option<PgCluster>,
    env: Vec<(String, String)>,
    /// The private cluster of a world built with [`WorldOptions::cluster`].
    pub cluster: Option<RedisCluster>,
    /// The key layout the processes use, so the inspections look at every shard.
    shards: Shards,
}

impl World {
    /// Build the world and migrate its database with `summaryd migrate` (the one process
    /// that migrates; every `serve` runs with `--no-migrate`).
    pub async fn new(name: &str, options: WorldOptions) -> World {
        let FreshNames {
            id,
            db_name,
            key_prefix,
        } = FreshNames::new("chaos");
        let dir = std::env::temp_dir().join(format!("summaryd-chaos-{name}-{id}"));
        std::fs::create_dir_all(&dir).expect("test dir");
        let redis = if options.private_redis {
            Some(RedisServer::start(&dir).await)
        } else {
            None
        };
        let cluster = options.cluster.then(RedisCluster::start);
        let redis_url = match (&options.harness_redis_url, &cluster) {
            (Some(url), _) => url.clone(),
            (None, Some(cluster)) => cluster.url(),
            (None, None) => redis.as_ref().map_or_else(redis_url, RedisServer::url),
        };
        let postgres = options
            .private_postgres
            .then(|| PgCluster::start_plain(&dir));
        let database_url = match &postgres {
            Some(pg) => pg.plain_url(&db_name),
            None => format!("{}/{db_name}", pg_base_url()),
        };
        let model = ModelServer::start(options.model).await;
        let mail = MailSink::start(options.mail).await;
        let webhooks = WebhookSink::start(options.webhook, &dir.join("webhook-secrets")).await;
        let mut env: BTreeMap<String, String> = [
            ("SUMMARYD_DATABASE_URL", database_url.clone()),
            ("SUMMARYD_REDIS_URL", redis_url.clone()),
            ("SUMMARYD_KEY_PREFIX", key_prefix.clone()),
            ("SUMMARYD_LOG_FORMAT", "json".into()),
            ("SUMMARYD_LLM_PROVIDER", "openai".into()),
            ("SUMMARYD_LLM_BASE_URL", model.base_url()),
            ("SUMMARYD_LLM_API_KEY", "sk-chaos".into()),
            // Short everything: the faults, not the waits, are what the tests are about.
            ("SUMMARYD_LLM_CALL_TIMEOUT_MS", "5000".into()),
            ("SUMMARYD_LLM_BACKOFF_MS", "20".into()),
            ("SUMMARYD_LLM_MAX_BACKOFF_MS", "200".into()),
            ("SUMMARYD_MAIL_PROVIDER", "http".into()),
            ("SUMMARYD_MAIL_HTTP_URL", mail.url()),
            ("SUMMARYD_MAIL_TIMEOUT_MS", "1000".into()),
            // Under the relay lease, as the configuration requires of every send's cap.
            ("SUMMARYD_WEBHOOK_TIMEOUT_MS", "1000".into()),
            // The sink listens on loopback, in plain http.
            ("SUMMARYD_WEBHOOK_ALLOW_HTTP", "1".into()),
            ("SUMMARYD_WEBHOOK_ALLOW_PRIVATE", "1".into()),
            (
                "SUMMARYD_WEBHOOK_SECRETS_FILE",
                webhooks.secrets_file().display().to_string(),
            ),
            // How soon a killed worker's entries are taken over (live ones extend their claim).
            ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "2000".into()),
            ("SUMMARYD_WORKER_BLOCK_MS", "200".into()),
            ("SUMMARYD_RELAY_POLL_MS", "50".into()),
            ("SUMMARYD_RELAY_LEASE_MS", "3000".into()),
            ("SUMMARYD_RELAY_BACKOFF_MS", "20".into()),
            ("SUMMARYD_RELAY_MAX_BACKOFF_MS", "300".into()),
            // A marker stranded by an outage blocks its key (409) this long.
            ("SUMMARYD_IDEMPOTENCY_LOCK_TTL_S", "5".into()),
            ("SUMMARYD_SHUTDOWN_GRACE_MS", "5000".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (k, v) in options.env {
            env.insert(k.to_owned(), v);
        }
        let shard_count = env
            .get("SUMMARYD_STREAM_SHARDS")
            .map_or(1, |n| n.parse().expect("SUMMARYD_STREAM_SHARDS"));
        let shards = Shards::new(&key_prefix, shard_count, cluster.is_some());
        let world = World {
            name: name.to_owned(),
            db_name,
            database_url,
            redis_url,
            key_prefix,
            dir,
            model,
            mail,
            webhooks,
            redis,
            postgres,
            env: env.into_iter().collect(),
            cluster,
            shards,
        };
        let out = process::run_to_completion(&["migrate"], &world.env);
        assert!(
            out.status.success(),
            "summaryd migrate failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        world
    }

    /// Start `summaryd serve --roles <roles> --no-migrate` in this world on a port of its
    /// choosing (read back from its "summaryd started" log line).
    pub async fn spawn(&self, name: &str, roles: &str, extra_args: &[&str]) -> Proc {
        self.spawn_on(name, roles, "127.0.0.1:0", extra_args).await
    }

    /// The split deployment the outage tests run: one api, `workers` worker processes of
    /// `consumers` consumers each, one relay, and a client of the api. The processes live
    /// as long as the returned value.
    pub async fn spawn_split(&self, workers: usize, consumers: usize) -> Split {
        let api = self.spawn("api", "api", &[]).await;
        let consumers = consumers.to_string();
        let mut worker_procs = Vec::with_capacity(workers);
        for i in 1..=workers {
            let name = format!("worker-{i}");
            worker_procs.push(
                self.spawn(&name, "worker", &["--consumers", &consumers])
                    .await,
            );
        }
        let relay = self.spawn("relay", "relay", &[]).await;
        let client = ApiClient::new(api.base_url());
        Split {
            workers: worker_procs,
            client,
            _api: api,
            _relay: relay,
        }
    }

    /// The same on a fixed address, for a process restarted where its clients expect it.
    pub async fn spawn_on(
        &self,
        name: &str,
        roles: &str,
        listen: &str,
        extra_args: &[&str],
    ) -> Proc {
        Proc::start(name, roles, listen, extra_args, &self.env, &self.dir).await
    }

    /// Set (or replace) one variable for the processes started from now on.
    pub fn set_env(&mut self, key: &str, value: String) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value));
    }

    /// This world's environment without the variables named in `unset`, for a one-off
    /// process ([`Self::spawn_with_env`]).
    pub fn env_without(&self, unset: &[&str]) -> Vec<(String, String)> {
        self.env
            .iter()
            .filter(|(k, _)| !unset.contains(&k.as_str()))
            .cloned()
            .collect()
    }

    /// [`Self::spawn`] with exactly `env` instead of the world's.
    pub async fn spawn_with_env(&self, name: &str, roles: &str, env: &[(String, String)]) -> Proc {
        Proc::start(name, roles, "127.0.0.1:0", &[], env, &self.dir).await
    }

    /// This world's environment with `overrides` applied, for a one-off process.
    pub fn env_with(&self, overrides: &[(&str, String)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
            .cloned()
            .collect();
        env.extend(overrides.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        env
    }

    pub async fn pg(&self) -> tokio_postgres::Client {
        pg_connect(&self.database_url).await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.pg()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    pub async fn redis_conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis_url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect redis")
    }

    /// A connection the inspections below query every shard through: a cluster
    /// connection in a cluster world, else one to the world's Redis.
    async fn inspect(&self) -> Inspect {
        match &self.cluster {
            Some(cluster) => {
                let nodes: Vec<String> = cluster
                    .ports()
                    .iter()
                    .map(|p| cluster.node_url(*p))
                    .collect();
                let conn = redis::cluster::ClusterClient::new(nodes)
                    .expect("cluster client")
                    .get_async_connection()
                    .await
                    .expect("connect cluster");
                Inspect::Cluster(Box::new(conn))
            }
            None => Inspect::Single(self.redis_conn().await),
        }
    }

    /// The keys of every shard the processes use (one, unsharded, unless the world sets
    /// `SUMMARYD_STREAM_SHARDS` or runs a cluster).
    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    /// Entries delivered to some consumer and not acknowledged, over every shard (0 for a
    /// shard whose group is missing).
    pub async fn stream_pending(&self) -> u64 {
        let mut conn = self.inspect().await;
        let mut pending = 0;
        for keys in self.shards.all() {
            let reply: redis::RedisResult<redis::streams::StreamPendingReply> =
                redis::cmd("XPENDING")
                    .arg(keys.stream())
                    .arg(GROUP)
                    .query_async(&mut conn)
                    .await;
            pending += reply.map_or(0, |r| r.count() as u64);
        }
        pending
    }

    /// Every job queued or pending: each shard's job stream's entries, then each of its
    /// tenants' lanes' (an api-only world's jobs all wait in lanes; nothing dispatches them).
    pub async fn queued_entries(&self) -> Vec<redis::streams::StreamId> {
        let mut conn = self.inspect().await;
        let mut entries = Vec::new();
        for keys in self.shards.all() {
            entries.extend(queued_in(&mut conn, keys).await);
        }
        entries
    }

    /// Jobs queued: entries on the job streams and in the tenants' lanes.
    pub async fn stream_length(&self) -> u64 {
        // An accepted job waits in its tenant's lane until a worker dispatches it.
        self.queued_entries().await.len() as u64
    }

    /// The delivery count of every pending entry, oldest first (per shard, shard by shard).
    pub async fn delivery_counts(&self) -> Vec<u64> {
        let mut conn = self.inspect().await;
        let mut counts = Vec::new();
        for keys in self.shards.all() {
            let reply: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
                .arg(keys.stream())
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(100)
                .query_async(&mut conn)
                .await
                .expect("XPENDING");
            counts.extend(reply.ids.iter().map(|p| p.times_delivered as u64));
        }
        counts
    }

    pub async fn dead_letters(&self) -> u64 {
        let mut conn = self.inspect().await;
        let mut n = 0;
        for keys in self.shards.all() {
            let len: u64 = redis::cmd("XLEN")
                .arg(keys.dead_letters())
                .query_async(&mut conn)
                .await
                .expect("XLEN");
            n += len;
        }
        n
    }

    /// Each dead letter's job id and reason, for a failure message that says why.
    pub async fn dead_letter_reasons(&self) -> Vec<String> {
        let mut conn = self.inspect().await;
        let mut reasons = Vec::new();
        for keys in self.shards.all() {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(keys.dead_letters())
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .expect("XRANGE dead letters");
            reasons.extend(reply.ids.iter().map(|e| {
                let field = |name: &str| {
                    e.get::<String>(name)
                        .unwrap_or_else(|| format!("<no {name}>"))
                };
                format!("{}: {}", field("job_id"), field("reason"))
            }));
        }
        reasons
    }

    /// Everything the quiescence check looks at, in one line for logs.
    async fn progress(&self) -> Progress {
        Progress {
            summaries: self.count("SELECT count(*) FROM summaries").await,
            outbox: self.count("SELECT count(*) FROM outbox").await,
            sent: self
                .count("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")
                .await,
            sink_distinct: self.mail.distinct_keys(),
            webhooks_distinct: self.webhooks.distinct_accepted(),
            pending: self.stream_pending().await,
        }
    }

    /// Wait until every accepted job is summarised, mailed (and its webhook, when it asked
    /// for one, accepted) and acknowledged, then check the exactly-once effects exactly.
    /// Returns the numbers for the test's report.
    pub async fn assert_exactly_once(&self, accepted: &[Accepted], client: &ApiClient) -> Report {
        self.assert_exactly_once_but(accepted, &[], client).await
    }

    /// [`Self::assert_exactly_once`] for `accepted`, while the jobs of `poisoned` (accepted
    /// too, kept apart) are dead-lettered, each once, and reported `failed` (and their
    /// `summary.failed` webhook, when they asked for one, accepted).
    pub async fn assert_exactly_once_but(
        &self,
        accepted: &[Accepted],
        poisoned: &[Accepted],
        client: &ApiClient,
    ) -> Report {
        // Same key → same job id, always (replays included).
        let mut by_key: BTreeMap<&str, &str> = BTreeMap::new();
        for a in accepted {
            let first = by_key.entry(&a.key).or_insert(&a.job_id);
            assert_eq!(*first, a.job_id, "key {} got two job ids", a.key);
        }
        let job_ids: BTreeSet<String> = by_key.values().map(|s| (*s).to_owned()).collect();
        assert_eq!(job_ids.len(), by_key.len(), "two keys share a job id");
        let n = job_ids.len();
        // The webhook-id each webhook must come under, and the job (with its key) it is of.
        let mut webhooks: BTreeMap<String, (&str, &str, &str)> = BTreeMap::new();
        for (list, event) in [
            (accepted, "summary_completed"),
            (poisoned, "summary_failed"),
        ] {
            for a in list.iter().filter(|a| a.webhook) {
                webhooks.insert(webhook_id(&a.job_id, event), (&a.job_id, &a.key, event));
            }
        }
        let w = webhooks.len();
        let rows = n + w;

        // Every 200 ms, not eventually's 20: each look opens three Postgres connections,
        // and the processes under test share the machine's two cores.
        let quiescent = eventually_every(QUIESCENCE, Duration::from_millis(200), || async {
            let p = self.progress().await;
            assert!(
                p.summaries as usize <= n
                    && p.outbox as usize <= rows
                    && p.sink_distinct <= n
                    && p.webhooks_distinct <= w,
                "more effects than accepted jobs ({n}, {w} webhooks): {p:?}"
            );
            p.summaries as usize == n
                && p.outbox as usize == rows
                && p.sent as usize == rows
                && p.sink_distinct == n
                && p.webhooks_distinct == w
                && p.pending == 0
        })
        .await;
        assert!(
            quiescent,
            "[{}] not quiescent within {QUIESCENCE:?}: accepted {n} ({w} webhooks), {:?}, dead letters {:?}",
            self.name,
            self.progress().await,
            self.dead_letter_reasons().await
        );

        let pg = self.pg().await;
        let summary_ids: BTreeSet<String> = pg
            .query("SELECT job_id::text FROM summaries", &[])
            .await
            .expect("summaries")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(summary_ids, job_ids, "summaries rows = accepted job ids");
        let expected_keys: BTreeSet<String> = job_ids
            .iter()
            .map(|id| format!("summary_ready:{id}"))
            .collect();
        let outbox_keys: BTreeSet<String> = pg
            .query("SELECT dedupe_key FROM outbox", &[])
            .await
            .expect("outbox")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let expected_rows: BTreeSet<String> = expected_keys
            .iter()
            .chain(webhooks.keys())
            .cloned()
            .collect();
        assert_eq!(
            outbox_keys, expected_rows,
            "one outbox row per job, and one per webhook event"
        );
        let webhook_report = self.assert_webhooks_once(&webhooks).await;

        let by_sink_key = self.mail.by_key();
        let sink_keys: BTreeSet<String> = by_sink_key.keys().cloned().collect();
        assert_eq!(
            sink_keys, expected_keys,
            "distinct Idempotency-Keys at the sink = accepted job ids"
        );
        let key_of_job: BTreeMap<&str, &str> = by_key.iter().map(|(k, j)| (*j, *k)).collect();
        for (key, bodies) in &by_sink_key {
            // A resend must be the same email under the same key, never a different one.
            assert!(
                bodies.windows(2).all(|w| w[0] == w[1]),
                "sends under {key} differ: {bodies:?}"
            );
            let job_id = key.trim_start_matches("summary_ready:");
            let text = bodies[0]["text"].as_str().unwrap_or_default();
            let marker = key_of_job[job_id];
            assert!(
                text.contains(job_id) && text.contains(&summary_for(marker)),
                "email for {job_id} does not carry its own summary: {text}"
            );
        }
        assert_eq!(
            self.dead_letters().await,
            poisoned.len() as u64,
            "nothing dead-lettered but the poisoned jobs"
        );
        for poison in poisoned {
            let (status, body) = get_with_patience(client, &poison.job_id).await;
            assert_eq!(status, 200, "GET {}: {body}", poison.job_id);
            assert_eq!(body["status"], "failed", "GET {}: {body}", poison.job_id);
        }

        for id in &job_ids {
            let (status, body) = get_with_patience(client, id).await;
            assert_eq!(status, 200, "GET {id}: {body}");
            assert_eq!(body["status"], "done", "GET {id}: {body}");
        }

        Report {
            jobs: n,
            posts: accepted.iter().map(|a| a.attempts).sum(),
            sends: self.mail.sent().len(),
            distinct_sends: by_sink_key.len(),
            rejected_sends: self.mail.rejected(),
            model_calls: self.model.total_calls(),
            client_outcomes: client.outcomes(),
            webhooks: webhook_report,
        }
    }

    /// The webhook half of the exactly-once check, once every expected event was accepted:
    /// each webhook-id of `expected` (to its job id, Idempotency-Key and event) accepted,
    /// a resend only ever under the same id with the same body, no request under any other
    /// id, each body the job's own event, and every request (failed ones too) verified by
    /// the Standard Webhooks reference library against the world's secret.
    async fn assert_webhooks_once(
        &self,
        expected: &BTreeMap<String, (&str, &str, &str)>,
    ) -> WebhookReport {
        let received = self.webhooks.received();
        for r in &received {
            let id = r.webhook_id().unwrap_or_default();
            assert!(
                expected.contains_key(id),
                "a webhook under {id:?}, which is no accepted job's event (status {:?})",
                r.status
            );
        }
        let by_id = self.webhooks.accepted_by_id();
        assert_eq!(
            by_id.keys().collect::<BTreeSet<_>>(),
            expected.keys().collect::<BTreeSet<_>>(),
            "accepted webhook-ids = the accepted jobs' events"
        );
        for (id, bodies) in &by_id {
            assert!(
                bodies.windows(2).all(|w| w[0] == w[1]),
                "webhooks under {id} differ: {bodies:?}"
            );
            let (job_id, key, event) = expected[id];
            let body = &bodies[0];
            assert_eq!(body["type"], event.replace('_', "."), "{id}: {body}");
            assert_eq!(body["data"]["job_id"], job_id, "{id}: {body}");
            if event == "summary_completed" {
                assert_eq!(body["data"]["status"], "done", "{id}: {body}");
                let summary = body["data"]["summary"].as_str().unwrap_or_default();
                assert!(
                    summary.contains(&summary_for(key)),
                    "{id} does not carry its job's summary: {body}"
                );
            } else {
                assert_eq!(body["data"]["status"], "failed", "{id}: {body}");
            }
        }
        if !received.is_empty() {
            let requests: Vec<_> = received.iter().map(|r| r.request.clone()).collect();
            standard_webhooks::verify_all(self.webhooks.secret(), &requests).await;
        }
        WebhookReport {
            requests: received.len(),
            accepted: received.iter().filter(|r| r.accepted()).count(),
            distinct: by_id.len(),
            rejected: self.webhooks.rejected(),
        }
    }
}

/// One shard's job stream entries, then its tenants' lanes' entries.
async fn queued_in(conn: &mut Inspect, keys: &RedisKeys) -> Vec<redis::streams::StreamId> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(keys.stream())
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    let mut entries = reply.ids;
    let tenants: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.lanes())
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("ZRANGE");
    for tenant in tenants {
        let lane: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(keys.lane(&tenant))
            .arg("-")
            .arg("+")
            .query_async(conn)
            .await
            .expect("XRANGE");
        entries.extend(lane.ids);
    }
    entries
}

/// The harness's own connection for inspecting Redis: one server, or a cluster (which
/// routes each command by its key's slot).
enum Inspect {
    Single(redis::aio::MultiplexedConnection),
    Cluster(Box<redis::cluster_async::ClusterConnection>),
}

impl redis::aio::ConnectionLike for Inspect {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Inspect::Single(c) => c.req_packed_command(cmd),
            Inspect::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Inspect::Single(c) => c.req_packed_commands(cmd, offset, count),
            Inspect::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The webhook-id of a job's event (`summary_completed`, `summary_failed`):
/// `msg_<job uuid, 32 hex digits>_<event>`.
pub fn webhook_id(job_id: &str, event: &str) -> String {
    let uuid = uuid::Uuid::parse_str(job_id).unwrap_or_else(|e| panic!("job id {job_id}: {e}"));
    format!("msg_{}_{event}", uuid.simple())
}

/// GET retried briefly on 503 / transport errors (a pool reconnecting after a fault), spaced
/// as a client would space them.
async fn get_with_patience(client: &ApiClient, job_id: &str) -> (u16, serde_json::Value) {
    let last = std::cell::RefCell::new((0, serde_json::Value::Null));
    eventually_every(
        Duration::from_secs(5),
        Duration::from_millis(200),
        || async {
            let got = client.get(job_id).await;
            let answered = !matches!(got.0, 0 | 503);
            *last.borrow_mut() = got;
            answered
        },
    )
    .await;
    last.into_inner()
}

#[derive(Debug)]
struct Progress {
    summaries: i64,
    outbox: i64,
    sent: i64,
    sink_distinct: usize,
    webhooks_distinct: usize,
    pending: u64,
}

/// The numbers a test prints (run with `--nocapture` to see them).
#[derive(Debug)]
pub struct Report {
    pub jobs: usize,
    /// POSTs the client made for them (retries and deliberate replays included).
    pub posts: usize,
    /// Accepted sends at the mail sink, resends included.
    pub sends: usize,
    pub distinct_sends: usize,
    /// Sends the sink refused with an injected 503.
    pub rejected_sends: usize,
    /// Every call the model received (parts and combinations of long texts included).
    pub model_calls: usize,
    pub client_outcomes: BTreeMap<String, usize>,
    pub webhooks: WebhookReport,
}

/// What the webhook sink saw.
#[derive(Debug, Default)]
pub struct WebhookReport {
    /// Every request, resends and refused ones included.
    pub requests: usize,
    /// Requests answered 2xx.
    pub accepted: usize,
    /// Distinct webhook-ids answered 2xx.
    pub distinct: usize,
    /// Requests refused with an injected 503.
    pub rejected: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "jobs {} | posts {} | sends {} vs distinct {} (injected 503s {}) | model calls {} | client answers {:?}",
            self.jobs,
            self.posts,
            self.sends,
            self.distinct_sends,
            self.rejected_sends,
            self.model_calls,
            self.client_outcomes
        )?;
        let w = &self.webhooks;
        if w.requests > 0 {
            write!(
                f,
                " | webhooks: requests {}, accepted {} vs distinct {} (injected 503s {})",
                w.requests, w.accepted, w.distinct, w.rejected
            )?;
        }
        Ok(())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Processes are dropped (killed) before the world: tests declare the world first.
        if let Some(redis) = self.redis.as_mut() {
            redis.kill9();
        } else if self.cluster.is_some() {
            // The cluster is stopped with the world; its keys go with it.
        } else {
            cleanup::delete_redis_prefix_blocking(self.redis_url.clone(), self.key_prefix.clone());
        }
        // A private Postgres is stopped (and its cluster removed) before the directory goes.
        if let Some(pg) = self.postgres.take() {
            drop(pg);
        } else {
            cleanup::drop_database_blocking(pg_base_url(), self.db_name.clone());
        }
        if std::thread::panicking() {
            eprintln!("[{}] logs kept in {}", self.name, self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What [`World::spawn_split`] started.
pub struct Split {
    pub workers: Vec<Proc>,
    pub client: ApiClient,
    // Held so the api and the relay run as long as the workers.
    _api: Proc,
    _relay: Proc,
}
