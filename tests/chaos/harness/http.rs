//! A minimal HTTP/1.1 server (keep-alive, Content-Length bodies) for the fake model API and
//! the mail sink. Plain tokio sockets, so a handler can also hang without answering, the
//! way a broken upstream does.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use crate::shared::http_request::Request;
use crate::shared::http_request::read_request;

/// What the handler wants done with a request.
#[derive(Debug, Clone)]
pub enum Response {
    Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Never answer; hold the connection until the client hangs up.
    Hang,
}

impl Response {
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Response::Reply {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_string(),
        }
    }
}

pub type Handler =
    Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// The server; stops accepting when dropped (open connections end with the test runtime).
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(handler: Handler) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, handler.clone()));
            }
        });
        Server { addr, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, handler: Handler) {
    let mut buf = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buf).await {
        match handler(request).await {
            Response::Reply {
                status,
                headers,
                body,
            } => {
                let mut head = format!(
                    "HTTP/1.1 {status} Fake\r\nContent-Length: {}\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                head.push_str(&body);
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
            }
            Response::Hang => {
                let mut sink = [0u8; 256];
                while let Ok(n) = stream.read(&mut sink).await {
                    if n == 0 {
                        return;
                    }
                }
                return;
            }
        }
    }
}
