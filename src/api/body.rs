//! Reading a JSON request body ourselves, so every failure maps to its documented status:
//! 415 wrong content type, 413 over the limit, 400 syntax, 422 schema (naming the field),
//! 408 too slow, 503 no room in the process's body budget. actix's `web::Json` would
//! answer some of these as text/plain 400s, and buffers without a process-wide bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use actix_web::web::{self, Bytes, BytesMut};
use futures_util::StreamExt;
use serde::de::IgnoredAny;
use serde_json::error::Category;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::problem::ApiError;
use crate::config::ApiSettings;
use crate::domain::{SummaryRequest, TenantId, ValidSummaryRequest, WebhookRules};

/// 415 unless the request says `application/json` (parameters allowed, charset only UTF-8,
/// which RFC 8259 makes the only JSON encoding).
pub(crate) fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
    let raw = req.headers().get(CONTENT_TYPE).map(|v| v.to_str());
    let unsupported = |got: Option<String>| ApiError::UnsupportedMediaType { got };
    let value = match raw {
        None => return Err(unsupported(None)),
        Some(Err(_)) => return Err(unsupported(Some("a non-ASCII value".into()))),
        Some(Ok(v)) => v,
    };
    let mut parts = value.split(';').map(str::trim);
    let essence = parts.next().unwrap_or_default();
    let charset_ok = parts.all(|p| match p.split_once('=') {
        Some((name, cs)) if name.trim().eq_ignore_ascii_case("charset") => {
            let cs = cs.trim().trim_matches('"');
            cs.eq_ignore_ascii_case("utf-8") || cs.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    });
    if essence.eq_ignore_ascii_case("application/json") && charset_ok {
        Ok(())
    } else {
        Err(unsupported(Some(value.to_owned())))
    }
}

/// Bodies up to this size may use the whole budget; larger ones only `LARGE_SHARE` of it.
/// Ordinary requests are a few KiB, so a flood of large, slow bodies can never take the
/// room they need.
const SMALL_BODY_BYTES: usize = 16 * 1024;
/// The part of the budget (numerator / denominator) that large bodies may hold together.
const LARGE_SHARE: (usize, usize) = (3, 4);
/// The part of that large-body room (numerator / denominator) one tenant may hold: one
/// tenant's slow uploads leave the other half to every other tenant's large bodies.
const TENANT_SHARE: (usize, usize) = (1, 2);

/// The process-wide budget for request-body bytes in flight. A body is read only once its
/// whole declared size is reserved, so what the process holds is bounded by the budget,
/// not by how many clients send at once, and a request that cannot get room is refused
/// before any of its body is read.
pub(crate) struct BodyBudget {
    all: Arc<Semaphore>,
    large: Arc<Semaphore>,
    tenants: Arc<Mutex<TenantShares>>,
    wait: Duration,
}

/// Room for one body; returned to the budget when dropped (when the handler is done).
pub(crate) struct BodyPermit {
    _all: OwnedSemaphorePermit,
    _large: Option<OwnedSemaphorePermit>,
    _tenant: Option<TenantHold>,
}

impl BodyBudget {
    pub fn new(settings: &ApiSettings) -> Self {
        let total = settings.body_budget_bytes;
        // At least one body at the limit must fit, or large bodies could never be read.
        let large = (total / LARGE_SHARE.1 * LARGE_SHARE.0)
            .max(settings.max_body_bytes)
            .min(Semaphore::MAX_PERMITS);
        let tenant = (large / TENANT_SHARE.1 * TENANT_SHARE.0).max(settings.max_body_bytes);
        Self {
            all: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
            large: Arc::new(Semaphore::new(large)),
            tenants: Arc::new(Mutex::new(TenantShares::new(tenant))),
            wait: settings.body_budget_wait,
        }
    }

