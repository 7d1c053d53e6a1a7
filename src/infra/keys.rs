//! Every Redis key and name this service owns, in one place (`docs/reference.md`, Redis and
//! Postgres layout).

use crate::domain::{IdempotencyKey, JobId, TenantId};

/// Consumer group shared by all workers of one deployment.
pub const GROUP: &str = "summarizers";

/// Method and path that idempotency keys are scoped to.
const SUMMARIES_SCOPE: &str = "POST:/v1/summaries";

/// The key names of one shard (`SUMMARYD_STREAM_SHARDS`), and of the keys that belong to
/// no shard. A shard's keys all start with the deployment's prefix and the shard's hash
/// tag, so a Redis Cluster keeps every key one script or MULTI touches in one slot; with
/// one shard on a single node there is no tag, and the names are those of a deployment
/// that predates shards.
#[derive(Debug, Clone)]
pub struct RedisKeys {
    /// What this shard's keys start with: the prefix, then `{s<n>}` when tagged.
    prefix: String,
    /// The deployment's prefix alone, for keys of no shard (sessions, the pause, the model
    /// providers' shared state, consumers' liveness marks).
    global: String,
    shard: u16,
}

impl RedisKeys {
    /// The one untagged shard of a single-node deployment.
    pub fn new(prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        Self {
            global: prefix.clone(),
            prefix,
            shard: 0,
        }
    }

    fn tagged(prefix: &str, shard: u16) -> Self {
        Self {
            prefix: format!("{prefix}{{s{shard}}}"),
            global: prefix.to_owned(),
            shard,
        }
    }

    /// Which shard these keys are (0 on an unsharded deployment).
    pub fn shard(&self) -> u16 {
        self.shard
    }

    /// A console session, by the SHA-256 of its cookie value: a copy of Redis shows no
    /// usable session id. Expires after the idle timeout, renewed by each request.
    pub(crate) fn console_session(&self, id_sha256: &str) -> String {
        format!("{}console:session:{id_sha256}", self.global)
    }

    /// Failed console sign-ins of one user name or one client address in the current
    /// window (`console::signin`).
    pub(crate) fn console_signin_failures(&self, who: &str) -> String {
        format!("{}console:signin_failures:{who}", self.global)
    }

    pub fn stream(&self) -> String {
        join(&[&self.prefix, "jobs:summaries"])
    }

    pub fn dead_letters(&self) -> String {
        format!("{}jobs:summaries:dead", self.prefix)
    }

    /// A tenant's lane: a stream (no consumer group) of its accepted jobs waiting to be
    /// dispatched onto the job stream (`stream/lanes.rs`). Deleted when it empties.
    pub fn lane(&self, tenant: &str) -> String {
        join(&[&self.prefix, LANE, tenant])
    }

    /// What every lane's name starts with: the dispatch script builds a lane's name from the
    /// tenant it picks, so it gets this part as an argument.
    pub(crate) fn lane_prefix(&self) -> String {
        join(&[&self.prefix, LANE])
    }

    /// The active lanes: a sorted set of tenants whose lane holds jobs, scored by the
    /// virtual time their next job may start at. The scheduler reads only its lowest
    /// members, and the gauges walk it instead of scanning the keyspace for lanes.
    pub fn lanes(&self) -> String {
        join(&[&self.prefix, "jobs:summaries:lanes"])
    }

    /// The scheduler's virtual time (a number): the score a newly active lane starts at.
    pub fn lanes_clock(&self) -> String {
        join(&[&self.prefix, "jobs:summaries:lanes:clock"])
    }

    /// Each tenant's weight and max_concurrent as the last accepted job carried them (a hash,
    /// tenant → "weight max_concurrent"; tenants with the defaults have no field), so workers
    /// schedule without the tokens file.
    pub fn lane_policies(&self) -> String {
        join(&[&self.prefix, "jobs:summaries:lanes:policy"])
    }

    /// A short list of tokens, one pushed per job put in a lane (capped): idle consumers
    /// wait on it (BLPOP) instead of on the job stream, which only dispatch writes.
    pub fn doorbell(&self) -> String {
        join(&[&self.prefix, "jobs:summaries:doorbell"])
    }

    /// The job-stream entry ids of a tenant's jobs dispatched and not yet finished (acked
    /// or dead-lettered): what `max_concurrent` limits. Kept only for tenants with one.
    pub fn running(&self, tenant: &str) -> String {
        format!("{}tenant:{tenant}:running", self.prefix)
    }

    /// A consumer's liveness mark: set with a TTL and refreshed by the live process that
    /// runs the consumer, so consumer cleanup can tell a gone consumer from a quiet one.
    pub fn consumer_alive(&self, consumer: &str) -> String {
        format!("{}jobs:summaries:alive:{consumer}", self.prefix)
    }

