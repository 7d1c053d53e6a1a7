//! Where one connection stands between requests, seen from its bytes alone: waiting for a
//! request head (since the connection started or since the last response was written), or
//! inside a request (its head complete, its response not yet begun).
//!
//! actix times only a connection's first head, so `api::connection` times every head
//! itself and needs to know, without parsing HTTP, when a head is complete. It only has to
//! agree with the parser on where the header section ends: the first empty line after a
//! non-empty one. The parser accepts bare LF line ends and skips empty lines before the
//! request line, so the scanner does too: otherwise a valid head would never count as
//! complete (and be cut at the deadline), or a client could escape the deadline by sending
//! empty lines first.

/// Scanner state between two reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Nothing but empty lines so far.
    Empty,
    /// Inside a non-empty line.
    Line,
    /// Just after a line's LF.
    Lf,
    /// Just after a line's LF and a CR.
    LfCr,
}

/// Finds the end of a request head across any split of its bytes into reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeadScanner(Scan);

impl Default for HeadScanner {
    fn default() -> Self {
        Self(Scan::Empty)
    }
}

impl HeadScanner {
    /// Feed the next bytes; `Some(n)` when the head ends with the `n`th of them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            if self.0 == Scan::Line {
                // Only a LF can end a line: skip to it.
                let lf = bytes[i..].iter().position(|&b| b == b'\n')?;
                i += lf + 1;
                self.0 = Scan::Lf;
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.0 = match (self.0, b) {
                (Scan::Empty, b'\r' | b'\n') => Scan::Empty,
                (Scan::Lf | Scan::LfCr, b'\n') => {
                    *self = Self::default();
                    return Some(i);
                }
                (Scan::Lf, b'\r') => Scan::LfCr,
                _ => Scan::Line,
            };
        }
        None
    }
}

/// What a read did to the connection's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadEvent {
    /// Nothing that changes the state (inside a request, or more of a started head).
    None,
    /// The first bytes of a head: the connection now holds a partial head.
    HeadStarted,
    /// The head is complete: the connection is inside a request.
    HeadComplete,
}

/// One connection's state, driven by what is read from and written to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeadTracker {
    awaiting: bool,
    started: bool,
    /// The last response said `connection: close`: no head follows on this connection.
    closing: bool,
    scanner: HeadScanner,
}

impl Default for HeadTracker {
    /// A new connection waits for its first head.
    fn default() -> Self {
        Self {
            awaiting: true,
            started: false,
            closing: false,
            scanner: HeadScanner::default(),
        }
    }
}

impl HeadTracker {
    /// Waiting for a head (rather than inside a request).
    pub(crate) fn awaiting(&self) -> bool {
        self.awaiting
    }

    /// Some of the awaited head has arrived.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Bytes read from the client. Inside a request they are its body (or a pipelined
    /// request the previous response will be followed by), and are not looked at.
    pub(crate) fn on_read(&mut self, bytes: &[u8]) -> ReadEvent {
        if !self.awaiting || bytes.is_empty() {
            return ReadEvent::None;
        }
        if self.scanner.feed(bytes).is_some() {
            self.awaiting = false;
            self.started = false;
            return ReadEvent::HeadComplete;
        }
        if self.started {
            ReadEvent::None
        } else {
            self.started = true;
            ReadEvent::HeadStarted
        }
    }

    /// Bytes of a response written: the next head is awaited from now on. `false` for an
    /// interim response (`100 Continue`), after which the request's body follows, not a
    /// head, and for a response that closes the connection (an early refusal: the HTTP
    /// layer drains the unread body for its short disconnect timeout, then closes). Bytes
    /// read after such a response are that body, not a head, so the connection stays
    /// inside its request and is never taken for a stalled one. More writes of the same
    /// response keep what was read of the next head.
    pub(crate) fn on_write(&mut self, buf: &[u8]) -> bool {
        if self.closing {
            return false;
        }
        if self.awaiting {
            return true;
        }
        if buf.starts_with(b"HTTP/1.1 1") {
            return false;
        }
        if closes(buf) {
            self.closing = true;
            return false;
        }
        *self = Self::default();
        true
    }
}

