//! summaryd: reliable plumbing around an LLM step.
//!
//! Data moves one way: api → stream → worker → db (summary + outbox) → relay → mail.

pub mod admin;
pub mod api;
pub mod app;
pub mod auth;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod connections;
pub mod db;
pub mod domain;
pub mod durability;
pub mod failure;
pub mod healthcheck;
pub mod http_client;
pub mod keys;
#[cfg(test)]
mod layering;
pub mod llm;
pub mod mail;
pub mod maintenance;
pub mod metrics;
pub mod redact;
pub mod redis_conn;
pub mod relay;
pub mod retry;
pub mod roles;
pub mod shutdown;
pub mod stream;
pub mod supervisor;
pub mod telemetry;
pub mod tls;
pub mod worker;
