//! The consumer's loop: one pass takes work and delivers it; passes repeat until shutdown,
//! pausing after a failed one.

use tokio::time::Instant;

use super::WorkerServices;
use super::consumer::{Consumer, WorkerError};
use super::gate::{MODEL, PAUSED};
use crate::shutdown::Shutdown;
use crate::stream::consumer_group as group;

impl Consumer {
    /// One pass, settled: [`Self::pass`], then waiting for the commit and acknowledgement
    /// of its last delivery, so everything the pass took is settled when it returns.
    /// Returns how many entries were taken.
    pub async fn run_once(&mut self) -> Result<usize, WorkerError> {
        let taken = self.pass().await?;
        self.finish().await?;
        Ok(taken)
    }

    /// Wait for the commit and acknowledgement of this consumer's last delivery, if they
    /// are still going on, and settle what they left (`finishing.rs`).
    pub async fn finish(&mut self) -> Result<(), WorkerError> {
        if self.finisher.is_some() {
            let mut conn = self.connection().await?;
            self.finish_pending(&mut conn).await?;
            self.conn = Some(conn);
        }
        Ok(())
    }

    /// One pass. First, what the finisher of an earlier delivery left, if it has ended.
    /// With the gate closed (a dependency is down), probe what this consumer can probe and
    /// take nothing while it stays down: `WorkerError::Paused`. Otherwise retry one held
    /// entry, else take over an entry idle past `claim_idle`, else wait up to `block` for
    /// a new one; deliver what was taken, whose commit and acknowledgement may go on after
    /// the pass (`finishing.rs`). Returns how many entries were taken.
    pub async fn pass(&mut self) -> Result<usize, WorkerError> {
        if self.finisher_ended() {
            self.finish().await?;
        }
        self.check_gate().await?;
        let mut conn = self.connection().await?;
        let taken = self.take(&mut conn).await?;
        let n = taken.len();
        for taken in taken {
            // Redis failed mid-delivery: the entry is still ours, and `deliver` held it to
            // retry what was left once Redis answers.
            self.deliver(&mut conn, taken).await?;
        }
        self.conn = Some(conn);
        Ok(n)
    }

    /// The connection of the last pass, unless it failed: every checkout from the pool
    /// costs a round trip of its own (UNWATCH and PING, the pool's health check), a
    /// quarter of a job's requests when each pass took one. A connection that fails is
    /// dropped with the error, so the next pass checks out a fresh, checked one.
    async fn connection(&mut self) -> Result<crate::infra::redis::Conn, WorkerError> {
        match self.conn.take() {
            Some(conn) => Ok(conn),
            None => Ok(self.services.redis.get().await?),
        }
    }
}

/// Run one consumer until shutdown. Shutdown is checked between passes: no new work is
/// taken after it, and the job in hand (and the commit of the one before) may finish until
/// just before the grace period ends;
/// then it is cut short and its delivery refunded (it was never allowed to finish), so
/// rolling deploys spend no job's deliveries.
pub async fn run(
    services: WorkerServices,
    name: String,
    shutdown: Shutdown,
) -> Result<(), WorkerError> {
    let metrics = services.metrics.clone();
    let gate = services.gate.clone();
    let mut consumer = Consumer::new(services.clone(), name);
    consumer.stop_on(shutdown.clone(), services.settings.shutdown.grace);
    let alive = consumer.keep_alive();
    let mut failures: u32 = 0;
    let mut group_ready = false;
    let mut next_maintenance = Instant::now();
    tracing::info!(consumer = %consumer.name(), "consumer started");
    while !shutdown.is_triggered() {
        let result = async {
            if !group_ready {
                consumer.ensure_group().await?;
                group_ready = true;
            }
            if Instant::now() >= next_maintenance {
                next_maintenance = Instant::now() + consumer.config.maintenance_every();
                consumer.maintain().await?;
            }
            consumer.pass().await
        }
        .await;
        match result {
            Ok(_) => {
                failures = 0;
                metrics.loop_succeeded("worker");
            }
            Err(e) => {
                // Waiting out a model outage is the loop doing its job: every provider's
                // breaker is open, which restarting this process would not fix, so it
                // does not count against readiness (`/readyz` shows the breakers). Nor does
                // a pause an operator asked for: a paused fleet is healthy, and taking its
                // pods out of service would only restart them.
                if !matches!(
                    e,
                    WorkerError::Paused {
                        dependency: MODEL | PAUSED,
                        ..
                    }
                ) {
                    metrics.loop_failed("worker", e.kind(), &e.to_string());
                }
                let wait = e.wait(failures);
                failures = failures.saturating_add(1);
                if matches!(e, WorkerError::Paused { .. }) {
                    // The gate logged the outage once; a line per probe would only be noise.
                    tracing::debug!(consumer = %consumer.name(), error = %e, "consumer paused");
                } else {
                    tracing::warn!(consumer = %consumer.name(), error = %e, retry_in_ms = wait.as_millis() as u64, "consumer pass failed");
                    // The group may be gone (Redis restarted without persistence): recreate it.
                    group_ready = false;
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = gate.reopened() => {}
                    _ = shutdown.wait() => {}
                }
            }
        }
    }
    // The last delivery's commit and acknowledgement, which a shutdown cuts short at the
    // same moment as a delivery.
    if let Err(e) = consumer.finish().await {
        tracing::warn!(consumer = %consumer.name(), error = %e, "could not settle the last delivery; it is redelivered");
    }
    drop(alive);
    // A clean stop: the consumer's mark goes with it, so cleanup need not wait for it to
    // lapse. Best effort; the mark expires by itself anyway.
    if let Ok(mut conn) = services.redis.get().await {
        for keys in services.keys.all() {
            let _ = group::clear_alive(&mut conn, keys, consumer.name()).await;
        }
    }
    tracing::info!(consumer = %consumer.name(), "consumer stopped");
    Ok(())
}
