//! One accepted connection, as the HTTP layer sees it: the TCP stream, except that the
//! answers actix-http gives by itself before any handler runs (a request it cannot parse:
//! 400; a head over its limit: 431; a first head not received in time: 408) leave with a
//! problem-details body like every other error, instead of an empty one.
//!
//! Those answers are written as one complete head with `content-length: 0`, followed by
//! closing the connection; no response of this service has that shape (every error it
//! produces carries a problem body), so a write that starts with such a head is rewritten
//! and everything else passes through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::ResponseError;
use actix_web::rt::net::TcpStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::problem::{ApiError, PROBLEM_JSON};

pub(crate) struct ProblemIo {
    inner: TcpStream,
    /// Bytes of a rewritten answer not yet written to the socket.
    pending: Vec<u8>,
    written: usize,
}

impl ProblemIo {
    pub fn new(inner: TcpStream) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }

    /// Write what is pending; Ready(Ok) once all of it is out.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = std::task::ready!(
                Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

/// The problem for an empty-bodied answer of the HTTP layer, by its status.
fn problem_for(status: &str) -> Option<ApiError> {
    match status {
        "400" => Some(ApiError::MalformedRequest),
        "408" => Some(ApiError::RequestTimeout),
        "431" => Some(ApiError::HeadTooLarge),
        _ => None,
    }
}

/// `buf` with its leading empty-bodied 400/408/431 head given a problem body, or `None`
/// when it does not start with one.
fn rewrite(buf: &[u8]) -> Option<Vec<u8>> {
    // Every response passes here: leave all but a 4xx head at the first bytes.
    if !buf.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status = status_line.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    let problem = problem_for(status)?;
    let headers: Vec<&str> = lines.collect();
    let empty = headers
        .iter()
        .any(|h| h.eq_ignore_ascii_case("content-length: 0"));
    let typed = headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("content-type:"));
    if !empty || typed {
        return None;
    }
    let body = serde_json::to_string(&problem.problem()).ok()?;
    let mut out = format!("{status_line}\r\ncontent-type: {PROBLEM_JSON}\r\n");
    for h in headers
        .iter()
        .filter(|h| !h.eq_ignore_ascii_case("content-length: 0"))
    {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    // Keep the status consistent with the one place that maps errors to statuses.
    debug_assert_eq!(problem.status_code().as_str(), status);
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&buf[head_end + 4..]);
    Some(bytes)
}

impl AsyncRead for ProblemIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ProblemIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        std::task::ready!(this.drain(cx))?;
        if let Some(rewritten) = rewrite(buf) {
            // The caller's bytes are taken whole; the rewritten ones go out from here.
            this.pending = rewritten;
            if let Poll::Ready(Err(e)) = this.drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_protocol_errors_get_a_problem_body_and_the_rest_passes() {
        let raw = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite(raw).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains("content-type: application/problem+json"));
        assert!(head.contains("connection: close") && head.contains("date: x"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let p: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(p["status"], 431);

        // Our own responses, and statuses actix does not produce by itself, pass untouched.
        for raw in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n{\"a\":\"b\"}   ",
            b"HTTP/1.1 400 Bad Req",
            b"{\"title\":\"HTTP/1.1 400\"}",
        ] {
            assert!(rewrite(raw).is_none(), "{}", String::from_utf8_lossy(raw));
        }
    }
}
