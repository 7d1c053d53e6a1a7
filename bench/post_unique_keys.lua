-- wrk script: POST /v1/summaries where EVERY request carries its own Idempotency-Key,
-- so each one takes the full "new job" path (lock, enqueue, store result).
--
--   wrk -t2 -c32 -d10s --latency -s bench/post_unique_keys.lua http://127.0.0.1:8080 -- <nonce>
--
-- <nonce> (optional) makes keys unique across runs; bench/run.sh passes a random one.
-- A second argument, when not empty, is a bearer token: the request then authenticates
-- with it (token mode) instead of naming its tenant in X-Tenant-Id.
-- Keys look like bench-<nonce>-<thread>-<counter>: visible ASCII, 16-128 chars.

local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local prefix
local counter = 0
local headers = {
  ["Content-Type"] = "application/json",
  ["X-Tenant-Id"] = "bench",
}
local body = '{"text": "Quarterly review: revenue grew 12 percent, churn fell to 3 percent. '
  .. 'The team shipped the new billing flow and plans a pricing change next quarter. '
  .. 'Risks: two enterprise renewals are late and support load is rising.", '
  .. '"notify": "bench@example.com"}'

function init(args)
  local nonce = args[1]
  if nonce == nil or nonce == "" then
    -- No nonce given: time plus a per-thread random number keeps reruns apart.
    math.randomseed(os.time() * 1000 + thread_id)
    nonce = string.format("%d%08x", os.time(), math.random(0, 0x7fffffff))
  end
  prefix = string.format("bench-%s-%d-", nonce, thread_id)
  if args[2] ~= nil and args[2] ~= "" then
    headers["X-Tenant-Id"] = nil
    headers["Authorization"] = "Bearer " .. args[2]
  end
end

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = prefix .. counter
  return wrk.format("POST", "/v1/summaries", headers, body)
end

-- One machine-readable line for bench/run.sh, after wrk's own report.
function done(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d req_per_s=%.1f p50_ms=%.3f p99_ms=%.3f non2xx=%d socket_errors=%d\n",
    summary.requests, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout))
end
