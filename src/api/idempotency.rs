//! The idempotency store: the same request (key + body fingerprint) gets the same answer,
//! and its handler runs at most once while the record lives.
//!
//! The first request wins a `SET NX` of an in-progress marker carrying a random token and a
//! short TTL, runs the handler, then overwrites the marker with the final response and a
//! long TTL. Finalise and release are compare-and-set on the exact marker (Lua), so a request
//! that overran its lock can never overwrite or delete the record of a newer request.

use std::future::Future;
use std::sync::{Arc, LazyLock};

use redis::{Script, Value};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::config::IdempotencySettings;
use crate::metrics::Metrics;

/// Overwrite the key with the final response only if it still holds OUR marker.
const FINALISE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
";

/// Delete the key only if it still holds OUR marker.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// `Script` runs EVALSHA and falls back to loading the script on NOSCRIPT.
static FINALISE: LazyLock<Script> = LazyLock::new(|| Script::new(FINALISE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// What is stored under an idempotency key (operators read it; keep it JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    InProgress {
        fp: String,
        token: String,
    },
    Done {
        fp: String,
        status: u16,
        body: serde_json::Value,
    },
}

/// A response worth remembering: status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The handler ran for this request.
    Fresh(StoredResponse),
    /// An earlier request with the same key and body finished; this is its response.
    Replayed(StoredResponse),
}

impl Outcome {
    pub fn response(&self) -> &StoredResponse {
        match self {
            Outcome::Fresh(r) | Outcome::Replayed(r) => r,
        }
    }

    pub fn is_replay(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("a request with this key is still in progress")]
    InProgress,
    #[error("the key was used with a different body")]
    KeyReused,
    #[error("Redis unavailable: {0}")]
    Unavailable(String),
    #[error("unreadable idempotency record: {0}")]
    Corrupt(String),
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<deadpool_redis::PoolError> for StoreError {
    fn from(e: deadpool_redis::PoolError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

#[derive(Clone)]
pub struct IdempotencyStore {
    redis: deadpool_redis::Pool,
    metrics: Arc<Metrics>,
    /// The crash-recovery time: a marker left by a dead request blocks retries (409) this long.
    lock_ttl_s: u64,
    /// How long clients may safely retry and get the stored answer.
    result_ttl_s: u64,
}

impl IdempotencyStore {
    pub fn new(
        redis: deadpool_redis::Pool,
        metrics: Arc<Metrics>,
        settings: &IdempotencySettings,
    ) -> Self {
        Self {
            redis,
            metrics,
            lock_ttl_s: settings.lock_ttl_s,
            result_ttl_s: settings.result_ttl_s,
        }
    }

    /// Run `handler` once per `key`, or answer from the record an earlier run left.
    ///
    /// Handler errors and 5xx responses release the key so the client can retry; storing
    /// them would make a transient failure permanent for `result_ttl_s`.
    pub async fn run<F, Fut, E>(
        &self,
        key: &str,
        fingerprint: &str,
        handler: F,
    ) -> Result<Outcome, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<StoredResponse, E>>,
        E: From<StoreError>,
    {
        let marker = serde_json::to_string(&Record::InProgress {
            fp: fingerprint.to_owned(),
            token: uuid::Uuid::new_v4().simple().to_string(),
        })
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        if !self.try_lock(key, &marker).await? {
            return self.existing(key, fingerprint).await.map_err(E::from);
        }
        self.count("new");
        let result = handler().await;
        let response = match result {
            Ok(r) if r.status < 500 => r,
            Ok(r) => {
                self.release(key, &marker).await;
                return Ok(Outcome::Fresh(r));
            }
            Err(e) => {
                self.release(key, &marker).await;
                return Err(e);
            }
        };
        self.finalise(key, &marker, fingerprint, &response).await;
        Ok(Outcome::Fresh(response))
    }

    async fn try_lock(&self, key: &str, marker: &str) -> Result<bool, StoreError> {
        let mut conn = self.redis.get().await?;
        let reply: Value = redis::cmd("SET")
            .arg(key)
            .arg(marker)
            .arg("NX")
            .arg("EX")
            .arg(self.lock_ttl_s)
            .query_async(&mut conn)
            .await?;
        Ok(!matches!(reply, Value::Nil))
    }

    async fn existing(&self, key: &str, fingerprint: &str) -> Result<Outcome, StoreError> {
        let mut conn = self.redis.get().await?;
        let raw: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
        let Some(raw) = raw else {
            // Expired or released between our SET and GET: the other request is (or just
            // was) running; the client's retry will decide.
            self.count("conflict");
            return Err(StoreError::InProgress);
        };
        let record: Record =
            serde_json::from_str(&raw).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        match record {
            Record::InProgress { fp, .. } | Record::Done { fp, .. } if fp != fingerprint => {
                self.count("mismatch");
                Err(StoreError::KeyReused)
            }
            Record::InProgress { .. } => {
                self.count("conflict");
                Err(StoreError::InProgress)
            }
            Record::Done { status, body, .. } => {
                self.count("replayed");
                Ok(Outcome::Replayed(StoredResponse { status, body }))
            }
        }
    }

    /// Store the final response if the key still holds our marker. A lost lock (our marker
    /// expired, maybe a newer request owns the key) is logged; the client still gets its answer.
    async fn finalise(
        &self,
        key: &str,
        marker: &str,
        fingerprint: &str,
        response: &StoredResponse,
    ) {
        let done = Record::Done {
            fp: fingerprint.to_owned(),
            status: response.status,
            body: response.body.clone(),
        };
        let result = async {
            let done =
                serde_json::to_string(&done).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let mut conn = self.redis.get().await?;
            let stored: i64 = FINALISE
                .key(key)
                .arg(marker)
                .arg(done)
                .arg(self.result_ttl_s)
                .invoke_async(&mut conn)
                .await?;
            Ok::<_, StoreError>(stored == 1)
        }
        .await;
        match result {
            Ok(true) => {}
            Ok(false) => warn!(key, "idempotency_lock_lost"),
            // The work is done (e.g. the job is enqueued); answering 503 now would make the
            // client believe it was not. The marker expires and a retry re-runs harmlessly,
            // because the job id is derived from the key.
            Err(e) => warn!(key, error = %e, "idempotency_finalise_failed"),
        }
    }

    /// Delete our marker so the client can retry now rather than after the lock TTL.
    async fn release(&self, key: &str, marker: &str) {
        let result = async {
            let mut conn = self.redis.get().await?;
            let released: i64 = RELEASE.key(key).arg(marker).invoke_async(&mut conn).await?;
            Ok::<_, StoreError>(released == 1)
        }
        .await;
        match result {
            Ok(true) => {}
            Ok(false) => warn!(key, "idempotency_lock_lost"),
            // The marker still expires after the lock TTL.
            Err(e) => warn!(key, error = %e, "idempotency_release_failed"),
        }
    }

    fn count(&self, outcome: &str) {
        self.metrics.idempotency.with_label_values(&[outcome]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_the_documented_json_shape() {
        let marker = serde_json::to_value(Record::InProgress {
            fp: "f".into(),
            token: "t".into(),
        })
        .unwrap();
        assert_eq!(
            marker,
            serde_json::json!({"state": "in_progress", "fp": "f", "token": "t"})
        );
        let done: Record =
            serde_json::from_str(r#"{"state":"done","fp":"f","status":202,"body":{"a":1}}"#)
                .unwrap();
        assert!(matches!(done, Record::Done { status: 202, .. }));
    }
}
