//! The fleet-wide pause of consumption in Redis: one key ([`RedisKeys::paused`]) holding the
//! [`Pause`] as a JSON string while consumption is paused, absent otherwise. No expiry: a
//! pause lasts until someone resumes, across restarts of every process (and of Redis, as far
//! as its persistence keeps keys). Written by `summaryd pause` / `resume` and the console,
//! read every second by every worker process.

use redis::AsyncCommands;
use redis::aio::ConnectionLike;

use crate::domain::Pause;
use crate::infra::keys::RedisKeys;

/// Pause consumption. Returns true when this call paused it, false when it was paused
/// already: the pause in place is kept as it was (SET NX), so the first pauser and time
/// stay on record however many people pause during one incident; whoever wants their own
/// reason recorded resumes first.
pub async fn pause<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    pause: &Pause,
) -> redis::RedisResult<bool> {
    conn.set_nx(keys.paused(), encode(pause)).await
}

/// Resume consumption. Returns the pause that was cleared (read and removed in one step,
/// GETDEL), or `None` when consumption was not paused.
pub async fn resume<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<Option<Pause>> {
    let stored: Option<String> = conn.get_del(keys.paused()).await?;
    Ok(stored.map(|text| decode(&text)))
}

/// The pause in place, if any. A stored value that does not parse counts as a pause by
/// [`Pause::UNKNOWN_BY`] (logged): when in doubt the workers stay stopped, since someone
/// evidently meant to stop them, and `resume` clears it.
pub async fn current<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<Option<Pause>> {
    let stored: Option<String> = conn.get(keys.paused()).await?;
    Ok(stored.map(|text| decode(&text)))
}

fn encode(pause: &Pause) -> String {
    // Serialising a struct of strings and a timestamp cannot fail; the fallback keeps the
    // key present (paused) rather than dropping an operator's pause.
    serde_json::to_string(pause).unwrap_or_else(|_| "{}".to_owned())
}

fn decode(text: &str) -> Pause {
    serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the stored pause does not parse; consumption counts as paused until resumed");
        Pause::unreadable(&e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn what_is_written_reads_back_and_garbage_reads_as_paused_by_unknown() {
        let pause = Pause::new("cli:ops@host", Some("incident".into()), Utc::now());
        assert_eq!(decode(&encode(&pause)), pause);
        for garbage in ["", "1", "paused", r#"{"by":"x"}"#] {
            let read = decode(garbage);
            assert_eq!(read.by(), Pause::UNKNOWN_BY, "{garbage:?}");
            assert!(read.reason().is_some(), "{garbage:?}");
        }
    }
}
