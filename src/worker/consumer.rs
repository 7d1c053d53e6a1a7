//! One consumer of the job stream: what it holds and the knobs it runs with. What it does
//! lives beside it, one file per part: taking work (`take.rs`), running one delivery
//! (`delivery.rs`), deciding what the delivery's end means (`settle.rs`) and carrying that
//! out (`complete.rs`), keeping its claims and its consumer alive (`liveness.rs`), the
//! commit and acknowledgement of its last delivery while it takes the next (`finishing.rs`),
//! and the loop (`run.rs`). Concurrency comes from running several consumers, each its own
//! task, with at most one model call at a time.
//! What spends a delivery and what does not: `docs/delivery.md`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Span;

use super::WorkerServices;
use super::gate::{DependencyGate, PAUSED, POSTGRES};
use super::handler::{JobOutcome, Unfinished};
use super::settle::{Finish, Settlement};
use crate::config::WorkerSettings;
use crate::domain::{Job, ModelSummary};
use crate::resilience::backoff::{Backoff, Jitter};
use crate::shutdown::Shutdown;
use crate::stream::consumer_group::{self as group, CURSOR_START, Delivery};

/// Pause after a failed pass, from 1 s doubling up to 10 s, so a Redis outage is not a busy
/// loop of errors and a Redis that is back is used again within seconds. No jitter: every
/// consumer has its own loop and its own moment of failure.
pub(super) const ERROR_BACKOFF: Backoff = Backoff::new(
    Duration::from_secs(1),
    Duration::from_secs(10),
    Jitter::None,
);
/// Pause between probes of a dependency that is down, from 200 ms doubling up to 2 s. Short:
/// once it is back, the entries the consumers hold are retried within this long, and a
/// probe is one cheap statement. No jitter, for the same reason as above.
const PROBE_BACKOFF: Backoff = Backoff::new(
    Duration::from_millis(200),
    Duration::from_secs(2),
    Jitter::None,
);
/// At most this long between two runs of consumer cleanup: a couple of cheap commands, and
/// gone consumers only cost a line in XINFO meanwhile. Shorter when `consumer_gc` is.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);
/// How long before the end of the shutdown grace a running delivery is cut short, so its
/// refund (one Redis call) reaches Redis before the task is aborted. At most a quarter of
/// the grace.
const STOP_MARGIN: Duration = Duration::from_millis(500);
/// Floor on how often a running delivery extends its claim, so a tiny `claim_idle` (as
/// in tests that reclaim at once) does not turn the extension into a busy loop.
const MIN_EXTEND_EVERY: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("could not get a Redis connection: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    /// A dependency a delivery needs is down, or consumption is paused ([`PAUSED`]): no
    /// work is taken until the gate opens again.
    #[error("{}", not_taking_work(.dependency, .reason))]
    Paused {
        dependency: &'static str,
        reason: String,
    },
}

impl WorkerError {
    /// The `kind` label of `summaryd_loop_errors_total`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            WorkerError::Redis(e) if e.code().is_some() => "redis_error",
            WorkerError::Redis(_) | WorkerError::Pool(_) => "redis_unavailable",
            WorkerError::Paused {
                dependency: POSTGRES,
                ..
            } => "postgres_unavailable",
            WorkerError::Paused {
                dependency: PAUSED, ..
            } => "paused",
            WorkerError::Paused { .. } => "dependency_unavailable",
        }
    }

    /// How long to wait after `failures` failed passes in a row (0 for the first).
    pub(super) fn wait(&self, failures: u32) -> Duration {
        match self {
            WorkerError::Paused { .. } => PROBE_BACKOFF.delay(failures),
            _ => ERROR_BACKOFF.delay(failures),
        }
    }
}

fn not_taking_work(dependency: &str, reason: &str) -> String {
    if dependency == PAUSED {
        // `reason` says who paused and when.
        format!("not taking work: consumption {reason}")
    } else {
        format!("not taking work while {dependency} is down: {reason}")
    }
}

