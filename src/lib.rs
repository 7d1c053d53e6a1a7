//! summaryd: reliable plumbing around an LLM step.
//!
//! Data moves one way: api → stream → worker → db (summary + outbox) → relay → mail. The
//! modules are layered (`docs/architecture.md`); each imports only from layers below it,
//! which `layering.rs` checks on every `cargo test`:
//!
//! - base: `domain` (the values that cross seams), `resilience` (waiting, failure
//!   vocabulary; no I/O), `shutdown`; then `config` (settings, pure checks)
//! - `infra`: connections, TLS, keys, redaction, telemetry, metrics
//! - adapters, one per outside system: `stream` (Redis), `db` (Postgres), `llm`, `mail`
//! - roles, one per `--roles` entry plus housekeeping: `api`, `worker`, `relay`, `maintenance`
//! - `app`: the handles each role gets, the supervisor
//! - `ops`: the operator commands; `cli`: parsing the command line

pub mod api;
pub mod app;
pub mod cli;
pub mod config;
pub mod console;
pub mod db;
pub mod domain;
pub mod infra;
#[cfg(test)]
mod layering;
pub mod llm;
pub mod mail;
pub mod maintenance;
pub mod ops;
pub mod relay;
pub mod resilience;
pub mod shutdown;
pub mod stream;
pub mod webhook;
pub mod worker;
