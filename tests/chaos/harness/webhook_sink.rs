//! A webhook receiver: records every request (its `webhook-id`, headers and body) with the
//! answer it got, and can be told to fail a share of them (503) or to hold each one a while
//! before answering, so a test can kill the relay between its send and its mark. The
//! secret the world's processes sign with is made here, per world, with the file
//! `SUMMARYD_WEBHOOK_SECRETS_FILE` names.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::shared::http_stub::{Connections, Recorded, Reply, Request, Server, handler};

/// Where the sink takes webhooks; any other path is a 404 (and still recorded).
const PATH: &str = "/hooks/summaryd";

#[derive(Debug, Clone)]
pub struct WebhookBehavior {
    /// Each request sleeps a uniform draw from this range (ms) before answering.
    pub latency_ms: Range<u64>,
    /// Share of requests answered 503 without `Retry-After` (the relay retries after the
    /// row's backoff).
    pub error_rate: f64,
}

impl WebhookBehavior {
    pub fn ok() -> Self {
        Self {
            latency_ms: 0..5,
            error_rate: 0.0,
        }
    }
}

/// One request as the sink saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub request: Recorded,
    /// What the sink answered; `None` while the request is held (and for good when its
    /// sender was killed before the hold ended and the sink has not come to answer yet).
    pub status: Option<u16>,
}

impl Received {
    pub fn webhook_id(&self) -> Option<&str> {
        self.request.header("webhook-id")
    }

    /// The sink took the event: it answered 2xx.
    pub fn accepted(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

struct State {
    behavior: WebhookBehavior,
    received: Mutex<Vec<Received>>,
    /// Each request arriving while set is held this long before it is answered.
    hold: Mutex<Option<Duration>>,
}

pub struct WebhookSink {
    server: Server,
    state: Arc<State>,
    secret: String,
    secrets_file: PathBuf,
}

impl WebhookSink {
    /// Start the sink and write a fresh secret to `secrets_file` (one `whsec_` line, header
    /// mode's format).
    pub async fn start(behavior: WebhookBehavior, secrets_file: &Path) -> WebhookSink {
        let secret = format!("whsec_{}", BASE64.encode(rand::random::<[u8; 32]>()));
        std::fs::write(secrets_file, format!("{secret}\n")).expect("write the secrets file");
        let state = Arc::new(State {
            behavior,
            received: Mutex::default(),
            hold: Mutex::default(),
        });
        WebhookSink {
            server: Server::start(handler(state.clone(), answer), Connections::KeepAlive).await,
            state,
            secret,
            secrets_file: secrets_file.to_owned(),
        }
    }

    /// The `webhook.url` of jobs meant for this sink.
    pub fn url(&self) -> String {
        self.server.url(PATH)
    }

    /// The secret the world's processes sign with (`whsec_…`).
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// `SUMMARYD_WEBHOOK_SECRETS_FILE` for this sink's secret.
    pub fn secrets_file(&self) -> &Path {
        &self.secrets_file
    }

    /// Hold each request arriving from now on this long before answering (`None`: answer
    /// at once again). Requests already held keep their hold.
    pub fn set_hold(&self, hold: Option<Duration>) {
        *self.state.hold.lock().unwrap() = hold;
    }

    /// Every request, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Every request as recorded, for the reference verifier.
    pub fn requests(&self) -> Vec<Recorded> {
        self.received().into_iter().map(|r| r.request).collect()
    }

    /// Bodies of the accepted (2xx) requests grouped by `webhook-id` ("" when missing).
    pub fn accepted_by_id(&self) -> BTreeMap<String, Vec<Value>> {
        let mut map: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for r in self.received().iter().filter(|r| r.accepted()) {
            let body = serde_json::from_slice(&r.request.body).unwrap_or(Value::Null);
            map.entry(r.webhook_id().unwrap_or_default().to_owned())
                .or_default()
                .push(body);
        }
        map
    }

    /// Distinct `webhook-id`s accepted so far.
    pub fn distinct_accepted(&self) -> usize {
        // Polled while a run settles: ids only, no body parsed or copied.
        let received = self.state.received.lock().unwrap();
        received
            .iter()
            .filter(|r| r.accepted())
            .filter_map(Received::webhook_id)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Requests answered with an injected 503.
    pub fn rejected(&self) -> usize {
        self.received()
            .iter()
            .filter(|r| r.status == Some(503))
            .count()
    }
}

async fn answer(state: Arc<State>, request: Request) -> Reply {
    let route_ok = request.method == "POST" && request.path == PATH;
    let index = {
        let mut received = state.received.lock().unwrap();
        received.push(Received {
            request,
            status: None,
        });
        received.len() - 1
    };
    let hold = *state.hold.lock().unwrap();
    let behavior = &state.behavior;
    let latency = if behavior.latency_ms.is_empty() {
        0
    } else {
        rand::random_range(behavior.latency_ms.clone())
    };
    tokio::time::sleep(hold.unwrap_or_default() + Duration::from_millis(latency)).await;
    let reply = if !route_ok {
        Reply::json(404, json!({"error": "no such route"}))
    } else if rand::random::<f64>() < behavior.error_rate {
        Reply::json(503, json!({"error": "injected failure"}))
    } else {
        Reply::json(200, json!({"ok": true}))
    };
    if let Reply::Respond { status, .. } = &reply {
        state.received.lock().unwrap()[index].status = Some(*status);
    }
    reply
}
