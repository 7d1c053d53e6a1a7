//! `summaryd pause [--reason TEXT]` and `summaryd resume`: stop and restart consumption
//! fleet-wide. Every worker process follows the pause within about a second; the api keeps
//! accepting jobs (they wait on the stream) and the relay keeps sending.

use clap::Args;
use std::io::Write;

use super::AdminError;
use crate::domain::Pause;
use crate::infra::keys::RedisKeys;
use crate::stream::pause as stored;

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// Why: shown with the pause in every worker's log and by `summaryd resume`.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

/// Tries at pausing when each attempt finds the pause gone between SET NX and the read of
/// who holds it (someone resumed in between); more than a few means a script is toggling it.
const PAUSE_ATTEMPTS: usize = 3;

/// Who pauses from the command line: `cli:<$USER>@<host>`, `unknown` for what cannot be told.
pub(crate) fn cli_actor() -> String {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    format!("cli:{user}@{host}")
}

/// Pause consumption as `by`; returns whether this call paused it. Pausing while paused
/// changes nothing and says who paused, when and why.
pub async fn pause(
    redis: &crate::infra::redis::RedisPool,
    keys: &RedisKeys,
    by: &str,
    reason: Option<String>,
    out: &mut impl Write,
) -> Result<bool, AdminError> {
    let mut conn = redis.get().await?;
    let wanted = Pause::new(by, reason, chrono::Utc::now());
    for _ in 0..PAUSE_ATTEMPTS {
        if stored::pause(&mut conn, keys, &wanted).await? {
            writeln!(
                out,
                "{wanted}; every worker stops taking work within a second (deliveries in progress finish)"
            )?;
            return Ok(true);
        }
        if let Some(existing) = stored::current(&mut conn, keys).await? {
            writeln!(out, "already {existing}; left as it was")?;
            return Ok(false);
        }
    }
    Err(AdminError::PauseContended(PAUSE_ATTEMPTS))
}

/// Resume consumption; returns the pause that was lifted, if there was one.
pub async fn resume(
    redis: &crate::infra::redis::RedisPool,
    keys: &RedisKeys,
    out: &mut impl Write,
) -> Result<Option<Pause>, AdminError> {
    let mut conn = redis.get().await?;
    let lifted = stored::resume(&mut conn, keys).await?;
    match &lifted {
        Some(pause) => writeln!(
            out,
            "resumed (was {pause}); every worker takes work again within a second"
        )?,
        None => writeln!(out, "was not paused; nothing changed")?,
    }
    Ok(lifted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_pauses_as_user_at_host() {
        let actor = cli_actor();
        let rest = actor.strip_prefix("cli:").unwrap();
        let (user, host) = rest.split_once('@').unwrap();
        assert!(!user.is_empty() && !host.is_empty(), "{actor}");
    }
}
