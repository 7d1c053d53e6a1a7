//! Logging: human-readable text on a terminal, JSON lines otherwise (for log shippers).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Dependencies that log request data at debug level: tokio-postgres prints every
/// statement's parameters (summaries, recipients). They are held at info whatever
/// `RUST_LOG` says, because logs must never carry request texts or recipients.
const PAYLOAD_LOGGERS: [&str; 1] = ["tokio_postgres=info"];

/// Install the global subscriber. `RUST_LOG` filters (default `info`), except for
/// [`PAYLOAD_LOGGERS`].
pub fn init(format: Option<LogFormat>) {
    let format = format.unwrap_or(if std::io::stdout().is_terminal() {
        LogFormat::Text
    } else {
        LogFormat::Json
    });
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in PAYLOAD_LOGGERS {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