    /// Whether consumption is paused fleet-wide: one JSON string, present while paused
    /// (`stream/pause.rs` owns its format).
    pub fn paused(&self) -> String {
        format!("{}paused", self.global)
    }

    /// Per-job state the API and the dead-letter path keep until Postgres has the summary.
    pub fn job(&self, job_id: JobId) -> String {
        join(&[
            &self.prefix,
            JOB,
            job_id
                .as_uuid()
                .hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer()),
        ])
    }

    /// What comes before a job id in its state's name ([`Self::job`]), for a script that
    /// finds the job id in a stream entry.
    pub(crate) fn job_prefix(&self) -> String {
        join(&[&self.prefix, JOB])
    }

    /// Set of a tenant's job ids accepted and not yet finished (done or dead-lettered):
    /// its size is what `max_in_flight` limits. A set, not a counter, so a repeated ack or
    /// dead-letter of the same job cannot count it twice.
    pub fn in_flight(&self, tenant: &str) -> String {
        join(&[&self.prefix, "tenant:", tenant, ":in_flight"])
    }

    /// SCAN pattern matching every tenant's in-flight set (the maintenance sweep finds
    /// them so), the prefix escaped so its own glob characters match only themselves.
    pub(crate) fn in_flight_pattern(&self) -> String {
        let mut escaped = String::with_capacity(self.prefix.len());
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        format!("{escaped}tenant:*:in_flight")
    }

    /// The tenant whose in-flight set `key` is, if it is one.
    pub(crate) fn in_flight_tenant<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix.as_str())?
            .strip_prefix("tenant:")?
            .strip_suffix(":in_flight")
    }

    /// What comes before and after the tenant in [`Self::running`], for the dispatch script
    /// that names the set of the tenant it picks.
    pub(crate) fn running_affixes(&self) -> (String, &'static str) {
        (format!("{}tenant:", self.prefix), ":running")
    }

    /// A tenant's rate-limit state (GCRA: the theoretical arrival time, in µs).
    pub fn rate(&self, tenant: &str) -> String {
        join(&[&self.prefix, "tenant:", tenant, ":rate"])
    }

    /// Redis key of the emails one tenant had sent to one recipient in the last hour (a
    /// sorted set of job ids by acceptance time), for `notify_per_hour`. The recipient is
    /// its `Email::recipient_id`, a hash: key names, which monitoring tools list, carry no
    /// address.
    pub fn notify_window(&self, tenant: &str, recipient_id: &str) -> String {
        join(&[&self.prefix, "tenant:", tenant, ":notify:", recipient_id])
    }

    /// One tenant's token budget for one period (`domain::BudgetPeriod::id`): a hash with
    /// `reserved` (held by accepted jobs not yet finished) and `used` (charged by finished
    /// ones), owned by `stream/budget.rs`. One per period, so a new period starts from
    /// nothing without a reset step; each expires a while after its period ended.
    pub fn budget(&self, tenant: &str, period_id: &str) -> String {
        join(&[&self.prefix, "tenant:", tenant, ":budget:", period_id])
    }

    /// An operator's bulk action on dead letters (`stream/bulk.rs`): its record, a JSON
    /// string with a TTL. The run id is a hash tag, so the record and its lease share a
    /// slot and one script may touch both.
    pub fn bulk_run(&self, run_id: &str) -> String {
        format!("{}console:bulk:{{{run_id}}}", self.global)
    }

    /// The lease of the one process working a bulk run (a token, with a TTL).
    pub fn bulk_lease(&self, run_id: &str) -> String {
        format!("{}console:bulk:{{{run_id}}}:lease", self.global)
    }

    /// A model provider's shared limiter (`llm/shared.rs`): a hash of the theoretical
    /// arrival times (ms) of its requests and of its tokens. Every key of one provider
    /// shares the hash tag of its label, so one script may touch them all on a cluster.
    pub fn llm_limit(&self, provider: &str) -> String {
        format!("{}llm:{{{provider}}}:limit", self.global)
    }

    /// Until when (Unix ms) no process calls the provider: set from a 429's `Retry-After`,
    /// only ever moved later.
    pub fn llm_cool_until(&self, provider: &str) -> String {
        format!("{}llm:{{{provider}}}:cool_until", self.global)
    }

    /// The provider's open circuit breaker as every process sees it (JSON: since, next
    /// probe, probes failed, reason); absent while it is closed.
    pub fn llm_breaker(&self, provider: &str) -> String {
        format!("{}llm:{{{provider}}}:breaker", self.global)
    }

    /// The fleet's one probe of the provider's open breaker: held by whoever probes, and
    /// after a failed probe for the cooldown, so no other process probes meanwhile.
    pub fn llm_probe(&self, provider: &str) -> String {
        format!("{}llm:{{{provider}}}:probe", self.global)
    }

    /// Redis key of one idempotency record.
    pub fn idempotency(&self, scope: &ScopedKey) -> String {
        join(&[&self.prefix, &scope.0])
    }
}

