-- Long documents (README, "Long documents").
--
-- A text longer than SUMMARYD_API_INLINE_TEXT_BYTES is stored here at intake, before the
-- job is enqueued; the stream entry carries only a reference. The worker deletes the row
-- in the transaction that commits the summary; retention removes texts of jobs that never
-- finished (dead letters past their retention, requests that were never enqueued).
CREATE TABLE job_texts (
    job_id     uuid PRIMARY KEY,
    tenant     text NOT NULL,
    text       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_texts_created_at ON job_texts (created_at);

-- Every finished part of a job summarised in parts: a piece of the text or a combination
-- of summaries, found by the SHA-256 of its input (kind and user message), so a later
-- delivery, whatever provider it meets, calls the model only for what is missing. `level`
-- (0: pieces of the text, 1 and up: combinations) and `part` (its place among its
-- siblings) say where it sat in the plan that wrote it. Rows go with the job's summary
-- under retention.
CREATE TABLE summary_parts (
    job_id            uuid NOT NULL,
    input_sha256      bytea NOT NULL,
    level             integer NOT NULL,
    part              integer NOT NULL,
    model             text NOT NULL,
    summary           text NOT NULL,
    prompt_tokens     integer,
    completion_tokens integer,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, input_sha256)
);
CREATE INDEX summary_parts_created_at ON summary_parts (created_at);

-- How many model calls a summary took, for jobs summarised in parts (NULL: one call).
ALTER TABLE summaries ADD COLUMN parts integer;
