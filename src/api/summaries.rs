//! `POST /v1/summaries` (accept a job exactly once per Idempotency-Key) and
//! `GET /v1/summaries/{job_id}` (its state, for the tenant that created it).

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, HeaderMap, HeaderName, LOCATION};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Timelike, Utc};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::ToSchema;
use uuid::Uuid;

use super::auth::TenantPolicy;
use super::body;
use super::idempotency::{Outcome, StoreError, StoredResponse};
use super::problem::{ApiError, Problem};
use super::state::ApiServices;
use super::state::ApiState;
use super::tenant::{KnownHeader, Tenant, single_header};
use crate::db;
use crate::domain::{
    IdempotencyKey, Job, JobId, JobText, TenantId, TraceContext, WebhookRules, WebhookUrl,
};
use crate::infra::keys::ScopedKey;
use crate::infra::telemetry;
use crate::resilience::failure::Disposition;
use crate::stream::budget::Admission;
use crate::stream::job_state::{self, Status};
use crate::stream::{self, Limit};

pub(crate) const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";
static IDEMPOTENCY_KEY_NAME: HeaderName = HeaderName::from_static("idempotency-key");
const IDEMPOTENCY_KEY: KnownHeader = KnownHeader {
    name: &IDEMPOTENCY_KEY_NAME,
    spelled: IDEMPOTENCY_KEY_HEADER,
};
pub(crate) const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// The body of `POST /v1/summaries`, for the OpenAPI document. Parsing goes through
/// `domain::SummaryRequest`, which names the field at fault.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "the body's schema for /openapi.json; the handler reads the body as domain::SummaryRequest"
)]
pub(crate) struct CreateSummary {
    /// The text to summarise; must not be blank, and must not contain NUL or control
    /// characters other than tab, LF and CR (the pipeline could not store or send them).
    /// The pattern says both: at least one character outside Unicode White_Space (what
    /// `str::trim` removes, e.g. U+0085), and no refused control character anywhere.
    #[schema(
        min_length = 1,
        pattern = r"^[^\u0000-\u0008\u000B\u000C\u000E-\u001F]*[^\u0000-\u0020\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000][^\u0000-\u0008\u000B\u000C\u000E-\u001F]*$"
    )]
    pub(crate) text: String,
    /// Who gets the "summary ready" email: a bare address whose domain is a dotted public
    /// name (no IP address, no `localhost`, no single label), without invisible or bidi
    /// characters, and within the tenant's `notify_domains`. A request needs `notify`,
    /// `webhook` (or the tenant's default `webhook_url`), or both.
    // `default` instead of `Option`: optional, and never `null` (the parser refuses a null).
    #[schema(format = Email)]
    #[serde(default)]
    pub(crate) notify: String,
    /// Where to send the signed `summary.completed` / `summary.failed` webhooks (Standard
    /// Webhooks; README "Webhooks").
    #[serde(default)]
    pub(crate) webhook: WebhookTarget,
}

/// A webhook target.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "part of the body's schema for /openapi.json; the handler reads domain::SummaryRequest"
)]
pub(crate) struct WebhookTarget {
    /// `https` (plain `http` only where the operator set `SUMMARYD_WEBHOOK_ALLOW_HTTP=1`),
    /// no user name or password, no fragment, a host that resolves to public addresses
    /// only (unless `SUMMARYD_WEBHOOK_ALLOW_PRIVATE=1`); redirects are never followed.
    #[schema(format = "uri", max_length = 2048)]
    pub(crate) url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Done,
    /// Dead-lettered; `error` says why.
    Failed,
}

/// 202 answer to a new job (and the replay of it).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Accepted {
    pub(crate) job_id: Uuid,
    pub(crate) status: JobStatus,
}

