//! `[retention]`: how long finished work is kept (`SUMMARYD_RETENTION_*`).

use serde::{Deserialize, Serialize};

/// How long finished work is kept; 0 keeps it forever. Removed by the maintenance task.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Dead letters (and their job state) older than this are removed.
    pub dead_letters_s: u64,
    /// Sent outbox rows older than this (since they were sent) are deleted.
    pub outbox_sent_s: u64,
    /// Summaries completed longer ago than this are deleted; must exceed the idempotency
    /// result TTL (checked with it, in `Settings::validate`).
    pub summaries_s: u64,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            dead_letters_s: 14 * 86_400,
            outbox_sent_s: 7 * 86_400,
            summaries_s: 0,
        }
    }
}
