-- Accept a job exactly once per idempotency key, in one atomic step (one round trip).
--
-- KEYS[1] idempotency record   KEYS[2] job stream   KEYS[3] job state hash
-- ARGV[1] final record (JSON)  ARGV[2] record TTL s ARGV[3] tenant
-- ARGV[4] created_at           ARGV[5] queued status ARGV[6..] stream entry field/value pairs
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
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 6))
redis.call('HSET', KEYS[3], 'tenant', ARGV[3], 'status', ARGV[5], 'created_at', ARGV[4])
redis.call('HDEL', KEYS[3], 'error')
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return {1, id}
