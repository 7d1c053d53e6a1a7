//! Confirming that writes reached the primary's replicas (`SUMMARYD_REDIS_MIN_REPLICAS_ACK`).
//!
//! Redis replicates asynchronously: a primary that dies takes with it the writes its
//! replicas had not received yet. `WAIT n timeout` blocks until `n` replicas have
//! acknowledged every write the connection it is sent on made so far (Redis remembers,
//! per connection, the replication offset right after that connection's last write), or
//! until the timeout, and answers how many did. Replication is ordered, so a replica that
//! has reached that offset also has every earlier write of every other connection.
//!
//! [`confirm`] is the only place that sends WAIT, so how it is routed (to the primary that
//! owns a key, on a cluster) is decided here and nowhere else.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::config::RedisTlsSettings;
use crate::infra::redis::routed::{Routable, wait_replicas};
use crate::infra::redis::script_call::{ScriptArgs, ScriptCall, is_noscript};

/// How many replicas must confirm a write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAcks {
    pub replicas: u32,
    pub timeout: Duration,
}

impl ReplicaAcks {
    /// `None` when the settings ask for no confirmation (0 replicas): then no WAIT is sent.
    pub fn from_settings(redis: &RedisTlsSettings) -> Option<Self> {
        (redis.min_replicas_ack > 0).then_some(Self {
            replicas: redis.min_replicas_ack,
            timeout: redis.ack_timeout,
        })
    }

    /// The timeout as WAIT takes it: milliseconds, and never 0, which would wait forever.
    fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// `Ok` when `acked` replicas (a WAIT's answer) are as many as asked for.
    pub fn check(&self, acked: u32) -> Result<(), NotReplicated> {
        if acked >= self.replicas {
            Ok(())
        } else {
            Err(NotReplicated::TimedOut {
                acked,
                wanted: self.replicas,
                timeout_ms: self.timeout_ms(),
            })
        }
    }
}

/// The write was made on the primary but not confirmed by enough replicas.
#[derive(Debug, thiserror::Error)]
pub enum NotReplicated {
    #[error("{acked} of {wanted} replicas confirmed the write within {timeout_ms} ms")]
    TimedOut {
        acked: u32,
        wanted: u32,
        timeout_ms: u64,
    },
    /// WAIT itself failed (connection lost, timeout of the client, refused command): the
    /// write may or may not have reached anyone.
    #[error("could not ask the replicas for {wanted} confirmation(s): {source}")]
    Redis {
        wanted: u32,
        #[source]
        source: redis::RedisError,
    },
    /// The value to confirm was no longer on the primary as it had been read: it expired
    /// and was written anew, or the primary that held it failed over to a replica that
    /// never received it. Nothing was confirmed; a retry reads it again.
    #[error(
        "the record to confirm changed on the primary before {wanted} replica(s) could confirm it"
    )]
    Changed { wanted: u32 },
}

impl NotReplicated {
    /// How many replicas were asked for.
    pub fn wanted(&self) -> u32 {
        match self {
            Self::TimedOut { wanted, .. }
            | Self::Redis { wanted, .. }
            | Self::Changed { wanted } => *wanted,
        }
    }
}

/// Wait until `acks.replicas` replicas confirm every write made so far on `conn` (and so
/// every earlier write on the primary), for at most `acks.timeout`.
///
/// `route_key` names the key whose write is being confirmed: on a single Redis node every
/// write has the same primary; on a cluster the WAIT goes to the primary owning that key's
/// slot, the one that took the write.
pub async fn confirm<C: Routable>(
    conn: &mut C,
    route_key: &str,
    acks: ReplicaAcks,
) -> Result<(), NotReplicated> {
    let acked = wait_replicas(conn, route_key, acks.replicas, acks.timeout)
        .await
        .map_err(|source| NotReplicated::Redis {
            wanted: acks.replicas,
            source,
        })?;
    acks.check(acked)
}

