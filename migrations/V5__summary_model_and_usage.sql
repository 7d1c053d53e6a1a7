-- Which model wrote each summary and what it cost: GET reports the model, `summaryd usage`
-- adds up the tokens per tenant and model. NULL for summaries written before this version
-- (and tokens NULL when the provider reported no usage): unknown, not zero.
ALTER TABLE summaries
    ADD COLUMN model             text,
    ADD COLUMN prompt_tokens     integer,
    ADD COLUMN completion_tokens integer;

-- `summaryd usage --since` reads one window of summaries; completed_at is indexed already
-- (V4, for retention), and the report groups what that range holds.
