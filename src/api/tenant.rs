//! Who is calling. Today (no tokens file) the tenant is the `X-Tenant-Id` header; token
//! authentication (contract §4) will replace the body of `from_request` without touching
//! the handlers, which only ever see a parsed `Tenant`.

use std::future::{Ready, ready};

use actix_web::dev::Payload;
use actix_web::http::header::HeaderMap;
use actix_web::{FromRequest, HttpRequest};

use super::problem::ApiError;
use crate::domain::TenantId;

pub const TENANT_HEADER: &str = "X-Tenant-Id";

/// The tenant a request acts for; extracting it fails with a 400 problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub TenantId);

impl Tenant {
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let invalid = |message: String| ApiError::InvalidHeader {
            header: TENANT_HEADER,
            message,
        };
        let raw = headers
            .get(TENANT_HEADER)
            .ok_or_else(|| invalid("is required: name the tenant this request is for".into()))?
            .to_str()
            .map_err(|_| invalid("must contain only visible ASCII characters".into()))?;
        TenantId::parse(raw)
            .map(Tenant)
            .map_err(|e| invalid(e.message))
    }
}

impl FromRequest for Tenant {
    type Error = ApiError;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Self::from_headers(req.headers()))
    }
}
