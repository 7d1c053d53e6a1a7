//! How the worker's batchers (group commit, `committer.rs`; batched acknowledgements,
//! `acker.rs`) gather their requests: whatever is queued, up to a maximum, and then, for a
//! batch that is not full, at most a given wait for more. While a batch is being written
//! the next one queues, so batches grow with the load without any wait at all.

use std::time::Duration;

use tokio::sync::mpsc;
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

/// Add what is queued to `batch`, then wait for more until it holds `batching.max` or
/// `batching.wait` has passed since this call, whichever comes first. Returns early when
/// every sender is gone.
pub(super) async fn gather<T>(
    requests: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    batching: Batching,
) {
    let deadline = Instant::now() + batching.wait;
    while batch.len() < batching.max {
        match requests.try_recv() {
            Ok(request) => batch.push(request),
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                match tokio::time::timeout_at(deadline, requests.recv()).await {
                    Ok(Some(request)) => batch.push(request),
                    // Every sender gone, or the wait is over: write what there is.
                    Ok(None) | Err(_) => return,
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
        )
        .await;
        sender.abort();
        batch.len()
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
