#!/usr/bin/env bash
# Every benchmark of bench/README.md in one run, each figure next to its reference measured
# in the same run on the same machine; prints a table, writes it to bench/results/latest.md
# and draws bench/results/intake.png and bench/results/e2e.png.
#
#   bench/run.sh                                  # ~7 min after the build
#   BENCH_CONNECTIONS="32 64" BENCH_CONSUMERS="8 64" bench/run.sh   # a quick subset
#
# Settings (environment):
#   BENCH_DURATION_S         seconds per wrk run (default 10)
#   BENCH_CONNECTIONS        wrk connections to sweep (default "8 16 32 64 128")
#   BENCH_THREADS            wrk threads (default 2, one per core of the reference machine)
#   BENCH_REDIS_REQUESTS     requests per redis-benchmark reference run (default 150000)
#   BENCH_CONSUMERS          consumers C to sweep end to end (default "1 2 4 8 16 32 64 128 256";
#                            " " skips the end-to-end part and pgbench)
#   BENCH_LATENCY_MS         fake model latency L (default 200)
#   BENCH_JOBS_PER_CONSUMER  N = this × C jobs per point (default 25: ~5 s per point at 200 ms)
#   BENCH_PGBENCH_S          seconds per pgbench run (default 5)
#   BENCH_SUMMARYD_BIN       use this binary instead of building target/release/summaryd
#   BENCH_OUT                where results go (default bench/results)
#   BENCH_LIMITS             1: the intake runs in token mode with per-tenant limits enabled
#                            (rate_per_s, burst and max_in_flight set so high that nothing is
#                            refused): measures what enforcing them costs. Default 0.
#   BENCH_RETENTION_S        end to end with retention at work: sent outbox rows are deleted
#                            this many seconds after sending, maintenance runs every second
#                            (default 1; 0 = the service defaults, which delete nothing in a
#                            run this short)
#   BENCH_PG_SSLMODE         sslmode of the end-to-end runs' Postgres connections (default
#                            disable; require measures TLS to Postgres)
#   BENCH_MONITOR_C          C of the one extra, untimed end-to-end run watched with Redis
#                            MONITOR for the requests sent per job (default 8; 0 skips it)
#   BENCH_AB_BASE            a summaryd binary of another build: after the sweep, this build
#                            is compared with it by bench/ab_intake.sh (CPU per POST, req/s)
#                            and bench/ab_drain.sh (a backlog drained with an instant model,
#                            with 16 consumers and again with BENCH_AB_WIDE_CONSUMERS),
#                            their medians appended to the table and drawn in ab.png
#                            (default unset: no comparison)
#   BENCH_AB_WIDE_CONSUMERS  consumers of the second drain (default 64)
#   BENCH_AB_ROUNDS          rounds of each comparison (default 7)
#
# Everything runs on loopback. Redis is a private redis-server started here on a free port
# (same version and persistence settings as the shared one: none), so the service and
# redis-benchmark use the same Redis and nothing else loads it; it is stopped at the end.
# Postgres is the shared one; every database created here is dropped at the end.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

DURATION_S=${BENCH_DURATION_S:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-"8 16 32 64 128"}
THREADS=${BENCH_THREADS:-2}
REDIS_REQUESTS=${BENCH_REDIS_REQUESTS:-150000}
CONSUMERS=${BENCH_CONSUMERS-"1 2 4 8 16 32 64 128 256"}
LATENCY_MS=${BENCH_LATENCY_MS:-200}
JOBS_PER_CONSUMER=${BENCH_JOBS_PER_CONSUMER:-25}
PGBENCH_S=${BENCH_PGBENCH_S:-5}
OUT=${BENCH_OUT:-bench/results}
LIMITS=${BENCH_LIMITS:-0}
RETENTION_S=${BENCH_RETENTION_S:-1}
PG_SSLMODE=${BENCH_PG_SSLMODE:-disable}
MONITOR_C=${BENCH_MONITOR_C:-8}
PG_PORT=${SUMMARYD_DEPS_PG_PORT:-5432}
PG_BASE="postgres://postgres@127.0.0.1:$PG_PORT"
BENCH_DB=summaryd_bench
PGBENCH_DB=summaryd_bench_pgbench
# The service uses logical database 0 of the private Redis, redis-benchmark database 1, so
# each side can be emptied between runs without touching the other.
REF_DB=1
# Round trips one POST makes to Redis: one EVALSHA of src/stream/enqueue_once.lua, for a new
# key and for a replay alike (see src/api/idempotency.rs). The command mix measured below
# (INFO commandstats) shows it.
ROUND_TRIPS_PER_POST=1
# The worker commits on at most this many Postgres connections (the pool cap in
# src/infra/connections.rs), so pgbench's ceiling for C consumers is measured at min(C, this) clients.
PG_POOL_CAP=32

