//! How the worker's batchers (group commit, `committer.rs`; batched acknowledgements,
//! `acker.rs`) gather their requests: whatever is queued, up to a maximum, and then, for a
//! batch that is not full, at most a given wait for more, unless no delivery that could
//! send one is left. While a batch is being written the next one queues, so batches grow
//! with the load without any wait at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

/// How a batch is gathered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most requests in one batch; 1 means no batching (each request written alone, by
    /// its own caller).
    pub max: usize,
    /// How long a batch that is not full waits for more once it has one.
    pub wait: Duration,
}

impl Batching {
    /// Whether requests are batched at all.
    pub(super) fn batches(&self) -> bool {
        self.max > 1
    }
}

/// The deliveries that may still send a batcher a request. Each holds a [`Joining`] from
/// before it could (before its model call) until just before it sends, or until it ends
/// without sending. When none is left, a batch holds every request that could come, and
/// waiting for more would only add latency: a lone job at low load, or every consumer of
/// a draining process, is written at once.
#[derive(Debug, Default)]
pub struct Joiners {
    count: AtomicUsize,
    none_left: Notify,
}

impl Joiners {
    /// One more delivery that may send a request, until the returned guard is dropped.
    pub(super) fn join(self: &Arc<Self>) -> Joining {
        self.count.fetch_add(1, Ordering::AcqRel);
        Joining(self.clone())
    }

    fn none(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// Returns once no delivery may send a request any more.
    async fn none_left(&self) {
        let notified = self.none_left.notified();
        tokio::pin!(notified);
        // Registered before the count is read, so a last leave in between still wakes it.
        notified.as_mut().enable();
        if !self.none() {
            notified.await;
        }
    }
}

/// A delivery that may still send a batcher a request: dropped just before it sends (so
/// a batch closed in between only misses it, and it goes in the next one) or when the
/// delivery ends without one.
#[must_use = "the batcher waits for a delivery only while its Joining is held"]
#[derive(Debug)]
pub struct Joining(Arc<Joiners>);

impl Drop for Joining {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_left.notify_waiters();
        }
    }
}

/// Add what is queued to `batch`, then wait for more until it holds `batching.max` or
/// `batching.wait` has passed since this call, whichever comes first, or until none of
/// `joiners` is left to send one. Returns early when every sender is gone.
pub(super) async fn gather<T>(
    requests: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    batching: Batching,
    joiners: Option<&Joiners>,
) {
    let deadline = Instant::now() + batching.wait;
    let none_left = async {
        match joiners {
            Some(joiners) => joiners.none_left().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(none_left);
    while batch.len() < batching.max {
        match requests.try_recv() {
            Ok(request) => batch.push(request),
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                if joiners.is_some_and(Joiners::none) {
                    return;
                }
                tokio::select! {
                    // A request already sent goes in before the batch closes.
                    biased;
                    got = tokio::time::timeout_at(deadline, requests.recv()) => match got {
                        Ok(Some(request)) => batch.push(request),
                        // Every sender gone, or the wait is over: write what there is.
                        Ok(None) | Err(_) => return,
                    },
                    () = &mut none_left => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn gathered(queued: usize, max: usize, wait_ms: u64, later: usize) -> usize {
        let (tx, mut rx) = mpsc::channel(64);
        for i in 0..queued {
            tx.send(i).await.unwrap();
        }
        let sender = tokio::spawn(async move {
            for i in 0..later {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if tx.send(i).await.is_err() {
                    break;
                }
            }
        });
        let mut batch = Vec::new();
        gather(
            &mut rx,
            &mut batch,
            Batching {
                max,
                wait: Duration::from_millis(wait_ms),
            },
            None,
        )
        .await;
        sender.abort();
        batch.len()
    }

    /// A batch of at most 8 with a wait of `wait_ms`, gathered while `later` deliveries
    /// that may still send (each holding a `Joining`) send their request after 10, 20, …
    /// ms, except the last `leave` of them, which end without sending (each 10 ms after
    /// the one before). Returns the batch's size and how long the gathering took.
    async fn gathered_with_joiners(
        queued: usize,
        later: usize,
        leave: usize,
        wait_ms: u64,
    ) -> (usize, Duration) {
        let (tx, mut rx) = mpsc::channel(64);
        let joiners = Arc::new(Joiners::default());
        for i in 0..queued {
            tx.send(i).await.unwrap();
        }
        let guards: Vec<Joining> = (0..later).map(|_| joiners.join()).collect();
        let sender = tokio::spawn(async move {
            for (i, guard) in guards.into_iter().enumerate() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(guard);
                if i < later - leave {
                    tx.send(100 + i).await.unwrap();
                }
            }
            // Keep the channel open, as a running process does.
            std::future::pending::<()>().await;
        });
        let started = Instant::now();
        let mut batch = Vec::new();
        let batching = Batching {
            max: 8,
            wait: Duration::from_millis(wait_ms),
        };
        gather(&mut rx, &mut batch, batching, Some(&joiners)).await;
        sender.abort();
        (batch.len(), started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_delivery_left_to_send_a_batch_waits_for_nothing() {
        assert_eq!(
            gathered_with_joiners(3, 0, 0, 1_000).await,
            (3, Duration::ZERO),
            "a lone job, or every job of a drain, is written at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_for_the_deliveries_that_may_still_send_and_no_longer() {
        assert_eq!(
            gathered_with_joiners(1, 3, 0, 1_000).await,
            (4, Duration::from_millis(30)),
            "closed by the last one's request, not by the wait"
        );
        assert_eq!(
            gathered_with_joiners(1, 3, 1, 1_000).await,
            (3, Duration::from_millis(30)),
            "closed when the last one ends without a request"
        );
        assert_eq!(
            gathered_with_joiners(1, 2, 2, 1_000).await,
            (1, Duration::from_millis(20)),
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deliveries_that_may_still_send_never_hold_a_batch_past_its_wait_or_size() {
        // 9 later requests, 10 ms apart: the batch of 8 is full at the 7th, at 70 ms.
        assert_eq!(
            gathered_with_joiners(1, 9, 0, 1_000).await,
            (8, Duration::from_millis(70))
        );
        // One delivery still in hand, whose request comes at 10 ms: a 5 ms wait ends first.
        assert_eq!(
            gathered_with_joiners(1, 1, 0, 5).await,
            (1, Duration::from_millis(5))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_what_is_queued_up_to_its_maximum() {
        assert_eq!(gathered(5, 8, 0, 0).await, 5);
        assert_eq!(gathered(12, 8, 0, 0).await, 8);
        assert_eq!(
            gathered(8, 8, 1_000, 3).await,
            8,
            "a full batch waits for nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_is_not_full_waits_at_most_its_wait() {
        // Requests arrive every 10 ms: a 35 ms wait takes three of them, none after.
        assert_eq!(gathered(1, 8, 35, 5).await, 4);
        assert_eq!(gathered(1, 8, 0, 5).await, 1, "no wait, no company");
        assert_eq!(
            gathered(1, 3, 1_000, 5).await,
            3,
            "the maximum ends the wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn senders_gone_end_the_gathering() {
        assert_eq!(gathered(2, 8, 1_000, 0).await, 2);
    }

    #[test]
    fn a_maximum_of_one_is_no_batching() {
        let of = |max| Batching {
            max,
            wait: Duration::ZERO,
        };
        assert!(!of(1).batches());
        assert!(of(2).batches());
    }
}