/// A job as `GET /v1/summaries/{job_id}` reports it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub(crate) job_id: Uuid,
    pub status: JobStatus,
    /// Only for `done`, while summaries retention has kept the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Present, and `true`, only for a `done` job whose text summaries retention removed
    /// (`SUMMARYD_RETENTION_SUMMARIES_S`): the job stays done, and a resend of its request
    /// is still the same, finished job; there is no `summary`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub summary_expired: bool,
    /// The model that wrote the summary (its configured name; `builtin` for the built-in
    /// summariser); only for `done`, and absent for summaries stored before models were
    /// recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// When the job was accepted (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) created_at: Option<DateTime<Utc>>,
    /// When the summary was stored (RFC 3339); only for `done`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) completed_at: Option<DateTime<Utc>>,
    /// How far a job summarised in parts has come; only while it is `queued` and after its
    /// first delivery planned the parts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Model calls the summary took, for a `done` job summarised in parts (absent for one
    /// call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parts: Option<u32>,
}

/// Model calls of a job summarised in parts: finished (or found finished by an earlier
/// delivery) and planned. The plan counts combinations as if every summary were as long
/// as it may be, so `parts_total` may shrink as the summaries come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Progress {
    pub parts_done: u32,
    pub parts_total: u32,
}

#[utoipa::path(
    post,
    path = "/v1/summaries",
    tag = "summaries",
    request_body(content = CreateSummary, content_type = "application/json"),
    params(
        ("Idempotency-Key" = String, Header, description = "16–128 visible ASCII characters, unique per logical request; scoped to tenant, method and path. Sent once (a repeated header is 400)",
            min_length = 16, max_length = 128, pattern = r"^[!-~]{16,128}$"),
        ("X-Tenant-Id" = String, Header, description = "1–64 characters of [A-Za-z0-9._-]. Sent once (a repeated header is 400). Ignored in token mode",
            min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$"),
    ),
    responses(
        (status = 202, description = "Accepted and queued; a replay of a finished request returns the same status and body plus `Idempotent-Replayed: true`", body = Accepted,
            headers(("Location" = String, description = "/v1/summaries/{job_id}"),
                    ("Idempotent-Replayed" = String, description = "`true` when this is a stored response"))),
        (status = 400, description = "Idempotency-Key or X-Tenant-Id missing, malformed or repeated (an Authorization header repeated too; `header` names it), or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body was not received within the request deadline; the connection is closed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Token mode (a tokens file is configured): missing or unknown bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant is over its rate_per_s/burst or max_in_flight (token mode), its token budget cannot hold the job's worst case (problem type ending `/budget-exhausted`; Retry-After until the period resets), or the recipient has had notify_per_hour emails from this tenant in the last hour (a replay of an accepted request is never refused)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds"))),
        (status = 409, description = "An in-progress marker of an older version holds the key (rolling upgrade only: this version accepts a key in one atomic step, with no observable in-progress state)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds; 1"))),
        (status = 413, description = "Body over SUMMARYD_API_MAX_BODY_BYTES (default 4 MiB), text over SUMMARYD_API_MAX_TEXT_CHARS (default 1,000,000 characters), or a text that would need more than SUMMARYD_LLM_MAX_PARTS model calls (`field` is `text`); nothing is stored", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Content-Type is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Valid JSON not matching the schema (`field` names it; `text` with NUL or control characters other than tab, LF, CR; a `notify` that is not a public dotted domain name or is outside the tenant's notify_domains; neither `notify` nor a webhook; a `webhook.url` that is not https, has a user name, or resolves to a non-public address; a webhook for a tenant without webhook secrets), or the key was reused with a different body", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable, the webhook host's name did not resolve in time, or no room for the body in the process's request-body budget (the body is not read and the connection is closed): nothing stored, nothing enqueued. Or (problem type ending `/not-replicated`) the job was recorded on the Redis primary but fewer than SUMMARYD_REDIS_MIN_REPLICAS_ACK replicas confirmed it within SUMMARYD_REDIS_ACK_TIMEOUT_MS: the retry with the same Idempotency-Key and body is a replay of the same job (same job_id, never enqueued twice), answered 202 once the replicas confirm it", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds"))),
    )
)]
pub(crate) async fn create(
    req: HttpRequest,
    state: web::Data<ApiState>,
    tenant: Tenant,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let span = post_span(&req, &tenant.id);
    let answer = accept(req, state, tenant, payload, &span)
        .instrument(span.clone())
        .await;
    if !span.is_none() {
        let status = match &answer {
            Ok(response) => response.status(),
            Err(e) => actix_web::ResponseError::status_code(e),
        };
        span.record("http.response.status_code", i64::from(status.as_u16()));
        // A 4xx is the client's to fix; only the server's own failures mark the span.
        if status.is_server_error() {
            telemetry::fail(&span, Disposition::Unavailable.class());
        }
    }
    answer
}

