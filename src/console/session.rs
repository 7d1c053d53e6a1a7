//! Console sessions and the sign-in rate limit, kept in Redis so every replica's ops
//! listener knows them: a load balancer may send consecutive requests to different pods.
//!
//! The cookie holds a random 256-bit id; Redis holds only its SHA-256, with the user name
//! and the session's CSRF token, and expires it after the idle timeout, which every request
//! renews. Nothing in the cookie is trusted beyond "whoever holds this id".

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::infra::keys::RedisKeys;

/// The cookie's name.
pub(crate) const COOKIE: &str = "summaryd_console";

/// Failed sign-ins allowed per user name, and per client address, in one window; the next
/// is refused until the window ends, whether or not its password is right.
pub(crate) const FAILURES_PER_NAME: u32 = 5;
/// Higher, because several people may sit behind one address (an office's NAT).
pub(crate) const FAILURES_PER_ADDRESS: u32 = 20;
/// Fifteen minutes: at five tries per window a guesser gets 480 a day per name.
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) user: String,
    /// Sent back with every form and compared before any change is made.
    pub(crate) csrf: String,
    pub(crate) signed_in_at: chrono::DateTime<chrono::Utc>,
}

impl Session {
    pub(crate) fn csrf_matches(&self, given: &str) -> bool {
        bool::from(self.csrf.as_bytes().ct_eq(given.as_bytes()))
    }
}

fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    URL_SAFE_NO_PAD.encode(bytes)
}

fn id_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// A new session for `user`: returns the cookie value and the session.
pub(crate) async fn create<C: AsyncCommands>(
    conn: &mut C,
    keys: &RedisKeys,
    user: &str,
    idle: Duration,
) -> redis::RedisResult<(String, Session)> {
    let id = random_token();
    let session = Session {
        user: user.to_owned(),
        csrf: random_token(),
        signed_in_at: chrono::Utc::now(),
    };
    let json = serde_json::to_string(&session).unwrap_or_default();
    let () = conn
        .pset_ex(keys.console_session(&id_hash(&id)), json, millis(idle))
        .await?;
    Ok((id, session))
}

/// The session behind a cookie value, its idle timer restarted; `None` when it expired,
/// was signed out or never existed.
pub(crate) async fn touch<C: AsyncCommands>(
    conn: &mut C,
    keys: &RedisKeys,
    id: &str,
    idle: Duration,
) -> redis::RedisResult<Option<Session>> {
    // GETEX reads and renews in one command.
    let json: Option<String> = redis::cmd("GETEX")
        .arg(keys.console_session(&id_hash(id)))
        .arg("PX")
        .arg(millis(idle))
        .query_async(conn)
        .await?;
    Ok(json.and_then(|json| serde_json::from_str(&json).ok()))
}

pub(crate) async fn end<C: AsyncCommands>(
    conn: &mut C,
    keys: &RedisKeys,
    id: &str,
) -> redis::RedisResult<()> {
    conn.del(keys.console_session(&id_hash(id))).await
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Whose failures a sign-in counts against: the name tried and the client's address.
pub(crate) fn failure_keys(keys: &RedisKeys, name: &str, address: &str) -> [(String, u32); 2] {
    [
        (
            keys.console_signin_failures(&format!("name:{}", id_hash(name))),
            FAILURES_PER_NAME,
        ),
        (
            keys.console_signin_failures(&format!("addr:{address}")),
            FAILURES_PER_ADDRESS,
        ),
    ]
}

/// How long until a sign-in for `name` from `address` may be tried again, or `None` when it
/// may be tried now.
pub(crate) async fn locked_for<C: AsyncCommands>(
    conn: &mut C,
    keys: &RedisKeys,
    name: &str,
    address: &str,
) -> redis::RedisResult<Option<Duration>> {
    let mut wait = None;
    for (key, limit) in failure_keys(keys, name, address) {
        let count: Option<u32> = conn.get(&key).await?;
        if count.is_some_and(|n| n >= limit) {
            let ttl: i64 = conn.pttl(&key).await?;
            let left = Duration::from_millis(u64::try_from(ttl).unwrap_or(1).max(1));
            wait = Some(wait.map_or(left, |w: Duration| w.max(left)));
        }
    }
    Ok(wait)
}

/// Count a failed sign-in against the name and the address. The window starts at the
/// first failure and is not extended by later ones, so a locked name opens again on time.
pub(crate) async fn note_failure<C: AsyncCommands>(
    conn: &mut C,
    keys: &RedisKeys,
    name: &str,
    address: &str,
) -> redis::RedisResult<()> {
    for (key, _) in failure_keys(keys, name, address) {
        // The window's counter is created with its expiry (SET NX PX) and then counted
        // (INCR keeps the expiry): never a counter without one, on any Redis version.
        let () = redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(&key)
            .arg(0)
            .arg("PX")
            .arg(millis(FAILURE_WINDOW))
            .arg("NX")
            .ignore()
            .incr(&key, 1)
            .ignore()
            .query_async(conn)
            .await?;
    }
    Ok(())
}

/// A successful sign-in clears its name's failures (not the address's: one right password
/// must not reopen an address that is guessing other names).
pub(crate) async fn clear_failures<C: AsyncCommands>(
    conn: &mut C,
    keys: &RedisKeys,
    name: &str,
    address: &str,
) -> redis::RedisResult<()> {
    let [(name_key, _), _] = failure_keys(keys, name, address);
    conn.del(name_key).await
}
