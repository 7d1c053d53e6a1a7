//! The delivery accounting as decisions without I/O: whether a delivery runs its job, what
//! its end means for the entry (acknowledge, leave pending, refund and hold, retry as a
//! counted delivery, dead-letter), and what count the entry's retry carries. `delivery.rs`
//! finds out what happened and `complete.rs` carries the decision out; the rules are
//! `docs/delivery.md`, and the table test below has a row for each of them, so a change to
//! the accounting has to change a row.

use std::time::Duration;

use super::dead_reason::DeadReason;
use super::handler::JobOutcome;
use crate::domain::ModelSummary;
use crate::resilience::backoff::{Backoff, Jitter};
use crate::stream::consumer_group::ClaimCount;

/// A job's deliveries are refunded at most this many times; after that each one counts. A
/// refund needs a dependency confirmed down (or a shutdown), so a real outage costs one
/// refund per job in flight, and this only stops a job that takes a dependency down every
/// time it runs (and comes back after) from being retried without end.
pub(crate) const MAX_REFUNDS: u64 = 10;

/// The first wait before a counted retry of a held entry; it doubles per delivery.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// The longest wait before a counted retry.
const RETRY_CAP: Duration = Duration::from_secs(30);

/// The limits the accounting applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Deliveries after which a job is dead-lettered instead of run again.
    pub(crate) max_deliveries: u64,
    /// Refunds after which a job's deliveries count whatever stopped them.
    pub(crate) max_refunds: u64,
    /// The wait before a counted retry, by how many deliveries the job has had.
    pub(crate) retry: Backoff,
}

impl Limits {
    /// The worker's limits. A counted retry waits at most half of `claim_idle`, so a held
    /// entry is retried by its holder before it looks idle to other consumers.
    pub(crate) fn new(max_deliveries: u64, claim_idle: Duration) -> Self {
        Self {
            max_deliveries,
            max_refunds: MAX_REFUNDS,
            retry: Backoff::new(
                RETRY_BASE.min(claim_idle / 2),
                RETRY_CAP.min(claim_idle / 2),
                Jitter::None,
            ),
        }
    }

    /// How long a counted retry waits after the job's `deliveries`-th delivery.
    fn retry_wait(&self, deliveries: u64) -> Duration {
        let earlier = u32::try_from(deliveries.saturating_sub(1)).unwrap_or(u32::MAX);
        self.retry.delay(earlier)
    }
}

/// Whether a delivery runs its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    Run,
    /// Out of deliveries: the job is not run again. What is left is to learn whether an
    /// earlier delivery committed it (then only its acknowledgement was lost).
    GiveUp,
}

/// The limit is checked before the job runs, not after it failed: a delivery that fails
/// transiently at the limit is left pending like any other, and the claim after it gives up.
pub(crate) fn admit(deliveries: u64, limits: &Limits) -> Admission {
    if deliveries > limits.max_deliveries {
        Admission::GiveUp
    } else {
        Admission::Run
    }
}

/// What asking a dependency said, right after a delivery stopped at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Probe {
    /// It is down, with why.
    Down(String),
    Answers,
}

/// What happened to one delivery of a job. (An entry that holds no job is dead-lettered
/// before there is a job to account for: no delivery could ever read it.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job's summary is committed: by this delivery, or found already there.
    Finished(JobOutcome),
    /// The job was tried and failed in a way a later delivery may not repeat (the model
    /// failed transiently on every usable provider, or the budget ran out).
    Failed(String),
    /// The same for a job in parts, but this delivery stored parts no delivery had
    /// stored before: it made progress, and is not a failed delivery.
    Progressed(String),
    /// The job was tried and failed in a way every delivery repeats (the model refused the
    /// request, Postgres refused the data).
    Rejected(DeadReason),
    /// The delivery stopped at a dependency, and a probe right after says whether it is
    /// down. `summary`: what the model already wrote, when the delivery stopped after it.
    Unavailable {
        dependency: &'static str,
        reason: String,
        probe: Probe,
        summary: Option<ModelSummary>,
    },
    /// Shutdown cut the delivery short: it was never allowed to finish.
    CutShort,
    /// The entry stopped being this consumer's while the delivery ran (reclaimed after
    /// missed claim extensions, or acknowledged by hand): the delivery stopped there.
    ClaimLost,
    /// Out of deliveries, and an earlier delivery had committed the summary.
    CommittedEarlier,
    /// Out of deliveries, and nothing was committed; why the last counted one failed, when
    /// that was noted.
    Exhausted(Option<String>),
    /// Out of deliveries, and looking for a summary failed (other than by an outage).
    Unchecked(String),
}