/// The knobs of one consumer; from `WorkerSettings`, adjustable per consumer in tests.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// XAUTOCLAIM min idle time: how soon a dead worker's entry is taken over. A running
    /// delivery re-claims its entry every third of it, so it need not exceed the slowest job.
    pub claim_idle: Duration,
    /// Deliveries after which a job is dead-lettered instead of run again.
    pub(crate) max_deliveries: u64,
    /// XREADGROUP BLOCK; also bounds how long a shutdown waits for an idle consumer.
    pub(crate) block: Duration,
    /// How long a consumer's liveness mark lasts without a refresh; consumers without a
    /// mark, idle this long, with nothing pending, are removed from the group.
    pub(crate) consumer_gc: Duration,
}

impl ConsumerConfig {
    /// A running delivery re-claims its entry this often: a third of `claim_idle`, so two
    /// extensions can be late (a slow Redis, a pause) before the entry looks idle.
    pub(crate) fn extend_every(&self) -> Duration {
        (self.claim_idle / 3).max(MIN_EXTEND_EVERY)
    }

    /// Consumer cleanup runs this often, so a gone consumer is removed within about two
    /// `consumer_gc` of its last mark.
    pub(crate) fn maintenance_every(&self) -> Duration {
        (self.consumer_gc / 2).clamp(MIN_EXTEND_EVERY, MAINTENANCE_EVERY)
    }

    /// The liveness mark is refreshed this often: three times per lifetime, so a live
    /// process misses two refreshes before its consumer could look gone.
    pub(crate) fn mark_every(&self) -> Duration {
        (self.consumer_gc / 3).max(MIN_EXTEND_EVERY)
    }
}

impl From<&WorkerSettings> for ConsumerConfig {
    fn from(s: &WorkerSettings) -> Self {
        Self {
            claim_idle: s.claim_idle,
            max_deliveries: s.max_deliveries,
            block: s.block,
            consumer_gc: s.consumer_gc,
        }
    }
}

pub struct Consumer {
    pub(super) services: WorkerServices,
    pub(super) name: String,
    pub config: ConsumerConfig,
    /// XAUTOCLAIM cursor of each shard, kept across calls so each call continues the scan
    /// instead of rescanning the whole PEL from the start.
    pub(super) cursors: Vec<String>,
    /// The shard whose turn is next to be read from, so every shard is read in turn.
    pub(super) next_shard: u16,
    /// The shard whose idle entries the next take looks for.
    pub(super) claim_shard: u16,
    /// Entries in this consumer's PEL to retry: a dependency outage (or a Redis error) kept
    /// them from being finished, or their counted retry waits a backoff. Retried as soon as
    /// they are due and the gate is open, so they wait seconds after a recovery, not
    /// `claim_idle`.
    pub(super) held: VecDeque<Held>,
    /// Whether the last entry taken was a held one: the next take prefers new work, so held
    /// entries never starve it.
    pub(super) took_held: bool,
    /// Shutdown, with how long a running delivery may go on after it (`liveness.rs`).
    pub(super) stop: Option<(Shutdown, Duration)>,
    /// Shared by every consumer of the process: one consumer seeing Postgres down stops all.
    pub(super) gate: Arc<DependencyGate>,
    /// The Redis connection this consumer's passes use while it works (`run.rs`).
    pub(super) conn: Option<crate::infra::redis::Conn>,
    /// The commit and acknowledgement of its last delivery, when they go on while it
    /// takes the next job (`finishing.rs`).
    pub(super) finisher: Option<Finisher>,
}

/// An entry this consumer still holds, to retry.
pub(super) struct Held {
    pub(super) delivery: Delivery,
    /// The delivery count its retry is handed out with (`None`: the count it has).
    pub(super) count: Option<u64>,
    pub(super) work: Work,
    /// Not before this (a counted retry's backoff); entries not yet due leave the consumer
    /// free to take other work.
    pub(super) due: Instant,
}

/// What a delivery does with its entry.
#[derive(Debug)]
pub(super) enum Work {
    /// Run the job, with the summary an earlier delivery was given by the model but could
    /// not commit, so this one does not pay for it again.
    Run(Option<ModelSummary>),
    /// Only carry out what an earlier delivery decided (acknowledge, dead-letter, refund):
    /// Redis failed while it did, and running the job again would call the model again.
    Settle(Settlement),
}