/// The `POST /v1/summaries` span, continuing the caller's trace when the request carries a
/// valid `traceparent` (an invalid one is ignored, as W3C asks: the trace starts here).
fn post_span(req: &HttpRequest, tenant: &TenantId) -> tracing::Span {
    if !telemetry::on() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: telemetry::TARGET,
        "POST /v1/summaries",
        "otel.kind" = "server",
        "http.request.method" = "POST",
        "http.route" = "/v1/summaries",
        "http.response.status_code" = tracing::field::Empty,
        "summaryd.job_id" = tracing::field::Empty,
        "summaryd.tenant" = %tenant,
        "otel.status_code" = tracing::field::Empty,
        "otel.status_description" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    );
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    if let Some(traceparent) = header("traceparent")
        && let Ok(parent) = TraceContext::parse(traceparent, header("tracestate"))
    {
        telemetry::continue_from(&span, &parent);
    }
    span
}

async fn accept(
    req: HttpRequest,
    state: web::Data<ApiState>,
    tenant: Tenant,
    payload: web::Payload,
    span: &tracing::Span,
) -> Result<HttpResponse, ApiError> {
    let api = &state.services.settings.api;
    // The head has arrived; the body gets the same time again (per 256 KiB it declares),
    // then the request is cut.
    let started = tokio::time::Instant::now();
    let key = idempotency_key(req.headers())?;
    body::require_json(&req)?;
    // `_room` returns the body's bytes to the process budget when this handler ends.
    let (bytes, _room) = body::read_limited(
        &req,
        payload,
        api.max_body_bytes,
        &state.body_budget,
        &tenant.id,
        started,
        api.request_timeout,
    )
    .await?;
    let rules = state.services.settings.webhook.rules();
    let request = body::parse_summary_request(&bytes, rules)?;
    drop(bytes);
    let budget = tenant.policy.budget;
    let cost = check_length(&state, &request.text, budget.is_some()).await?;

    // Before anything is stored: a recipient the tenant may not notify, or a webhook that
    // cannot be sent, is the client's to fix (422), never a job.
    if let (Some(domains), Some(notify)) = (&tenant.policy.notify_domains, &request.notify) {
        domains.check(notify)?;
    }
    let webhook = webhook_target(&request.webhook, &tenant.policy, rules).await?;
    if request.notify.is_none() && webhook.is_none() {
        return Err(ApiError::validation(
            "notify",
            "is required when there is no webhook: give notify (an email address), \
             webhook ({\"url\": \"https://…\"}) or both",
        ));
    }

    let scoped = ScopedKey::summaries(&tenant.id, &key);
    let fingerprint = request
        .fingerprint()
        .map_err(|e| ApiError::Unavailable(format!("request fingerprint: {e}")))?;
    let job_id = scoped.job_id(&fingerprint);
    span.record("summaryd.job_id", tracing::field::display(job_id));
    let redis_key = state
        .services
        .keys
        .of_tenant(tenant.id.as_str())
        .idempotency(&scoped);
    let limits = tenant.policy.limits(&state.services.settings.notify);
    // A long text goes to Postgres first, so a job on the stream always finds it; a
    // retry of the request finds it there (the job id is the key).
    let (text, stored_here) = if request.text.len() > api.inline_text_bytes {
        if let Some(earlier) = state
            .idempotency
            .earlier_answer(&redis_key, &fingerprint)
            .await?
        {
            return respond(&earlier, job_id);
        }
        let stored =
            db::job_texts::store(&state.services.pg, job_id, &tenant.id, &request.text).await?;
        (JobText::Stored, stored)
    } else {
        (JobText::Inline(request.text), false)
    };
    let job = Job {
        job_id,
        tenant: tenant.id,
        text,
        notify: request.notify,
        webhook,
        created_at: Utc::now(),
    };
    // The job's worst case, reserved against the tenant's budget in the accepting step.
    let admission = budget
        .zip(cost)
        .map(|(budget, cost)| Admission::new(budget, cost, job.created_at));
    // The 202 is known before anything is written (the job id comes from the request), so
    // it is stored in the same atomic step that enqueues the job: see `api::idempotency`.
    let outcome = state
        .idempotency
        .enqueue_within(
            &redis_key,
            &fingerprint,
            &job,
            accepted(job_id)?,
            &limits,
            admission.as_ref(),
        )
        .await;
    if let (Err(StoreError::OverLimit(over)), Some(admission)) = (&outcome, &admission)
        && over.limit == Limit::Budget
    {
        return Err(budget_exhausted(&state, job.tenant.as_str(), admission).await);
    }
    if stored_here && matches!(outcome, Err(StoreError::KeyReused)) {
        // Another body holds the key, so no job with this id was or will be enqueued under
        // it: the text belongs to no job. (After a limit or an outage the text stays for
        // the client's retry, which finds it; a concurrent twin of this request may have
        // enqueued the same job id, so a replay never removes it. Retention removes what
        // no job ever took.)
        if let Err(e) = db::job_texts::forget(&state.services.pg, job_id).await {
            tracing::warn!(error = %e, %job_id, "could not remove a stored text no job uses; retention removes it");
        }
    }
    respond(&outcome?, job_id)
}