/// What to do with the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// The job is finished: acknowledge the entry.
    Ack(Finish),
    /// Leave the entry pending: XAUTOCLAIM redelivers it after `claim_idle`, which
    /// doubles as a coarse backoff between deliveries.
    LeavePending(Pending),
    /// The dependency is down and the job was not finished through no fault of its own:
    /// close the gate under the dependency, refund the delivery (`refund`) and hold the
    /// entry, with the summary if one was written, until the dependency is back.
    RefundAndHold {
        dependency: &'static str,
        /// Why the probe says it is down.
        down: String,
        /// Why the delivery stopped.
        reason: String,
        refund: RefundOf,
        summary: Option<ModelSummary>,
    },
    /// The dependency answers, so the failure is the job's own: hold the entry and retry it
    /// after `wait` as a delivery that counts, with the summary if one was written.
    RetryCounted {
        dependency: &'static str,
        reason: String,
        retry: Retry,
        summary: Option<ModelSummary>,
    },
    /// The delivery made progress on a job in parts before it stopped: hold the entry and
    /// run it again at once, as the same delivery (its count unchanged). Bounded without a
    /// limit of its own: each such delivery stores at least one more of the job's parts.
    Continue {
        reason: String,
        retry: Retry,
    },
    /// The process is stopping: refund the delivery and leave the entry for whoever
    /// claims it next.
    Refund(RefundOf),
    /// Not this consumer's entry any more: nothing to do.
    Drop,
    DeadLetter(DeadReason),
}

/// How a finished job came to be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// This delivery committed the summary.
    Summarised,
    /// An earlier or concurrent delivery had committed it.
    Duplicate,
    /// Out of deliveries, an earlier delivery had committed it: its acknowledgement was lost.
    AckLost,
}

impl Finish {
    /// How a job that ran to `finished` is acknowledged.
    pub(crate) fn of(finished: JobOutcome) -> Self {
        match finished {
            JobOutcome::Done => Finish::Summarised,
            JobOutcome::Duplicate => Finish::Duplicate,
        }
    }
}

/// Why an entry is left pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pending {
    /// The job failed transiently.
    Failed(String),
    /// Whether an out-of-deliveries job was committed could not be learned.
    Unchecked(String),
}

/// The retry of a held entry: the delivery count it is handed out with, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    pub(crate) count: u64,
    /// `ZERO`: as soon as the gate is open.
    pub(crate) wait: Duration,
}

/// Decide what `outcome` of the job's `deliveries`-th delivery means for the entry.
pub(crate) fn settle(outcome: Outcome, deliveries: u64, limits: &Limits) -> Settlement {
    match outcome {
        Outcome::Finished(finished) => Settlement::Ack(Finish::of(finished)),
        Outcome::Failed(reason) => Settlement::LeavePending(Pending::Failed(reason)),
        Outcome::Progressed(reason) => Settlement::Continue {
            reason,
            retry: Retry {
                count: deliveries,
                wait: Duration::ZERO,
            },
        },
        Outcome::Rejected(reason) => Settlement::DeadLetter(reason),
        Outcome::Unavailable {
            dependency,
            reason,
            probe: Probe::Down(down),
            summary,
        } => Settlement::RefundAndHold {
            dependency,
            down,
            reason,
            refund: refund(deliveries, limits),
            summary,
        },
        Outcome::Unavailable {
            dependency,
            reason,
            probe: Probe::Answers,
            summary,
        } => Settlement::RetryCounted {
            dependency,
            reason,
            retry: counted_retry(deliveries, limits),
            summary,
        },
        Outcome::CutShort => Settlement::Refund(refund(deliveries, limits)),
        Outcome::ClaimLost => Settlement::Drop,
        Outcome::CommittedEarlier => Settlement::Ack(Finish::AckLost),
        Outcome::Exhausted(last) => Settlement::DeadLetter(DeadReason::exhausted(
            limits.max_deliveries,
            last.as_deref(),
        )),
        Outcome::Unchecked(reason) => Settlement::LeavePending(Pending::Unchecked(reason)),
    }
}

/// Take the `deliveries`-th delivery back, within the job's refunds.
fn refund(deliveries: u64, limits: &Limits) -> RefundOf {
    RefundOf {
        deliveries,
        limit: limits.max_refunds,
    }
}

