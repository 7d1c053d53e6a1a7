//! A scriptable HTTP/1.1 server on 127.0.0.1:0 standing in for a model API or an email API.
//!
//! Plain tokio sockets rather than a framework, so a test can misbehave at the byte level:
//! reset the connection, or send headers and then drip the body forever.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::shared::http_request::read_request;

/// What the server does with each request.
#[derive(Debug, Clone)]
pub enum Reply {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Read the request, then reset the connection (RST) without answering.
    Reset,
    /// Send `200` headers promising a large body, then one byte per `every` until the client
    /// goes away.
    Drip { every: Duration },
    /// Read the request (or whatever the client sends first) and never answer.
    Hang,
}

impl Reply {
    pub fn json(status: u16, body: serde_json::Value) -> Self {
        Reply::Respond {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_string(),
        }
    }

    pub fn text(status: u16, body: &str) -> Self {
        Reply::Respond {
            status,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: body.into(),
        }
    }

    /// An OpenAI-style chat completion whose answer is `content`.
    pub fn completion(content: &str) -> Self {
        Reply::json(
            200,
            serde_json::json!({
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop"
                }]
            }),
        )
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }
}

/// One request as the stub saw it.
pub type Recorded = crate::shared::http_request::Request;

struct State {
    /// Played first, one per connection; then `reply` for every connection after.
    script: Mutex<std::collections::VecDeque<Reply>>,
    reply: Mutex<Reply>,
    requests: Mutex<Vec<Recorded>>,
    open_connections: AtomicUsize,
}

pub struct HttpStub {
    pub addr: std::net::SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl HttpStub {
    pub async fn start(reply: Reply) -> HttpStub {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind stub");
        let addr = listener.local_addr().expect("stub addr");
        let state = Arc::new(State {
            script: Mutex::new(Default::default()),
            reply: Mutex::new(reply),
            requests: Mutex::new(Vec::new()),
            open_connections: AtomicUsize::new(0),
        });
        let accept_state = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = accept_state.clone();
                state.open_connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    serve(stream, &state).await;
                    state.open_connections.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        HttpStub { addr, state, task }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answer the next connections with `replies`, in order, before the standing reply.
    pub fn script(&self, replies: Vec<Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    pub fn set_reply(&self, reply: Reply) {
        *self.state.reply.lock().unwrap() = reply;
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Connections the server still holds open (a drip ends when the client hangs up).
    pub fn open_connections(&self) -> usize {
        self.state.open_connections.load(Ordering::SeqCst)
    }

    /// Poll until no connection is open; false if one is still open after `within`.
    pub async fn wait_all_closed(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.open_connections() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

impl Drop for HttpStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A port nothing listens on: bind, note the port, close.
pub async fn closed_port_url(path: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}{path}")
}

async fn serve(mut stream: TcpStream, state: &State) {
    let scripted = state.script.lock().unwrap().pop_front();
    let reply = scripted.unwrap_or_else(|| state.reply.lock().unwrap().clone());
    if matches!(reply, Reply::Hang) {
        return hang(stream).await;
    }
    let Some(request) = read_request(&mut stream, &mut Vec::new()).await else {
        return;
    };
    state.requests.lock().unwrap().push(request);
    match reply {
        Reply::Respond {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Stub\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Reply::Reset => {
            let _ = stream.set_zero_linger();
            drop(stream);
        }
        Reply::Drip { every } => drip(stream, every).await,
        Reply::Hang => hang(stream).await,
    }
}

async fn hang(mut stream: TcpStream) {
    let mut buf = [0u8; 64];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

async fn drip(mut stream: TcpStream, every: Duration) {
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n";
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let mut buf = [0u8; 64];
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {
                if stream.write_all(b" ").await.is_err() {
                    return;
                }
            }
            // EOF or error: the client hung up.
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
}
