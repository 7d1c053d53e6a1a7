//! Whether Redis holds work under a shard layout other than the one configured: changing
//! `SUMMARYD_STREAM_SHARDS` (or moving to a cluster, which tags even one shard) on a
//! deployment with queued, pending or dead-lettered jobs would leave them where no consumer
//! and no operator command looks. A process refuses to start then, naming the layout that
//! holds them; the way to change the count is to drain first (`docs/scaling.md`).

use redis::aio::ConnectionLike;

use crate::config::stream::MAX_SHARDS;
use crate::infra::keys::{RedisKeys, Shards};

/// Work left under a layout this process does not use.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "Redis holds {entries} job entries (queued, pending or dead-lettered) under {layout}, \
         but SUMMARYD_STREAM_SHARDS={shards}{cluster} would never read them: start with the \
         shard count they were written with, drain (no queued, pending or dead-lettered job), \
         then change it (docs/scaling.md, \"Changing the shard count\")"
    )]
    Stranded {
        layout: String,
        entries: u64,
        shards: usize,
        cluster: &'static str,
    },
    #[error("could not check Redis for jobs under another shard layout: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Refuse when another layout's streams, lanes or dead letters hold anything. One key at a
/// time (each its own slot on a cluster); at most a few hundred small reads, at startup.
pub async fn refuse_stranded<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    prefix: &str,
    current: &Shards,
    cluster: bool,
) -> Result<(), LayoutError> {
    for (layout, keys) in others(prefix, current) {
        let entries = held(conn, &keys).await?;
        if entries > 0 {
            return Err(LayoutError::Stranded {
                layout,
                entries,
                shards: current.count(),
                cluster: if cluster { " on a cluster" } else { "" },
            });
        }
    }
    Ok(())
}

/// Every layout's shard keys that the current layout does not have, with a name for each.
fn others(prefix: &str, current: &Shards) -> Vec<(String, RedisKeys)> {
    let in_use: Vec<String> = current.all().iter().map(RedisKeys::stream).collect();
    let untagged = RedisKeys::new(prefix);
    let mut all = vec![("the unsharded key names".to_owned(), untagged)];
    let tagged = Shards::new(prefix, MAX_SHARDS, true);
    all.extend(
        tagged
            .all()
            .iter()
            .map(|keys| (format!("shard {{s{}}}", keys.shard()), keys.clone())),
    );
    all.into_iter()
        .filter(|(_, keys)| !in_use.contains(&keys.stream()))
        .collect()
}

/// Entries on the shard's job stream and dead letters, and tenants with a non-empty lane.
async fn held<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
) -> redis::RedisResult<u64> {
    let mut total = 0;
    for key in [keys.stream(), keys.dead_letters()] {
        let n: u64 = redis::cmd("XLEN").arg(key).query_async(conn).await?;
        total += n;
    }
    let lanes: u64 = redis::cmd("ZCARD")
        .arg(keys.lanes())
        .query_async(conn)
        .await?;
    Ok(total + lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_other_layout_is_checked_and_the_current_one_never() {
        let one = Shards::new("p:", 1, false);
        let names: Vec<String> = others("p:", &one)
            .into_iter()
            .map(|(_, k)| k.stream())
            .collect();
        assert_eq!(names.len(), usize::from(MAX_SHARDS));
        assert!(!names.contains(&"p:jobs:summaries".to_owned()));
        assert!(names.contains(&"p:{s0}jobs:summaries".to_owned()));

        let three = Shards::new("p:", 3, false);
        let names: Vec<String> = others("p:", &three)
            .into_iter()
            .map(|(_, k)| k.stream())
            .collect();
        assert_eq!(names.len(), usize::from(MAX_SHARDS) + 1 - 3);
        assert!(names.contains(&"p:jobs:summaries".to_owned()));
        assert!(names.contains(&"p:{s3}jobs:summaries".to_owned()));
        for s in 0..3 {
            assert!(!names.contains(&format!("p:{{s{s}}}jobs:summaries")));
        }
    }
}
