//! Who is asking, and whether they may change things: a session cookie (the browser), or
//! a user's API token under `/console/api/` (scripts). Every change needs the operator
//! role, and from a browser the session's CSRF token too.

use actix_web::HttpRequest;
use actix_web::http::header::{AUTHORIZATION, COOKIE};

use super::Console;
use super::error::ConsoleError;
use super::form::Fields;
use super::session::{self, Session};
use super::users::Role;

/// The header scripts running in the page send the CSRF token in (forms send a field).
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";
/// The form field holding the CSRF token.
pub(crate) const CSRF_FIELD: &str = "csrf";

pub(crate) struct Who {
    pub(crate) name: String,
    pub(crate) role: Role,
    pub(crate) via: Via,
}

pub(crate) enum Via {
    /// The browser: the cookie's value and the session it names.
    Session { id: String, session: Session },
    /// A script with the user's token: no cookie, so nothing another site could make a
    /// browser send, and no CSRF token to check.
    Token,
}

impl Who {
    /// The CSRF token pages put in their forms; empty for token callers (who get no pages).
    pub(crate) fn csrf(&self) -> &str {
        match &self.via {
            Via::Session { session, .. } => &session.csrf,
            Via::Token => "",
        }
    }

    pub(crate) fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// May this request change something? Operators only (403 for viewers, whatever else
    /// the request says), and a browser's request must carry its session's CSRF token in
    /// the form or in the `X-CSRF-Token` header.
    pub(crate) fn may_change(
        &self,
        req: &HttpRequest,
        fields: &Fields,
    ) -> Result<(), ConsoleError> {
        if !self.is_operator() {
            return Err(ConsoleError::Forbidden);
        }
        match &self.via {
            Via::Token => Ok(()),
            Via::Session { session, .. } => {
                let given = fields
                    .get(CSRF_FIELD)
                    .or_else(|| req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok()));
                match given {
                    Some(token) if session.csrf_matches(token) => Ok(()),
                    _ => Err(ConsoleError::Csrf),
                }
            }
        }
    }
}

/// The value of the console's cookie in the request, if any.
pub(crate) fn session_cookie(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get_all(COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == session::COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The signed-in user, from a bearer token (only where `tokens` is true: `/console/api/`)
/// or the session cookie. The user's role is read from the users file as it is now, so a
/// removed user's session ends and a demoted one's powers with it.
pub(crate) async fn who(
    req: &HttpRequest,
    console: &Console,
    tokens: bool,
) -> Result<Who, ConsoleError> {
    let users = console.users.current().await;
    if tokens && let Some(token) = bearer(req) {
        return users
            .by_token(token)
            .map(|user| Who {
                name: user.name.clone(),
                role: user.role,
                via: Via::Token,
            })
            .ok_or(ConsoleError::NotSignedIn);
    }
    let id = session_cookie(req).ok_or(ConsoleError::NotSignedIn)?;
    let mut conn = console.redis.get().await?;
    let session = session::touch(&mut conn, console.keys.global(), &id, console.idle)
        .await?
        .ok_or(ConsoleError::NotSignedIn)?;
    let user = users.get(&session.user).ok_or(ConsoleError::NotSignedIn)?;
    Ok(Who {
        name: user.name.clone(),
        role: user.role,
        via: Via::Session { id, session },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn the_cookie_is_found_among_others() {
        let req = TestRequest::default()
            .insert_header((COOKIE, "a=1; summaryd_console=abc; b=2"))
            .to_http_request();
        assert_eq!(session_cookie(&req).as_deref(), Some("abc"));
        let req = TestRequest::default()
            .insert_header((COOKIE, "summaryd_console_x=abc; summaryd_console="))
            .to_http_request();
        assert_eq!(session_cookie(&req), None);
        assert_eq!(
            session_cookie(&TestRequest::default().to_http_request()),
            None
        );
    }

    #[test]
    fn bearer_tokens_only() {
        let with = |v: &str| {
            TestRequest::default()
                .insert_header((AUTHORIZATION, v))
                .to_http_request()
        };
        assert_eq!(bearer(&with("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&with("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&with("Basic abc")), None);
        assert_eq!(bearer(&with("Bearer ")), None);
        assert_eq!(bearer(&TestRequest::default().to_http_request()), None);
    }
}