    /// Reserve `bytes` for a body of `tenant`, waiting at most the configured time for
    /// others to finish. A large body over the tenant's share is refused at once: only the
    /// tenant's own bodies can make room, and it is the one sending them.
    pub(crate) async fn reserve(
        &self,
        bytes: usize,
        tenant: &TenantId,
    ) -> Result<BodyPermit, ApiError> {
        let n = u32::try_from(bytes).map_err(|_| ApiError::BodyBudgetExhausted)?;
        let give_up = Instant::now() + self.wait;
        let take = |sem: &Arc<Semaphore>| {
            tokio::time::timeout_at(give_up, sem.clone().acquire_many_owned(n))
        };
        let (large, tenant) = if bytes > SMALL_BODY_BYTES {
            // First, so a refused body never waits for room it may not hold; dropped (and
            // given back) if the wait below fails.
            let hold = TenantHold::take(&self.tenants, tenant, bytes)
                .ok_or(ApiError::TenantBodyShareExhausted)?;
            match take(&self.large).await {
                Ok(Ok(permit)) => (Some(permit), Some(hold)),
                _ => return Err(ApiError::BodyBudgetExhausted),
            }
        } else {
            (None, None)
        };
        match take(&self.all).await {
            Ok(Ok(all)) => Ok(BodyPermit {
                _all: all,
                _large: large,
                _tenant: tenant,
            }),
            _ => Err(ApiError::BodyBudgetExhausted),
        }
    }
}

/// Large-body bytes each tenant holds, against one cap for all tenants.
#[derive(Debug)]
struct TenantShares {
    cap: usize,
    held: HashMap<TenantId, usize>,
}

impl TenantShares {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            held: HashMap::new(),
        }
    }

    /// Count `bytes` for `tenant` if that keeps it within the cap.
    fn take(&mut self, tenant: &TenantId, bytes: usize) -> bool {
        match self.held(tenant).checked_add(bytes) {
            Some(total) if total <= self.cap => {
                self.held.insert(tenant.clone(), total);
                true
            }
            _ => false,
        }
    }

    /// Return `bytes` taken for `tenant`; a tenant holding nothing is forgotten, so the map
    /// holds only tenants with a large body in flight.
    fn give_back(&mut self, tenant: &TenantId, bytes: usize) {
        if let Some(held) = self.held.get_mut(tenant) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                self.held.remove(tenant);
            }
        }
    }

    fn held(&self, tenant: &TenantId) -> usize {
        self.held.get(tenant).copied().unwrap_or(0)
    }
}

/// A tenant's large-body bytes, counted while this lives.
struct TenantHold {
    shares: Arc<Mutex<TenantShares>>,
    tenant: TenantId,
    bytes: usize,
}

impl TenantHold {
    fn take(shares: &Arc<Mutex<TenantShares>>, tenant: &TenantId, bytes: usize) -> Option<Self> {
        let taken = shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(tenant, bytes);
        taken.then(|| Self {
            shares: shares.clone(),
            tenant: tenant.clone(),
            bytes,
        })
    }
}

impl Drop for TenantHold {
    fn drop(&mut self) {
        self.shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .give_back(&self.tenant, self.bytes);
    }
}

/// Collect the body within the budget and by `deadline`, refusing (413) as soon as it
/// exceeds `limit` bytes: a declared Content-Length over the limit is refused before
/// reading anything. Without a Content-Length (chunked), room for `limit` is reserved.
/// A large body counts against `tenant`'s share of the budget too.
pub(crate) async fn read_limited(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    budget: &BodyBudget,
    tenant: &TenantId,
    started: Instant,
    timeout: Duration,
) -> Result<(Bytes, BodyPermit), ApiError> {
    let too_large = || ApiError::PayloadTooLarge { limit };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let deadline = started + body_time(timeout, declared.unwrap_or(limit));
    let read = async {
        let permit = budget.reserve(declared.unwrap_or(limit), tenant).await?;
        // Grown as bytes arrive, never sized from the header: a client that declares
        // 256 KiB and sends 10 bytes costs 10 bytes.
        let mut body = BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(ApiError::UnreadableBody)?;
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body.freeze(), permit))
    };
    tokio::time::timeout_at(deadline, read)
        .await
        .map_err(|_| ApiError::RequestTimeout)?
}

