//! Real `summaryd` processes: started from the binary cargo built for this test target,
//! their output captured to a file, killed (SIGKILL) on drop so no test leaves orphans,
//! and the tail of their log printed when a test fails.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::shared::eventually;

/// `serve` writes "summaryd started" once its listener is bound and its roles run; a
/// process that has not done so by then is broken (the slowest step is connecting pools,
/// which is lazy, so this is generous even on a loaded 2-core CI machine).
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Log lines shown per process when a test fails.
const TAIL_LINES: usize = 30;

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_summaryd")
}

pub struct Proc {
    pub name: String,
    pub port: u16,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// `summaryd serve --roles <roles> --no-migrate --listen <listen> <extra args>` with
    /// exactly `env` (the parent's environment is cleared so no stray `SUMMARYD_*` leaks in).
    /// Returns once the process logged "summaryd started" (and its port).
    pub async fn start(
        name: &str,
        roles: &str,
        listen: &str,
        extra_args: &[&str],
        env: &[(String, String)],
        log_dir: &Path,
    ) -> Proc {
        let log = unique_log_path(log_dir, name);
        let out = File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let child = Command::new(binary())
            .args([
                "serve",
                "--roles",
                roles,
                "--no-migrate",
                "--listen",
                listen,
            ])
            .args(extra_args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn summaryd");
        let mut proc = Proc {
            name: name.to_owned(),
            port: 0,
            child,
            log,
            exited: None,
        };
        proc.port = proc.wait_started().await;
        proc
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn wait_started(&mut self) -> u16 {
        let port = Cell::new(None);
        let exited = Cell::new(None);
        let child = RefCell::new(&mut self.child);
        let log = &self.log;
        eventually(START_TIMEOUT, || async {
            port.set(started_port(log));
            if let Ok(Some(status)) = child.borrow_mut().try_wait() {
                exited.set(Some(status));
            }
            port.get().is_some() || exited.get().is_some()
        })
        .await;
        if let Some(port) = port.get() {
            return port;
        }
        if let Some(status) = exited.get() {
            self.exited = Some(status);
            panic!(
                "{} exited during start with {status}:\n{}",
                self.name,
                self.tail()
            );
        }
        panic!(
            "{} did not log 'summaryd started' within {START_TIMEOUT:?}:\n{}",
            self.name,
            self.tail()
        );
    }

    /// SIGKILL and reap: the process gets no chance to clean anything up.
    pub fn kill9(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }

    /// SIGTERM: the orchestrator's polite stop.
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", self.pid());
    }

    /// Wait for the process to exit by itself; `None` if it is still running after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            let child = RefCell::new(&mut self.child);
            let exited = Cell::new(None);
            eventually(within, || async {
                exited.set(child.borrow_mut().try_wait().ok().flatten());
                exited.get().is_some()
            })
            .await;
            self.exited = exited.get();
        }
        self.exited
    }

    /// The process's output so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the process's output.
    pub fn tail(&self) -> String {
        let text = self.output();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(TAIL_LINES);
        lines[from..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "----- {} (pid {}, log {}) -----\n{}",
                self.name,
                self.child.id(),
                self.log.display(),
                self.tail()
            );
        }
    }
}

fn unique_log_path(dir: &Path, name: &str) -> PathBuf {
    (0..)
        .map(|n| dir.join(format!("{name}.{n}.log")))
        .find(|p| !p.exists())
        .expect("a free log name")
}

/// The port from the JSON line `{"message":"summaryd started", "port": N, ...}`.
fn started_port(log: &Path) -> Option<u16> {
    let file = File::open(log).ok()?;
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.contains("summaryd started"))
        .find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l).ok()?;
            u16::try_from(v.get("port")?.as_u64()?).ok()
        })
}

/// SIGTERM every process at once and require each to exit 0 within `within` (the drain
/// grace plus teardown): a process that hangs on shutdown, or exits non-zero, fails here.
pub async fn stop_all(procs: &mut [&mut Proc], within: Duration) {
    for p in procs.iter() {
        p.sigterm();
    }
    for p in procs.iter_mut() {
        let status = p.wait_exit(within).await;
        let Some(status) = status else {
            panic!(
                "{} still running {within:?} after SIGTERM:\n{}",
                p.name,
                p.tail()
            );
        };
        assert!(
            status.success(),
            "{} exited with {status} after SIGTERM:\n{}",
            p.name,
            p.tail()
        );
    }
}

/// Run a one-shot subcommand (e.g. `migrate`) to completion.
pub fn run_to_completion(args: &[&str], env: &[(String, String)]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run summaryd")
}

/// Run a subcommand that is expected to exit by itself; `None` (after killing it) when it
/// is still running after `within`, so a process that should have failed cannot hang a test.
/// Output is read while it runs, so a chatty process cannot block on a full pipe.
pub async fn run_with_deadline(
    args: &[&str],
    env: &[(String, String)],
    within: Duration,
) -> Option<std::process::Output> {
    let child = tokio::process::Command::new(binary())
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run summaryd");
    tokio::time::timeout(within, child.wait_with_output())
        .await
        .ok()?
        .ok()
}

/// A refusal at startup happens while the settings are read, long before this.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(20);

/// `summaryd serve --roles <roles> --no-migrate --listen <listen>` expected to refuse to
/// start; panics if it is still running after the refusal deadline.
pub async fn serve_expecting_exit(
    roles: &str,
    listen: &str,
    env: &[(String, String)],
) -> std::process::Output {
    let args = [
        "serve",
        "--roles",
        roles,
        "--no-migrate",
        "--listen",
        listen,
    ];
    run_with_deadline(&args, env, REFUSAL_DEADLINE)
        .await
        .unwrap_or_else(|| panic!("--roles {roles} on {listen} kept running"))
}

/// Everything a finished process printed, stdout then stderr.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
