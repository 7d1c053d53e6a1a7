//! `GET /openapi.json`: the contract of every route, generated from the handlers'
//! `#[utoipa::path]` attributes and the DTO types, so it cannot drift from the code.

use std::sync::LazyLock;

use actix_web::HttpResponse;
use utoipa::OpenApi;

use super::health::{self, Health};
use super::metrics;
use super::problem::{ApiError, Problem};
use super::summaries::{
    self, Accepted, CreateSummary, JobStatus, JobView, Progress, WebhookTarget,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "summaryd",
        description = "Accepts LLM summary jobs exactly once per Idempotency-Key and emails the result. \
                       Every error body is RFC 9457 problem details (application/problem+json)."
    ),
    paths(
        summaries::create,
        summaries::get,
        health::healthz,
        health::readyz,
        metrics::metrics,
        openapi_json,
    ),
    components(schemas(
        CreateSummary,
        WebhookTarget,
        Accepted,
        JobView,
        JobStatus,
        Progress,
        Problem,
        Health
    )),
    tags(
        (name = "summaries", description = "Summary jobs (served with role api)"),
        (name = "operations", description = "Health, metrics and this document (served on every role)"),
    )
)]
pub(crate) struct ApiDoc;

/// Built once: the document is static for the life of the process.
static DOCUMENT: LazyLock<Result<String, String>> = LazyLock::new(document);

fn document() -> Result<String, String> {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).map_err(|e| e.to_string())?;
    // A request asks for at least one effect. The derive cannot say "one of two optional
    // fields"; without it a client (or a fuzzer) takes a text-only body for valid. A tenant
    // with a default webhook_url may send one anyway: the schema is stricter than that
    // tenant needs, never looser than any tenant gets.
    if let Some(create) = doc.pointer_mut("/components/schemas/CreateSummary")
        && let Some(object) = create.as_object_mut()
    {
        object.insert(
            "anyOf".into(),
            serde_json::json!([{"required": ["notify"]}, {"required": ["webhook"]}]),
        );
    }
    serde_json::to_string(&doc).map_err(|e| e.to_string())
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object))
)]
pub(crate) async fn openapi_json() -> Result<HttpResponse, ApiError> {
    match &*DOCUMENT {
        Ok(doc) => Ok(HttpResponse::Ok()
            .content_type("application/json")
            .body(doc.clone())),
        Err(e) => Err(ApiError::Unavailable(format!("OpenAPI document: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_schema_is_closed_and_requires_the_text() {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT.as_ref().unwrap()).unwrap();
        let schema = &doc["components"]["schemas"]["CreateSummary"];
        assert_eq!(schema["additionalProperties"], false, "{schema}");
        // notify and webhook are each optional; one of them (or the tenant's default
        // webhook_url) is required, which the 422 documents.
        assert_eq!(schema["required"], serde_json::json!(["text"]));
        assert!(schema["properties"]["webhook"].is_object(), "{schema}");
        assert_eq!(
            schema["anyOf"],
            serde_json::json!([{"required": ["notify"]}, {"required": ["webhook"]}])
        );
        // Neither field may be null: the parser refuses a null as the wrong type.
        assert_eq!(schema["properties"]["notify"]["type"], "string", "{schema}");
        let target = &doc["components"]["schemas"]["WebhookTarget"];
        assert_eq!(target["additionalProperties"], false, "{target}");
        assert_eq!(target["required"], serde_json::json!(["url"]));
        let body = &doc["paths"]["/v1/summaries"]["post"]["requestBody"]["content"];
        assert!(body["application/json"].is_object(), "{body}");
    }

    /// A client generated from the document must accept a done job without its text.
    #[test]
    fn job_view_documents_an_expired_summary_as_optional() {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT.as_ref().unwrap()).unwrap();
        let schema = &doc["components"]["schemas"]["JobView"];
        assert_eq!(
            schema["properties"]["summary_expired"]["type"], "boolean",
            "{schema}"
        );
        let required = schema["required"].as_array().cloned().unwrap_or_default();
        for optional in ["summary", "summary_expired"] {
            assert!(
                !required.contains(&serde_json::json!(optional)),
                "{optional} in {required:?}"
            );
        }
    }
}
