//! The API client of the tests: submits a job and keeps retrying with the SAME
//! Idempotency-Key on timeouts, connection errors, 409 and 503, the way docs/reference.md tells
//! clients to; anything else (a 500 above all) fails the test.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::model_server::{long_marked_text, marked_text};

/// Per request: a request that takes longer than this is treated as lost and retried with
/// the same key (what a real client with a timeout does).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The client honours Retry-After but waits at most this long, so a test does not idle
/// through the API's 5 s hint for Redis outages.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(1);
/// A job that cannot be accepted within this long means the service never recovered.
const SUBMIT_PATIENCE: Duration = Duration::from_secs(90);

pub const TENANT: &str = "chaos";

#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    /// The `webhook.url` every job of [`Self::body_for`] asks for, besides its email.
    webhook: Option<String>,
    /// Answers seen, by status ("timeout"/"error" for transport failures), for the report.
    outcomes: Arc<Mutex<BTreeMap<String, usize>>>,
    /// The tenant this client posts as ([`TENANT`] unless [`Self::as_tenant`] says otherwise).
    tenant: String,
    /// The tenant of every job accepted through this client or one made from it with
    /// [`Self::as_tenant`], so a GET asks as the job's own tenant.
    tenants_of: Arc<Mutex<HashMap<String, String>>>,
}

/// A job the API accepted.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub key: String,
    pub job_id: String,
    /// POSTs it took (1 when the first one was answered 202).
    pub attempts: usize,
    /// The job asked for a webhook as well as its email.
    pub webhook: bool,
}

impl ApiClient {
    pub fn new(base: String) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .build()
                .expect("client"),
            base,
            webhook: None,
            outcomes: Arc::default(),
            tenant: TENANT.to_owned(),
            tenants_of: Arc::default(),
        }
    }

    /// The same client posting as `tenant`; answers and the jobs' tenants are shared with
    /// this one, so either can check every job.
    pub fn as_tenant(&self, tenant: &str) -> Self {
        let mut other = self.clone();
        other.tenant = tenant.to_owned();
        other
    }

    /// A client whose jobs ([`Self::body_for`], [`Self::submit`]) ask for a webhook to `url`
    /// as well as their email.
    pub fn with_webhook(mut self, url: String) -> Self {
        self.webhook = Some(url);
        self
    }

    /// Answers seen so far, by status.
    pub fn outcomes(&self) -> BTreeMap<String, usize> {
        self.outcomes.lock().unwrap().clone()
    }

    fn note(&self, what: String) {
        *self.outcomes.lock().unwrap().entry(what).or_default() += 1;
    }

    pub fn body(marker: &str) -> Value {
        Self::body_with(marker, marked_text(marker))
    }

    /// A job whose text is a long one of at least `bytes` bytes ([`long_marked_text`]).
    pub fn long_body(marker: &str, bytes: usize) -> Value {
        Self::body_with(marker, long_marked_text(marker, bytes))
    }

    fn body_with(marker: &str, text: String) -> Value {
        json!({"text": text, "notify": format!("{marker}@example.com")})
    }

    /// [`Self::body`], with this client's webhook when it has one.
    pub fn body_for(&self, marker: &str) -> Value {
        self.with_own_webhook(Self::body(marker))
    }

    /// [`Self::long_body`], with this client's webhook when it has one.
    pub fn long_body_for(&self, marker: &str, bytes: usize) -> Value {
        self.with_own_webhook(Self::long_body(marker, bytes))
    }

    fn with_own_webhook(&self, mut body: Value) -> Value {
        if let Some(url) = &self.webhook {
            body["webhook"] = json!({"url": url});
        }
        body
    }

    /// One POST; the raw answer (status, Retry-After, body) or the transport error.
    pub async fn post_once(
        &self,
        key: &str,
        body: &Value,
    ) -> Result<(u16, Option<String>, Value), reqwest::Error> {
        let response = self
            .http
            .post(format!("{}/v1/summaries", self.base))
            .header("Idempotency-Key", key)
            .header("X-Tenant-Id", &self.tenant)
            .json(body)
            .send()
            .await?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok((status, retry_after, body))
    }

    /// POST until accepted, retrying with the same key. Panics on an answer docs/reference.md
    /// does not allow for a valid request (500 and friends) or if it never gets through.
    pub async fn submit(&self, key: &str, marker: &str) -> Accepted {
        self.submit_body(key, &self.body_for(marker)).await
    }

    /// [`Self::submit`] with any body (a long text, see [`Self::long_body`]).
    pub async fn submit_body(&self, key: &str, body: &Value) -> Accepted {
        let give_up = tokio::time::Instant::now() + SUBMIT_PATIENCE;
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(
                tokio::time::Instant::now() < give_up,
                "job {key} not accepted within {SUBMIT_PATIENCE:?}; answers so far: {:?}",
                self.outcomes()
            );
            let wait = match self.post_once(key, body).await {
                Ok((status, retry_after, answer)) => {
                    self.note(status.to_string());
                    match status {
                        202 => {
                            let job_id = answer["job_id"]
                                .as_str()
                                .unwrap_or_else(|| panic!("202 without job_id: {answer}"))
                                .to_owned();
                            self.tenants_of
                                .lock()
                                .unwrap()
                                .insert(job_id.clone(), self.tenant.clone());
                            return Accepted {
                                key: key.to_owned(),
                                job_id,
                                attempts,
                                webhook: body.get("webhook").is_some(),
                            };
                        }
                        409 | 503 => {
                            let hint = retry_after
                                .unwrap_or_else(|| panic!("{status} without Retry-After"));
                            let secs: u64 = hint
                                .parse()
                                .unwrap_or_else(|_| panic!("Retry-After {hint:?} not seconds"));
                            Duration::from_secs(secs).min(MAX_RETRY_WAIT)
                        }
                        other => panic!("POST {key}: unexpected {other}: {answer}"),
                    }
                }
                Err(e) => {
                    self.note(if e.is_timeout() { "timeout" } else { "error" }.into());
                    Duration::from_millis(200)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// GET the job; (status, body). Transport errors count as `0`.
    pub async fn get(&self, job_id: &str) -> (u16, Value) {
        let tenant = self
            .tenants_of
            .lock()
            .unwrap()
            .get(job_id)
            .cloned()
            .unwrap_or_else(|| self.tenant.clone());
        match self
            .http
            .get(format!("{}/v1/summaries/{job_id}", self.base))
            .header("X-Tenant-Id", tenant)
            .send()
            .await
        {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }
}