log() { printf 'bench: %s\n' "$*" >&2; }
die() {
    printf 'bench: ERROR: %s\n' "$*" >&2
    exit 1
}

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=bench/private_redis.sh
. bench/private_redis.sh
# shellcheck source=bench/enqueue_call.sh
. bench/enqueue_call.sh
# shellcheck source=bench/redis_counts.sh
. bench/redis_counts.sh
command -v wrk >/dev/null 2>&1 || _deps_apt_install wrk
command -v redis-benchmark >/dev/null 2>&1 || _deps_apt_install redis-tools
command -v pgbench >/dev/null 2>&1 || _deps_apt_install postgresql-client
command -v gnuplot >/dev/null 2>&1 || _deps_apt_install gnuplot-nox

if [[ -n "${BENCH_SUMMARYD_BIN:-}" ]]; then
    bin=$BENCH_SUMMARYD_BIN
else
    log "cargo build --release"
    cargo build --release --locked --bin summaryd
    bin=target/release/summaryd
fi
[[ -x "$bin" ]] || die "$bin is not an executable"
if [[ -n "${CONSUMERS// /}" ]]; then
    log "cargo bench --no-run (end-to-end benchmark binary)"
    cargo bench --locked --bench e2e_jobs --no-run >/dev/null 2>&1 ||
        die "could not build the e2e benchmark: cargo bench --bench e2e_jobs --no-run"
fi

nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
prefix="bench:${nonce}:"
workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-bench.XXXXXX")
pid=""
redis_pid=""
monitor_pid=""
mkdir -p "$OUT"

# GET http://127.0.0.1:$1$2 and print the status code; bash's /dev/tcp, so no curl needed.
# shellcheck disable=SC2016 # $0..$2 expand in the child bash, on purpose
http_status() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
        printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
        IFS=" " read -r _ code _ <&3 && printf "%s" "$code"' "$1" "$2" 2>/dev/null
}

# Stop the process $1 with SIGTERM, SIGKILL after $2 seconds.
stop_pid() {
    local p=$1 grace=$2
    [[ -n "$p" ]] || return 0
    if kill -0 "$p" 2>/dev/null; then
        kill -TERM "$p" 2>/dev/null || true
        local deadline=$((SECONDS + grace))
        while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 "$p" 2>/dev/null; then
            log "pid $p did not stop within $grace s; killing it"
            kill -KILL "$p" 2>/dev/null || true
        fi
    fi
    wait "$p" 2>/dev/null || true
}

psql_admin() { psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }

