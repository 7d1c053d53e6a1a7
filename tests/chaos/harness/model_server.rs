//! A fake OpenAI-compatible model API (`POST /v1/chat/completions`) with scriptable
//! latency, failure statuses, hangs and outages. It counts calls per job: every job's text
//! carries a marker `[[...]]` and the answer is derived from it, so every delivery of the
//! same job produces the same summary (and the same email body). Breaker probes (requests
//! for one completion token) are counted apart.
//!
//! Long texts are summarised in parts (`worker::parts`): the request's system message says
//! which prompt it is (a whole document, one part, or a combination of part summaries).
//! Only one part of a long text holds its marker, so a part's answer carries the markers
//! found in its input (`[[marker]]`), and a combination's answer the markers found in its
//! summaries, with [`summary_for`] each: the final summary still names its job. Every
//! answer is a function of the request's input alone, so every delivery of a job ends in
//! the same summary however its parts were reused.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use summaryd::llm::PromptKind;
use summaryd::llm::prompts::{COMBINE_PROMPT, PART_PROMPT, SYSTEM_PROMPT};

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
    /// Calls per job marker (every call whose input carries it, failed ones included).
    calls: Mutex<HashMap<String, usize>>,
    /// Calls by prompt (marker or not, failed ones included).
    kinds: Mutex<HashMap<PromptKind, usize>>,
    /// Every call but probes.
    total: AtomicUsize,
    /// Breaker probes (one completion token), answered or not.
    probes: AtomicUsize,
    in_flight: AtomicUsize,
    /// Markers answered with a fixed status whatever the behaviour (a poisonous text).
    refused: Mutex<HashMap<String, u16>>,
    /// When each request arrived, and whether it was a probe.
    arrivals: Mutex<Vec<(Instant, bool)>>,
    /// The provider's own requests-per-minute limit, when the test gives it one.
    limit: Mutex<Option<Bucket>>,
    /// Job calls the limit would have refused with 429 (they are answered anyway).
    over_limit: AtomicUsize,
    /// Answer the n-th job call (from 1) with 429 and `Retry-After` of this many seconds.
    throttle_once: Mutex<Option<(usize, u64)>>,
    /// When that 429 was answered.
    throttled_at: Mutex<Option<Instant>>,
}

/// A token bucket, as a provider meters requests: `capacity` at once, refilled at `per_s`.
struct Bucket {
    capacity: f64,
    per_s: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    /// Take one request; false when the bucket is empty (the provider would answer 429).
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.per_s;
        self.level = (self.level + refill).min(self.capacity);
        self.at = now;
        if self.level >= 1.0 {
            self.level -= 1.0;
            true
        } else {
            false
        }
    }
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

/// A text of about `bytes` bytes (never fewer) with `marker` in its first sentence: the
/// account review of [`marked_text`] and then paragraphs of meeting notes, each different
/// (its number is in every sentence), so no two parts of it are the same input.
pub fn long_marked_text(marker: &str, bytes: usize) -> String {
    let mut text = marked_text(marker);
    let mut i = 0;
    while text.len() < bytes {
        i += 1;
        text.push_str(&format!(
            "\n\nNotes {i}: the team met on day {i} to review the account. Item {i}.1: the \
             customer confirmed the renewal terms discussed in meeting {i}. Item {i}.2: the \
             price list of revision {i} goes out after legal has read it. Item {i}.3: the \
             security questionnaire number {i} is due before the contract is signed."
        ));
    }
    text
}

/// The summary the fake model returns for a marker.
pub fn summary_for(marker: &str) -> String {
    format!("Summary of {marker}: renewal agreed, pricing next week.")
}

/// Which prompt a request is, by its system message; `None` for an unknown one.
fn kind_of(system: &str) -> Option<PromptKind> {
    [
        (SYSTEM_PROMPT, PromptKind::Document),
        (PART_PROMPT, PromptKind::Part),
        (COMBINE_PROMPT, PromptKind::Combine),
    ]
    .into_iter()
    .find_map(|(prompt, kind)| (prompt == system).then_some(kind))
}

