//! The idempotency store of `POST /v1/summaries`: the same request (key + body fingerprint)
//! gets the same answer, and the job behind a key is enqueued at most once while the record
//! lives.
//!
//! Design: accepting a job is one atomic Redis script (`stream/enqueue_once.lua`, one round
//! trip). For a key without a record it puts the job on the stream, writes the job state
//! and stores the final 202 response together; for a key with a record it only reads it.
//!
//! Why not the general "claim, run the handler, finalise" pattern (SET NX of an in-progress
//! marker with a token, then compare-and-set of the final response): that costs three round
//! trips per new key and leaves a window in which the marker is visible (duplicates get 409,
//! and a crash inside it blocks the key until the marker expires). The handler of this route
//! is itself a Redis write whose response is known in advance (the job id is derived from
//! the key), so it can run inside the same atomic step, and the window disappears: a
//! concurrent duplicate sees either no record (and it is the one that enqueues) or the
//! final one. There is no observable in-progress state for this route.
//!
//! With `SUMMARYD_REDIS_MIN_REPLICAS_ACK` set, an accept counts only once that many replicas
//! confirm it (`stream::replicas`): the script's writes, or, for a replay, the record it
//! answers from. Until then the answer is [`StoreError::NotReplicated`]; the record and the
//! job stay on the primary, so the client's retry is a replay of the same job.
//!
//! A record in the in-progress shape (`{"state":"in_progress",...}`) is still understood
//! and answered with 409: an instance of an older version may write one during a rolling
//! upgrade.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::IdempotencySettings;
use crate::domain::Job;
use crate::infra::connections::SharedRedis;
use crate::infra::keys::{RedisKeys, Shards};
use crate::infra::metrics::Metrics;
use crate::stream::budget::Admission;
use crate::stream::replicas::{self, NotReplicated, ReplicaAcks};
use crate::stream::{self, EnqueueOnce, OverLimit, TenantLimits};

/// What is stored under an idempotency key (operators read it; keep it JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    /// Written only by older versions, while their handler ran.
    InProgress { fp: String },
    Done {
        fp: String,
        status: u16,
        body: serde_json::Value,
    },
}

/// [`Record::Done`] as it is written, borrowing what it stores: a POST serialises one, and
/// copying the body and fingerprint first would only feed the serialiser the same bytes.
/// A test pins that both write the same JSON.
#[derive(Serialize)]
struct DoneRecord<'a> {
    state: &'static str,
    fp: &'a str,
    status: u16,
    body: &'a serde_json::Value,
}

const DONE: &str = "done";

/// A response worth remembering: status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// This request enqueued the job; this is the response stored for its key.
    Fresh(StoredResponse),
    /// An earlier request with the same key and body did; this is its response.
    Replayed(StoredResponse),
}

impl Outcome {
    pub(crate) fn response(&self) -> &StoredResponse {
        match self {
            Outcome::Fresh(r) | Outcome::Replayed(r) => r,
        }
    }