cleanup() {
    local rc=$?
    redis_monitor_stop
    # The service drains for SUMMARYD_SHUTDOWN_GRACE_MS (5 s below); 15 s in all.
    stop_pid "$pid" 15
    # Everything in it was written here; no save, no AOF: nothing is left on disk.
    stop_pid "$redis_pid" 10
    psql_admin -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" >/dev/null 2>&1 || true
    psql_admin -c "DROP DATABASE IF EXISTS $PGBENCH_DB WITH (FORCE)" >/dev/null 2>&1 || true
    if [[ $rc -eq 0 ]]; then
        rm -rf "$workdir"
    else
        log "logs kept in $workdir"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- private Redis ----------------------------------------------------------------------
start_private_redis 16400 "$workdir" --databases 2
log "redis-server on 127.0.0.1:$rport (private to this run)"
rcli() { redis-cli -h 127.0.0.1 -p "$rport" "$@"; }
lua_sha=$(rcli -n "$REF_DB" SCRIPT LOAD "$(cat src/stream/enqueue_once.lua)")
[[ ${#lua_sha} -eq 40 ]] || die "SCRIPT LOAD failed: $lua_sha"

# --- the POST's Redis work, alone: redis-benchmark of the very script one POST runs ------
# bench/enqueue_call.sh builds the call, arguments shaped like the wrk request's.
# With BENCH_LIMITS=1 the tenant has the job limits, set far above what one machine can
# send (1,000,000 jobs/s, a burst of as many, 10^9 in flight), so each check runs and none
# refuses. notify_per_hour stays off: every benchmark job notifies one address, and a
# per-recipient window that never refuses would have to hold millions of members.
tokens_file=""
token=""
if [[ "$LIMITS" == 1 ]]; then
    # A fixed time far in the future: the rate state never holds the next call back.
    enqueue_limit_args=(1 1000000 1000000000 4000000000000000 0 0)
    token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    tokens_file="$workdir/tokens.toml"
    cat >"$tokens_file" <<EOF_TOKENS
[tenants.bench]
token_sha256 = "$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)"
rate_per_s = 1000000.0
burst = 1000000
max_in_flight = 1000000000
EOF_TOKENS
fi
# $1 = clients, $2 = idempotency key, $3 = output file
redis_reference() {
    rcli -n "$REF_DB" FLUSHDB >/dev/null
    enqueue_call_args "$lua_sha" ref: "$2" 'ref:job:__rand_int__'
    timeout 300 redis-benchmark -h 127.0.0.1 -p "$rport" --dbnum "$REF_DB" --csv \
        -c "$1" -n "$REDIS_REQUESTS" -r 100000000000 "${enqueue_call[@]}" >"$3" 2>&1
    rcli -n "$REF_DB" FLUSHDB >/dev/null
}
ref_field() { redis_benchmark_field "$@"; }

# --- start the service (role api) ----------------------------------------------------------
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
start_service() { # $1 = roles, $2 = log file
    port=$(free_port 18080)
    url="http://127.0.0.1:$port"
    SUMMARYD_LISTEN="127.0.0.1:$port" \
        SUMMARYD_KEY_PREFIX="$prefix" \
        SUMMARYD_REDIS_URL="$redis_url" \
        SUMMARYD_DATABASE_URL="$PG_BASE/$BENCH_DB" \
        SUMMARYD_SHUTDOWN_GRACE_MS=5000 \
        SUMMARYD_LOG_FORMAT=json \
        SUMMARYD_MAIL_PROVIDER=log \
        env ${tokens_file:+SUMMARYD_AUTH_TOKENS_FILE="$tokens_file"} "$bin" serve --roles "$1" >"$2" 2>&1 &
    pid=$!
    # Migrations on a new database take a second or two; 60 s bounds a service that hangs.
    local deadline=$((SECONDS + 60))
    until [[ "$(http_status "$port" /readyz || true)" == "200" ]]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$2" >&2 || true
            pid=""
            die "summaryd exited before it became ready (log above)"
        fi
        ((SECONDS < deadline)) || die "summaryd not ready within 60 s; see $2"
        sleep 0.2
    done
}

# Idle memory of the whole service (every role, nothing to do), then the api role for load.
log "idle RSS: summaryd serve (all roles)"
start_service api,worker,relay "$workdir/summaryd-all.log"
sleep 3 # let the consumers and the relay make their first (empty) passes
rss_idle_all=$(rss_kib "$pid")
stop_pid "$pid" 15
pid=""
rcli FLUSHDB >/dev/null

log "starting summaryd serve --roles api (key prefix $prefix, database $BENCH_DB)"
start_service api "$workdir/summaryd.log"
sleep 1
rss_idle_api=$(rss_kib "$pid")
rss_load_max=0

# --- intake load ------------------------------------------------------------------------------
# wrk stops by itself after -d; `timeout` only guards against a wedged client. While it runs,
# the service's VmRSS is sampled every 0.2 s (bounded by wrk's own end).
run_wrk() { # $1 = script, $2 = duration s, $3 = nonce, $4 = output file, $5 = connections
    local sampler rss_file="$workdir/rss.$RANDOM"
    (
        max=0
        while kill -0 "$pid" 2>/dev/null; do
            r=$(rss_kib "$pid")
            ((r > max)) && max=$r && echo "$max" >"$rss_file"
            sleep 0.2
        done
    ) &
    sampler=$!
    timeout $(($2 + 60)) wrk -t"$THREADS" -c"$5" -d"$2s" --timeout 5s --latency \
        -s "$1" "$url" -- "$3" "$token" >"$4"
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    local r
    r=$(cat "$rss_file" 2>/dev/null || echo 0)
    ((r > rss_load_max)) && rss_load_max=$r
    rm -f "$rss_file"
}
field() { # $1 = wrk output file, $2 = key in the BENCH line
    sed -n 's/^BENCH //p' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

log "warm-up (2 s)"
run_wrk bench/post_unique_keys.lua 2 "warm${nonce}" "$workdir/warmup.txt" 32
for c in $CONNECTIONS; do
    log "connections $c: redis-benchmark of the POST script (new keys, then replay)"
    redis_reference "$c" 'ref:idem:__rand_int__' "$workdir/ref-unique-$c.csv"
    # The replay reference: one key that exists, so the script only reads it, as for a replay.
    # Same arguments as the new-key call; the first call stores the record, so every call
    # redis-benchmark makes only reads it. A failed store would make this a new-key run:
    # the reply is checked.
    enqueue_call_args "$lua_sha" ref: ref:idem:fixed ref:job:fixed
    replay_call=("${enqueue_call[@]}")
    [[ "$(rcli -n "$REF_DB" "${replay_call[@]}" | head -n 1)" == 1 ]] ||
        die "the replay reference could not store its record"
    timeout 300 redis-benchmark -h 127.0.0.1 -p "$rport" --dbnum "$REF_DB" --csv \
        -c "$c" -n "$REDIS_REQUESTS" "${replay_call[@]}" >"$workdir/ref-replay-$c.csv" 2>&1
    rcli -n "$REF_DB" FLUSHDB >/dev/null
    for f in unique replay; do
        [[ -n "$(ref_field "$workdir/ref-$f-$c.csv" rps)" ]] ||
            die "could not read redis-benchmark output: $(cat "$workdir/ref-$f-$c.csv")"
    done

    log "connections $c: wrk unique keys, ${DURATION_S} s"
    rcli CONFIG RESETSTAT >/dev/null
    run_wrk bench/post_unique_keys.lua "$DURATION_S" "$nonce-$c" "$workdir/unique-$c.txt" "$c"
    rcli INFO commandstats >"$workdir/commandstats-$c.txt"
    log "connections $c: wrk replayed key, ${DURATION_S} s"
    run_wrk bench/post_replay.lua "$DURATION_S" "$nonce-$c" "$workdir/replay-$c.txt" "$c"
    for f in unique replay; do
        [[ -n "$(field "$workdir/$f-$c.txt" req_per_s)" ]] ||
            die "no BENCH line from wrk ($f, $c connections): $(cat "$workdir/$f-$c.txt")"
    done
    # Nothing consumes the stream here; empty the service's database between runs so Redis
    # memory does not grow through the sweep (the private instance holds nothing else).
    rcli FLUSHDB >/dev/null
done
stop_pid "$pid" 15
pid=""

# Redis commands per POST at 32 connections (or the first count swept): the command mix.
mix_c=32
[[ -f "$workdir/commandstats-$mix_c.txt" ]] || mix_c=${CONNECTIONS%% *}
mix_requests=$(field "$workdir/unique-$mix_c.txt" requests)
command_mix=$(tr -d '\r' <"$workdir/commandstats-$mix_c.txt" | awk -F'[:=,]' -v n="$mix_requests" '
    /^cmdstat_/ && n > 0 {
        name = substr($1, 9)
        if (name == "config" || name == "info") next
        printf "%s%s=%.2f", sep, toupper(name), $3 / n; sep = " "
    }')

# --- Postgres commit ceiling: pgbench with the handler's transaction ----------------------
log "pgbench: the worker's commit transaction, database $PGBENCH_DB"
psql_admin -c "DROP DATABASE IF EXISTS $PGBENCH_DB WITH (FORCE)" >/dev/null
psql_admin -c "CREATE DATABASE $PGBENCH_DB" >/dev/null
while IFS= read -r migration; do
    psql -X -q -w -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$PGBENCH_DB" \
        -f "$migration" >/dev/null
done < <(find migrations -name 'V*__*.sql' | sort -V)
declare -A pg_tps=()
for c in $CONSUMERS; do
    clients=$((c < PG_POOL_CAP ? c : PG_POOL_CAP))
    [[ -n "${pg_tps[$clients]:-}" ]] && continue
    timeout $((PGBENCH_S + 60)) pgbench -n -M prepared -f bench/commit_txn.sql \
        -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$clients" -j $((clients < 2 ? 1 : 2)) \
        -T "$PGBENCH_S" "$PGBENCH_DB" >"$workdir/pgbench-$clients.txt" 2>&1 ||
        die "pgbench failed: $(tail -n 5 "$workdir/pgbench-$clients.txt")"
    pg_tps[$clients]=$(awk '/^tps = / { print $3; exit }' "$workdir/pgbench-$clients.txt")
    log "pgbench $clients clients: ${pg_tps[$clients]} tps"
done
psql_admin -c "DROP DATABASE IF EXISTS $PGBENCH_DB WITH (FORCE)" >/dev/null

# --- end to end: N jobs, model latency L, C consumers -----------------------------------------
# Nothing else uses the private Redis now, so what it ran between two snapshots around a
# point (bench/redis_counts.sh) is that point's: the enqueue (one MULTI … EXEC per job), the
# worker, the relay, and the benchmark's cleanup (one KEYS and one DEL per run).
e2e_jobs_for() {
    local jobs=$(($1 * JOBS_PER_CONSUMER))
    echo $((jobs < 20 ? 20 : jobs))
}
e2e_run() { # $1 = consumers, $2 = output file
    BENCH_JOBS=$(e2e_jobs_for "$1") BENCH_CONSUMERS=$1 BENCH_LATENCY_MS=$LATENCY_MS \
        BENCH_RETENTION_S=$RETENTION_S BENCH_PG_SSLMODE=$PG_SSLMODE \
        BENCH_PG_URL="$PG_BASE" BENCH_REDIS_URL="$redis_url" \
        timeout 400 cargo bench --locked --bench e2e_jobs >"$2" 2>&1 ||
        die "end-to-end run failed (C = $1): $(tail -n 5 "$2")"
    grep -q '^BENCH ' "$2" || die "no BENCH line (C = $1): $(tail -n 5 "$2")"
}
for c in $CONSUMERS; do
    log "end to end: $(e2e_jobs_for "$c") jobs, L = $LATENCY_MS ms, C = $c"
    redis_counts_snapshot "$rport" "$workdir/e2e-redis-before-$c.txt"
    e2e_run "$c" "$workdir/e2e-$c.txt"
    redis_counts_snapshot "$rport" "$workdir/e2e-redis-after-$c.txt"
    redis_counts_delta "$workdir/e2e-redis-before-$c.txt" "$workdir/e2e-redis-after-$c.txt" \
        >"$workdir/e2e-redis-delta-$c.txt"
done
e2e_field() { # $1 = consumers, $2 = key
    sed -n 's/^BENCH //p' "$workdir/e2e-$1.txt" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
# "cmds_per_job reads_per_job redis_cpu_ms_per_job top" of the point with C = $1.
e2e_redis() { redis_counts_summary "$workdir/e2e-redis-delta-$1.txt" "$(e2e_jobs_for "$1")" "${2:-6}"; }
# The requests sent per job: MONITOR slows Redis down, so it watches one more run at
# C = MONITOR_C whose time is not reported.
monitor_line=""
if [[ -n "${CONSUMERS// /}" ]] && ((MONITOR_C > 0)); then
    log "end to end under MONITOR (untimed): $(e2e_jobs_for "$MONITOR_C") jobs, C = $MONITOR_C"
    redis_monitor_start "$rport" "$workdir/e2e-monitor.txt"
    e2e_run "$MONITOR_C" "$workdir/e2e-monitor-run.txt"
    redis_monitor_stop
    read -r sent scripted top < <(redis_monitor_summary "$workdir/e2e-monitor.txt" "$(e2e_jobs_for "$MONITOR_C")" 8)
    monitor_line="Requests sent to Redis per job (MONITOR over one more, untimed run at C = $MONITOR_C, $(e2e_jobs_for "$MONITOR_C") jobs; a MULTI … EXEC block counts once, commands a script runs apart): **$sent** sent, $scripted run by scripts; most sent: ${top//,/ }."
fi

# --- report ---------------------------------------------------------------------------------
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }
report="$workdir/latest.md"
{
    echo "# summaryd benchmarks"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), redis $(rcli INFO server | tr -d '\r' | sed -n 's/^redis_version://p'), $(psql_admin -Atc 'SHOW server_version' | cut -d' ' -f1 | sed 's/^/postgres /'). wrk, summaryd, Redis and Postgres share the machine."
    echo
    echo "## POST /v1/summaries (wrk, ${THREADS} threads, ${DURATION_S} s per run)"
    echo
    echo "Ceiling = redis-benchmark ops/s of the very script one POST runs (src/stream/enqueue_once.lua, same arguments, same connections, same Redis) ÷ ${ROUND_TRIPS_PER_POST} round trip(s) per POST."
    echo
    echo "| connections | scenario | req/s | p50 ms | p99 ms | non-2xx | ceiling ops/s | ceiling p99 ms | ratio |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    for c in $CONNECTIONS; do
        for f in unique replay; do
            rps=$(field "$workdir/$f-$c.txt" req_per_s)
            ref=$(ref_field "$workdir/ref-$f-$c.csv" rps)
            ceiling=$(awk -v r="$ref" -v n="$ROUND_TRIPS_PER_POST" 'BEGIN { printf "%.0f", r / n }')
            name=$([[ $f == unique ]] && echo "new key" || echo "replay")
            printf '| %s | %s | %.0f | %s | %s | %s | %s | %s | **%s** |\n' "$c" "$name" "$rps" \
                "$(field "$workdir/$f-$c.txt" p50_ms)" "$(field "$workdir/$f-$c.txt" p99_ms)" \
                "$(field "$workdir/$f-$c.txt" non2xx)" "$ceiling" "$(ref_field "$workdir/ref-$f-$c.csv" p99)" \
                "$(ratio "$rps" "$ceiling")"
        done
    done
    echo
    echo "Redis commands per new-key POST ($mix_c connections, INFO commandstats ÷ requests; commands a script runs count too): $command_mix"
    echo
    echo "## End to end (fake model L = ${LATENCY_MS} ms, worker + relay in one process, N = ${JOBS_PER_CONSUMER}·C jobs)"
    echo
    echo "Commit ceiling = pgbench tps of the worker's transaction (bench/commit_txn.sql) at min(C, ${PG_POOL_CAP}) clients, same Postgres."
    if ((RETENTION_S > 0)); then
        echo "Retention on: sent outbox rows are deleted ${RETENTION_S} s after sending, maintenance every 1 s (the \"deleted\" column counts the rows it removed during the run)."
    fi
    echo "Postgres connections: sslmode=${PG_SSLMODE}. CPU ms/job = the process's user + system CPU (worker, relay, maintenance and the enqueueing loop) ÷ jobs; at small C the polling of idle consumers and relays dominates it."
    echo
    echo "Redis per job, between snapshots around each point (INFO commandstats, commands a script runs included; read events = requests as they reached Redis, a pipeline or a multiplexed batch once): cmds, reads, Redis CPU."
    echo
    echo "| C | jobs | jobs/s | ideal C/L | ratio to C/L | commit ceiling tps | ratio to min(C/L, ceiling) | peak RSS MiB | CPU ms/job | deleted | Redis cmds/job | Redis reads/job | Redis CPU ms/job |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for c in $CONSUMERS; do
        clients=$((c < PG_POOL_CAP ? c : PG_POOL_CAP))
        rate=$(e2e_field "$c" jobs_per_s)
        ideal=$(e2e_field "$c" ideal)
        ceiling=${pg_tps[$clients]}
        bound=$(awk -v a="$ideal" -v b="$ceiling" 'BEGIN { print (a < b) ? a : b }')
        read -r cmds reads redis_cpu _ < <(e2e_redis "$c")
        printf '| %s | %s | %s | %s | **%s** | %.0f | %s | %s | %s | %s | %s | %s | %s |\n' "$c" "$(e2e_field "$c" jobs)" "$rate" \
            "$ideal" "$(ratio "$rate" "$ideal")" "$ceiling" "$(ratio "$rate" "$bound")" \
            "$(mib "$(e2e_field "$c" peak_rss_kib)")" "$(e2e_field "$c" cpu_ms_per_job)" \
            "$(e2e_field "$c" retention_deleted)" "$cmds" "$reads" "$redis_cpu"
    done
    if [[ -n "${CONSUMERS// /}" ]]; then
        mix_e2e=$(awk '{ print $NF }' <<<"$CONSUMERS")
        echo
        echo "Redis commands per job at C = $mix_e2e (commandstats ÷ jobs, script-run ones included): $(e2e_redis "$mix_e2e" 10 | cut -d' ' -f4 | tr ',' ' ')"
    fi
    if [[ -n "$monitor_line" ]]; then
        echo
        echo "$monitor_line"
    fi
    echo
    echo "## Memory (VmRSS from /proc)"
    echo
    echo "| process | idle MiB | under load MiB |"
    echo "|---|---:|---:|"
    echo "| summaryd serve (all roles) | $(mib "$rss_idle_all") | see peak RSS per C above (same roles, in process) |"
    echo "| summaryd serve --roles api | $(mib "$rss_idle_api") | $(mib "$rss_load_max") (max sampled over the whole intake sweep) |"
} >"$report"

# --- charts ---------------------------------------------------------------------------------
{
    echo "# connections new_rps new_p99 replay_rps replay_p99 ceiling_new ceiling_replay"
    for c in $CONNECTIONS; do
        echo "$c $(field "$workdir/unique-$c.txt" req_per_s) $(field "$workdir/unique-$c.txt" p99_ms)" \
            "$(field "$workdir/replay-$c.txt" req_per_s) $(field "$workdir/replay-$c.txt" p99_ms)" \
            "$(ref_field "$workdir/ref-unique-$c.csv" rps) $(ref_field "$workdir/ref-replay-$c.csv" rps)"
    done
} >"$workdir/intake.dat"
{
    echo "# consumers jobs_per_s ideal commit_ceiling"
    for c in $CONSUMERS; do
        clients=$((c < PG_POOL_CAP ? c : PG_POOL_CAP))
        echo "$c $(e2e_field "$c" jobs_per_s) $(e2e_field "$c" ideal) ${pg_tps[$clients]}"
    done
} >"$workdir/e2e.dat"
gnuplot <<EOF || die "gnuplot failed"
set terminal pngcairo size 1100,420 font "sans,10"
set datafile commentschars "#"
set output "$OUT/intake.png"
set multiplot layout 1,2 title "POST /v1/summaries: summaryd vs the same-run Redis ceiling (${THREADS}-thread wrk, ${DURATION_S} s per point)"
set logscale x 2
set xlabel "connections"
set key top left
set grid
set ylabel "req/s"
set yrange [0:*]
plot "$workdir/intake.dat" using 1:2 with linespoints lw 2 title "new key", \
     "$workdir/intake.dat" using 1:4 with linespoints lw 2 title "replay", \
     "$workdir/intake.dat" using 1:(\$6/$ROUND_TRIPS_PER_POST) with lines dt 2 title "ceiling, new key", \
     "$workdir/intake.dat" using 1:(\$7/$ROUND_TRIPS_PER_POST) with lines dt 3 title "ceiling, replay"
set ylabel "p99 latency (ms)"
plot "$workdir/intake.dat" using 1:3 with linespoints lw 2 title "new key p99", \
     "$workdir/intake.dat" using 1:5 with linespoints lw 2 title "replay p99", \
     5 with lines dt 2 title "target 5 ms"
unset multiplot
EOF
if [[ -n "${CONSUMERS// /}" ]]; then
    gnuplot <<EOF || die "gnuplot failed"
set terminal pngcairo size 1100,420 font "sans,10"
set datafile commentschars "#"
set grid
set key top left
set key bottom right
set output "$OUT/e2e.png"
set title "End to end: jobs/s vs consumers C (model latency ${LATENCY_MS} ms)"
set logscale xy 2
set xlabel "consumers C"
set ylabel "jobs/s"
set yrange [*:*]
plot "$workdir/e2e.dat" using 1:2 with linespoints lw 2 title "measured", \
     "$workdir/e2e.dat" using 1:3 with lines dt 2 title "ideal C/L", \
     "$workdir/e2e.dat" using 1:4 with linespoints dt 3 title "Postgres commit ceiling (pgbench)"
EOF
fi

if [[ -n "${BENCH_AB_BASE:-}" ]]; then
    ab_rounds=${BENCH_AB_ROUNDS:-7}
    log "against $BENCH_AB_BASE: bench/ab_intake.sh and bench/ab_drain.sh, $ab_rounds rounds each"
    AB_ROUNDS=$ab_rounds bench/ab_intake.sh "$BENCH_AB_BASE" "$bin" >"$workdir/ab_intake.txt" ||
        die "bench/ab_intake.sh failed"
    AB_ROUNDS=$ab_rounds bench/ab_drain.sh "$BENCH_AB_BASE" "$bin" >"$workdir/ab_drain.txt" ||
        die "bench/ab_drain.sh failed"
    # The pipeline's own ceiling: as many consumers as keep the machine busy (16 leave
    # part of it waiting on round trips), against pgbench at the pool's 32 connections.
    drain_wide=${BENCH_AB_WIDE_CONSUMERS:-64}
    AB_ROUNDS=$ab_rounds AB_CONSUMERS=$drain_wide AB_MONITOR_JOBS=0 \
        bench/ab_drain.sh "$BENCH_AB_BASE" "$bin" >"$workdir/ab_drain_wide.txt" ||
        die "bench/ab_drain.sh ($drain_wide consumers) failed"
    cpu_ratio=$(sed -n 's/^candidate  *median [0-9.]* us, ratio \([0-9.]*\).*/\1/p' "$workdir/ab_intake.txt")
    rps_ratio=$(sed -n '/^connections/,/^CPU/s/^candidate  *median \([0-9.]*\) .*/\1/p' "$workdir/ab_intake.txt")
    read -r drain_rate drain_cpu drain_core < <(sed -n \
        's/^new\/base, median of the rounds. ratios: jobs\/s \([0-9.]*\), worker CPU ms\/job \([0-9.]*\), jobs\/s per core \([0-9.]*\).*/\1 \2 \3/p' \
        "$workdir/ab_drain.txt")
    ceilings() { awk '$1 == "base" && b == "" { b = $6 } $1 == "new" && n == "" { n = $6 } END { print b, n }' "$1"; }
    read -r ceiling_base ceiling_new < <(ceilings "$workdir/ab_drain.txt")
    read -r wide_base wide_new < <(ceilings "$workdir/ab_drain_wide.txt")
    wide_rate=$(sed -n 's/^new\/base, median of the rounds. ratios: jobs\/s \([0-9.]*\),.*/\1/p' "$workdir/ab_drain_wide.txt")
    {
        echo
        echo "## This build against $(basename "$BENCH_AB_BASE") ($ab_rounds rounds each, alternating, ratios new/base)"
        echo
        echo "| figure | ratio |"
        echo "|---|---:|"
        echo "| CPU µs per POST, new key, 32 connections (\`bench/ab_intake.sh\`) | **$cpu_ratio** |"
        echo "| POST req/s, new key, 32 connections | $rps_ratio |"
        echo "| drain jobs/s, instant model, 16 consumers (\`bench/ab_drain.sh\`) | **$drain_rate** |"
        echo "| drain worker CPU ms per job | $drain_cpu |"
        echo "| drain jobs/s per core of the worker | **$drain_core** |"
        echo "| drain jobs/s ÷ the same run's pgbench commit ceiling: base, new | $ceiling_base, **$ceiling_new** |"
        echo "| drain jobs/s, $drain_wide consumers | $wide_rate |"
        echo "| drain jobs/s, $drain_wide consumers, ÷ pgbench at 32 clients: base, new | $wide_base, **$wide_new** |"
        echo
        echo "POST (\`bench/ab_intake.sh\`):"
        echo
        echo '```'
        sed -n '/^connections/,$p' "$workdir/ab_intake.txt"
        echo '```'
        echo
        echo "Drain (\`bench/ab_drain.sh\`):"
        echo
        echo '```'
        sed -n '/^medians/,$p' "$workdir/ab_drain.txt"
        echo '```'
        echo
        echo "Drain with $drain_wide consumers (\`AB_CONSUMERS=$drain_wide bench/ab_drain.sh\`):"
        echo
        echo '```'
        sed -n '/^medians/,/^new\/base/p' "$workdir/ab_drain_wide.txt"
        echo '```'
    } >>"$report"
    printf '"%s" %s\n' "CPU per POST" "$cpu_ratio" "drain jobs/s" "$drain_rate" "drain per core" "$drain_core" >"$workdir/ab.dat"
    gnuplot <<EOF || die "gnuplot failed"
set terminal pngcairo size 760,380 font "sans,10"
set output "$OUT/ab.png"
set title "This build against $(basename "$BENCH_AB_BASE" | cut -c1-20): ratios new/base (1 = no change)"
set style data histograms
set style fill solid 0.6
set boxwidth 0.6
set yrange [0:*]
set grid ytics
unset key
plot "$workdir/ab.dat" using 2:xtic(1), 1 with lines dt 2
EOF
fi

cp "$report" "$OUT/latest.md"
cat "$report"
printf '\nbench: table in %s, charts %s/intake.png and %s/e2e.png\n' "$OUT/latest.md" "$OUT" "$OUT" >&2