/// Where a consumer starts its turns: spread by its name, so the consumers of a process
/// (and of the fleet) begin on different shards and wait on different doorbells.
fn first_shard(name: &str, shards: usize) -> u16 {
    let spread = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    u16::try_from(spread as usize % shards.max(1)).unwrap_or(0)
}

/// `host-pid-index`: unique per process and task, so two consumers never share a PEL.
pub fn consumer_name(index: usize) -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}-{}-{index}", std::process::id())
}

impl Consumer {
    pub fn new(services: WorkerServices, name: impl Into<String>) -> Self {
        let config = ConsumerConfig::from(&services.settings.worker);
        let name = name.into();
        let gate = services.gate.clone();
        let shards = services.keys.count();
        Self {
            services,
            next_shard: first_shard(&name, shards),
            claim_shard: first_shard(&name, shards),
            name,
            config,
            cursors: vec![CURSOR_START.into(); shards],
            held: VecDeque::new(),
            took_held: false,
            stop: None,
            gate,
            conn: None,
            finisher: None,
        }
    }

    /// Cut a running delivery short once `shutdown` has run for `grace` less a margin, and
    /// refund it, before the supervisor aborts the task at `grace`.
    pub fn stop_on(&mut self, shutdown: Shutdown, grace: Duration) {
        self.stop = Some((shutdown, grace.saturating_sub(STOP_MARGIN.min(grace / 4))));
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub async fn ensure_group(&self) -> Result<(), WorkerError> {
        let mut conn = self.services.redis.get().await?;
        for keys in self.services.keys.all() {
            group::ensure_group(&mut conn, keys).await?;
        }
        Ok(())
    }

    /// Keep `delivery` to retry after `wait`, handed out with `count`: before new work once
    /// due, though never twice in a row while new work waits (`take.rs`).
    pub(super) fn hold(
        &mut self,
        delivery: Delivery,
        count: Option<u64>,
        work: Work,
        wait: Duration,
    ) {
        // An entry is held once: a newer decision replaces an older one. Ids are per shard.
        self.held.retain(|held| {
            (held.delivery.id.as_str(), held.delivery.shard)
                != (delivery.id.as_str(), delivery.shard)
        });
        self.held.push_back(Held {
            delivery,
            count,
            work,
            due: Instant::now() + wait,
        });
    }
}

/// How a delivery run under [`Consumer::with_claim_extended`] ended.
pub(super) enum Ran<T> {
    Finished(T),
    /// Shutdown's grace was nearly over.
    CutShort,
    /// The entry stopped being this consumer's.
    ClaimLost,
}

/// The spans of one delivery: `deliver`, and the `job` span inside it that its log
/// lines carry. The finisher runs inside them, so the delivery's trace and its log lines
/// read as if it had ended in line.
#[derive(Clone)]
pub(super) struct Spans {
    pub(super) deliver: Span,
    pub(super) job: Span,
}

/// A finisher at work (`finishing.rs`): the commit and acknowledgement of this consumer's
/// last delivery. Its types live here, with what else a consumer holds.
pub(super) struct Finisher(pub(super) JoinHandle<Left>);

/// A delivery whose commit did not end in a job to acknowledge.
pub(super) struct Unsettled {
    pub(super) delivery: Delivery,
    pub(super) job: Job,
    pub(super) deliveries: u64,
    pub(super) ran: Ran<Result<JobOutcome, Unfinished>>,
    pub(super) spans: Spans,
}

/// What a finisher leaves its consumer to do.
pub(super) enum Left {
    /// Committed and acknowledged.
    Nothing,
    /// Its commit did not end in a job to acknowledge (it failed, or the delivery was cut
    /// short or lost its claim): settle the delivery as one that ran that far.
    Settle(Box<Unsettled>),
    /// Redis failed the acknowledgement: hold the entry to carry it out again.
    Hold {
        delivery: Delivery,
        deliveries: u64,
        finish: Finish,
        error: WorkerError,
    },
}
