//! A Lua script's call built as one `EVALSHA` command.
//!
//! The redis crate's `ScriptInvocation` keeps every argument in a buffer of its own and
//! copies them all into a command each time it is sent. The accept script takes about forty
//! arguments on every POST, so building the command directly saves that many allocations and
//! a copy per request; the NOSCRIPT handling is the same (load the script, send again).

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs};

/// Where a script's arguments go, however its call is built: the helpers that pass a
/// concept's arguments (a tenant's limits, a job's state) serve both kinds of call.
pub trait ScriptArgs {
    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self;
}

impl ScriptArgs for redis::ScriptInvocation<'_> {
    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        redis::ScriptInvocation::arg(self, arg)
    }
}

/// `EVALSHA <sha> <number of keys> <keys…> <args…>` of one script.
pub struct ScriptCall {
    script: &'static Script,
    cmd: Cmd,
}

impl ScriptCall {
    /// A call of `script` on `keys`; the arguments follow with [`ScriptArgs::arg`].
    pub fn new(script: &'static Script, keys: &[&str]) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Self { script, cmd }
    }

    /// The command, for a pipeline that carries it with others.
    pub fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    /// The command itself, for a pipeline whose caller handles a NOSCRIPT another way.
    pub fn into_cmd(self) -> Cmd {
        self.cmd
    }

    /// Put the script in the node's cache (after a NOSCRIPT).
    pub async fn load<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<()> {
        self.script.load_async(conn).await.map(drop)
    }

    /// Send the call; after a NOSCRIPT (a node's script cache is empty after a restart or
    /// a promotion), load the script and send it again.
    pub async fn invoke<T: FromRedisValue, C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if is_noscript(&e) => {
                self.load(conn).await?;
                self.cmd.query_async(conn).await
            }
            answered => answered,
        }
    }
}

impl ScriptArgs for ScriptCall {
    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// Whether Redis refused a call because it does not have the script.
pub fn is_noscript(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}
