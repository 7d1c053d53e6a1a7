//! Every way a console request can fail, answered once: as a page for the browser, as
//! problem details under `/console/api/`.

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use actix_web::{HttpResponse, ResponseError};

use crate::db::DbError;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("sign in first")]
    NotSignedIn,
    #[error("this needs the operator role; viewers can look but not change anything")]
    Forbidden,
    #[error(
        "the form's CSRF token is missing or wrong (a stale page, or a request from another site); reload the page and try again"
    )]
    Csrf,
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    NotFound(String),
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("Redis: {0}")]
    RedisPool(#[from] deadpool_redis::PoolError),
    #[error("Postgres: {0}")]
    Db(#[from] DbError),
    #[error("{0}")]
    Internal(String),
}

impl ConsoleError {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotSignedIn => StatusCode::UNAUTHORIZED,
            Self::Forbidden | Self::Csrf => StatusCode::FORBIDDEN,
            Self::BadInput(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Redis(_) | Self::RedisPool(_) | Self::Db(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn slug(&self) -> &'static str {
        match self {
            Self::NotSignedIn => "console-not-signed-in",
            Self::Forbidden => "console-forbidden",
            Self::Csrf => "console-csrf",
            Self::BadInput(_) => "console-bad-input",
            Self::NotFound(_) => "console-not-found",
            Self::Redis(_) | Self::RedisPool(_) | Self::Db(_) => "console-unavailable",
            Self::Internal(_) => "console-internal",
        }
    }

    fn log(&self) {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, status = status.as_u16(), "console request failed");
        } else if matches!(self, Self::Forbidden | Self::Csrf) {
            // A refused change is worth a line: it is either a misconfigured role or an attack.
            tracing::warn!(error = %self, status = status.as_u16(), "console request refused");
        }
    }
}

/// The browser's answer: a page saying what went wrong, or the sign-in form.
impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        self.log();
        if let Self::NotSignedIn = self {
            return HttpResponse::SeeOther()
                .insert_header((LOCATION, super::paths::SIGN_IN))
                .finish();
        }
        HttpResponse::build(self.status())
            .content_type("text/html; charset=utf-8")
            .body(super::document::error_page(self.status(), &self.to_string()).into_string())
    }
}

/// The same error under `/console/api/`: problem details, and 401 with a challenge instead
/// of a redirect.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ApiFailure(#[from] pub ConsoleError);

impl ResponseError for ApiFailure {
    fn status_code(&self) -> StatusCode {
        self.0.status()
    }

    fn error_response(&self) -> HttpResponse {
        self.0.log();
        let status = self.0.status();
        let mut builder = HttpResponse::build(status);
        builder.insert_header((CONTENT_TYPE, crate::api::problem::PROBLEM_JSON));
        if let ConsoleError::NotSignedIn = &self.0 {
            builder.insert_header((WWW_AUTHENTICATE, "Bearer realm=\"summaryd-console\""));
        }
        let body = serde_json::json!({
            "type": format!("tag:summaryd,2025:problems/{}", self.0.slug()),
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": self.0.to_string(),
        });
        builder.body(body.to_string())
    }
}