/// Run `invocation` and a WAIT for `acks` right behind it, as one pipeline: one request on
/// one connection, to the node that owns the script's keys (the script's first key routes
/// the pipeline on a cluster; WAIT has no key). Answers the script's reply and the
/// number of replicas WAIT counted; [`ReplicaAcks::check`] judges it.
///
/// Why one pipeline rather than the script and then [`confirm`]: WAIT covers the writes
/// of the connection it arrives on. When a primary dies while a separate WAIT is in
/// flight, the cluster client sends that WAIT again, on a new connection to the promoted
/// replica, where it covers none of the script's writes (which died with the old
/// primary) and is answered at once by whatever replica is connected: a confirmation of
/// writes that no longer exist. A pipeline is resent whole, so the script runs again on
/// the node that answers and the WAIT behind it covers what it wrote there.
///
/// The script is sent as EVALSHA; after a NOSCRIPT (a node's script cache is empty after
/// a restart or a promotion) it is loaded and the whole pipeline sent again.
pub async fn invoke_confirmed<T, C>(
    conn: &mut C,
    call: &ScriptCall,
    acks: ReplicaAcks,
) -> redis::RedisResult<(T, u32)>
where
    T: redis::FromRedisValue,
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    pipe.add_command(call.cmd().clone())
        .cmd("WAIT")
        .arg(acks.replicas)
        .arg(acks.timeout_ms());
    match pipe.query_async(conn).await {
        Err(e) if is_noscript(&e) => {
            call.load(conn).await?;
            pipe.query_async(conn).await
        }
        answered => answered,
    }
}

/// Rewrite `key` with the `value` it holds (same value, same TTL), only if it still holds
/// exactly that; true when it did. It changes nothing a reader can see, but it is a write
/// on this connection, so a [`confirm`] after it covers everything the primary had at that
/// moment, `key`'s original write included.
///
/// Why it is needed: WAIT only covers the writes of the connection it is sent on. A
/// request that only reads a record (a replay of an accept) has written nothing there, or
/// something older than that record, so its WAIT would return at once with the replicas
/// that are connected, whether or not they have the record. The first attempt of the same
/// request may have been refused precisely because they did not.
pub async fn rewrite_unchanged<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    value: &str,
) -> redis::RedisResult<bool> {
    let rewritten: i64 = REWRITE_UNCHANGED
        .key(key)
        .arg(value)
        .invoke_async(conn)
        .await?;
    Ok(rewritten == 1)
}

/// [`rewrite_unchanged`] and its WAIT as one pipeline ([`invoke_confirmed`] says why):
/// `Ok` only when `key` still held `value` on the node that answered and `acks` replicas
/// confirmed it. A key that no longer holds it is [`NotReplicated::Changed`]: after a
/// failover that is a record the promoted primary never received, and answering from
/// the copy read before would confirm a job that no longer exists.
pub async fn confirm_unchanged<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    value: &str,
    acks: ReplicaAcks,
) -> Result<(), NotReplicated> {
    let mut call = ScriptCall::new(&REWRITE_UNCHANGED, &[key]);
    call.arg(value);
    let (rewritten, acked): (i64, u32) =
        invoke_confirmed(conn, &call, acks)
            .await
            .map_err(|source| NotReplicated::Redis {
                wanted: acks.replicas,
                source,
            })?;
    if rewritten != 1 {
        return Err(NotReplicated::Changed {
            wanted: acks.replicas,
        });
    }
    acks.check(acked)
}

/// KEYS[1] the key   ARGV[1] the value it is expected to hold. Compared and rewritten in
/// one step, so a value that changed in between (expired and written anew) is never
/// overwritten with the old one.
static REWRITE_UNCHANGED: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
  return 1
end
return 0
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_replicas_asked_means_no_wait() {
        let mut redis = RedisTlsSettings::default();
        assert_eq!(ReplicaAcks::from_settings(&redis), None);
        redis.min_replicas_ack = 2;
        redis.ack_timeout = Duration::from_millis(250);
        assert_eq!(
            ReplicaAcks::from_settings(&redis),
            Some(ReplicaAcks {
                replicas: 2,
                timeout: Duration::from_millis(250)
            })
        );
    }
}