/// What a lane's name adds to the shard's prefix before the tenant.
const LANE: &str = "jobs:summaries:lane:";

/// What a job state's name adds to the shard's prefix before the job id.
const JOB: &str = "job:";

/// `parts` end to end. The keys a POST names (about a dozen) are built per request, and
/// this is one allocation of the right size each, without the formatting machinery.
fn join(parts: &[&str]) -> String {
    let mut key = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        key.push_str(part);
    }
    key
}

/// Every shard's keys (`SUMMARYD_STREAM_SHARDS`), and which shard a tenant belongs to.
///
/// A tenant's jobs, limits, budget, lane and idempotency records all live in one shard, so
/// the accept script, the dispatch script and every finishing step touch one hash slot and
/// a tenant's limits stay exact; tenants spread over the shards.
#[derive(Debug, Clone)]
pub struct Shards {
    shards: std::sync::Arc<[RedisKeys]>,
}

impl Shards {
    /// `count` shards under `prefix`; `tagged` (a cluster, or more than one shard) puts each
    /// shard's hash tag in its keys. One untagged shard keeps the unsharded names.
    pub fn new(prefix: &str, count: u16, tagged: bool) -> Self {
        let shards: Vec<RedisKeys> = if tagged || count > 1 {
            (0..count.max(1))
                .map(|shard| RedisKeys::tagged(prefix, shard))
                .collect()
        } else {
            vec![RedisKeys::new(prefix)]
        };
        Self {
            shards: shards.into(),
        }
    }

    /// The layout `settings` ask for: `SUMMARYD_STREAM_SHARDS`, tagged on a cluster.
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        Self::new(
            &settings.key_prefix,
            settings.stream.shards,
            settings.redis_is_cluster(),
        )
    }

    /// The layout of one unsharded single-node deployment.
    pub fn single(prefix: impl Into<String>) -> Self {
        Self {
            shards: vec![RedisKeys::new(prefix)].into(),
        }
    }

    /// How many shards there are.
    pub fn count(&self) -> usize {
        self.shards.len()
    }

    /// Every shard, in order.
    pub fn all(&self) -> &[RedisKeys] {
        &self.shards
    }

    /// Shard `index` (taken modulo the count, so a stale index never panics).
    pub fn get(&self, index: u16) -> &RedisKeys {
        &self.shards[usize::from(index) % self.shards.len()]
    }

    /// The shard holding everything of `tenant`: the first 8 bytes of the SHA-256 of its
    /// id, modulo the count. Stable across versions and processes (a test pins it): moving
    /// a tenant would strand its queued jobs and its records.
    pub fn of_tenant(&self, tenant: &str) -> &RedisKeys {
        use sha2::{Digest, Sha256};
        // Every POST asks; with one shard there is nothing to hash.
        if let [only] = &*self.shards {
            return only;
        }
        let digest = Sha256::digest(tenant.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let n = self.shards.len() as u64;
        &self.shards[(u64::from_be_bytes(first) % n) as usize]
    }

    /// Keys of no shard (the pause, console sessions, bulk runs, the model providers'
    /// shared state) are named the same from every shard: shard 0 names them.
    pub fn global(&self) -> &RedisKeys {
        &self.shards[0]
    }
}

/// `idem:{tenant}:POST:/v1/summaries:{key}`, without the deployment prefix, so the job id
/// derived from it does not change when a deployment changes its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedKey(String);

impl ScopedKey {
    pub fn summaries(tenant: &TenantId, key: &IdempotencyKey) -> Self {
        Self(format!("idem:{tenant}:{SUMMARIES_SCOPE}:{}", key.as_str()))
    }

