-- Summaries retention removes a summary's text, never its row: the row is the job's
-- identity (the primary key that makes a resent request a duplicate instead of a second
-- model call and a second email, and what GET answers `done` from). `summary_expired_at`
-- says when retention removed the text; a row has its text or that time, never neither.
-- NOT VALID: every existing row satisfies the check (summary was NOT NULL and the column
-- is new), so validating would only scan the whole table under this migration's lock;
-- rows written from now on are checked all the same.
ALTER TABLE summaries
    ALTER COLUMN summary DROP NOT NULL,
    ADD COLUMN summary_expired_at timestamptz,
    ADD CONSTRAINT summaries_text_or_expired
        CHECK ((summary IS NULL) = (summary_expired_at IS NOT NULL)) NOT VALID;

-- Retention looks for the oldest rows that still have their text. Expired rows are the
-- oldest ones and stay for good, so an index over every row would make each batch step
-- over all of them first; this one holds only the rows retention can still act on.
CREATE INDEX summaries_text_completed_at ON summaries (completed_at)
    WHERE summary IS NOT NULL;
