-- Accept a job exactly once per idempotency key, within the tenant's limits, in one atomic
-- step (one round trip).
--
-- KEYS[1] idempotency record   KEYS[2] job stream   KEYS[3] job state hash
-- KEYS[4] the tenant's in-flight set   KEYS[5] the tenant's rate state (GCRA)
-- ARGV[1] final record (JSON)  ARGV[2] record TTL in seconds   ARGV[3] job id
-- ARGV[4] emission interval in µs (0: no rate limit)   ARGV[5] burst
-- ARGV[6] max in flight (0: none)   ARGV[7] now, µs since the epoch (the API's clock; 0
--         without a rate limit)   (src/stream/tenant_limits.rs)
-- ARGV[8] n, then ARGV[9 .. 8+n] job-state fields and values to set, ARGV[9+n] the
--         job-state field to clear (names and values come from src/stream/job_state.rs)
-- ARGV[10+n ..] the stream entry's fields and values (src/stream/job_entry.rs)
--
-- Replies {0, record, 0} (the key had one), {1, entry id, 0} (enqueued) or {2, limit, retry ms}
-- (refused by 'rate' or 'in_flight'; nothing written).
--
-- A key that already has a record is answered from it before any limit: a replay is never
-- charged or refused. Otherwise the limits are checked, then the job goes on the stream with
-- its state, and the final response is stored, before any other command runs: there is no
-- in-progress moment another request could observe. The only failing command (XADD on a key
-- of the wrong type) comes before every write, so a failed run stores and enqueues nothing.
local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing, 0}
end
local interval = tonumber(ARGV[4])
local now, tat
if interval > 0 then
  now = tonumber(ARGV[7])
  tat = math.max(tonumber(redis.call('GET', KEYS[5]) or 0), now) + interval
  local allowed_at = tat - interval * tonumber(ARGV[5])
  if allowed_at > now then
    return {2, 'rate', math.ceil((allowed_at - now) / 1000)}
  end
end
local max_in_flight = tonumber(ARGV[6])
if max_in_flight > 0 and redis.call('SCARD', KEYS[4]) >= max_in_flight then
  return {2, 'in_flight', 0}
end
local n = tonumber(ARGV[8])
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 10 + n))
redis.call('HSET', KEYS[3], unpack(ARGV, 9, 8 + n))
redis.call('HDEL', KEYS[3], ARGV[9 + n])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
-- Only a tenant with a max_in_flight needs its jobs counted; one command less per POST for
-- every other tenant. (A limit added later by a reload counts the jobs accepted after it.)
if max_in_flight > 0 then
  redis.call('SADD', KEYS[4], ARGV[3])
end
if tat then
  redis.call('SET', KEYS[5], string.format('%.0f', tat), 'PX', math.max(1, math.ceil((tat - now) / 1000)))
end
return {1, id, 0}
