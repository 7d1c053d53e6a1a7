-- The trace context (W3C traceparent and tracestate) of the step that wrote the row: the
-- commit of the job's summary, or the dead-lettering of its job. The relay's send joins
-- that trace, so one trace runs from the POST to the email or webhook. NULL: the row was
-- written with trace export off, or by an older version.
ALTER TABLE outbox ADD COLUMN traceparent text;
ALTER TABLE outbox ADD COLUMN tracestate text;
