//! The deployment's key for hashing personal data in logs (`migrations/V8__deployment_key.sql`).
//!
//! A plain hash of an address lets anyone with the log confirm a guess (hash
//! `bob@acme.com`, compare); a keyed hash does not, without the key. The key lives in
//! Postgres, where every process that logs such a hash already connects, so one deployment
//! has one key and its lines correlate across processes with nothing for an operator to set.

use hmac::{KeyInit, Mac};
use tokio::sync::OnceCell;

/// Bytes of key: the HMAC-SHA256 block is larger, the output as large.
const KEY_BYTES: usize = 32;
/// Hex digits of the tag kept in a log line: 64 bits, far from colliding between the
/// addresses one deployment emails, and short enough to read.
const TAG_HEX_DIGITS: usize = 16;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The key itself. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LogKey([u8; KEY_BYTES]);

impl std::fmt::Debug for LogKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogKey([REDACTED])")
    }
}

impl LogKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// A fresh key from the thread-local CSPRNG (seeded by the operating system).
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// What a log line shows for the recipient `address`: the first 16 hex digits of
    /// HMAC-SHA256(key, address with ASCII letters lowercased). Lowercased because servers
    /// treat an address's case as one mailbox, and so an operator can check an address
    /// however it was typed (`docs/security.md`).
    pub fn recipient_tag(&self, address: &str) -> String {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(address.trim().to_ascii_lowercase().as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut tag = hex::encode(digest);
        tag.truncate(TAG_HEX_DIGITS);
        tag
    }
}

/// The key could not be read or created (Postgres down or refusing): what wanted it waits
/// and tries again, like any other write that needs Postgres.
#[derive(Debug, thiserror::Error)]
pub enum LogKeyError {
    #[error("could not get a Postgres connection for the deployment key: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("could not read the deployment key: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("the deployment key in Postgres is {0} bytes, not 32")]
    Malformed(usize),
}

/// The key of this deployment, read from Postgres on first use and kept for the life of the
/// process (it never changes: a new key would break correlation with earlier lines).
pub enum DeploymentKey {
    Postgres {
        pg: deadpool_postgres::Pool,
        key: OnceCell<LogKey>,
    },
    /// A given key, for tests and benchmarks that run without the table.
    Fixed(LogKey),
}

impl DeploymentKey {
    /// Read from (or, for the first process, created in) `pg`; no connection until first use,
    /// so a process starts while Postgres is still down.
    pub fn from_postgres(pg: deadpool_postgres::Pool) -> Self {
        Self::Postgres {
            pg,
            key: OnceCell::new(),
        }
    }

    pub async fn get(&self) -> Result<&LogKey, LogKeyError> {
        match self {
            Self::Postgres { pg, key } => key.get_or_try_init(|| load_or_create(pg)).await,
            Self::Fixed(key) => Ok(key),
        }
    }
}

/// Two statements, not one: a process that loses the race to insert must read the winner's
/// row, which a single statement's snapshot (taken before the winner committed) would miss.
async fn load_or_create(pg: &deadpool_postgres::Pool) -> Result<LogKey, LogKeyError> {
    let client = pg.get().await?;
    let candidate = LogKey::random();
    client
        .execute(
            "INSERT INTO deployment_key (log_hmac_key) VALUES ($1) ON CONFLICT (id) DO NOTHING",
            &[&candidate.0.as_slice()],
        )
        .await?;
    let row = client
        .query_one("SELECT log_hmac_key FROM deployment_key", &[])
        .await?;
    let stored: Vec<u8> = row.try_get(0)?;
    let bytes = <[u8; KEY_BYTES]>::try_from(stored.as_slice())
        .map_err(|_| LogKeyError::Malformed(stored.len()))?;
    Ok(LogKey(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_keyed_case_blind_and_never_the_plain_hash() {
        let key = LogKey::from_bytes([7; 32]);
        let tag = key.recipient_tag("Bob@Acme.com");
        assert_eq!(tag.len(), 16);
        assert!(tag.chars().all(|c| c.is_ascii_hexdigit()), "{tag}");
        assert_eq!(tag, key.recipient_tag(" bob@acme.com "));
        assert_ne!(tag, key.recipient_tag("bob@acme.co"));
        assert_ne!(
            tag,
            LogKey::from_bytes([8; 32]).recipient_tag("bob@acme.com")
        );
        use sha2::Digest;
        let plain = hex::encode(sha2::Sha256::digest(b"bob@acme.com"));
        assert!(!plain.starts_with(&tag[..12]), "{tag} {plain}");
        // RFC 4231 test case 2: HMAC pads a short key with zeros, so "Jefe" and "Jefe"
        // followed by 28 zero bytes are one key; the tag is HMAC-SHA256's first 64 bits.
        let mut jefe = [0u8; 32];
        jefe[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            LogKey::from_bytes(jefe).recipient_tag("what do ya want for nothing?"),
            "5bdcc146bf60754e"
        );
        assert_eq!(
            format!("{:?}", LogKey::from_bytes([0x41; 32])),
            "LogKey([REDACTED])"
        );
    }
}
