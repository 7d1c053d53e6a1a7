use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Namespace for job ids. Fixed forever: changing it would give replays new job ids.
const JOB_NAMESPACE: Uuid = Uuid::from_u128(0x6a0c_1f8e_5b7d_4c2a_9e31_7d44_b2f0_a915);

/// A job id is derived from the request (tenant-scoped idempotency key and body
/// fingerprint), never random, so a second enqueue of the same request (API crash after
/// XADD, client retry) collapses downstream, and a key reused with another body once its
/// record expired is another job: it can never be answered with the first one's summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(Uuid);

impl JobId {
    /// No request's id (a v5 id is never nil): stands for "no job" where a key is needed.
    pub(crate) const NIL: JobId = JobId(Uuid::nil());

    /// The id of the request with this scoped key and body fingerprint. A scoped key is
    /// visible ASCII, so the newline between the two cannot be forged by either.
    pub(crate) fn for_request(scoped_key: &str, fingerprint: &str) -> Self {
        Self::from_scoped_key(&format!("{scoped_key}\n{fingerprint}"))
    }

    /// A name-derived id without a body (producers that are not the API: tests, benches).
    pub fn from_scoped_key(scoped_key: &str) -> Self {
        Self(Uuid::new_v5(&JOB_NAMESPACE, scoped_key.as_bytes()))
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for JobId {
    fn from(value: Uuid) -> Self {
        Self(value)
    }
}

impl FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_scoped_key_same_id_and_scopes_differ() {
        let a = JobId::from_scoped_key("idem:acme:POST:/v1/summaries:k");
        assert_eq!(a, JobId::from_scoped_key("idem:acme:POST:/v1/summaries:k"));
        assert_ne!(a, JobId::from_scoped_key("idem:other:POST:/v1/summaries:k"));
        assert_eq!(a.as_uuid().get_version_num(), 5);
    }

    #[test]
    fn the_request_id_depends_on_key_and_body() {
        let key = "idem:acme:POST:/v1/summaries:k";
        let a = JobId::for_request(key, "fp1");
        assert_eq!(a, JobId::for_request(key, "fp1"));
        assert_ne!(a, JobId::for_request(key, "fp2"));
        assert_ne!(
            a,
            JobId::for_request("idem:other:POST:/v1/summaries:k", "fp1")
        );
        assert_eq!(a.as_uuid().get_version_num(), 5);
    }
}
