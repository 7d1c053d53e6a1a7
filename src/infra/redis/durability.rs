//! Redis holds every accepted job until a worker has stored its summary, so its persistence
//! and eviction settings decide whether "accepted" means "will be done". They are read at
//! startup (API and worker roles) and each risk is logged as a warning naming the setting;
//! `docs/operations.md` (Redis durability) says what each one means.

use std::collections::HashMap;

use tracing::{info, warn};

/// The settings read, in one `CONFIG GET` (Redis 7 accepts several patterns).
const SETTINGS: [&str; 4] = ["appendonly", "appendfsync", "save", "maxmemory-policy"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Risk {
    /// The Redis setting to change.
    pub(crate) setting: &'static str,
    pub(crate) message: String,
}

/// What could happen to accepted jobs under `config` (an empty list: nothing known).
pub(crate) fn assess(config: &HashMap<String, String>) -> Vec<Risk> {
    let get = |k: &str| config.get(k).map(String::as_str);
    let mut risks = Vec::new();
    let aof = get("appendonly") == Some("yes");
    let rdb = get("save").is_some_and(|s| !s.trim().is_empty());
    if !aof && !rdb {
        risks.push(Risk {
            setting: "appendonly",
            message: "Redis persists nothing (appendonly no and save \"\"): every queued job \
                      is lost when Redis restarts; set appendonly yes"
                .into(),
        });
    } else if !aof {
        risks.push(Risk {
            setting: "appendonly",
            message: format!(
                "Redis persists only RDB snapshots (appendonly no, save \"{}\"): jobs accepted \
                 since the last snapshot are lost when Redis restarts; set appendonly yes",
                get("save").unwrap_or_default()
            ),
        });
    } else if get("appendfsync") == Some("no") {
        risks.push(Risk {
            setting: "appendfsync",
            message: "appendfsync no: the kernel flushes the AOF when it likes (about every \
                      30 s), so a host crash loses the jobs accepted in that window; use \
                      everysec (at most 1 s) or always"
                .into(),
        });
    }
    if let Some(policy) = get("maxmemory-policy")
        && policy != "noeviction"
    {
        risks.push(Risk {
            setting: "maxmemory-policy",
            message: format!(
                "maxmemory-policy {policy}: under memory pressure Redis may evict the job \
                 stream or idempotency keys, losing accepted jobs; set noeviction (writes \
                 then fail and the API answers 503 instead)"
            ),
        });
    }
    risks
}

/// Read the settings over `conn` and log what they risk; when `CONFIG` is refused (managed
/// Redis usually renames or forbids it), say once that nothing could be checked.
pub async fn report<C: redis::aio::ConnectionLike + Send>(conn: &mut C) {
    let reply: redis::RedisResult<HashMap<String, String>> = config_get().query_async(conn).await;
    log(reply, None);
}

/// [`report`] for each master of a cluster (each holds a share of the jobs), naming the
/// node in every line.
pub async fn report_masters(conn: &mut redis::cluster_async::ClusterConnection) {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
    let reply = conn
        .route_command(
            config_get(),
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await
        .and_then(|v| {
            Ok(redis::from_redis_value::<
                HashMap<String, HashMap<String, String>>,
            >(v)?)
        });
    match reply {
        Ok(by_node) => {
            let mut nodes: Vec<_> = by_node.into_iter().collect();
            nodes.sort_by(|a, b| a.0.cmp(&b.0));
            for (node, config) in nodes {
                log(Ok(config), Some(&node));
            }
        }
        Err(e) => log(Err(e), None),
    }
}

fn config_get() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(&SETTINGS[..]);
    cmd
}

fn log(reply: redis::RedisResult<HashMap<String, String>>, node: Option<&str>) {
    match reply {
        Ok(config) => {
            let risks = assess(&config);
            for risk in &risks {
                warn!(
                    redis_node = node,
                    redis_setting = risk.setting,
                    "{}",
                    risk.message
                );
            }
            if risks.is_empty() {
                info!(
                    redis_node = node,
                    appendonly = config.get("appendonly").map(String::as_str),
                    appendfsync = config.get("appendfsync").map(String::as_str),
                    maxmemory_policy = config.get("maxmemory-policy").map(String::as_str),
                    "Redis persistence and eviction settings keep accepted jobs"
                );
            }
        }
        Err(e) => warn!(
            error = %e,
            "could not check Redis durability settings (CONFIG GET refused, as managed Redis \
             often does); make sure the provider keeps an append-only file and uses \
             maxmemory-policy noeviction"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn aof_with_everysec_and_noeviction_risks_nothing() {
        let c = config(&[
            ("appendonly", "yes"),
            ("appendfsync", "everysec"),
            ("save", ""),
            ("maxmemory-policy", "noeviction"),
        ]);
        assert_eq!(assess(&c), vec![]);
    }

    #[test]
    fn no_persistence_and_eviction_are_both_named() {
        let c = config(&[
            ("appendonly", "no"),
            ("appendfsync", "everysec"),
            ("save", ""),
            ("maxmemory-policy", "allkeys-lru"),
        ]);
        let settings: Vec<_> = assess(&c).iter().map(|r| r.setting).collect();
        assert_eq!(settings, ["appendonly", "maxmemory-policy"]);
    }

    #[test]
    fn snapshots_only_and_lazy_fsync_are_risks_too() {
        let rdb = config(&[("appendonly", "no"), ("save", "3600 1 300 100")]);
        assert!(assess(&rdb)[0].message.contains("since the last snapshot"));
        let lazy = config(&[("appendonly", "yes"), ("appendfsync", "no")]);
        assert_eq!(assess(&lazy)[0].setting, "appendfsync");
    }
}
