//! The delivery accounting as decisions without I/O: whether a delivery runs its job, and
//! what its end means for the entry (acknowledge, leave pending, refund and hold,
//! dead-letter). `delivery.rs` finds out what happened and `complete.rs` carries the
//! decision out; the rules are `docs/delivery.md`, and the table test below has a row for
//! each of them, so a change to the accounting has to change a row.

use super::dead_reason::DeadReason;
use super::handler::JobOutcome;

/// The limits the accounting applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Deliveries after which a job is dead-lettered instead of run again.
    pub(crate) max_deliveries: u64,
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
    /// The job was tried and failed in a way every delivery repeats (the model refused the
    /// request, Postgres refused the data).
    Rejected(DeadReason),
    /// The delivery stopped at a dependency before the job was tried to the end.
    Unavailable {
        dependency: &'static str,
        reason: String,
        probe: Probe,
    },
    /// Out of deliveries, and an earlier delivery had committed the summary.
    CommittedEarlier,
    /// Out of deliveries, and nothing was committed.
    Exhausted,
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
    /// The dependency is down and the job was not tried: close the gate under the
    /// dependency, refund the delivery and hold the entry until the dependency is back.
    RefundAndHold {
        dependency: &'static str,
        /// Why the probe says it is down.
        down: String,
        /// Why the delivery stopped.
        reason: String,
    },
    /// The dependency answers again, so the failure may be the job's own: hold the entry
    /// and retry it soon as a delivery that counts.
    RetryCounted {
        dependency: &'static str,
        reason: String,
    },
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

/// Why an entry is left pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pending {
    /// The job failed transiently.
    Failed(String),
    /// Whether an out-of-deliveries job was committed could not be learned.
    Unchecked(String),
}

/// Decide what `outcome` means for the entry.
pub(crate) fn settle(outcome: Outcome, limits: &Limits) -> Settlement {
    match outcome {
        Outcome::Finished(JobOutcome::Done) => Settlement::Ack(Finish::Summarised),
        Outcome::Finished(JobOutcome::Duplicate) => Settlement::Ack(Finish::Duplicate),
        Outcome::Failed(reason) => Settlement::LeavePending(Pending::Failed(reason)),
        Outcome::Rejected(reason) => Settlement::DeadLetter(reason),
        Outcome::Unavailable {
            dependency,
            reason,
            probe: Probe::Down(down),
        } => Settlement::RefundAndHold {
            dependency,
            down,
            reason,
        },
        Outcome::Unavailable {
            dependency,
            reason,
            probe: Probe::Answers,
        } => Settlement::RetryCounted { dependency, reason },
        Outcome::CommittedEarlier => Settlement::Ack(Finish::AckLost),
        Outcome::Exhausted => Settlement::DeadLetter(DeadReason::exhausted(limits.max_deliveries)),
        Outcome::Unchecked(reason) => Settlement::LeavePending(Pending::Unchecked(reason)),
    }
}

/// How re-claiming an entry this consumer holds (`claim_own`) moves its delivery count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recount {
    /// The delivery did not try the job: take it back.
    Refund,
    /// The count stays: a running delivery extending its claim, or a retry that takes the
    /// place of a delivery that was not refunded.
    Keep,
    /// The retry of a refunded delivery tries the job: it is a delivery of its own.
    Count,
}

impl Recount {
    /// The `adjust` argument of `claim_own`.
    pub(crate) fn delta(self) -> i64 {
        match self {
            Recount::Refund => -1,
            Recount::Keep => 0,
            Recount::Count => 1,
        }
    }
}

/// What became of a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refund {
    Refunded,
    /// The entry is no longer pending for this consumer (finished, or reclaimed elsewhere).
    NotOurs,
    /// Redis did not answer.
    Failed,
}