/// A body gets its request deadline once per this many bytes it declares: the deadline
/// was sized for a 256 KiB body at 256 kbit/s, a slow mobile uplink, and a longer body at
/// that rate needs proportionally longer. The budget holds its declared size meanwhile,
/// so a slow long body costs its tenant's share, not other tenants' room.
const BYTES_PER_TIMEOUT: usize = 256 * 1024;

/// How long a body of `declared` bytes may take to arrive.
pub(crate) fn body_time(timeout: Duration, declared: usize) -> Duration {
    // A size-proportional deadline, not a growing wait (those live in `resilience`).
    let periods = u64::try_from(declared.div_ceil(BYTES_PER_TIMEOUT).max(1)).unwrap_or(u64::MAX);
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(ms.saturating_mul(periods))
}

/// Parse and validate the body of `POST /v1/summaries`; `rules` are the `[webhook]`
/// settings' rules for `webhook.url`.
pub fn parse_summary_request(
    bytes: &[u8],
    rules: WebhookRules,
) -> Result<ValidSummaryRequest, ApiError> {
    // serde would also build the struct from an array (`["text", "a@b.co"]`); the schema
    // is an object, so anything else is refused (after its syntax, which decides 400 vs 422).
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        serde_json::from_slice::<IgnoredAny>(bytes).map_err(classify)?;
        return Err(not_an_object());
    }
    // Straight into the struct rather than via `Value`, which would hide duplicate fields.
    let raw: SummaryRequest = serde_json::from_slice(bytes).map_err(classify)?;
    raw.validate(rules)
        .map_err(|e| ApiError::validation(e.field, e.message))
}

fn not_an_object() -> ApiError {
    ApiError::validation(
        "body",
        "must be a JSON object with the fields text, notify and webhook",
    )
}

