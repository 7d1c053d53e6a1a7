-- Signed webhooks are outbox rows too (topic 'webhook'), written in the same transaction as
-- the summary, or before the dead letter, so they share the relay's lease, fencing and
-- give-up horizon with emails; each row's dedupe_key is its webhook-id.

-- The HTTP status of the row's last attempt (NULL: none yet, or no HTTP answer: a timeout,
-- a refused connection). `summaryd webhook deliveries` shows it as last_status.
ALTER TABLE outbox ADD COLUMN last_status integer;
-- Set instead of sending: the row's endpoint was disabled for its tenant (a 410 Gone, or
-- every delivery failing for SUMMARYD_WEBHOOK_DISABLE_AFTER_S). A skipped row is not sent
-- by itself again, is not unsent work, and goes under the sent rows' retention;
-- `summaryd webhook replay` makes it due again.
ALTER TABLE outbox ADD COLUMN skipped_at timestamptz;

-- The relay claims per topic, so an email and a webhook never wait for each other, and
-- skipped rows are as finished as sent ones.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (topic, next_attempt_at, id)
    WHERE sent_at IS NULL AND failed_at IS NULL AND skipped_at IS NULL;
-- summaryd_outbox_unsent{topic} reads this index, not the table.
DROP INDEX outbox_unsent;
CREATE INDEX outbox_unsent ON outbox (topic) WHERE sent_at IS NULL AND skipped_at IS NULL;
CREATE INDEX outbox_skipped_at ON outbox (skipped_at) WHERE skipped_at IS NOT NULL;

-- One row per tenant and webhook URL that has had trouble: whether it is disabled, and
-- since when every delivery to it has failed. An endpoint without a row is enabled and
-- healthy. Keyed by tenant: one tenant's 410 never disables another tenant's use of a URL.
CREATE TABLE webhook_endpoints (
    tenant          text        NOT NULL,
    url             text        NOT NULL,
    -- Start of the current run of failures; NULL again after a delivery succeeds.
    failing_since   timestamptz,
    disabled_at     timestamptz,
    -- Why: "410 Gone" or "every delivery failed for …", for `webhook deliveries` and logs.
    disabled_reason text,
    PRIMARY KEY (tenant, url)
);

-- When the row's last attempt failed (or it was skipped): `webhook replay --failed-since`
-- and `webhook deliveries --failed` select by it. Set for every topic.
ALTER TABLE outbox ADD COLUMN last_failed_at timestamptz;
