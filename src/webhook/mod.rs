//! Webhook receivers: the clients' endpoints summaryd posts signed events to (Standard
//! Webhooks). One outside system like a mail provider, with one difference that shapes
//! this module: the target is chosen by a client, so every connection is checked against
//! the address rules (`resolve`), and nothing a receiver answers (a redirect, a slow
//! body) can take the relay somewhere else or hold it.
//!
//! - `resolve`: names resolved to public addresses only, at intake and at connect time.
//! - `send`: one signed POST under a wall-clock cap, and what its answer means.

mod resolve;
mod send;

pub use resolve::{TargetError, check_target};
pub use send::{Delivered, WebhookClient, WebhookError};
