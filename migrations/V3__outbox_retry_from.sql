-- Start of a row's give-up horizon. A row that keeps failing transiently is retried until
-- SUMMARYD_RELAY_GIVE_UP_S has passed since this moment, then it needs a person. NULL means
-- "since the row was created"; `summaryd outbox retry` sets it to now, restarting the horizon.
ALTER TABLE outbox ADD COLUMN retry_from timestamptz;
