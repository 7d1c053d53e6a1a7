-- The maintenance task counts unsent rows every few seconds (the summaryd_outbox_unsent
-- gauge): this index holds only the unsent rows, so the count reads them and not the
-- whole table, which keeps a week of sent rows.
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
-- Retention deletes sent rows and summaries oldest first, in small batches; without these
-- every batch would scan the table.
CREATE INDEX outbox_sent_at ON outbox (sent_at) WHERE sent_at IS NOT NULL;
CREATE INDEX summaries_completed_at ON summaries (completed_at);
