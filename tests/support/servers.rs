//! Private Redis and Postgres servers a test starts with the configuration it is about
//! (TLS, renamed commands, persistence off), on free ports in a temporary directory, and
//! kills when dropped. Binaries come from the distribution's packages (`scripts/deps.sh`
//! installs them on a fresh Debian machine).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::certs::Issued;

/// How long a started server may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(20);

pub use super::http_stub::free_port;

/// A `redis-server` with a plain port (for the test's own checks) and whatever `args` add.
pub struct RedisProc {
    pub port: u16,
    child: Child,
}

impl RedisProc {
    /// Start with `--port <free> --bind 127.0.0.1 --save "" --dir <dir>` plus `args`
    /// (later arguments win); returns once the plain port answers.
    pub fn start(dir: &Path, args: &[String]) -> RedisProc {
        std::fs::create_dir_all(dir).expect("redis dir");
        let port = free_port();
        let log = std::fs::File::create(dir.join(format!("redis-{port}.log"))).expect("log");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn redis-server (scripts/deps.sh installs it)");
        let mut proc = RedisProc { port, child };
        let deadline = Instant::now() + START_TIMEOUT;
        while !answers_ping(port) {
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!("redis-server exited with {status}; see {}", dir.display());
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {port} did not start"
            );
            // Blocking, like the rest of this start, so callers need no runtime; the async
            // `eventually` cannot poll here.
            std::thread::sleep(Duration::from_millis(50));
        }
        proc
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A connection of the test's own, for its checks.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The server's process id, for signals to this server alone (a replica frozen with
    /// SIGSTOP keeps its connections open, as a stalled one does).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `--tls-*` arguments for a TLS port with `server`'s certificate; with
    /// `client_ca`, clients must present a certificate from that CA (mutual TLS).
    pub fn tls_args(tls_port: u16, server: &Issued, client_ca: Option<&Path>) -> Vec<String> {
        let mut args = vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            server.cert_file.display().to_string(),
            "--tls-key-file".into(),
            server.key_file.display().to_string(),
        ];
        match client_ca {
            Some(ca) => args.extend([
                "--tls-ca-cert-file".into(),
                ca.display().to_string(),
                "--tls-auth-clients".into(),
                "yes".into(),
            ]),
            None => args.extend(["--tls-auth-clients".into(), "no".into()]),
        }
        args
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Any RESP reply to PING (`+PONG`, or `-NOAUTH` from a server with a password) means up.
fn answers_ping(port: u16) -> bool {
    let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    if conn.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 1];
    matches!(conn.read(&mut buf), Ok(1) if buf[0] == b'+' || buf[0] == b'-')
}

/// A PostgreSQL cluster of its own (initdb + pg_ctl from the installed server binaries),
/// trust auth: with TLS on and only TLS connections accepted (`hostssl` in pg_hba.conf), or
/// plain, for a test that stops and starts it (an outage).
pub struct PgCluster {
    pub port: u16,
    data: PathBuf,
    bin: PathBuf,
    /// The server options every start uses.
    options: String,
}

impl PgCluster {
    pub fn start_tls(dir: &Path, server: &Issued) -> PgCluster {
        let mut pg = PgCluster::init(dir);
        // The key must belong to the server's user and be private to it.
        let cert = pg.data.join("server.crt");
        let key = pg.data.join("server.key");
        std::fs::copy(&server.cert_file, &cert).expect("copy cert");
        std::fs::copy(&server.key_file, &key).expect("copy key");
        if is_root() {
            run(Command::new("chown")
                .args(["postgres:"])
                .arg(&cert)
                .arg(&key));
        }
        std::fs::write(
            pg.data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("pg_hba.conf");
        pg.options
            .push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        pg.start();
        pg
    }

    /// Plain TCP on loopback; [`PgCluster::stop`] and [`PgCluster::start`] make an outage.
    pub fn start_plain(dir: &Path) -> PgCluster {
        let pg = PgCluster::init(dir);
        pg.start();
        pg
    }

    /// initdb a cluster under `dir`, not yet started.
    fn init(dir: &Path) -> PgCluster {
        let bin = pg_bin_dir();
        let port = free_port();
        let root = dir.join(format!("pg-{port}"));
        let data = root.join("data");
        std::fs::create_dir_all(&root).expect("pg dir");
        // Postgres refuses to run as root: the cluster belongs to the postgres user then.
        let as_postgres = is_root();
        if as_postgres {
            run(Command::new("chown").args(["-R", "postgres:"]).arg(&root));
        }
        let mut initdb = postgres_command(&bin.join("initdb"), as_postgres);
        initdb
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&data);
        run(&mut initdb);
        let options = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c fsync=off",
            root.display()
        );
        PgCluster {
            port,
            data,
            bin,
            options,
        }
    }

