-- pgbench script: the worker's commit for one job (db::summaries::commit_with_outbox), as
-- the Postgres ceiling of the end-to-end and drain benchmarks: the summary row (ON CONFLICT
-- DO NOTHING RETURNING, as the handler, with the columns it writes: completed_at and the
-- model call it made, as the builtin summariser's) and its email's outbox row (ON CONFLICT
-- on the dedupe key DO NOTHING), in one transaction, with values the size of a benchmark
-- job's. One transaction is one job, so pgbench's tps at C clients is the most jobs/s C
-- consumers can commit one job at a time.
BEGIN;
INSERT INTO summaries (job_id, tenant, summary, created_at, model, prompt_tokens, completion_tokens, parts,
                       completed_at, model_calls)
    VALUES (gen_random_uuid(), 'bench',
            'Quarterly review: revenue grew 12 percent, churn fell to 3 percent. The team shipped the new billing flow and plans a pricing change next quarter. Risks: two enterprise renewals are late and support load is rising.',
            now(), 'builtin', NULL, NULL, NULL, now(),
            '[{"at": "2026-12-03T06:17:49.857357504Z", "seq": 0, "model": "builtin", "delivery": 1, "provider": "builtin", "duration_ms": 0, "error_class": null, "prompt_tokens": null, "completion_tokens": null}]')
    ON CONFLICT (job_id) DO NOTHING RETURNING job_id;
INSERT INTO outbox (topic, dedupe_key, payload)
    VALUES ('email.summary_ready', 'summary_ready:' || gen_random_uuid(),
            '{"to": "bench@example.com", "job_id": "5b0f2af0-6d5e-5616-b33b-201a21f13f2f", "tenant": "bench", "summary": "Quarterly review: revenue grew 12 percent, churn fell to 3 percent. The team shipped the new billing flow and plans a pricing change next quarter. Risks: two enterprise renewals are late and support load is rising.", "accepted_at": "2026-12-03T06:17:49.853268Z"}')
    ON CONFLICT (dedupe_key) DO NOTHING;
COMMIT;
