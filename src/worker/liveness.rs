//! Liveness: a running delivery keeps its entry from looking idle, and a live consumer keeps
//! its mark, so neither is taken for dead; consumers that are gone are removed.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::consumer::{Consumer, ERROR_BACKOFF, Ran, WorkerError};
use crate::infra::keys::Shards;
use crate::shutdown::Shutdown;
use crate::stream::consumer_group::{self as group, ClaimCount, Delivery};

impl Consumer {
    /// Run `work` (one delivery) while re-claiming its entry every `extend_every`, so the
    /// entry never looks idle to XAUTOCLAIM while the delivery runs: a delivery slower than
    /// `claim_idle` is neither reclaimed nor dead-lettered under it, and `claim_idle`
    /// only bounds how soon a dead worker's job is picked up. The re-claim is owner-checked
    /// (`group::claim_own`): an entry that was taken from us meanwhile stays with its taker,
    /// and the delivery stops there, so it does not go on paying for a model call that is
    /// now someone else's. A shutdown lets it run until just before the grace period ends.
    pub(super) async fn with_claim_extended<T>(
        &self,
        conn: &mut crate::infra::redis::Conn,
        delivery: &Delivery,
        work: impl Future<Output = T>,
    ) -> Ran<T> {
        self.claimant()
            .extend_while(ClaimConn::Held(conn), delivery, work)
            .await
    }

    /// What extending this consumer's claims needs, owned, so a delivery's commit can go
    /// on extending its claim after the consumer took its next job (`finishing.rs`).
    pub(super) fn claimant(&self) -> Claimant {
        Claimant {
            keys: self.services.keys.clone(),
            name: self.name.clone(),
            every: self.config.extend_every(),
            stop: self.stop.clone(),
        }
    }

    /// Remove consumers that are gone, at the cadence `consumer_gc` asks for (the
    /// maintenance task runs the same cleanup at its own, usually longer, interval).
    pub(crate) async fn maintain(&self) -> Result<(), WorkerError> {
        let mut conn = self.services.redis.get().await?;
        let mut removed = Vec::new();
        for keys in self.services.keys.all() {
            removed.extend(
                group::remove_idle_consumers(&mut conn, keys, &self.name, self.config.consumer_gc)
                    .await?,
            );
        }
        if !removed.is_empty() {
            tracing::info!(consumers = ?removed, "removed gone consumers with nothing pending");
        }
        Ok(())
    }

    /// Keep this consumer's liveness mark fresh until the returned guard is dropped (the
    /// consumer stops, or the process dies and takes the task with it).
    pub(crate) fn keep_alive(&self) -> AliveMark {
        let (services, name) = (self.services.clone(), self.name.clone());
        let ttl = self.config.consumer_gc.max(Duration::from_millis(1));
        let every = self.config.mark_every();
        AliveMark(tokio::spawn(async move {
            loop {
                let marked = async {
                    let mut conn = services.redis.get().await?;
                    for keys in services.keys.all() {
                        group::mark_alive(&mut conn, keys, &name, ttl).await?;
                    }
                    Ok::<(), WorkerError>(())
                }
                .await;
                // After a failure (Redis down) try again soon: the mark may have lapsed.
                let wait = match marked {
                    Ok(()) => every,
                    Err(_) => every.min(ERROR_BACKOFF.base),
                };
                tokio::time::sleep(wait).await;
            }
        }))
    }
}

/// Refreshes a consumer's liveness mark while it lives; stops when dropped.
pub(crate) struct AliveMark(tokio::task::JoinHandle<()>);

impl Drop for AliveMark {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where a claim extension gets its Redis connection.
pub(super) enum ClaimConn<'a> {
    /// The consumer's own, idle while its delivery runs.
    Held(&'a mut crate::infra::redis::Conn),
    /// One from the pool, checked out only when an extension is due: a commit that
    /// finishes within `extend_every` (nearly all) costs Redis nothing.
    Pool(&'a crate::infra::redis::RedisPool),
}

/// A consumer's claims, as the extension of one delivery needs them.
pub(super) struct Claimant {
    keys: Shards,
    name: String,
    every: Duration,
    stop: Option<(Shutdown, Duration)>,
}

impl Claimant {
    /// [`Consumer::with_claim_extended`], with the connection `conn` gives.
    pub(super) async fn extend_while<T>(
        &self,
        mut conn: ClaimConn<'_>,
        delivery: &Delivery,
        work: impl Future<Output = T>,
    ) -> Ran<T> {
        let mut work = std::pin::pin!(work);
        let mut next = Instant::now() + self.every;
        let stop = self.stop.clone();
        let mut cut_short = std::pin::pin!(async move {
            match stop {
                Some((shutdown, after)) => {
                    shutdown.wait().await;
                    tokio::time::sleep(after).await;
                }
                None => std::future::pending::<()>().await,
            }
        });
        let mut checked_out = None;
        loop {
            tokio::select! {
                out = &mut work => return Ran::Finished(out),
                () = &mut cut_short => {
                    tracing::warn!("shutdown grace nearly over: cutting the delivery short");
                    return Ran::CutShort;
                }
                () = tokio::time::sleep_until(next) => {
                    next = Instant::now() + self.every;
                    match self.extend(&mut conn, &mut checked_out, delivery).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!("entry no longer pending for this consumer: stopping its delivery");
                            return Ran::ClaimLost;
                        }
                        Err(e) => tracing::warn!(error = %e, "could not extend the claim of a running delivery"),
                    }
                }
            }
        }
    }

    async fn extend(
        &self,
        conn: &mut ClaimConn<'_>,
        checked_out: &mut Option<crate::infra::redis::Conn>,
        delivery: &Delivery,
    ) -> Result<bool, WorkerError> {
        let keys = self.keys.get(delivery.shard);
        let conn = match conn {
            ClaimConn::Held(conn) => &mut **conn,
            ClaimConn::Pool(pool) => match checked_out {
                Some(conn) => conn,
                None => checked_out.insert(pool.get().await?),
            },
        };
        let claimed = group::claim_own(conn, keys, &self.name, delivery, ClaimCount::Keep).await;
        if claimed.is_err() {
            // A connection that failed is not used again.
            *checked_out = None;
        }
        Ok(claimed?.is_some())
    }
}