/// Syntax errors are the client's JSON (400); data errors are our schema (422).
fn classify(e: serde_json::Error) -> ApiError {
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::MalformedJson(e),
        Category::Data => {
            let msg = e.to_string();
            // serde names the offender in backticks: "unknown field `cc`, expected ...".
            let named = ["unknown field", "duplicate field"]
                .iter()
                .find(|p| msg.starts_with(*p))
                .and_then(|_| msg.split('`').nth(1));
            match named {
                Some(field) if msg.starts_with("unknown") => ApiError::validation(
                    field,
                    "is not part of the schema; the allowed fields are text, notify and webhook",
                ),
                Some(field) => ApiError::validation(field, "appears more than once"),
                None => not_an_object(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_body_gets_the_deadline_once_per_256_kib() {
        let t = Duration::from_secs(10);
        assert_eq!(body_time(t, 0), t);
        assert_eq!(body_time(t, 1), t);
        assert_eq!(body_time(t, 256 * 1024), t);
        assert_eq!(body_time(t, 256 * 1024 + 1), 2 * t);
        assert_eq!(body_time(t, 4 * 1024 * 1024), 16 * t);
    }

    fn field_of(json: &str) -> Option<String> {
        match parse_summary_request(json.as_bytes(), WebhookRules::default()) {
            Err(ApiError::Validation { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn schema_errors_name_the_field_and_syntax_errors_are_400() {
        assert_eq!(
            field_of(r#"{"text":"x","notify":"a@b.co","cc":1}"#).as_deref(),
            Some("cc")
        );
        assert_eq!(
            field_of(r#"{"text":"x","text":"y","notify":"a@b.co"}"#).as_deref(),
            Some("text")
        );
        assert_eq!(field_of(r#"["x","a@b.co"]"#).as_deref(), Some("body"));
        assert_eq!(field_of("null").as_deref(), Some("body"));
        assert_eq!(
            field_of(r#"{"text":5,"notify":"a@b.co"}"#).as_deref(),
            Some("text")
        );
        for bad in [r#"{"text":"#, "", "{'text':1}", r#"{"text":"x"} trailing"#] {
            assert!(
                matches!(
                    parse_summary_request(bad.as_bytes(), WebhookRules::default()),
                    Err(ApiError::MalformedJson(_))
                ),
                "{bad}"
            );
        }
        assert!(
            parse_summary_request(
                br#"{"text":"x","notify":"a@b.co"}"#,
                WebhookRules::default()
            )
            .is_ok()
        );
    }

    fn tenant(name: &str) -> TenantId {
        TenantId::parse(name).unwrap()
    }

    #[test]
    fn a_tenant_holds_at_most_its_share_and_gets_it_back() {
        let (a, b) = (tenant("a"), tenant("b"));
        let mut shares = TenantShares::new(100);
        assert!(shares.take(&a, 60));
        assert!(!shares.take(&a, 41), "over the share");
        assert!(shares.take(&a, 40), "exactly the share");
        assert!(!shares.take(&a, 1));
        assert!(shares.take(&b, 100), "another tenant's share is its own");
        assert!(!shares.take(&b, usize::MAX), "no overflow");
        shares.give_back(&a, 60);
        assert_eq!(shares.held(&a), 40);
        assert!(shares.take(&a, 60));
        shares.give_back(&a, 100);
        assert_eq!(shares.held(&a), 0);
        assert!(
            !shares.held.contains_key(&a),
            "a tenant holding nothing is forgotten"
        );
        shares.give_back(&a, 5);
        assert_eq!(shares.held(&a), 0);
        assert_eq!(shares.held(&b), 100);
    }

    fn budget(total: usize, max_body: usize) -> BodyBudget {
        let mut settings = crate::config::Settings::default().api;
        settings.body_budget_bytes = total;
        settings.max_body_bytes = max_body;
        settings.body_budget_wait = Duration::from_millis(20);
        BodyBudget::new(&settings)
    }

    #[tokio::test]
    async fn one_tenants_large_bodies_leave_room_for_anothers() {
        // 128 KiB: 96 KiB for large bodies, 48 KiB of it per tenant.
        let budget = budget(128 * 1024, 32 * 1024);
        let (a, b) = (tenant("a"), tenant("b"));
        let kib = |n: usize| n * 1024;
        let first = budget.reserve(kib(30), &a).await.ok();
        assert!(first.is_some());
        assert!(matches!(
            budget.reserve(kib(20), &a).await,
            Err(ApiError::TenantBodyShareExhausted)
        ));
        let small = budget.reserve(kib(16), &a).await;
        assert!(
            small.is_ok(),
            "small bodies are not counted against the share"
        );
        let other = budget.reserve(kib(32), &b).await;
        assert!(other.is_ok(), "b's large body fits beside a's");
        drop(first);
        assert!(
            budget.reserve(kib(32), &a).await.is_ok(),
            "a's room came back"
        );
        assert_eq!(budget.tenants.lock().unwrap().held(&a), 0);
        assert_eq!(budget.tenants.lock().unwrap().held(&b), kib(32));
    }

    #[tokio::test]
    async fn a_body_refused_for_the_process_budget_gives_back_the_tenants_share() {
        let budget = budget(64 * 1024, 48 * 1024);
        let (a, b) = (tenant("a"), tenant("b"));
        let held = budget.reserve(40 * 1024, &a).await;
        assert!(held.is_ok());
        assert!(matches!(
            budget.reserve(40 * 1024, &b).await,
            Err(ApiError::BodyBudgetExhausted)
        ));
        assert_eq!(budget.tenants.lock().unwrap().held(&b), 0);
        // At least one body at the limit fits a tenant's share, however small the budget.
        assert_eq!(budget.tenants.lock().unwrap().cap, 48 * 1024);
    }
}
