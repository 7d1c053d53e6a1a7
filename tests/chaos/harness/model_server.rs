//! A fake OpenAI-compatible model API (`POST /v1/chat/completions`) with scriptable
//! latency, failure statuses, hangs and outages. It counts calls per job: every job's text
//! carries a marker `[[...]]` and the answer is derived from it, so every delivery of the
//! same job produces the same summary (and the same email body). Breaker probes (requests
//! for one completion token) are counted apart.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::shared::http_stub::{Connections, Reply, Request, Server, handler};

/// How the model answers; changeable while processes run.
#[derive(Debug, Clone)]
pub struct ModelBehavior {
    /// Each call sleeps a uniform draw from this range (ms) before answering.
    pub latency_ms: Range<u64>,
    /// Share of calls answered 500 (retried by the worker).
    pub error_rate: f64,
    /// Share of calls answered 429 with `retry-after-ms` (retried after that delay).
    pub throttle_rate: f64,
    /// Never answer (the worker's call timeout or a shutdown has to end the call).
    pub hang: bool,
    /// An outage: every call, probes included, is answered 503 at once.
    pub down: bool,
}

impl ModelBehavior {
    pub fn fast() -> Self {
        Self {
            latency_ms: 5..30,
            error_rate: 0.0,
            throttle_rate: 0.0,
            hang: false,
            down: false,
        }
    }

    pub fn down() -> Self {
        Self {
            down: true,
            ..Self::fast()
        }
    }

    pub fn slow(ms: u64) -> Self {
        Self {
            latency_ms: ms..ms + 1,
            ..Self::fast()
        }
    }
}

#[derive(Default)]
struct State {
    behavior: Mutex<Option<ModelBehavior>>,
    /// Calls per job marker (every call, failed ones included).
    calls: Mutex<HashMap<String, usize>>,
    /// Breaker probes (one completion token), answered or not.
    probes: AtomicUsize,
    in_flight: AtomicUsize,
    /// Markers answered with a fixed status whatever the behaviour (a poisonous text).
    refused: Mutex<HashMap<String, u16>>,
}

pub struct ModelServer {
    server: Server,
    state: Arc<State>,
}

/// The marker a job's text carries, so the model server can tell jobs apart.
pub fn marked_text(marker: &str) -> String {
    format!(
        "Account review [[{marker}]]. Renewal agreed for next year. Pricing to follow next week. \
         The customer asked for a security review before signing."
    )
}

/// The summary the fake model returns for a marker.
pub fn summary_for(marker: &str) -> String {
    format!("Summary of {marker}: renewal agreed, pricing next week.")
}

impl ModelServer {
    pub async fn start(behavior: ModelBehavior) -> ModelServer {
        let state = Arc::new(State::default());
        *state.behavior.lock().unwrap() = Some(behavior);
        ModelServer {
            server: Server::start(handler(state.clone(), answer), Connections::KeepAlive).await,
            state,
        }
    }

    /// `SUMMARYD_LLM_BASE_URL` for this server.
    pub fn base_url(&self) -> String {
        self.server.url("/v1")
    }

    /// Answer every call for `marker` with `status` (a guardrail's 403 for one text).
    pub fn refuse(&self, marker: &str, status: u16) {
        self.state
            .refused
            .lock()
            .unwrap()
            .insert(marker.to_owned(), status);
    }

    pub fn set_behavior(&self, behavior: ModelBehavior) {
        *self.state.behavior.lock().unwrap() = Some(behavior);
    }

    /// Calls per marker so far.
    pub fn calls(&self) -> HashMap<String, usize> {
        self.state.calls.lock().unwrap().clone()
    }

    pub fn total_calls(&self) -> usize {
        self.state.calls.lock().unwrap().values().sum()
    }

    /// Breaker probes so far (not in `calls`).
    pub fn probes(&self) -> usize {
        self.state.probes.load(Ordering::SeqCst)
    }

    /// Calls sleeping out their latency right now (hung calls are not counted: they are
    /// handed to the connection, which holds them until the client hangs up).
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }
}

/// Decrements the in-flight gauge however the handler ends (answer, hang, client gone).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn answer(state: Arc<State>, req: Request) -> Reply {
    if req.method != "POST" || req.path != "/v1/chat/completions" {
        return Reply::json(404, json!({"error": {"message": "no such route"}}));
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let down = state
        .behavior
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|b| b.down);
    if body["max_tokens"] == 1 {
        state.probes.fetch_add(1, Ordering::SeqCst);
        return if down {
            Reply::json(503, json!({"error": {"message": "outage"}}))
        } else {
            completion("pong")
        };
    }
    // The text is in the user message (the last one); the system message is fixed.
    let content = body["messages"][1]["content"].as_str().unwrap_or_default();
    let Some(marker) = marker_of(content) else {
        return Reply::json(
            400,
            json!({"error": {"message": "no [[marker]] in prompt"}}),
        );
    };
    *state
        .calls
        .lock()
        .unwrap()
        .entry(marker.clone())
        .or_default() += 1;
    if let Some(status) = state.refused.lock().unwrap().get(&marker) {
        return Reply::json(*status, json!({"error": {"message": "refused by policy"}}));
    }
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    let _gauge = InFlight(&state.in_flight);
    let behavior = state.behavior.lock().unwrap().clone().expect("behavior");
    if behavior.hang {
        return Reply::Hang;
    }
    if behavior.down {
        return Reply::json(503, json!({"error": {"message": "outage"}}));
    }
    let latency = if behavior.latency_ms.is_empty() {
        0
    } else {
        rand::random_range(behavior.latency_ms.clone())
    };
    tokio::time::sleep(Duration::from_millis(latency)).await;
    let draw: f64 = rand::random();
    if draw < behavior.error_rate {
        return Reply::json(500, json!({"error": {"message": "injected failure"}}));
    }
    if draw < behavior.error_rate + behavior.throttle_rate {
        return Reply::json(429, json!({"error": {"message": "slow down"}}))
            .with_header("retry-after-ms", "50");
    }
    completion(&summary_for(&marker))
}

fn completion(content: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "id": "chatcmpl-chaos",
            "object": "chat.completion",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop"
            }]
        }),
    )
}

fn marker_of(content: &str) -> Option<String> {
    let start = content.find("[[")? + 2;
    let len = content[start..].find("]]")?;
    Some(content[start..start + len].to_owned())
}
