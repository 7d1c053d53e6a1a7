-- One row per job that finished: the primary key is what makes a job produce at most one
-- summary however often it is delivered (workers insert with ON CONFLICT DO NOTHING).
CREATE TABLE summaries (
    job_id       uuid        PRIMARY KEY,
    tenant       text        NOT NULL,
    summary      text        NOT NULL,
    -- When the API accepted the job (carried in the stream message).
    created_at   timestamptz NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now()
);

-- Side-effect intents, written in the same transaction as the summary and drained by the
-- relay. dedupe_key is UNIQUE as a backstop and is the provider's idempotency key.
CREATE TABLE outbox (
    id              bigserial   PRIMARY KEY,
    topic           text        NOT NULL,
    dedupe_key      text        NOT NULL UNIQUE,
    payload         jsonb       NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    -- Per-row backoff after a transient failure.
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- Lease: a relay owns the row until then, without holding a row lock across the send.
    claimed_until   timestamptz,
    -- Set on a permanent provider error: the row needs a person (`summaryd outbox retry`).
    failed_at       timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz
);

-- The relay's claim query scans only rows still to send, oldest due first.
CREATE INDEX outbox_due ON outbox (next_attempt_at, id)
    WHERE sent_at IS NULL AND failed_at IS NULL;