    /// Start the server (again); returns once it accepts connections.
    pub fn start(&self) {
        let log = self.data.parent().unwrap_or(&self.data).join("server.log");
        let mut start = postgres_command(&self.bin.join("pg_ctl"), is_root());
        start
            .args(["-w", "-t", "30", "-D"])
            .arg(&self.data)
            .arg("-l")
            .arg(log)
            .args(["-o", &self.options, "start"]);
        run(&mut start);
    }

    /// Stop the server the way a restart does: every session is closed at once.
    pub fn stop(&self) {
        let mut stop = postgres_command(&self.bin.join("pg_ctl"), is_root());
        stop.args(["-w", "-D"])
            .arg(&self.data)
            .args(["-m", "fast", "stop"]);
        run(&mut stop);
    }

    /// A URL for `dbname` on this cluster through `host` (a name or an address).
    pub fn url(&self, host: &str, dbname: &str, params: &str) -> String {
        format!("postgres://postgres@{host}:{}/{dbname}?{params}", self.port)
    }

    /// `postgres://postgres@127.0.0.1:PORT/{dbname}`, for a plain cluster.
    pub fn plain_url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let mut stop = postgres_command(&self.bin.join("pg_ctl"), is_root());
        stop.args(["-D"])
            .arg(&self.data)
            .args(["-m", "immediate", "stop"]);
        let _ = stop.stdout(Stdio::null()).stderr(Stdio::null()).status();
        if let Some(root) = self.data.parent() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn postgres_command(program: &Path, as_postgres: bool) -> Command {
    if as_postgres {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The newest installed PostgreSQL's server binaries.
fn pg_bin_dir() -> PathBuf {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("/usr/lib/postgresql (scripts/deps.sh installs PostgreSQL)")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().expect("an installed PostgreSQL with initdb").1
}

/// A temporary directory others can traverse (the postgres user must reach its cluster
/// inside); removed when dropped.
pub fn test_dir(name: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix(&format!("summaryd-{name}-"))
        .permissions(std::fs::Permissions::from_mode(0o755))
        .tempdir()
        .expect("temp dir")
}

/// Redis memory as `INFO memory` reports it, for tests that measure what jobs cost.
#[derive(Debug, Clone, Copy)]
pub struct RedisMemory {
    /// `used_memory` less `mem_clients_normal`: the data without what connected clients
    /// hold (their buffers come and go with the connection pools, not with jobs; the server
    /// re-accounts them late, so this wobbles by tens of KB).
    pub used_less_clients: i64,
    /// `used_memory_dataset`: `used_memory` less every overhead, the data alone.
    pub dataset: i64,
}

pub async fn redis_memory(redis: &mut redis::aio::MultiplexedConnection) -> RedisMemory {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(redis)
        .await
        .unwrap();
    let field = |name: &str| -> i64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in INFO memory"))
    };
    RedisMemory {
        used_less_clients: field("used_memory") - field("mem_clients_normal"),
        dataset: field("used_memory_dataset"),
    }
}