    /// The job id of the request with this key and body `fingerprint`.
    pub fn job_id(&self, fingerprint: &str) -> JobId {
        JobId::for_request(&self.0, fingerprint)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One shard on a single node keeps the names of a deployment that predates shards,
    /// byte for byte: an upgrade must find its stream, records and lanes where they were.
    #[test]
    fn one_untagged_shard_keeps_the_unsharded_names() {
        let shards = Shards::new("p:", 1, false);
        assert_eq!(shards.count(), 1);
        let k = shards.of_tenant("acme");
        let job: JobId = "0191e7a0-0000-7000-8000-000000000001".parse().unwrap();
        let scope = ScopedKey(format!("idem:acme:{SUMMARIES_SCOPE}:k-0123456789abcdef"));
        let names = [
            (k.stream(), "p:jobs:summaries"),
            (k.dead_letters(), "p:jobs:summaries:dead"),
            (k.lane("acme"), "p:jobs:summaries:lane:acme"),
            (k.lanes(), "p:jobs:summaries:lanes"),
            (k.lanes_clock(), "p:jobs:summaries:lanes:clock"),
            (k.lane_policies(), "p:jobs:summaries:lanes:policy"),
            (k.doorbell(), "p:jobs:summaries:doorbell"),
            (k.running("acme"), "p:tenant:acme:running"),
            (k.consumer_alive("h-1-0"), "p:jobs:summaries:alive:h-1-0"),
            (k.paused(), "p:paused"),
            (k.job(job), "p:job:0191e7a0-0000-7000-8000-000000000001"),
            (k.in_flight("acme"), "p:tenant:acme:in_flight"),
            (k.rate("acme"), "p:tenant:acme:rate"),
            (k.notify_window("acme", "r1"), "p:tenant:acme:notify:r1"),
            (
                k.budget("acme", "d2026-12-03"),
                "p:tenant:acme:budget:d2026-12-03",
            ),
            (
                k.idempotency(&scope),
                "p:idem:acme:POST:/v1/summaries:k-0123456789abcdef",
            ),
            (k.console_session("h"), "p:console:session:h"),
            (k.bulk_run("r"), "p:console:bulk:{r}"),
            (k.llm_limit("openai"), "p:llm:{openai}:limit"),
        ];
        for (got, want) in names {
            assert_eq!(got, want);
        }
        assert_eq!(k.lane_prefix(), "p:jobs:summaries:lane:");
        assert_eq!(k.running_affixes(), ("p:tenant:".to_owned(), ":running"));
        let job = JobId::from_scoped_key("t:k");
        assert_eq!(k.job(job), format!("{}{job}", k.job_prefix()));
        assert_eq!(k.in_flight_pattern(), "p:tenant:*:in_flight");
        assert_eq!(Shards::single("p:").global().stream(), "p:jobs:summaries");
    }

    /// Every key a script or MULTI touches with a shard's stream carries the shard's tag;
    /// keys of no shard carry none of it.
    #[test]
    fn a_tagged_shard_puts_its_tag_on_every_key_of_the_shard_and_none_on_the_others() {
        let shards = Shards::new("p:", 3, false);
        assert_eq!(shards.count(), 3);
        let k = shards.get(2);
        assert_eq!(k.shard(), 2);
        for key in [
            k.stream(),
            k.dead_letters(),
            k.lane("acme"),
            k.lanes(),
            k.lanes_clock(),
            k.lane_policies(),
            k.doorbell(),
            k.running("acme"),
            k.consumer_alive("c"),
            k.in_flight("acme"),
            k.rate("acme"),
            k.notify_window("acme", "r"),
            k.budget("acme", "d"),
            k.lane_prefix(),
            k.running_affixes().0,
        ] {
            assert!(key.starts_with("p:{s2}"), "{key}");
        }
        assert_eq!(k.stream(), "p:{s2}jobs:summaries");
        for key in [
            k.paused(),
            k.console_session("h"),
            k.console_signin_failures("w"),
            k.bulk_run("r"),
            k.bulk_lease("r"),
            k.llm_limit("x"),
            k.llm_cool_until("x"),
            k.llm_breaker("x"),
            k.llm_probe("x"),
        ] {
            assert!(key.starts_with("p:") && !key.contains("{s"), "{key}");
        }
        assert_eq!(k.paused(), shards.global().paused());
        // A cluster tags even a single shard.
        assert_eq!(
            Shards::new("p:", 1, true).get(0).stream(),
            "p:{s0}jobs:summaries"
        );
        // A stale index wraps instead of panicking.
        assert_eq!(shards.get(5).shard(), 2);
    }

    /// The tenant → shard map is part of the stored layout: a change would strand every
    /// tenant's queued jobs and records. These values pin it.
    #[test]
    fn tenants_map_to_shards_by_a_pinned_hash() {
        let shards = Shards::new("", 3, false);
        let of = |t: &str| shards.of_tenant(t).shard();
        let seen: Vec<u16> = ["acme", "globex", "initech", "umbrella", "hooli", "default"]
            .iter()
            .map(|t| of(t))
            .collect();
        assert_eq!(seen, PINNED);
        // Every shard gets tenants.
        let mut hit = [false; 3];
        for i in 0..60 {
            hit[usize::from(of(&format!("tenant-{i}")))] = true;
        }
        assert_eq!(hit, [true; 3]);
        assert_eq!(Shards::new("", 1, true).of_tenant("acme").shard(), 0);
    }

    const PINNED: [u16; 6] = [0, 1, 1, 2, 2, 1];
}
