//! `[otel]`: trace export (`SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `SUMMARYD_OTEL_CAPTURE_CONTENT`). The standard `OTEL_*` variables are read where the
//! exporter is built (`infra::telemetry`), as every OpenTelemetry SDK reads them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtelSettings {
    /// Base URL of an OTLP/HTTP receiver (`http://collector:4318`); traces go to
    /// `{endpoint}/v1/traces`. Unset (and no `OTEL_EXPORTER_OTLP_*ENDPOINT`): no export, and
    /// nothing of OpenTelemetry is built.
    pub exporter_otlp_endpoint: Option<String>,
    /// Prompts and completions on the model-call spans. Off by default: spans go to
    /// systems with other readers and retention than the summaries themselves.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub capture_content: bool,
}

#[cfg(test)]
mod tests {
    use super::super::testing::load;

    #[test]
    fn the_endpoint_and_content_switch_load_from_file_and_environment() {
        let s = load(
            "[otel]\nexporter_otlp_endpoint = \"http://127.0.0.1:4318\"\n",
            &[("SUMMARYD_OTEL_CAPTURE_CONTENT", "1")],
        )
        .unwrap();
        assert_eq!(
            s.otel.exporter_otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert!(s.otel.capture_content);
        let s = load("", &[]).unwrap();
        assert_eq!(s.otel.exporter_otlp_endpoint, None);
        assert!(!s.otel.capture_content);
    }
}