/// The fake's answer to one request: a function of its kind and user message only.
fn answer_for(kind: PromptKind, content: &str, markers: &[String]) -> String {
    let mut hash = DefaultHasher::new();
    content.hash(&mut hash);
    let tags: Vec<String> = markers.iter().map(|m| format!("[[{m}]]")).collect();
    match kind {
        PromptKind::Document => summary_for(&markers[0]),
        PromptKind::Part if markers.is_empty() => {
            format!(
                "Part {:016x}: renewal terms, prices, questionnaire.",
                hash.finish()
            )
        }
        PromptKind::Part => format!("Part {:016x}: {}", hash.finish(), tags.join(" ")),
        PromptKind::Combine if markers.is_empty() => {
            format!(
                "Parts {:016x}: renewal terms, prices, questionnaire.",
                hash.finish()
            )
        }
        PromptKind::Combine => markers
            .iter()
            .zip(&tags)
            .map(|(m, tag)| format!("{} {tag}", summary_for(m)))
            .collect::<Vec<_>>()
            .join(" "),
    }
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

    /// Calls per marker so far (a call whose input carries no marker, a part of a long
    /// text, is in no job's count; one carrying two is in both).
    pub fn calls(&self) -> HashMap<String, usize> {
        self.state.calls.lock().unwrap().clone()
    }

    /// Every call so far, marker or not (probes not included).
    pub fn total_calls(&self) -> usize {
        self.state.total.load(Ordering::SeqCst)
    }

    /// Calls of one prompt so far: whole documents, parts or combinations.
    pub fn calls_of(&self, kind: PromptKind) -> usize {
        self.state
            .kinds
            .lock()
            .unwrap()
            .get(&kind)
            .copied()
            .unwrap_or(0)
    }

    /// Breaker probes so far (not in `calls`).
    pub fn probes(&self) -> usize {
        self.state.probes.load(Ordering::SeqCst)
    }

    /// Meter job calls as a provider with `rpm` requests a minute and a burst of `burst`
    /// would; see [`Self::over_limit`].
    pub fn enforce_rpm(&self, rpm: u32, burst: u32) {
        *self.state.limit.lock().unwrap() = Some(Bucket {
            capacity: f64::from(burst),
            per_s: f64::from(rpm) / 60.0,
            level: f64::from(burst),
            at: Instant::now(),
        });
    }

    /// Job calls the limit of [`Self::enforce_rpm`] would have answered with 429.
    pub fn over_limit(&self) -> usize {
        self.state.over_limit.load(Ordering::SeqCst)
    }

    /// Answer the `nth` job call from now on (from 1) with 429 and `Retry-After: secs`.
    pub fn throttle_once(&self, nth: usize, secs: u64) {
        let nth = self.total_calls() + nth;
        *self.state.throttle_once.lock().unwrap() = Some((nth, secs));
    }

    /// When the 429 of [`Self::throttle_once`] was answered.
    pub fn throttled_at(&self) -> Option<Instant> {
        *self.state.throttled_at.lock().unwrap()
    }

    /// When each job call arrived.
    pub fn job_call_times(&self) -> Vec<Instant> {
        self.arrivals(false)
    }

    /// When each probe arrived.
    pub fn probe_times(&self) -> Vec<Instant> {
        self.arrivals(true)
    }

    fn arrivals(&self, probes: bool) -> Vec<Instant> {
        self.state
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, probe)| *probe == probes)
            .map(|(at, _)| *at)
            .collect()
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
    let arrived = Instant::now();
    if body["max_tokens"] == 1 {
        state.arrivals.lock().unwrap().push((arrived, true));
        state.probes.fetch_add(1, Ordering::SeqCst);
        return if down {
            Reply::json(503, json!({"error": {"message": "outage"}}))
        } else {
            completion("pong")
        };
    }
    // The instructions are the system message, the data the user message.
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    let Some(kind) = kind_of(system) else {
        return Reply::json(
            400,
            json!({"error": {"message": "not one of summaryd's system prompts"}}),
        );
    };
    let content = body["messages"][1]["content"].as_str().unwrap_or_default();
    let markers = markers_of(content);
    // A whole document always names its job; a part or a combination may not.
    if kind == PromptKind::Document && markers.is_empty() {
        return Reply::json(
            400,
            json!({"error": {"message": "no [[marker]] in prompt"}}),
        );
    }
    let nth = state.total.fetch_add(1, Ordering::SeqCst) + 1;
    state.arrivals.lock().unwrap().push((arrived, false));
    if let Some(bucket) = state.limit.lock().unwrap().as_mut()
        && !bucket.take(arrived)
    {
        state.over_limit.fetch_add(1, Ordering::SeqCst);
    }
    let throttle = {
        let mut once = state.throttle_once.lock().unwrap();
        match *once {
            Some((at, secs)) if at == nth => {
                *once = None;
                Some(secs)
            }
            _ => None,
        }
    };
    if let Some(secs) = throttle {
        *state.throttled_at.lock().unwrap() = Some(Instant::now());
        return Reply::json(429, json!({"error": {"message": "rate limit reached"}}))
            .with_header("retry-after", &secs.to_string());
    }
    *state.kinds.lock().unwrap().entry(kind).or_default() += 1;
    {
        let mut calls = state.calls.lock().unwrap();
        for marker in &markers {
            *calls.entry(marker.clone()).or_default() += 1;
        }
    }
    let refused = {
        let refused = state.refused.lock().unwrap();
        markers.iter().find_map(|m| refused.get(m).copied())
    };
    if let Some(status) = refused {
        return Reply::json(status, json!({"error": {"message": "refused by policy"}}));
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
    completion(&answer_for(kind, content, &markers))
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

/// Every distinct marker `[[...]]` in `content`, in order of first appearance.
fn markers_of(content: &str) -> Vec<String> {
    let mut markers: Vec<String> = Vec::new();
    let mut rest = content;
    while let Some(start) = rest.find("[[") {
        let after = &rest[start + 2..];
        let Some(len) = after.find("]]") else { break };
        let marker = &after[..len];
        if !markers.iter().any(|m| m == marker) {
            markers.push(marker.to_owned());
        }
        rest = &after[len + 2..];
    }
    markers
}
