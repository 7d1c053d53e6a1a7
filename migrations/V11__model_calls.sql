-- Every model call a job made is kept in one of two places. The calls of the delivery that
-- committed the job are a JSON array on its summaries row (`summaries.model_calls`): one
-- more value in the INSERT the pipeline makes anyway, so the history costs the hot path no
-- statement, row or index of its own. The calls of deliveries that did not commit (a
-- retry, a dead letter, a delivery cut short) are rows of `model_calls`.
--
-- A model_calls row: each attempt against a provider, retried and failed ones
-- included, with the delivery that made it (the stream's delivery count) and its place
-- among that delivery's calls (`seq`, in the order they started). `error_class` is NULL
-- for a call that succeeded, otherwise the `result` label of summaryd_llm_requests_total
-- (`timeout`, `status_503`, …). Written before a delivery that did not finish its job is
-- settled (or, rarely, beside a summary another delivery had committed first). No key of its own: a delivery that did
-- not count (a dependency was down) shares its number with the one after it.
--
-- Retention: a job's rows go with its summary's text (SUMMARYD_RETENTION_SUMMARIES_S), and
-- every row once as old as a dead letter may be (SUMMARYD_RETENTION_DEAD_LETTERS_S).
CREATE TABLE model_calls (
    job_id            uuid        NOT NULL,
    tenant            text        NOT NULL,
    delivery          integer     NOT NULL,
    seq               integer     NOT NULL,
    provider          text        NOT NULL,
    model             text        NOT NULL,
    prompt_tokens     integer,
    completion_tokens integer,
    duration_ms       integer     NOT NULL,
    error_class       text,
    at                timestamptz NOT NULL
);
-- The job page reads a job's calls; retention deletes those of a summary whose text expires.
CREATE INDEX model_calls_job_id ON model_calls (job_id);
-- Retention deletes rows past its horizon in batches. BRIN, not a btree: rows arrive in
-- time order, so block ranges summarise them well, and a BRIN costs next to nothing per
-- insert on the pipeline's hot path.
CREATE INDEX model_calls_at ON model_calls USING brin (at);

-- The calls of the delivery that committed the job (the same fields as a model_calls row),
-- NULL for jobs committed before this version; removed with the summary's text.
ALTER TABLE summaries ADD COLUMN model_calls jsonb;
