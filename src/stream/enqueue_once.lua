-- Accept a job exactly once per idempotency key, within the tenant's limits, in one atomic
-- step (one round trip).
--
-- KEYS[1] idempotency record   KEYS[2] the tenant's lane   KEYS[3] job state hash
-- KEYS[4] the tenant's in-flight set   KEYS[5] the tenant's rate state (GCRA)
-- KEYS[6] the emails this tenant sent the job's recipient in the last hour (sorted set)
-- ARGV[1] final record (JSON)  ARGV[2] record TTL in seconds   ARGV[3] job id
-- ARGV[4] emission interval in µs (0: no rate limit)   ARGV[5] burst
-- ARGV[6] max in flight (0: none)   ARGV[7] now, µs since the epoch (the API's clock; 0
--         without a rate limit)   ARGV[8] emails per recipient per hour (0: none)
-- ARGV[9] now, ms since the epoch (0 without that limit)   (src/stream/tenant_limits.rs)
-- ARGV[10] n, then ARGV[11 .. 10+n] job-state fields and values to set, ARGV[11+n] the
--         job-state field to clear (names and values come from src/stream/job_state.rs)
-- KEYS[7] the tenant's budget hash for the period (src/stream/budget.rs)
-- KEYS[8] active lanes (sorted set)   KEYS[9] the scheduler's virtual time
-- KEYS[10] the doorbell list   KEYS[11] the lanes' policies (hash)   (src/stream/lanes.rs)
-- ARGV[12+n .. #ARGV-10] the stream entry's fields and values (src/stream/job_entry.rs)
-- ARGV[#ARGV-9] the tenant's weight   ARGV[#ARGV-8] its max_concurrent (0: none)
-- ARGV[#ARGV-7] the tenant   (src/stream/lanes.rs)
-- ARGV[#ARGV-6 .. #ARGV] the job's worst-case tokens (0: no budget), the budget, ms until
--         the period resets, the hash's TTL in ms, the job-state field of the period, the
--         period id, the job-state field of the tokens (src/stream/budget.rs, last)
--
-- Replies {0, record, 0} (the key had one), {1, entry id, 0} (enqueued) or {2, limit, retry ms}
-- (refused by 'rate', 'in_flight', 'notify' or 'budget'; nothing written).
--
-- A key that already has a record is answered from it before any limit: a replay is never
-- charged or refused. Otherwise the limits are checked, then the job goes in its tenant's
-- lane (the workers' dispatch moves it onto the job stream, stream/lanes.rs) with
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
-- The recipient's window: accepted jobs of the last hour, counted without writing, so a
-- refusal writes nothing. When it is full, the request fits once enough of them age out
-- (more than one when a reload lowered the limit).
local per_hour = tonumber(ARGV[8])
local window_start
if per_hour > 0 then
  window_start = tonumber(ARGV[9]) - 3600000
  local sent = redis.call('ZCOUNT', KEYS[6], '(' .. window_start, '+inf')
  if sent >= per_hour then
    local oldest = redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. window_start, '+inf',
      'WITHSCORES', 'LIMIT', sent - per_hour, 1)
    return {2, 'notify', math.max(1, tonumber(oldest[2]) - window_start)}
  end
end
-- The budget: the job's worst case must fit beside what is reserved and used in the
-- period, and is reserved in this same step, so no two requests can both take the last of it.
local b = #ARGV - 7
local cost = tonumber(ARGV[b + 1])
if cost > 0 then
  local taken = redis.call('HMGET', KEYS[7], 'reserved', 'used')
  if (tonumber(taken[1]) or 0) + (tonumber(taken[2]) or 0) + cost > tonumber(ARGV[b + 2]) then
    return {2, 'budget', tonumber(ARGV[b + 3])}
  end
end
local n = tonumber(ARGV[10])
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 12 + n, b - 3))
redis.call('HSET', KEYS[3], unpack(ARGV, 11, 10 + n))
redis.call('HDEL', KEYS[3], ARGV[11 + n])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
-- Only a tenant with a max_in_flight needs its jobs counted; one command less per POST for
-- every other tenant. (A limit added later by a reload counts the jobs accepted after it.)
if max_in_flight > 0 then
  redis.call('SADD', KEYS[4], ARGV[3])
end
if window_start then
  redis.call('ZADD', KEYS[6], ARGV[9], ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', window_start)
  redis.call('PEXPIRE', KEYS[6], 3600000)
end
if tat then
  redis.call('SET', KEYS[5], string.format('%.0f', tat), 'PX', math.max(1, math.ceil((tat - now) / 1000)))
end
if cost > 0 then
  -- Reserved back at exactly the cost: the hash is new (or held no reservation, and then
  -- the TTL it was made with is renewed to the same horizon), so it is given its TTL here
  -- and not on every acceptance. Nothing else creates the hash (a settle never does).
  if redis.call('HINCRBY', KEYS[7], 'reserved', ARGV[b + 1]) == cost then
    redis.call('PEXPIRE', KEYS[7], ARGV[b + 4])
  end
  redis.call('HSET', KEYS[3], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 1])
end
-- The lane joins the schedule at the current virtual time (NX: a lane already waiting keeps
-- its place); its policy is what this tenant's jobs are dispatched under; one token wakes
-- one idle consumer.
local tenant = ARGV[b]
redis.call('ZADD', KEYS[8], 'NX', redis.call('GET', KEYS[9]) or 0, tenant)
if ARGV[b - 2] == '1' and ARGV[b - 1] == '0' then
  redis.call('HDEL', KEYS[11], tenant)
else
  redis.call('HSET', KEYS[11], tenant, ARGV[b - 2] .. ' ' .. ARGV[b - 1])
end
-- Trimmed only when past its cap: a token per job, as many as a burst can wake.
if redis.call('RPUSH', KEYS[10], 1) > 64 then
  redis.call('LTRIM', KEYS[10], -64, -1)
end
return {1, id, 0}
