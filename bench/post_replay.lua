-- wrk script: POST /v1/summaries with the SAME Idempotency-Key and body on every request.
-- The first request creates the job; every later one is answered from the stored result
-- (202, Idempotent-Replayed: true): this measures the replay path, one Redis round trip.
-- non2xx should be 0 (there is no in-progress state a concurrent first request could show).
--
--   wrk -t2 -c32 -d10s --latency -s bench/post_replay.lua http://127.0.0.1:8080 -- <nonce>

local key = "bench-replay-fixed-key-0001"
local headers = {
  ["Content-Type"] = "application/json",
  ["X-Tenant-Id"] = "bench",
}
local body = '{"text": "Quarterly review: revenue grew 12 percent, churn fell to 3 percent. '
  .. 'The team shipped the new billing flow and plans a pricing change next quarter. '
  .. 'Risks: two enterprise renewals are late and support load is rising.", '
  .. '"notify": "bench@example.com"}'

-- No request() function: wrk then builds this one request once per thread and resends the
-- same bytes, so the client spends no Lua time per request.
function init(args)
  -- Every thread gets the same nonce, so all of them replay one key.
  if args[1] ~= nil and args[1] ~= "" then
    key = "bench-replay-" .. args[1]
  end
  headers["Idempotency-Key"] = key
  -- A second argument, when not empty, is a bearer token (token mode), as in
  -- post_unique_keys.lua.
  if args[2] ~= nil and args[2] ~= "" then
    headers["X-Tenant-Id"] = nil
    headers["Authorization"] = "Bearer " .. args[2]
  end
  wrk.method = "POST"
  wrk.path = "/v1/summaries"
  wrk.body = body
  -- Add to wrk.headers rather than replace it: it already holds the Host header wrk set,
  -- and a request without Host is a 400, not a replay.
  for name, value in pairs(headers) do
    wrk.headers[name] = value
  end
end

function done(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d req_per_s=%.1f p50_ms=%.3f p99_ms=%.3f non2xx=%d socket_errors=%d\n",
    summary.requests, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout))
end
