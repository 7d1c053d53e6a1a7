-- Accept a job exactly once per idempotency key, in one atomic step (one round trip).
--
-- KEYS[1] idempotency record   KEYS[2] job stream   KEYS[3] job state hash
-- ARGV[1] final record (JSON)  ARGV[2] record TTL in seconds
-- ARGV[3] n, then ARGV[4 .. 3+n] job-state fields and values to set, ARGV[4+n] the
--         job-state field to clear (names and values come from src/stream/job_state.rs)
-- ARGV[5+n ..] the stream entry's fields and values (src/stream/job_entry.rs)
--
-- A key that already has a record is answered from it and nothing is written. Otherwise the
-- job goes on the stream with its state, and the final response is stored, before any other
-- command runs: there is no in-progress moment another request could observe. The only
-- failing command (XADD on a key of the wrong type) comes before every write, so a failed
-- run stores and enqueues nothing.
local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing}
end
local n = tonumber(ARGV[3])
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 5 + n))
redis.call('HSET', KEYS[3], unpack(ARGV, 4, 3 + n))
redis.call('HDEL', KEYS[3], ARGV[4 + n])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return {1, id}