/// The refund of a job's `deliveries`-th delivery, within `limit` refunds per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RefundOf {
    pub(crate) deliveries: u64,
    pub(crate) limit: u64,
}

impl RefundOf {
    /// The `claim_own` that gives it: the count back to what it was before the delivery.
    pub(crate) fn claim(&self) -> ClaimCount {
        ClaimCount::Refund {
            to: self.deliveries.saturating_sub(1),
            limit: self.limit,
        }
    }
}

/// The next delivery after the `deliveries`-th, after a backoff.
fn counted_retry(deliveries: u64, limits: &Limits) -> Retry {
    Retry {
        count: deliveries.saturating_add(1),
        wait: limits.retry_wait(deliveries),
    }
}

/// What became of a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refund {
    Refunded,
    /// The job has had its refunds: the delivery counts.
    Denied,
    /// The entry is no longer pending for this consumer (finished, or reclaimed elsewhere).
    NotOurs,
    /// Redis did not answer: whether the refund happened is unknown.
    Failed,
}

/// The retry of a held entry after the refund `of` a delivery; `None`: not
/// ours to retry. A refunded delivery's retry stands in for it and carries its count; so
/// does the retry after a refund whose answer was lost, since counts are set, not moved,
/// and land the same whether the refund happened or not. A denied refund is a counted
/// delivery like any other, and its retry waits its backoff.
pub(crate) fn retry_after(refund: Refund, of: RefundOf, limits: &Limits) -> Option<Retry> {
    match refund {
        Refund::Refunded | Refund::Failed => Some(Retry {
            count: of.deliveries,
            wait: Duration::ZERO,
        }),
        Refund::Denied => Some(counted_retry(of.deliveries, limits)),
        Refund::NotOurs => None,
    }
}

/// How a delivery that stopped at the model learns whether the model is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelCheck {
    /// It called no provider (every breaker was open before it could): it did not try the
    /// job, and the open breakers are the answer.
    Down,
    /// Its own calls opened the last breaker: a probe right now tells the provider's fault
    /// (the probe fails too) from the job's (the probe passes).
    Confirm,
}

