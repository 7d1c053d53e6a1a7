//! The one loopback HTTP/1.1 server the tests use wherever a model API or an email API
//! stands: `Server` runs a handler per request (the chaos suite's fake model API and mail
//! sink), `HttpStub` is a handler that plays scripted replies and records requests.
//!
//! Plain tokio sockets rather than a framework, so a reply can misbehave at the byte level:
//! reset the connection, send headers and then drip the body forever, or never answer.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use crate::shared::http_request::Request;
use crate::shared::http_request::read_request;
use crate::shared::script::Script;

/// What the server does with one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Reset the connection (RST) without answering.
    Reset,
    /// Send `200` headers promising a large body, then one byte per `every` until the client
    /// goes away.
    Drip { every: Duration },
    /// Never answer; hold the connection until the client hangs up.
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

pub type Handler =
    Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync>;

/// A handler that answers each request with `answer(state, request)`.
pub fn handler<S, F, Fut>(state: Arc<S>, answer: F) -> Handler
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    Arc::new(move |request| Box::pin(answer(state.clone(), request)))
}

/// Whether a connection carries more than one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connections {
    /// Keep-alive, as a real provider under load is used.
    KeepAlive,
    /// `Connection: close` after each reply, so every request opens its own connection and a
    /// finished exchange leaves no connection open.
    ClosedAfterReply,
}

/// The server; stops accepting when dropped (open connections end with the test runtime).
pub struct Server {
    pub addr: SocketAddr,
    open_connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(handler: Handler, connections: Connections) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let open_connections = Arc::new(AtomicUsize::new(0));
        let open = open_connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let handler = handler.clone();
                let open = open.clone();
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    serve(stream, handler, connections).await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Server {
            addr,
            open_connections,
            task,
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections the server still holds open (a drip ends when the client hangs up).
    pub fn open_connections(&self) -> usize {
        self.open_connections.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A port nothing listens on right now (bind port 0, note it, release it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `http://127.0.0.1:PORT{path}` on a port nothing listens on.
pub fn closed_port_url(path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", free_port())
}

async fn serve(mut stream: TcpStream, handler: Handler, connections: Connections) {
    let mut buf = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buf).await {
        match handler(request).await {
            Reply::Respond {
                status,
                headers,
                body,
            } => {
                let mut head = format!(
                    "HTTP/1.1 {status} Stub\r\nContent-Length: {}\r\n",
                    body.len()
                );
                if connections == Connections::ClosedAfterReply {
                    head.push_str("Connection: close\r\n");
                }
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                head.push_str(&body);
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                if connections == Connections::ClosedAfterReply {
                    let _ = stream.shutdown().await;
                    return;
                }
            }
            Reply::Reset => {
                let _ = stream.set_zero_linger();
                return;
            }
            Reply::Drip { every } => return drip(stream, every).await,
            Reply::Hang => return hang(stream).await,
        }
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

/// One request as the stub saw it.
pub type Recorded = Request;

struct Stub {
    replies: Script<Reply>,
    requests: Mutex<Vec<Recorded>>,
}

/// A server that records every request and answers with scripted replies, one connection
/// per request.
pub struct HttpStub {
    pub addr: SocketAddr,
    server: Server,
    stub: Arc<Stub>,
}

impl HttpStub {
    pub async fn start(reply: Reply) -> HttpStub {
        let stub = Arc::new(Stub {
            replies: Script::new(Vec::new(), reply),
            requests: Mutex::new(Vec::new()),
        });
        let handler = handler(stub.clone(), |stub, request| async move {
            stub.requests.lock().unwrap().push(request);
            stub.replies.next()
        });
        let server = Server::start(handler, Connections::ClosedAfterReply).await;
        HttpStub {
            addr: server.addr,
            server,
            stub,
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Answer the next requests with `replies`, in order, before the standing reply.
    pub fn script(&self, replies: Vec<Reply>) {
        self.stub.replies.extend(replies);
    }

    pub fn set_reply(&self, reply: Reply) {
        self.stub.replies.set_standing(reply);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.stub.requests.lock().unwrap().clone()
    }

    /// Connections the server still holds open (a drip ends when the client hangs up).
    pub fn open_connections(&self) -> usize {
        self.server.open_connections()
    }

    /// Poll until no connection is open; false if one is still open after `within`.
    pub async fn wait_all_closed(&self, within: Duration) -> bool {
        crate::shared::eventually(within, || async { self.open_connections() == 0 }).await
    }
}
