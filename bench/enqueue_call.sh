# shellcheck shell=bash
# The EVALSHA call one POST makes (src/stream/enqueue_once.lua), with arguments of the same
# size as a benchmark request's, for redis-benchmark to run as the Redis-only ceiling of the
# intake. Sourced by bench/run.sh and bench/scaling.sh; a change to the script's keys or
# arguments is made here once.

# The same text and record as bench/post_unique_keys.lua's and bench/post_tenants.lua's
# requests, so Redis does the same work per call as for a POST.
_enqueue_text='Quarterly review: revenue grew 12 percent, churn fell to 3 percent. The team shipped the new billing flow and plans a pricing change next quarter. Risks: two enterprise renewals are late and support load is rising.'
_enqueue_job='00000000-0000-5000-8000-000000000000'
_enqueue_stamp='2025-01-01T00:00:00.000000Z'
_enqueue_record="{\"state\":\"done\",\"fp\":\"$(printf %064d 0)\",\"status\":202,\"body\":{\"job_id\":\"$_enqueue_job\",\"status\":\"queued\"}}"
_enqueue_payload="{\"notify\":\"bench@example.com\",\"text\":\"$_enqueue_text\"}"
# The job-state writes the script receives, as src/stream/job_state.rs passes them: the
# count of field/value arguments, the pairs to HSET, then the field to HDEL.
_enqueue_state_args=(6 tenant bench status queued created_at "$_enqueue_stamp" error)
# The budget's arguments, last (src/stream/budget.rs): no budget, so no reservation, as for
# a tenant without one.
_enqueue_budget_args=(0 0 0 0 budget_period '' budget_reserved)
# The tenant limits the script receives (src/stream/tenant_limits.rs): emission interval in
# µs, burst, max in flight, the time in µs, emails per recipient per hour and the time in
# ms; 0 = no limit, as for a tenant without limits. A caller measuring limits sets this
# array before calling enqueue_call_args.
enqueue_limit_args=(0 1 0 0 0 0)

# enqueue_call_args SHA PREFIX IDEM_KEY JOB_KEY: sets the array `enqueue_call` to the whole
# command (EVALSHA ... ) with the per-tenant keys under PREFIX. In a Redis Cluster every key
# must hash to one slot: give PREFIX, IDEM_KEY and JOB_KEY the same hash tag.
enqueue_call_args() {
    local sha=$1 p=$2 idem=$3 job_key=$4
    # shellcheck disable=SC2034 # read by the caller
    enqueue_call=(EVALSHA "$sha" 11 "$idem" "${p}lane" "$job_key" "${p}in_flight" "${p}rate"
        "${p}notify" "${p}budget" "${p}lanes" "${p}lanes:clock" "${p}doorbell" "${p}lanes:policy"
        "$_enqueue_record" 86400 "$_enqueue_job" "${enqueue_limit_args[@]}" "${_enqueue_state_args[@]}"
        job_id "$_enqueue_job" tenant bench payload "$_enqueue_payload" created_at "$_enqueue_stamp"
        1 0 bench "${_enqueue_budget_args[@]}")
}

# The columns of `redis-benchmark --csv`: "test","rps","avg_latency_ms","min_latency_ms",
# "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms". The test name is the
# command line, JSON commas included: count the columns from the end.
redis_benchmark_field() { # $1 = file, $2 = rps|p50|p99
    awk -F, -v want="$2" 'NR == 2 {
        col = (want == "rps") ? NF - 6 : (want == "p50") ? NF - 3 : NF - 1
        gsub(/"/, "", $col); print $col; exit }' "$1"
}
