//! A private `redis-server` with an append-only file fsynced on every write, so a SIGKILL
//! loses nothing it acknowledged; restartable on the same port and data directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::shared::eventually;

pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    pub async fn start(dir: &Path) -> RedisServer {
        let dir = dir.join("redis");
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut server = RedisServer {
            port: super::free_port(),
            dir,
            child: None,
        };
        server.restart().await;
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no shutdown save; only what the AOF holds survives.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`pause: true`) or SIGCONT: a server that holds its connections open and
    /// answers nothing, as one stalled by a long fork or a saturated host.
    pub fn pause(&self, pause: bool) {
        let Some(child) = &self.child else {
            panic!("redis is not running");
        };
        let pid = i32::try_from(child.id()).expect("pid");
        let signal = if pause { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) on the server this harness started; no memory is involved.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "signal {signal} to redis {pid}");
    }

    /// Start (again) on the same port and directory; returns once it answers PING.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "redis is already running");
        let log = std::fs::File::create(self.dir.join(format!(
            "redis.{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
        )))
        .expect("redis log");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
            ])
            .arg(&self.dir)
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        let this = &*self;
        assert!(
            eventually(Duration::from_secs(10), || this.ping()).await,
            "private redis-server did not answer PING on port {}",
            self.port
        );
    }

    async fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
    }
}
