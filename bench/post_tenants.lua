-- wrk script: POST /v1/summaries in token mode for many tenants, every request with its own
-- Idempotency-Key (the new-job path), the tenants taken in turn so a sharded layout sees
-- every shard. bench/scaling.sh runs one wrk per api process with it.
--
--   BENCH_HIST_FILE=hist.txt wrk -t1 -c16 -d10s -s bench/post_tenants.lua URL -- NONCE TOKEN...
--
-- NONCE makes keys unique across runs; every further argument is a bearer token (one per
-- tenant). With BENCH_HIST_FILE set, done() also writes the latency histogram (one
-- "microseconds count" line per non-empty bucket), so the runs against several processes can
-- be merged into one exact p50/p99 (percentiles of separate runs cannot be averaged).

local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local prefix
local counter = 0
local tokens = {}
local headers = { ["Content-Type"] = "application/json" }
local body = '{"text": "Quarterly review: revenue grew 12 percent, churn fell to 3 percent. '
  .. 'The team shipped the new billing flow and plans a pricing change next quarter. '
  .. 'Risks: two enterprise renewals are late and support load is rising.", '
  .. '"notify": "bench@example.com"}'

function init(args)
  prefix = string.format("scale-%s-%d-", args[1] or "x", thread_id)
  for i = 2, #args do
    tokens[#tokens + 1] = "Bearer " .. args[i]
  end
  if #tokens == 0 then
    error("post_tenants.lua needs at least one bearer token after the nonce")
  end
end

function request()
  counter = counter + 1
  -- Start each thread at another tenant, so short runs still spread over all of them.
  headers["Authorization"] = tokens[((counter + thread_id) % #tokens) + 1]
  headers["Idempotency-Key"] = prefix .. counter
  return wrk.format("POST", "/v1/summaries", headers, body)
end

function done(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d req_per_s=%.1f p50_ms=%.3f p99_ms=%.3f non2xx=%d socket_errors=%d\n",
    summary.requests, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout))
  local path = os.getenv("BENCH_HIST_FILE")
  if path ~= nil and path ~= "" then
    local f = assert(io.open(path, "w"))
    -- #latency is the number of distinct latencies seen; latency(i) gives the i-th of them
    -- (microseconds) and how many requests took it.
    for i = 1, #latency do
      local us, n = latency(i)
      f:write(string.format("%d %d\n", us, n))
    end
    f:close()
  end
end
