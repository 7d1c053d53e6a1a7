//! An HTTP email API that records every send with its `Idempotency-Key` and body, and can
//! be told to fail a share of sends (503) to make the relay resend.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::shared::http_stub::{Connections, Reply, Request, Server, handler};

#[derive(Debug, Clone)]
pub struct MailBehavior {
    /// Each send sleeps a uniform draw from this range (ms) before answering.
    pub latency_ms: Range<u64>,
    /// Share of sends answered 503 (the relay retries after the row's backoff).
    pub error_rate: f64,
}

impl MailBehavior {
    pub fn ok() -> Self {
        Self {
            latency_ms: 0..5,
            error_rate: 0.0,
        }
    }
}

/// One accepted send (failed ones are not recorded as sends, only counted).
#[derive(Debug, Clone)]
pub struct Sent {
    pub idempotency_key: Option<String>,
    pub body: Value,
}

#[derive(Default)]
struct State {
    behavior: Mutex<Option<MailBehavior>>,
    sent: Mutex<Vec<Sent>>,
    rejected: Mutex<usize>,
    /// An outage: every send is answered 503 while set.
    down: AtomicBool,
}

pub struct MailSink {
    server: Server,
    state: Arc<State>,
}

impl MailSink {
    pub async fn start(behavior: MailBehavior) -> MailSink {
        let state = Arc::new(State::default());
        *state.behavior.lock().unwrap() = Some(behavior);
        MailSink {
            server: Server::start(handler(state.clone(), answer), Connections::KeepAlive).await,
            state,
        }
    }

    /// `SUMMARYD_MAIL_HTTP_URL` for this sink.
    pub fn url(&self) -> String {
        self.server.url("/send")
    }

    /// Every accepted send, in arrival order.
    pub fn sent(&self) -> Vec<Sent> {
        self.state.sent.lock().unwrap().clone()
    }

    /// Accepted sends grouped by Idempotency-Key (sends without one under "").
    pub fn by_key(&self) -> BTreeMap<String, Vec<Value>> {
        let mut map: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for s in self.sent() {
            map.entry(s.idempotency_key.unwrap_or_default())
                .or_default()
                .push(s.body);
        }
        map
    }

    pub fn distinct_keys(&self) -> usize {
        self.by_key().len()
    }

    /// Start or end an outage: while down, every send is answered 503.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    /// Sends answered with an injected 503.
    pub fn rejected(&self) -> usize {
        *self.state.rejected.lock().unwrap()
    }
}

async fn answer(state: Arc<State>, req: Request) -> Reply {
    if req.method != "POST" || req.path != "/send" {
        return Reply::json(404, json!({"error": "no such route"}));
    }
    let behavior = state.behavior.lock().unwrap().clone().expect("behavior");
    let latency = if behavior.latency_ms.is_empty() {
        0
    } else {
        rand::random_range(behavior.latency_ms.clone())
    };
    tokio::time::sleep(Duration::from_millis(latency)).await;
    if state.down.load(Ordering::SeqCst) || rand::random::<f64>() < behavior.error_rate {
        *state.rejected.lock().unwrap() += 1;
        return Reply::json(503, json!({"error": "injected failure"}));
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    state.sent.lock().unwrap().push(Sent {
        idempotency_key: req.header("Idempotency-Key").map(str::to_owned),
        body,
    });
    Reply::json(200, json!({"id": "msg"}))
}
