//! `summaryd healthcheck`: GET `/healthz` of a running summaryd and exit 0 on 200, 1 otherwise.
//!
//! It exists for container `HEALTHCHECK`s: the runtime image has no curl or wget, and the
//! binary already knows where it listens (the same settings `serve` reads). Plain blocking
//! std I/O on purpose: one request with a deadline needs no runtime, pool or TLS.

use clap::Args;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{FlagOverrides, Settings};

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// Address to check instead of the configured one; 0.0.0.0 and [::] mean loopback.
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: Option<SocketAddr>,
    /// Deadline for the connect and for each read and write.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub(crate) timeout_ms: u64,
}

/// The route every role serves while the process lives (liveness, not readiness).
const PATH: &str = "/healthz";

/// Enough for any status line; a longer head is not summaryd's.
const MAX_HEAD: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum HealthcheckError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("GET {PATH} on {addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("GET {PATH} on {addr} answered {status_line:?}, not 200")]
    Status {
        addr: SocketAddr,
        status_line: String,
    },
}

/// `summaryd healthcheck`: exit 0 when healthy, 1 for anything else, configuration errors
/// included (Docker reserves exit code 2 of a health check, so 2 is never used here).
pub fn run(config: Option<&Path>, args: &HealthcheckArgs) -> ExitCode {
    let settings = match Settings::load(config, &FlagOverrides::default()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("summaryd healthcheck: {e}");
            return ExitCode::FAILURE;
        }
    };
    // As every command does, though only the address is used: a configuration `serve`
    // would refuse is reported here too.
    if let Err(e) = crate::infra::check_tls_files(&settings) {
        eprintln!("summaryd healthcheck: {e}");
        return ExitCode::FAILURE;
    }
    let addr = args.listen.unwrap_or_else(|| healthz_addr(&settings));
    match check(addr, Duration::from_millis(args.timeout_ms)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("summaryd healthcheck: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where `/healthz` is served: the ops listener when there is one (the main listener then
/// answers it with 404), else the main listener.
fn healthz_addr(settings: &Settings) -> SocketAddr {
    settings.ops.listen.unwrap_or(settings.listen)
}

/// One HTTP/1.1 GET of `/healthz` on `listen`; `timeout` bounds the connect and each read
/// and write, so a hung server fails the check instead of hanging it.
pub fn check(listen: SocketAddr, timeout: Duration) -> Result<(), HealthcheckError> {
    let addr = dialable(listen);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|source| HealthcheckError::Connect { addr, source })?;
    let io = |source| HealthcheckError::Io { addr, source };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request =
        format!("GET {PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;

    // Only the status line matters; read until its end (or the server closes).
    let mut head = Vec::with_capacity(128);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let status_line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(version), Some("200")) if version.starts_with("HTTP/1.") => Ok(()),
        _ => Err(HealthcheckError::Status { addr, status_line }),
    }
}

/// A listener bound to the unspecified address (`0.0.0.0`, `[::]`, as in a container) is
/// reached on the loopback address of the same family.
fn dialable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_listen_addresses_are_dialled_on_loopback() {
        let v4: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(dialable(v4), "127.0.0.1:8080".parse().unwrap());
        let v6: SocketAddr = "[::]:8080".parse().unwrap();
        assert_eq!(dialable(v6), "[::1]:8080".parse().unwrap());
        let pod: SocketAddr = "10.1.2.3:8080".parse().unwrap();
        assert_eq!(dialable(pod), pod);
    }
}