    pub(crate) fn is_replay(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("a request with this key is still in progress")]
    InProgress,
    #[error("the key was used with a different body")]
    KeyReused,
    #[error("Redis unavailable: {0}")]
    Unavailable(#[from] redis::RedisError),
    #[error("unreadable idempotency record: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("the tenant is over a limit")]
    OverLimit(OverLimit),
    /// Stored and enqueued on the primary, but not confirmed by enough replicas: a retry
    /// is a replay of the same job, confirmed again before it answers.
    #[error("the accept is not confirmed by enough replicas: {0}")]
    NotReplicated(#[source] NotReplicated),
}

#[derive(Clone)]
pub struct IdempotencyStore {
    redis: SharedRedis,
    keys: Shards,
    metrics: Arc<Metrics>,
    /// How long clients may safely retry and get the stored answer.
    result_ttl_s: u64,
    /// Replicas that must confirm an accept before it is answered; `None`: no WAIT.
    acks: Option<ReplicaAcks>,
}

impl IdempotencyStore {
    pub fn new(
        redis: SharedRedis,
        keys: Shards,
        metrics: Arc<Metrics>,
        settings: &IdempotencySettings,
    ) -> Self {
        Self {
            redis,
            keys,
            metrics,
            result_ttl_s: settings.result_ttl_s,
            acks: None,
        }
    }

    /// Answer an accept (or its replay) only once `acks` confirm it; `None`: at once.
    pub fn with_replica_acks(mut self, acks: Option<ReplicaAcks>) -> Self {
        self.acks = acks;
        self
    }

    /// Enqueue `job` and store `response` under `key`, once per key, in one atomic step,
    /// if the tenant is within `limits`; or answer from the record an earlier request left
    /// (never charged to or refused by a limit).
    ///
    /// On an error nothing was written (Redis refused or never ran the script), except when
    /// the reply was lost after Redis ran it; then the client's retry is answered as a
    /// replay with the same job id, which is the same outcome.
    pub async fn enqueue_once(
        &self,
        key: &str,
        fingerprint: &str,
        job: &Job,
        response: StoredResponse,
        limits: &TenantLimits,
    ) -> Result<Outcome, StoreError> {
        self.enqueue_within(key, fingerprint, job, response, limits, None)
            .await
    }

    /// [`Self::enqueue_once`], reserving `budget` (the job's worst case against its
    /// tenant's budget) in the same atomic step; a job that does not fit is refused as
    /// over the `Budget` limit and nothing is written.
    pub async fn enqueue_within(
        &self,
        key: &str,
        fingerprint: &str,
        job: &Job,
        response: StoredResponse,
        limits: &TenantLimits,
        budget: Option<&Admission>,
    ) -> Result<Outcome, StoreError> {
        let done = serde_json::to_string(&DoneRecord {
            state: DONE,
            fp: fingerprint,
            status: response.status,
            body: &response.body,
        })?;
        let mut conn = self.redis.get().await?;
        let keys = self.keys.of_tenant(job.tenant.as_str());
        let record = stream::IdempotencyRecord {
            key,
            value: &done,
            ttl_s: self.result_ttl_s,
        };
        let admit = stream::Admit { limits, budget };
        let (reply, acked) = match self.acks {
            None => (
                stream::enqueue_once(&mut conn, keys, job, record, admit).await?,
                None,
            ),
            Some(acks) => {
                let (reply, acked) =
                    stream::enqueue_once_confirmed(&mut conn, keys, job, record, admit, acks)
                        .await?;
                (reply, Some((acks, acked)))
            }
        };
        match reply {
            EnqueueOnce::Enqueued { .. } => {
                self.count("new");
                // The WAIT travelled behind the script in one pipeline, so it covers the
                // script's writes on whichever node ran it (`replicas::invoke_confirmed`).
                if let Some((acks, acked)) = acked {
                    acks.check(acked).map_err(|e| self.not_replicated(e))?;
                }
                Ok(Outcome::Fresh(response))
            }
            EnqueueOnce::Existing { record } => {
                self.replayed(&mut conn, key, &record, fingerprint).await
            }
            EnqueueOnce::Refused(over) => Err(StoreError::OverLimit(over)),
        }
    }

    /// [`Self::existing`], and for a replay with replica acks required, confirmed first.
    ///
    /// The record may be one whose first answer was a 503 because the replicas had not
    /// confirmed it, and this request wrote nothing: WAIT is defined over the writes of
    /// the connection it is sent on, so on a connection that wrote nothing (another
    /// process's, a new one) it may answer at once with whatever replicas are connected.
    /// (Redis 7.0 also moves a connection's offset forward on reads, but that is not part
    /// of WAIT's contract.) WAIT cannot be given an offset, so the way to make it cover the
    /// record is a write on this connection after it: the record rewritten with the value
    /// and TTL it has, and the WAIT behind it in the same pipeline
    /// (`replicas::confirm_unchanged`). Replication is ordered, so a replica that has that
    /// write has the record. It costs one round trip, only for replays and only when acks
    /// are required, and lands on the primary that owns the record's key, so it stays
    /// right on a cluster, where every shard has its own primary and offsets. A record no
    /// longer there as it was read (a failover in between took it) is not confirmed: the
    /// client's retry then finds no record and enqueues the job again, same id.
    async fn replayed<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        key: &str,
        raw: &str,
        fingerprint: &str,
    ) -> Result<Outcome, StoreError> {
        let outcome = self.existing(raw, fingerprint)?;
        if let Some(acks) = self.acks {
            replicas::confirm_unchanged(conn, key, raw, acks)
                .await
                .map_err(|e| self.not_replicated(e))?;
        }
        Ok(outcome)
    }

    /// An accept the replicas did not confirm, counted.
    fn not_replicated(&self, cause: NotReplicated) -> StoreError {
        self.metrics
            .replica_ack_timeouts
            .with_label_values(&["accept"])
            .inc();
        StoreError::NotReplicated(cause)
    }

    /// The answer an earlier request left under `key`, if there is one, without enqueuing:
    /// a long text is stored in Postgres only for a request that may enqueue it, so a
    /// replay (perhaps of a job that finished and dropped its text) stores nothing.
    pub(crate) async fn earlier_answer(
        &self,
        key: &str,
        fingerprint: &str,
    ) -> Result<Option<Outcome>, StoreError> {
        let mut conn = self.redis.get().await?;
        let raw: Option<String> = redis::AsyncCommands::get(&mut conn, key).await?;
        match raw {
            Some(raw) => Ok(Some(
                self.replayed(&mut conn, key, &raw, fingerprint).await?,
            )),
            None => Ok(None),
        }
    }

    fn existing(&self, raw: &str, fingerprint: &str) -> Result<Outcome, StoreError> {
        let record: Record = serde_json::from_str(raw)?;
        match record {
            Record::InProgress { fp } | Record::Done { fp, .. } if fp != fingerprint => {
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

    fn count(&self, outcome: &str) {
        self.metrics.idempotency.with_label_values(&[outcome]).inc();
    }
}

/// The job an earlier request with `key` made for `tenant`, while its record lives (the
/// console finds jobs by the client's Idempotency-Key). `None` for no record, or a record
/// of an older version's in-progress marker.
pub(crate) async fn job_of<C: redis::aio::ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    tenant: &crate::domain::TenantId,
    key: &crate::domain::IdempotencyKey,
) -> Result<Option<crate::domain::JobId>, StoreError> {
    let scope = crate::infra::keys::ScopedKey::summaries(tenant, key);
    let raw: Option<String> = redis::AsyncCommands::get(conn, keys.idempotency(&scope)).await?;
    let Some(raw) = raw else { return Ok(None) };
    Ok(match serde_json::from_str::<Record>(&raw)? {
        Record::Done { body, .. } => body
            .get("job_id")
            .and_then(|id| id.as_str())
            .and_then(|id| id.parse().ok()),
        Record::InProgress { .. } => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_the_documented_json_shape() {
        let done = serde_json::to_value(Record::Done {
            fp: "f".into(),
            status: 202,
            body: serde_json::json!({"a": 1}),
        })
        .unwrap();
        assert_eq!(
            done,
            serde_json::json!({"state": "done", "fp": "f", "status": 202, "body": {"a": 1}})
        );
        let borrowed = serde_json::to_string(&DoneRecord {
            state: DONE,
            fp: "f",
            status: 202,
            body: &serde_json::json!({"a": 1}),
        })
        .unwrap();
        let owned = serde_json::to_string(&Record::Done {
            fp: "f".into(),
            status: 202,
            body: serde_json::json!({"a": 1}),
        })
        .unwrap();
        assert_eq!(borrowed, owned);
        // The marker of older versions carries a token too; it must still parse.
        let marker: Record =
            serde_json::from_str(r#"{"state":"in_progress","fp":"f","token":"t"}"#).unwrap();
        assert_eq!(marker, Record::InProgress { fp: "f".into() });
    }
}
