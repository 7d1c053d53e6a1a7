//! The console's own stylesheet and script, compiled into the binary (nothing fetched at
//! run time), and the headers every console answer carries.

use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use actix_web::middleware::DefaultHeaders;
use actix_web::{HttpRequest, HttpResponse};

pub(crate) const CSS: &str = include_str!("static/console.css");
pub(crate) const JS: &str = include_str!("static/console.js");

/// No inline script or style anywhere (`'self'` only), no framing, forms post only here.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

pub(crate) fn security_headers() -> DefaultHeaders {
    DefaultHeaders::new()
        .add(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .add(("X-Frame-Options", "DENY"))
        .add(("X-Content-Type-Options", "nosniff"))
        .add(("Referrer-Policy", "same-origin"))
        // Pages show job data and CSRF tokens: no cache keeps a copy.
        .add((CACHE_CONTROL, "no-store"))
}

/// `/console/static/{name}`: the two files, or 404.
pub(crate) async fn serve(req: HttpRequest) -> HttpResponse {
    let (body, content_type) = match req.match_info().get("name") {
        Some("console.css") => (CSS, "text/css; charset=utf-8"),
        Some("console.js") => (JS, "text/javascript; charset=utf-8"),
        _ => return HttpResponse::NotFound().finish(),
    };
    HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, content_type))
        .body(body)
}