/// Where the job's webhooks go: the request's `webhook.url`, else the tenant's default
/// `webhook_url`; checked against the `[webhook]` rules (a public address, resolved now;
/// the relay checks again when it connects) and refused when nothing could sign it.
async fn webhook_target(
    requested: &Option<WebhookUrl>,
    policy: &TenantPolicy,
    rules: WebhookRules,
) -> Result<Option<WebhookUrl>, ApiError> {
    let url = match (requested, &policy.webhook_url) {
        (Some(url), _) => url.clone(),
        (None, Some(default)) => {
            // The tenant's own default, syntax-checked when the tokens file loaded.
            default.check(rules).map_err(|e| {
                ApiError::validation(
                    "webhook.url",
                    format!("the tenant's default webhook_url {}", e.message),
                )
            })?;
            default.clone()
        }
        (None, None) => return Ok(None),
    };
    if policy.webhook_secrets.is_none() {
        return Err(ApiError::validation(
            "webhook",
            "cannot be signed: no webhook secret is configured for this tenant \
             (the operator adds webhook_secrets to the tokens file, or \
             SUMMARYD_WEBHOOK_SECRETS_FILE in header mode)",
        ));
    }
    match crate::webhook::check_target(&url, rules).await {
        Ok(()) => Ok(Some(url)),
        Err(e) if e.is_timeout() => Err(ApiError::Unavailable(format!("webhook.url: {e}"))),
        Err(e) => Err(ApiError::validation("webhook.url", e.to_string())),
    }
}

/// The 429 for a job the tenant's budget cannot hold: how much is left (read now; the
/// refusal itself was atomic with the check) and when the period resets.
async fn budget_exhausted(state: &ApiState, tenant: &str, admission: &Admission) -> ApiError {
    let left = match state.services.redis.get().await {
        Ok(mut conn) => stream::budget::read(
            &mut conn,
            state.services.keys.of_tenant(tenant),
            tenant,
            &admission.period_id,
        )
        .await
        .map(|taken| admission.budget.left(taken))
        .unwrap_or(0),
        Err(_) => 0,
    };
    let retry_after = std::time::Duration::from_millis(admission.retry_after_ms);
    let resets_at = Utc::now() + retry_after;
    ApiError::BudgetExhausted {
        cost: admission.cost,
        budget: admission.budget.tokens,
        left,
        resets_at: resets_at
            .with_nanosecond(0)
            .unwrap_or(resets_at)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        retry_after_s: retry_after.as_millis().div_ceil(1000).max(1) as u64,
    }
}

