//! Who is calling (`docs/reference.md`, Tenants). Without a tokens file the tenant is the
//! `X-Tenant-Id` header (unauthenticated; start-up warns); with one, the tenant comes from
//! the bearer token and `X-Tenant-Id` is ignored. Handlers only ever see a parsed `Tenant`.

use std::future::{Ready, ready};
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::http::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use actix_web::{FromRequest, HttpRequest, web};

use super::problem::ApiError;
use super::state::ApiState;
use crate::api::auth::{Denied, TenantPolicy, TokenStore};
use crate::domain::TenantId;

pub(crate) const TENANT_HEADER: &str = "X-Tenant-Id";
const AUTHORIZATION_HEADER: &str = "Authorization";
static TENANT_NAME: HeaderName = HeaderName::from_static("x-tenant-id");

/// A header looked up by every request: its parsed name (a lookup by a string parses and
/// lower-cases the name first, each time) and its spelling for problem details.
pub(crate) struct KnownHeader {
    pub(crate) name: &'static HeaderName,
    pub(crate) spelled: &'static str,
}

pub(crate) const TENANT: KnownHeader = KnownHeader {
    name: &TENANT_NAME,
    spelled: TENANT_HEADER,
};
const AUTHORIZATION_KNOWN: KnownHeader = KnownHeader {
    name: &AUTHORIZATION,
    spelled: AUTHORIZATION_HEADER,
};

/// The one value of `header`, if sent. A header that identifies the caller or the request
/// must not be ambiguous: a proxy that appends instead of replacing would otherwise let
/// the first value (the client's own) win, so a repeated one is a 400 naming it.
pub(crate) fn single_header<'a>(
    headers: &'a HeaderMap,
    header: &KnownHeader,
) -> Result<Option<&'a HeaderValue>, ApiError> {
    let mut values = headers.get_all(header.name);
    let first = values.next();
    if values.next().is_some() {
        return Err(ApiError::InvalidHeader {
            header: header.spelled,
            message: "was sent more than once; send it exactly once".into(),
        });
    }
    Ok(first)
}

/// The tenant a request acts for, and what it may do; extracting it fails with a 400 (or,
/// in token mode, 401) problem. The policy comes with the identity from one version of the
/// tokens file, so a reload while the request runs cannot give it another file's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub id: TenantId,
    pub(crate) policy: Arc<TenantPolicy>,
}

impl Tenant {
    pub(crate) fn from_headers(
        headers: &HeaderMap,
        policy: &Arc<TenantPolicy>,
    ) -> Result<Self, ApiError> {
        let invalid = |message: String| ApiError::InvalidHeader {
            header: TENANT_HEADER,
            message,
        };
        let raw = single_header(headers, &TENANT)?
            .ok_or_else(|| invalid("is required: name the tenant this request is for".into()))?
            .to_str()
            .map_err(|_| invalid("must contain only visible ASCII characters".into()))?;
        TenantId::parse(raw)
            .map(|id| Tenant {
                id,
                policy: policy.clone(),
            })
            .map_err(|e| invalid(e.message))
    }

    /// Token mode: `Authorization: Bearer <token>` names the tenant.
    pub(crate) fn from_token(headers: &HeaderMap, store: &TokenStore) -> Result<Self, ApiError> {
        let value = single_header(headers, &AUTHORIZATION_KNOWN)?
            .ok_or(ApiError::Unauthorized("no Authorization header"))?
            .to_str()
            .map_err(|_| ApiError::Unauthorized("malformed Authorization header"))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthorized(
                "the Authorization scheme must be Bearer",
            ))?;
        match store.authenticate(token) {
            Ok((id, policy)) => Ok(Tenant { id, policy }),
            Err(Denied::Unauthenticated) => Err(ApiError::Unauthorized("unknown token")),
        }
    }
}

impl FromRequest for Tenant {
    type Error = ApiError;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(state) = req.app_data::<web::Data<ApiState>>() else {
            return ready(Err(ApiError::Unavailable(
                "the API state is not configured".into(),
            )));
        };
        let tokens = state.services.auth.clone();
        let headers = req.headers();
        // Both are refused when repeated in either mode: which one a proxy rewrites
        // should not depend on how this server is configured.
        let checked = single_header(headers, &TENANT)
            .and_then(|_| single_header(headers, &AUTHORIZATION_KNOWN));
        ready(checked.and_then(|_| match tokens {
            // The file as loaded now; a reload swaps it whole, never mid-request.
            Some(tokens) => Self::from_token(headers, &tokens.current()),
            None => Self::from_headers(headers, &state.header_policy),
        }))
    }
}