pub(crate) fn model_check(called: bool) -> ModelCheck {
    if called {
        ModelCheck::Confirm
    } else {
        ModelCheck::Down
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::gate::{MODEL, POSTGRES};

    const MAX: u64 = 3;
    const CLAIM_IDLE: Duration = Duration::from_secs(120);

    fn limits() -> Limits {
        Limits::new(MAX, CLAIM_IDLE)
    }

    /// One decision the accounting makes, with what it must come to.
    #[allow(
        clippy::large_enum_variant,
        reason = "a short table built once per test"
    )]
    enum Case {
        Admit(u64, Admission),
        /// The outcome of the job's n-th delivery.
        Settle(Outcome, u64, Settlement),
        /// A refund's result, for the refund of the n-th delivery.
        RetryAfter(Refund, u64, Option<Retry>),
        Claim(RefundOf, ClaimCount),
        Check(bool, ModelCheck),
    }
    use Case::*;

    fn reason(tenant: &str) -> DeadReason {
        DeadReason {
            tenant: tenant.into(),
            operator: format!("{tenant}: detail"),
            class: crate::domain::ReasonClass::ModelRefused,
        }
    }

    fn summary() -> Option<ModelSummary> {
        Some(ModelSummary {
            text: "paid for".into(),
            model: "m".into(),
            usage: None,
            parts: None,
            calls: Vec::new(),
        })
    }

    fn unavailable(dependency: &'static str, probe: Probe) -> Outcome {
        Outcome::Unavailable {
            dependency,
            reason: "connection refused".into(),
            probe,
            summary: summary(),
        }
    }

    fn refund_of(deliveries: u64) -> RefundOf {
        RefundOf {
            deliveries,
            limit: MAX_REFUNDS,
        }
    }

    fn held(dependency: &'static str, down: &str, deliveries: u64) -> Settlement {
        Settlement::RefundAndHold {
            dependency,
            down: down.into(),
            reason: "connection refused".into(),
            refund: refund_of(deliveries),
            summary: summary(),
        }
    }

    fn counted(dependency: &'static str, count: u64, wait_s: u64) -> Settlement {
        Settlement::RetryCounted {
            dependency,
            reason: "connection refused".into(),
            retry: Retry {
                count,
                wait: Duration::from_secs(wait_s),
            },
            summary: summary(),
        }
    }

    /// One row per rule of `docs/delivery.md` (the quoted text is the rule's), then the
    /// decisions the page leaves to the code's own comments.
    fn table() -> Vec<(&'static str, Case)> {
        vec![
            (
                "XREADGROUP hands out a new entry | yes (Redis sets 1)",
                Admit(1, Admission::Run),
            ),
            (
                "XAUTOCLAIM takes over an entry idle past `claim_idle_ms` | yes (Redis adds 1): \
                 a job that has not had `max_deliveries` yet runs",
                Admit(MAX, Admission::Run),
            ),
            (
                "after `SUMMARYD_WORKER_MAX_DELIVERIES` of them the job is dead-lettered",
                Admit(MAX + 1, Admission::GiveUp),
            ),
            (
                "after `SUMMARYD_WORKER_MAX_DELIVERIES` of them the job is dead-lettered \
                 (with why, in the tenant's wording)",
                Settle(
                    Outcome::Exhausted(Some("HTTP 403".into())),
                    MAX + 1,
                    Settlement::DeadLetter(DeadReason::exhausted(MAX, Some("HTTP 403"))),
                ),
            ),
            (
                "the model fails transiently past the in-process attempts … and some \
                 provider's breaker is still closed | yes | leave it pending",
                Settle(
                    Outcome::Failed("HTTP 503".into()),
                    1,
                    Settlement::LeavePending(Pending::Failed("HTTP 503".into())),
                ),
            ),
            (
                "a job in parts: the delivery stored new parts, then a part failed \
                 transiently | **no** | hold the entry and run it again at once, with the \
                 same count",
                Settle(
                    Outcome::Progressed("HTTP 503".into()),
                    3,
                    Settlement::Continue {
                        reason: "HTTP 503".into(),
                        retry: Retry {
                            count: 3,
                            wait: Duration::ZERO,
                        },
                    },
                ),
            ),
            (
                "the model fails as the job's fault (400, 413, 422, input too long) | yes | \
                 dead-letter at once",
                Settle(
                    Outcome::Rejected(reason("the model rejected the request (HTTP 400)")),
                    1,
                    Settlement::DeadLetter(reason("the model rejected the request (HTTP 400)")),
                ),
            ),
            (
                "every model provider's breaker was open before the delivery called one \
                 | **no** | the open breakers are the answer",
                Check(false, ModelCheck::Down),
            ),
            (
                "the delivery's own calls opened the last breaker | a probe right away decides",
                Check(true, ModelCheck::Confirm),
            ),
            (
                "every breaker open, or the probe after the delivery's own calls fails too \
                 | **no** | refund the delivery, close the gate under `model`, hold the entry",
                Settle(
                    unavailable(MODEL, Probe::Down("every breaker is open".into())),
                    2,
                    held(MODEL, "every breaker is open", 2),
                ),
            ),
            (
                "the probe after the delivery's own calls passes: the job is at fault \
                 (a 401/403/404 or failures only its text causes) | yes | its breaker is \
                 closed again; retry it after a backoff as another counted delivery",
                Settle(unavailable(MODEL, Probe::Answers), 2, counted(MODEL, 3, 2)),
            ),
            (
                "Postgres fails before the model was called or at the commit (down, or \
                 refusing writes), and the write probe confirms it | **no** | refund the \
                 delivery, close the gate, hold the entry with the summary the model wrote",
                Settle(
                    unavailable(POSTGRES, Probe::Down("read-only".into())),
                    1,
                    held(POSTGRES, "read-only", 1),
                ),
            ),
            (
                "the same, but Postgres answers the write probe | yes | retry it after a \
                 backoff as another counted delivery, with the summary",
                Settle(
                    unavailable(POSTGRES, Probe::Answers),
                    1,
                    counted(POSTGRES, 2, 1),
                ),
            ),
            (
                "a counted retry waits 1 s, doubling per delivery",
                Settle(
                    unavailable(POSTGRES, Probe::Answers),
                    4,
                    counted(POSTGRES, 5, 8),
                ),
            ),
            (
                "a counted retry waits at most 30 s (and at most half of `claim_idle_ms`)",
                Settle(
                    unavailable(POSTGRES, Probe::Answers),
                    40,
                    counted(POSTGRES, 41, 30),
                ),
            ),
            (
                "Postgres refuses the job's data (SQLSTATE class 22 or 23) | yes | \
                 dead-letter at once",
                Settle(
                    Outcome::Rejected(reason("the summary could not be stored")),
                    1,
                    Settlement::DeadLetter(reason("the summary could not be stored")),
                ),
            ),
            (
                "a refund sets the count one lower",
                Claim(
                    refund_of(4),
                    ClaimCount::Refund {
                        to: 3,
                        limit: MAX_REFUNDS,
                    },
                ),
            ),
            (
                "a refunded delivery's retry carries its count, as soon as the gate opens",
                RetryAfter(
                    Refund::Refunded,
                    2,
                    Some(Retry {
                        count: 2,
                        wait: Duration::ZERO,
                    }),
                ),
            ),
            (
                "Redis fails mid-delivery (the refund's answer lost) | **no** | the retry \
                 sets the same count whether the refund happened or not",
                RetryAfter(
                    Refund::Failed,
                    2,
                    Some(Retry {
                        count: 2,
                        wait: Duration::ZERO,
                    }),
                ),
            ),
            (
                "a job that has had its refunds | yes | its retry is a counted delivery, \
                 after a backoff",
                RetryAfter(
                    Refund::Denied,
                    2,
                    Some(Retry {
                        count: 3,
                        wait: Duration::from_secs(2),
                    }),
                ),
            ),
            (
                "[the refund] first checks the entry is still pending for this consumer",
                RetryAfter(Refund::NotOurs, 2, None),
            ),
            (
                "shutdown cuts a delivery short | **no** | refund it and leave the entry",
                Settle(Outcome::CutShort, 2, Settlement::Refund(refund_of(2))),
            ),
            (
                "the entry is taken from a running delivery | — | the delivery stops; the \
                 taker decides",
                Settle(Outcome::ClaimLost, 2, Settlement::Drop),
            ),
            (
                "`dlq replay` | the count starts over | a new entry on the stream",
                Admit(1, Admission::Run),
            ),
            (
                "A job on the stream is handed to a consumer until one delivery finishes \
                 it: the summary is committed",
                Settle(
                    Outcome::Finished(JobOutcome::Done),
                    1,
                    Settlement::Ack(Finish::Summarised),
                ),
            ),
            (
                "the summary is committed (by an earlier or a concurrent delivery)",
                Settle(
                    Outcome::Finished(JobOutcome::Duplicate),
                    2,
                    Settlement::Ack(Finish::Duplicate),
                ),
            ),
            // What follows is not in the page's table; each row quotes the comment that
            // says why.
            (
                "Out of deliveries. A job whose summary is committed is done however often \
                 its ack was lost, so it is acknowledged, not dead-lettered.",
                Settle(
                    Outcome::CommittedEarlier,
                    MAX + 1,
                    Settlement::Ack(Finish::AckLost),
                ),
            ),
            (
                "cannot check for a summary; will be redelivered",
                Settle(
                    Outcome::Unchecked("permission denied".into()),
                    MAX + 1,
                    Settlement::LeavePending(Pending::Unchecked("permission denied".into())),
                ),
            ),
        ]
    }

    #[test]
    fn the_accounting_follows_docs_delivery_md() {
        let limits = limits();
        let mut wrong = Vec::new();
        for (rule, case) in table() {
            let (got, want) = match case {
                Admit(deliveries, want) => (
                    format!("{:?}", admit(deliveries, &limits)),
                    format!("{want:?}"),
                ),
                Settle(outcome, deliveries, want) => (
                    format!("{:?}", settle(outcome, deliveries, &limits)),
                    format!("{want:?}"),
                ),
                RetryAfter(refund, deliveries, want) => (
                    format!("{:?}", retry_after(refund, refund_of(deliveries), &limits)),
                    format!("{want:?}"),
                ),
                Claim(refund, want) => (format!("{:?}", refund.claim()), format!("{want:?}")),
                Check(called, want) => (format!("{:?}", model_check(called)), format!("{want:?}")),
            };
            if got != want {
                wrong.push(format!("{rule}\n    got  {got}\n    want {want}"));
            }
        }
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    }

    #[test]
    fn a_short_claim_idle_shortens_the_counted_retry_to_half_of_it() {
        let limits = Limits::new(MAX, Duration::from_millis(200));
        assert_eq!(limits.retry_wait(1), Duration::from_millis(100));
        assert_eq!(limits.retry_wait(9), Duration::from_millis(100));
        assert_eq!(limits.max_refunds, MAX_REFUNDS);
        assert_eq!(limits.max_deliveries, MAX);
    }
}