/// 413 for a text longer than `SUMMARYD_API_MAX_TEXT_CHARS`, or one that would need more
/// than `SUMMARYD_LLM_MAX_PARTS` model calls on the configured chain. With `budgeted`, also
/// the text's worst-case tokens on the primary provider (what a budget reserves), counted
/// in the same pass.
async fn check_length(
    state: &ApiState,
    text: &str,
    budgeted: bool,
) -> Result<Option<u64>, ApiError> {
    let api = &state.services.settings.api;
    // A UTF-8 char is at least one byte, so a short byte length settles it without a scan.
    if text.len() > api.max_text_chars && text.chars().nth(api.max_text_chars).is_some() {
        return Err(ApiError::TextTooLong {
            max_chars: api.max_text_chars,
        });
    }
    let max_parts = state.services.settings.llm.max_parts;
    // Planning a long text counts its tokens, milliseconds per 100 KB: off the HTTP
    // workers' threads for a long one.
    let plan = move |fits: &[crate::llm::Fit], text: &str| {
        let needed = crate::llm::most_calls(fits, text);
        let cost = budgeted
            .then(|| fits.first().map(|primary| primary.worst_case_tokens(text)))
            .flatten();
        (needed, cost)
    };
    let (needed, cost) = if text.len() <= PLAN_INLINE_BYTES {
        plan(&state.fits, text)
    } else {
        let fits = state.fits.clone();
        let text = text.to_owned();
        actix_web::rt::task::spawn_blocking(move || plan(&fits, &text))
            .await
            .map_err(|e| ApiError::Unavailable(format!("planning the text's parts failed: {e}")))?
    };
    if needed > max_parts {
        return Err(ApiError::TooManyParts { needed, max_parts });
    }
    Ok(cost)
}

/// Texts up to this size are planned on the request's own thread.
const PLAN_INLINE_BYTES: usize = 16 * 1024;

fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let invalid = |message: String| ApiError::InvalidHeader {
        header: IDEMPOTENCY_KEY_HEADER,
        message,
    };
    let raw = single_header(headers, &IDEMPOTENCY_KEY)?
        .ok_or_else(|| {
            invalid("is required: send a unique key of 16–128 visible ASCII characters".into())
        })?
        .to_str()
        .map_err(|_| invalid("must contain only visible ASCII characters".into()))?;
    IdempotencyKey::parse(raw).map_err(|e| invalid(e.message))
}

/// The answer to a new job, stored for its replays.
fn accepted(job_id: JobId) -> Result<StoredResponse, ApiError> {
    let body = serde_json::to_value(Accepted {
        job_id: job_id.as_uuid(),
        status: JobStatus::Queued,
    })
    .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(StoredResponse {
        status: StatusCode::ACCEPTED.as_u16(),
        body,
    })
}

fn respond(outcome: &Outcome, job_id: JobId) -> Result<HttpResponse, ApiError> {
    let stored = outcome.response();
    let status = StatusCode::from_u16(stored.status)
        .map_err(|_| ApiError::Unavailable(format!("stored status {}", stored.status)))?;
    let mut builder = HttpResponse::build(status);
    builder.insert_header((CONTENT_TYPE, "application/json"));
    if status.is_success() {
        builder.insert_header((LOCATION, format!("/v1/summaries/{job_id}")));
    }
    if outcome.is_replay() {
        builder.insert_header((REPLAYED_HEADER, "true"));
    }
    let body = serde_json::to_vec(&stored.body)
        .map_err(|e| ApiError::Unavailable(format!("stored body: {e}")))?;
    Ok(builder.body(body))
}

