//! A minimal SMTP server on 127.0.0.1:0 that records what lettre sends.
//!
//! Speaks just enough of RFC 5321 for a plaintext client (EHLO/HELO, AUTH PLAIN/LOGIN, MAIL,
//! RCPT, DATA, RSET, NOOP, QUIT; any credentials are accepted); `RCPT TO` and `AUTH` can be
//! scripted to answer with an error to test classification, `RCPT TO` echoing the address
//! as real servers do.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One accepted message.
#[derive(Debug, Clone)]
pub struct Received {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The DATA section with dot-stuffing removed, CRLF line ends.
    pub data: String,
}

impl Received {
    /// First header named `name` (case-insensitive), unfolded.
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.data.split("\r\n\r\n").next()?;
        let mut found: Option<String> = None;
        for line in head.split("\r\n") {
            if line.starts_with([' ', '\t']) {
                if let Some(value) = found.as_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if found.is_some() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case(name)
            {
                found = Some(v.trim().to_owned());
            }
        }
        found
    }

    pub fn body(&self) -> &str {
        self.data.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }
}

#[derive(Default)]
struct State {
    messages: Mutex<Vec<Received>>,
    /// When set, the full reply line to `RCPT TO` (e.g. "550 5.1.1 no such user"), with
    /// `{rcpt}` standing for the address the client sent, as servers echo it.
    rcpt_reply: Mutex<Option<String>>,
    /// AUTH exchanges completed (credentials are accepted, not checked).
    logins: Mutex<usize>,
    /// When set, the full reply line to every AUTH exchange (e.g. "535 5.7.8 bad
    /// credentials"), which then does not count as a login.
    auth_reply: Mutex<Option<String>>,
}

pub struct SmtpSink {
    pub addr: std::net::SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind sink");
        let addr = listener.local_addr().expect("sink addr");
        let state = Arc::new(State::default());
        let accept_state = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = accept_state.clone();
                tokio::spawn(async move {
                    let _ = session(stream, &state).await;
                });
            }
        });
        SmtpSink { addr, state, task }
    }

    /// A plaintext lettre URL for this sink.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    pub fn messages(&self) -> Vec<Received> {
        self.state.messages.lock().unwrap().clone()
    }

    /// How many sessions authenticated.
    pub fn logins(&self) -> usize {
        *self.state.logins.lock().unwrap()
    }

    /// Refuse every recipient with `reply_line`; `{rcpt}` in it becomes the address sent.
    pub fn reject_rcpt_with(&self, reply_line: &str) {
        *self.state.rcpt_reply.lock().unwrap() = Some(reply_line.into());
    }

    /// Refuse every AUTH with `reply_line` (an expired password), until `accept_auth`.
    pub fn reject_auth_with(&self, reply_line: &str) {
        *self.state.auth_reply.lock().unwrap() = Some(reply_line.into());
    }

    pub fn accept_auth(&self) {
        *self.state.auth_reply.lock().unwrap() = None;
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn session(stream: TcpStream, state: &State) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    write.write_all(b"220 sink.test ESMTP ready\r\n").await?;
    let mut mail_from = String::new();
    let mut rcpt_to = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let command = line.trim_end().to_owned();
        let verb = command
            .split([' ', ':'])
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        let reply = match verb.as_str() {
            "EHLO" => "250-sink.test\r\n250 AUTH PLAIN LOGIN\r\n".to_owned(),
            "HELO" => "250 sink.test\r\n".to_owned(),
            "AUTH" => {
                // PLAIN carries the credentials in its argument; LOGIN (or PLAIN without an
                // initial response) asks for them, one line per prompt.
                let args: Vec<&str> = command.split_whitespace().skip(1).collect();
                let prompts = match args.as_slice() {
                    [m, _] if m.eq_ignore_ascii_case("PLAIN") => 0,
                    [m] if m.eq_ignore_ascii_case("PLAIN") => 1,
                    [m, _] if m.eq_ignore_ascii_case("LOGIN") => 1,
                    _ => 2,
                };
                for _ in 0..prompts {
                    write.write_all(b"334 \r\n").await?;
                    line.clear();
                    if lines.read_line(&mut line).await? == 0 {
                        return Ok(());
                    }
                }
                match state.auth_reply.lock().unwrap().clone() {
                    Some(custom) => format!("{custom}\r\n"),
                    None => {
                        *state.logins.lock().unwrap() += 1;
                        "235 2.7.0 authenticated\r\n".to_owned()
                    }
                }
            }
            "MAIL" => {
                mail_from = angle_addr(&command);
                rcpt_to.clear();
                "250 2.1.0 ok\r\n".to_owned()
            }
            "RCPT" => match state.rcpt_reply.lock().unwrap().clone() {
                Some(custom) => format!("{}\r\n", custom.replace("{rcpt}", &angle_addr(&command))),
                None => {
                    rcpt_to.push(angle_addr(&command));
                    "250 2.1.5 ok\r\n".to_owned()
                }
            },
            "DATA" => {
                write.write_all(b"354 end with <CRLF>.<CRLF>\r\n").await?;
                let data = read_data(&mut lines).await?;
                state.messages.lock().unwrap().push(Received {
                    mail_from: mail_from.clone(),
                    rcpt_to: rcpt_to.clone(),
                    data,
                });
                "250 2.0.0 queued\r\n".to_owned()
            }
            "RSET" => {
                mail_from.clear();
                rcpt_to.clear();
                "250 2.0.0 ok\r\n".to_owned()
            }
            "NOOP" => "250 2.0.0 ok\r\n".to_owned(),
            "QUIT" => {
                write.write_all(b"221 2.0.0 bye\r\n").await?;
                return Ok(());
            }
            _ => "502 5.5.2 command not implemented\r\n".to_owned(),
        };
        write.write_all(reply.as_bytes()).await?;
    }
}

/// `MAIL FROM:<a@b> SIZE=1` -> `a@b`.
fn angle_addr(command: &str) -> String {
    command
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map(|(addr, _)| addr.to_owned())
        .unwrap_or_default()
}

async fn read_data(
    lines: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> std::io::Result<String> {
    let mut data = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(data);
        }
        if line == ".\r\n" {
            // The CRLF before the terminating dot belongs to the protocol, not the message.
            if data.ends_with("\r\n") {
                data.truncate(data.len() - 2);
            }
            return Ok(data);
        }
        let unstuffed = line.strip_prefix('.').unwrap_or(&line);
        data.push_str(unstuffed);
    }
}
