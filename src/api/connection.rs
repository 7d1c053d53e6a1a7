//! One accepted connection, as the HTTP layer sees it: the TCP stream, with two duties
//! actix-http does not have.
//!
//! **Every head has a deadline.** actix times only a connection's first head, so a client
//! could send one request, then the next head a byte at a time, and hold its connection
//! (one of `SUMMARYD_API_MAX_CONNECTIONS`) for ever. Here each head must be complete within
//! `SUMMARYD_API_REQUEST_TIMEOUT_MS` of the connection's start or of the last write of the
//! previous response; else the client gets a 408 and the connection is closed. The wrapper
//! learns where it stands from the bytes alone (`api::head`), and publishes it in its slot
//! (`api::slots`), so a newcomer at the cap can close a connection that is only waiting.
//!
//! **Problem bodies for actix's own answers.** The answers actix gives by itself before any
//! handler runs (a request it cannot parse: 400; a head over its limit: 431) leave with a
//! problem-details body like every other error, instead of an empty one. Those answers are
//! written as one complete head with `content-length: 0`, followed by closing the
//! connection; no response of this service has that shape (every error it produces carries
//! a problem body), so a write that starts with such a head is rewritten and everything
//! else passes through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::ResponseError;
use actix_web::rt::net::TcpStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::head::{HeadTracker, ReadEvent};
use super::problem::{ApiError, PROBLEM_JSON};
use super::slots::Ticket;

pub(crate) struct ProblemIo {
    inner: TcpStream,
    /// Bytes of a rewritten answer not yet written to the socket.
    pending: Vec<u8>,
    written: usize,
    /// Where the connection stands between requests.
    head: HeadTracker,
    /// When the awaited head must be complete.
    deadline: Instant,
    timeout: Duration,
    /// Created the first time a head is not there at once, then only moved when it fires
    /// early (the deadline moves with every response, the timer at most once per timeout).
    timer: Option<Pin<Box<Sleep>>>,
    slot: Ticket,
    /// The last write left bytes unwritten: the HTTP layer still owes the client part of a
    /// response, so a 408 of ours cannot follow it.
    owed: bool,
    /// Closed here (deadline or eviction): reads see the end of the stream, writes fail.
    closed: bool,
}

impl ProblemIo {
    /// `inner`, accepted at `accepted`, holding `slot`; every head must arrive within
    /// `timeout`.
    pub fn new(inner: TcpStream, slot: Ticket, accepted: Instant, timeout: Duration) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            written: 0,
            head: HeadTracker::default(),
            deadline: accepted + timeout,
            timeout,
            timer: None,
            slot,
            owed: false,
            closed: false,
        }
    }

    fn on_read(&mut self, bytes: &[u8]) {
        match self.head.on_read(bytes) {
            ReadEvent::None => {}
            ReadEvent::HeadStarted => self.slot.awaiting(self.deadline - self.timeout, true),
            ReadEvent::HeadComplete => self.slot.in_request(),
        }
    }

    fn on_write(&mut self, buf: &[u8], taken: usize) {
        self.owed = taken < buf.len();
        if taken > 0 && self.head.on_write(buf) {
            let now = Instant::now();
            self.deadline = now + self.timeout;
            self.slot.awaiting(now, self.head.started());
        }
    }

    /// Waiting for a head and none came: Ready when the connection is to end (chosen to
    /// make room, or past its deadline), Pending with the task woken at either.
    fn poll_head_wait(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.slot.evicted(cx.waker()) {
            self.closed = true;
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if timer.deadline() >= deadline {
                break;
            }
            timer.as_mut().reset(deadline);
        }
        self.closed = true;
        if !self.owed && self.pending.is_empty() {
            // One try, without waiting: the socket's buffer is empty between requests, and
            // a client that does not read is not waited for.
            if let Some(answer) = timeout_answer() {
                let _ = Pin::new(&mut self.inner).poll_write(cx, &answer);
            }
        }
        Poll::Ready(())
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

/// The 408 for a head not received in time, with the problem body every answer carries.
fn timeout_answer() -> Option<Vec<u8>> {
    let date = chrono::Utc::now().format("%a, %d %b %Y %H:%M:%S GMT");
    let head = format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\ndate: {date}\r\n\r\n"
    );
    rewrite(head.as_bytes())
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
        let this = &mut *self;
        if this.closed {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.on_read(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Nothing to read: the only moment a waiting connection can be ended, and the
            // one where its timer and its slot must be watched for the next wake-up.
            Poll::Pending if this.head.awaiting() => this.poll_head_wait(cx).map(Ok),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for ProblemIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        std::task::ready!(this.drain(cx))?;
        if let Some(rewritten) = rewrite(buf) {
            // The caller's bytes are taken whole; the rewritten ones go out from here.
            this.pending = rewritten;
            this.on_write(buf, buf.len());
            if let Poll::Ready(Err(e)) = this.drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        match written {
            Poll::Ready(Ok(n)) => this.on_write(buf, n),
            Poll::Pending => this.owed = true,
            Poll::Ready(Err(_)) => {}
        }
        written
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
