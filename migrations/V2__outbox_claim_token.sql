-- Fencing token for the relay's lease. Every claim writes a fresh token, and a relay may
-- only record a failure for a row while the row still carries the token it claimed it with.
-- Without it, a relay whose lease ran out mid-send (slow provider, long GC pause) could
-- reset `claimed_until` or set `failed_at` on a row another relay has claimed since, letting
-- a third relay send it again or parking a row that is being delivered right now.
ALTER TABLE outbox ADD COLUMN claim_token uuid;