/// Whether the response head at the start of `buf` says `connection: close`.
fn closes(buf: &[u8]) -> bool {
    const CLOSE: &[u8] = b"connection: close\r\n";
    let head = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf, |end| &buf[..end + 2]);
    // Line by line, after the status line: every response passes here, and comparing the
    // whole line at each offset cost more than the rest of the head's handling together.
    head.split_inclusive(|&b| b == b'\n')
        .skip(1)
        .any(|line| line.eq_ignore_ascii_case(CLOSE))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the head ends when `bytes` arrive split at every position into two reads,
    /// and in one read: all must agree.
    fn end_of(bytes: &[u8]) -> Option<usize> {
        let whole = HeadScanner::default().feed(bytes);
        for split in 0..=bytes.len() {
            let mut s = HeadScanner::default();
            let (a, b) = bytes.split_at(split);
            let got = s.feed(a).or_else(|| s.feed(b).map(|n| n + split));
            assert_eq!(
                got,
                whole,
                "split at {split} of {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        // And one byte per read, as a trickling client sends it.
        let mut s = HeadScanner::default();
        let byte_by_byte = (0..bytes.len()).find_map(|i| s.feed(&bytes[i..=i]).map(|_| i + 1));
        assert_eq!(byte_by_byte, whole);
        whole
    }

    #[test]
    fn the_head_ends_at_the_first_empty_line_after_a_non_empty_one() {
        let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(end_of(get), Some(get.len()));
        // What follows the head (a body, the next request) is not part of it.
        let post = b"POST /v1 HTTP/1.1\r\nContent-Length: 4\r\n\r\n\r\n\r\n";
        assert_eq!(end_of(post), Some(post.len() - 4));
        // Bare LF line ends, as the parser accepts them, and mixed ones.
        let lf = b"GET / HTTP/1.1\nHost: x\n\n";
        assert_eq!(end_of(lf), Some(lf.len()));
        for mixed in [
            &b"GET / HTTP/1.1\r\nHost: x\n\r\nrest"[..],
            b"GET / HTTP/1.1\nHost: x\r\n\nrest",
        ] {
            assert_eq!(end_of(mixed), Some(mixed.len() - 4));
        }
        // A request line alone, then an empty line.
        assert_eq!(end_of(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
    }

    #[test]
    fn an_unfinished_head_does_not_end() {
        for partial in [
            &b""[..],
            b"GET /healthz HTTP/1.1",
            b"GET /healthz HTTP/1.1\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r",
            // CRs without a LF end nothing.
            b"GET /healthz HTTP/1.1\r\r\r\r",
            b"GET /healthz HTTP/1.1\n\r\r\n",
            // Empty lines before the request line are skipped, not an empty head: a client
            // cannot leave the deadline behind by sending them first.
            b"\r\n\r\n\r\n",
            b"\n\n\n\n",
            b"\r\n\r\nGET / HTTP/1.1\r\n",
        ] {
            assert_eq!(
                end_of(partial),
                None,
                "{:?}",
                String::from_utf8_lossy(partial)
            );
        }
        assert_eq!(end_of(b"\r\n\nGET / HTTP/1.1\r\n\r\n"), Some(21));
    }

    #[test]
    fn the_scanner_starts_over_after_a_head() {
        let mut s = HeadScanner::default();
        assert_eq!(s.feed(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
        assert_eq!(s, HeadScanner::default());
        // An empty line right after is not a second head.
        assert_eq!(s.feed(b"\r\n"), None);
        assert_eq!(s.feed(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(s.feed(b"\r\n"), Some(2));
    }

    #[test]
    fn a_connection_awaits_a_head_until_it_is_complete_then_until_a_response_is_written() {
        let mut t = HeadTracker::default();
        assert!(t.awaiting() && !t.started());
        assert_eq!(t.on_read(b""), ReadEvent::None);
        assert!(!t.started(), "an empty read starts nothing");
        assert_eq!(t.on_read(b"GET / HT"), ReadEvent::HeadStarted);
        assert!(t.awaiting() && t.started());
        assert_eq!(t.on_read(b"TP/1.1\r\n"), ReadEvent::None);
        assert_eq!(t.on_read(b"\r\n{\"body\""), ReadEvent::HeadComplete);
        assert!(!t.awaiting() && !t.started());
        // Inside the request: its body is not scanned, whatever it holds.
        assert_eq!(t.on_read(b"a\r\n\r\nb"), ReadEvent::None);
        assert!(!t.awaiting());
        // An interim answer is not the response: the body still follows.
        assert!(!t.on_write(b"HTTP/1.1 100 Continue\r\n\r\n"));
        assert!(!t.awaiting());
        assert!(t.on_write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n"));
        assert!(t.awaiting() && !t.started());
        // The next head, in one read with its end.
        assert_eq!(
            t.on_read(b"GET / HTTP/1.1\r\n\r\n"),
            ReadEvent::HeadComplete
        );
        assert!(!t.awaiting());
    }

    #[test]
    fn after_a_response_that_closes_the_connection_no_head_is_awaited() {
        let mut t = HeadTracker::default();
        t.on_read(b"POST / HTTP/1.1\r\ncontent-length: 9999\r\n\r\n");
        assert!(!t.on_write(
            b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\ncontent-length: 2\r\n\r\n{}"
        ));
        assert!(!t.awaiting());
        // The unread body drains: not a head, however it looks.
        assert_eq!(t.on_read(b"GET / HTTP/1.1\r\n"), ReadEvent::None);
        assert!(!t.awaiting() && !t.started());
        assert!(!t.on_write(b"more"));
        // Only in the head: a body that mentions it closes nothing.
        let mut t = HeadTracker::default();
        t.on_read(b"GET / HTTP/1.1\r\n\r\n");
        assert!(
            t.on_write(b"HTTP/1.1 200 OK\r\ncontent-length: 24\r\n\r\n\r\nconnection: close\r\n")
        );
        assert!(t.awaiting());
        assert!(closes(b"HTTP/1.1 408 x\r\nconnection: close\r\n\r\n"));
        assert!(!closes(
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\n\r\n"
        ));
        // A whole line says it, in the head, in any case; nothing that merely contains it.
        assert!(closes(
            b"HTTP/1.1 400 x\r\ncontent-length: 0\r\nCONNECTION: Close\r\n\r\n"
        ));
        for not in [
            &b"HTTP/1.1 200 OK\r\nx-connection: close\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nconnection: closed\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nconnection: close",
            b"connection: close\r\n\r\n",
        ] {
            assert!(!closes(not), "{}", String::from_utf8_lossy(not));
        }
    }

    #[test]
    fn more_of_a_response_keeps_what_was_read_of_the_next_head() {
        let mut t = HeadTracker::default();
        t.on_read(b"GET / HTTP/1.1\r\n\r\n");
        assert!(t.on_write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"));
        assert_eq!(t.on_read(b"GET / HTTP/1.1\r\n\r"), ReadEvent::HeadStarted);
        // The rest of the body of the response: still awaiting, the head half read.
        assert!(t.on_write(b"HTTP/1"));
        assert!(t.awaiting() && t.started());
        assert_eq!(t.on_read(b"\n"), ReadEvent::HeadComplete);
    }
}
