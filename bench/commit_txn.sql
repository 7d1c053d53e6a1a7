-- pgbench script: the worker's commit for one job (db::summaries::commit_with_outbox), as
-- the Postgres ceiling of the end-to-end benchmark: the summary row (ON CONFLICT DO NOTHING
-- RETURNING, as the handler) and its outbox row, in one transaction. One transaction is one
-- job, so pgbench's tps at C clients is the most jobs/s C consumers can commit.
BEGIN;
INSERT INTO summaries (job_id, tenant, summary, created_at, model, prompt_tokens, completion_tokens)
    VALUES (gen_random_uuid(), 'bench', 'Revenue grew eleven percent in the quarter. Churn fell to two percent.', now(),
            'gpt-4.1-mini', 412, 58)
    ON CONFLICT (job_id) DO NOTHING RETURNING job_id;
INSERT INTO outbox (topic, dedupe_key, payload)
    VALUES ('email.summary_ready', 'summary_ready:' || gen_random_uuid(),
            '{"tenant": "bench", "to": "bench@example.com", "summary": "Revenue grew eleven percent in the quarter. Churn fell to two percent."}');
COMMIT;