/// How the retry of a held entry counts after its refund; `None`: not ours to retry.
pub(crate) fn retry_after(refund: Refund) -> Option<Recount> {
    match refund {
        Refund::Refunded => Some(Recount::Count),
        // The refund did not happen, so the retry must not count instead: the same in the end.
        Refund::Failed => Some(Recount::Keep),
        Refund::NotOurs => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::gate::{MODEL, POSTGRES};

    const LIMITS: Limits = Limits { max_deliveries: 3 };

    /// One decision the accounting makes, with what it must come to.
    enum Case {
        Admit(u64, Admission),
        Settle(Outcome, Settlement),
        RetryAfter(Refund, Option<Recount>),
        Delta(Recount, i64),
    }
    use Case::*;

    fn reason(tenant: &str) -> DeadReason {
        DeadReason {
            tenant: tenant.into(),
            operator: format!("{tenant}: detail"),
        }
    }

    fn unavailable(dependency: &'static str, probe: Probe) -> Outcome {
        Outcome::Unavailable {
            dependency,
            reason: "connection refused".into(),
            probe,
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
                "XAUTOCLAIM takes over an entry idle past `claim_idle` | yes (Redis adds 1): \
                 a job that has not had `max_deliveries` yet runs",
                Admit(LIMITS.max_deliveries, Admission::Run),
            ),
            (
                "after `SUMMARYD_WORKER_MAX_DELIVERIES` of them the job is dead-lettered",
                Admit(LIMITS.max_deliveries + 1, Admission::GiveUp),
            ),
            (
                "after `SUMMARYD_WORKER_MAX_DELIVERIES` of them the job is dead-lettered \
                 (with why, in the tenant's wording)",
                Settle(
                    Outcome::Exhausted,
                    Settlement::DeadLetter(DeadReason::exhausted(LIMITS.max_deliveries)),
                ),
            ),
            (
                "the model fails transiently past the in-process attempts … or the budget \
                 runs out, and some provider's breaker is still closed | yes | leave it \
                 pending; XAUTOCLAIM redelivers it after `claim_idle`",
                Settle(
                    Outcome::Failed("HTTP 503".into()),
                    Settlement::LeavePending(Pending::Failed("HTTP 503".into())),
                ),
            ),
            (
                "the model fails as the job's fault (400, 413, 422, input too long) | yes | \
                 dead-letter at once",
                Settle(
                    Outcome::Rejected(reason("the model rejected the request (HTTP 400)")),
                    Settlement::DeadLetter(reason("the model rejected the request (HTTP 400)")),
                ),
            ),
            (
                "every model provider's circuit breaker is open (before or during the \
                 delivery) | **no** | refund the delivery, close the gate under `model`, \
                 hold the entry",
                Settle(
                    unavailable(MODEL, Probe::Down("every breaker is open".into())),
                    Settlement::RefundAndHold {
                        dependency: MODEL,
                        down: "every breaker is open".into(),
                        reason: "connection refused".into(),
                    },
                ),
            ),
            (
                "Postgres fails before the model was called (the pre-check) or at the \
                 commit, and a probe confirms it is down | **no** | refund the delivery, \
                 close the gate, hold the entry",
                Settle(
                    unavailable(POSTGRES, Probe::Down("no connection".into())),
                    Settlement::RefundAndHold {
                        dependency: POSTGRES,
                        down: "no connection".into(),
                        reason: "connection refused".into(),
                    },
                ),
            ),
            (
                "the same, but Postgres answers the probe at once | yes | the failure may \
                 be the job's own: retry it promptly as another counted delivery",
                Settle(
                    unavailable(POSTGRES, Probe::Answers),
                    Settlement::RetryCounted {
                        dependency: POSTGRES,
                        reason: "connection refused".into(),
                    },
                ),
            ),
            (
                "a job that fails with 401/403/404 right after its provider's probe passed \
                 is at fault itself: its delivery counts (CONTRACT §6, `docs/providers.md`)",
                Settle(
                    unavailable(MODEL, Probe::Answers),
                    Settlement::RetryCounted {
                        dependency: MODEL,
                        reason: "connection refused".into(),
                    },
                ),
            ),
            (
                "Postgres refuses the job's data (SQLSTATE class 22 or 23) | yes | \
                 dead-letter at once",
                Settle(
                    Outcome::Rejected(reason("the summary could not be stored")),
                    Settlement::DeadLetter(reason("the summary could not be stored")),
                ),
            ),
            (
                "Redis fails mid-delivery (reading the count, acknowledging, dead-lettering) \
                 | **no** | hold the entry; its retry after Redis answers takes this \
                 delivery's place (no extra count)",
                Delta(Recount::Keep, 0),
            ),
            (
                "If Redis is down too and the refund cannot happen, the retry does not count \
                 instead (`claim_own(…, 0)`)",
                RetryAfter(Refund::Failed, Some(Recount::Keep)),
            ),
            (
                "a running delivery extends its claim | no | `claim_own(…, 0)` only resets \
                 the idle time",
                Delta(Recount::Keep, 0),
            ),
            (
                "The delivery that met the outage is refunded: `claim_own(…, -1)`",
                Delta(Recount::Refund, -1),
            ),
            (
                "a consumer's held entry is handed to it again after a refund | yes (+1, \
                 after the −1)",
                RetryAfter(Refund::Refunded, Some(Recount::Count)),
            ),
            (
                "a consumer's held entry is handed to it again after a refund | yes (+1, \
                 after the −1): `claim_own(…, 1)`",
                Delta(Recount::Count, 1),
            ),
            (
                "[the refund] first checks the entry is still pending for this consumer (a \
                 plain XCLAIM would take it from whoever reclaimed it meanwhile)",
                RetryAfter(Refund::NotOurs, None),
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
                    Settlement::Ack(Finish::Summarised),
                ),
            ),
            (
                "the summary is committed (by an earlier or a concurrent delivery)",
                Settle(
                    Outcome::Finished(JobOutcome::Duplicate),
                    Settlement::Ack(Finish::Duplicate),
                ),
            ),
            // What follows is not in the page's table; each row quotes the comment that
            // says why.
            (
                "Out of deliveries. A job whose summary is committed is done however often \
                 its ack was lost, so it is acknowledged, not dead-lettered.",
                Settle(Outcome::CommittedEarlier, Settlement::Ack(Finish::AckLost)),
            ),
            (
                "cannot check for a summary; will be redelivered",
                Settle(
                    Outcome::Unchecked("permission denied".into()),
                    Settlement::LeavePending(Pending::Unchecked("permission denied".into())),
                ),
            ),
        ]
    }

    #[test]
    fn the_accounting_follows_docs_delivery_md() {
        let mut wrong = Vec::new();
        for (rule, case) in table() {
            let (got, want) = match case {
                Admit(deliveries, want) => (
                    format!("{:?}", admit(deliveries, &LIMITS)),
                    format!("{want:?}"),
                ),
                Settle(outcome, want) => (
                    format!("{:?}", settle(outcome, &LIMITS)),
                    format!("{want:?}"),
                ),
                RetryAfter(refund, want) => {
                    (format!("{:?}", retry_after(refund)), format!("{want:?}"))
                }
                Delta(recount, want) => (recount.delta().to_string(), want.to_string()),
            };
            if got != want {
                wrong.push(format!("{rule}\n    got  {got}\n    want {want}"));
            }
        }
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    }
}
