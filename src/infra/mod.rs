//! What every adapter and role stands on: connections to Redis and Postgres, TLS, the Redis
//! key names, redaction, telemetry and metrics. Nothing here knows what a job is for.

pub mod connections;
pub mod http_client;
pub mod keys;
pub mod metrics;
pub mod postgres;
pub mod redact;
pub mod redis;
pub mod telemetry;
pub mod tls;