#[utoipa::path(
    get,
    path = "/v1/summaries/{job_id}",
    tag = "summaries",
    params(
        ("job_id" = String, Path, description = "The job id from the 202 answer"),
        ("X-Tenant-Id" = String, Header, description = "The tenant that created the job: 1–64 characters of [A-Za-z0-9._-], sent once. Ignored in token mode",
            min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]{1,64}$"),
    ),
    responses(
        (status = 200, description = "The job's state", body = JobView),
        (status = 400, description = "X-Tenant-Id missing, malformed or repeated (an Authorization header repeated too; `header` names it)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Token mode: missing or unknown bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job for this tenant: unknown, another tenant's (existence is not revealed), or not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis or Postgres unavailable", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds"))),
    )
)]
pub async fn get(
    req: HttpRequest,
    state: web::Data<ApiState>,
    tenant: Tenant,
) -> Result<HttpResponse, ApiError> {
    let not_found = || {
        ApiError::NotFound(format!(
            "No job with this id exists for tenant {}; use the job_id from the 202 answer.",
            tenant.id
        ))
    };
    let raw = req.match_info().get("job_id").unwrap_or_default();
    let job_id: JobId = raw.parse().map_err(|_| not_found())?;
    match read_job(&state.services, &tenant.id, job_id, std::future::ready(())).await? {
        Some(view) => Ok(HttpResponse::Ok().json(view)),
        None => Err(not_found()),
    }
}

/// What GET answers for `job_id` and `tenant`; `None` is a 404.
///
/// The job state (Redis) is read first and the summary (Postgres) second, and a summary
/// wins. That order cannot miss an accepted job: the state exists from the 202 until the
/// worker's acknowledgement removes it, which happens only after the summary committed. So
/// if the first read finds no state because the job was just acknowledged, the second read
/// finds its summary; the other order could read "no summary yet", then "no state any more"
/// and answer 404 for a job that is done. `between_reads` runs between the two reads; the
/// handler passes a no-op, tests use it to commit and acknowledge the job right there.
///
/// A summary row answers `done` whether or not retention removed its text: the row is the
/// job's identity and outlives the text.
///
/// When Redis cannot be read, a summary still answers (a done job needs only Postgres);
/// otherwise the Redis error is the answer (503), never a 404.
pub async fn read_job(
    services: &ApiServices,
    tenant: &TenantId,
    job_id: JobId,
    between_reads: impl Future<Output = ()>,
) -> Result<Option<JobView>, ApiError> {
    let state = match services.redis_shared.get().await {
        Ok(mut conn) => {
            job_state::get(&mut conn, services.keys.of_tenant(tenant.as_str()), job_id).await
        }
        Err(e) => Err(e),
    };
    between_reads.await;
    if let Some(row) = db::summaries::find(&services.pg, job_id).await? {
        if row.tenant != tenant.as_str() {
            return Ok(None);
        }
        return Ok(Some(JobView {
            job_id: job_id.as_uuid(),
            status: JobStatus::Done,
            summary_expired: row.summary.is_none(),
            summary: row.summary,
            model: row.model,
            error: None,
            created_at: Some(row.created_at),
            completed_at: Some(row.completed_at),
            progress: None,
            parts: row.parts.and_then(|n| u32::try_from(n).ok()),
        }));
    }
    Ok(match state? {
        Some(s) if s.tenant == tenant.as_str() => Some(JobView {
            job_id: job_id.as_uuid(),
            status: match s.status {
                Status::Failed => JobStatus::Failed,
                Status::Queued => JobStatus::Queued,
            },
            summary: None,
            summary_expired: false,
            model: None,
            error: s.error,
            created_at: s.created_at,
            completed_at: None,
            progress: s.progress.map(|(parts_done, parts_total)| Progress {
                parts_done,
                parts_total,
            }),
            parts: None,
        }),
        _ => None,
    })
}
