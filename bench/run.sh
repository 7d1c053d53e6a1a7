#!/usr/bin/env bash
# HTTP intake benchmark: wrk against `summaryd serve --roles api`, next to a same-run
# redis-benchmark of the same Redis as the ceiling. See bench/README.md for how to read it.
#
#   bench/run.sh
#   BENCH_DURATION_S=30 BENCH_CONNECTIONS=64 bench/run.sh
#
# Settings (environment):
#   BENCH_DURATION_S     seconds per wrk run (default 10)
#   BENCH_CONNECTIONS    wrk connections and redis-benchmark clients (default 32)
#   BENCH_THREADS        wrk threads (default 2, one per core of the reference machine)
#   BENCH_SUMMARYD_BIN   use this binary instead of building target/release/summaryd
#
# Everything runs on loopback. The service gets its own database (summaryd_bench) and its
# own random Redis key prefix; both are removed at the end, as is redis-benchmark's key.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

DURATION_S=${BENCH_DURATION_S:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
THREADS=${BENCH_THREADS:-2}
PG_PORT=${SUMMARYD_DEPS_PG_PORT:-5432}
REDIS_PORT=${SUMMARYD_DEPS_REDIS_PORT:-6379}
BENCH_DB=summaryd_bench
# redis-benchmark writes the literal key "key:__rand_int__"; a logical database of its own
# keeps it away from anything in database 0 (same server, same speed).
REDIS_BENCH_DB=9

log() { printf 'bench: %s\n' "$*" >&2; }
die() {
    printf 'bench: ERROR: %s\n' "$*" >&2
    exit 1
}

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
command -v wrk >/dev/null 2>&1 || _deps_apt_install wrk
command -v redis-benchmark >/dev/null 2>&1 || _deps_apt_install redis-tools

if [[ -n "${BENCH_SUMMARYD_BIN:-}" ]]; then
    bin=$BENCH_SUMMARYD_BIN
else
    log "cargo build --release"
    cargo build --release --locked --bin summaryd
    bin=target/release/summaryd
fi
[[ -x "$bin" ]] || die "$bin is not an executable"

nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
prefix="bench:${nonce}:"
workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-bench.XXXXXX")
pid=""

# GET http://127.0.0.1:$1$2 and print the status code; bash's /dev/tcp, so no curl needed.
# shellcheck disable=SC2016 # $0..$2 expand in the child bash, on purpose
http_status() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
        printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
        IFS=" " read -r _ code _ <&3 && printf "%s" "$code"' "$1" "$2" 2>/dev/null
}

# First loopback port in a fixed range that nothing listens on (bounded: 200 tries).
free_port() {
    local p
    for ((p = 18080; p < 18280; p++)); do
        if ! _deps_tcp_open 127.0.0.1 "$p"; then
            echo "$p"
            return 0
        fi
    done
    die "no free port in 18080-18279"
}

stop_service() {
    [[ -n "$pid" ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        # The service drains for SUMMARYD_SHUTDOWN_GRACE_MS (5 s below); give it 15 s in all.
        local deadline=$((SECONDS + 15))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then
            log "summaryd (pid $pid) did not stop within 15 s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
    pid=""
}

cleanup() {
    local rc=$?
    stop_service
    # Every key the service wrote carries our prefix: idempotency records, stream, job state.
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" --scan --pattern "${prefix}*" |
        xargs -r -n 500 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" DEL >/dev/null || true
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" -n "$REDIS_BENCH_DB" DEL 'key:__rand_int__' >/dev/null || true
    if command -v psql >/dev/null 2>&1; then
        psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
            -c "DROP DATABASE IF EXISTS $BENCH_DB" >/dev/null 2>&1 || true
    fi
    if [[ $rc -eq 0 ]]; then
        rm -rf "$workdir"
    else
        log "logs kept in $workdir"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- baseline: the Redis every POST talks to, measured now, under the same machine load --
log "redis-benchmark (ceiling)"
# --csv instead of -q: the same test, but it also reports p99 and prints no progress lines.
timeout 300 redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" --dbnum "$REDIS_BENCH_DB" \
    --csv -n 100000 -c "$CONNECTIONS" -t set,get >"$workdir/redis.txt" 2>&1
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms",...
redis_field() { # $1 = SET|GET, $2 = rps|p50|p99
    awk -F, -v cmd="\"$1\"" -v want="$2" '$1 == cmd {
        col = (want == "rps") ? 2 : (want == "p50") ? 5 : 7
        gsub(/"/, "", $col); print $col; exit }' "$workdir/redis.txt"
}
set_rps=$(redis_field SET rps)
get_rps=$(redis_field GET rps)
[[ -n "$set_rps" && -n "$get_rps" ]] || die "could not read redis-benchmark output: $(cat "$workdir/redis.txt")"

# --- start the service ----------------------------------------------------------------
port=$(free_port)
url="http://127.0.0.1:$port"
log "starting $bin serve --roles api on 127.0.0.1:$port (key prefix $prefix, database $BENCH_DB)"
SUMMARYD_LISTEN="127.0.0.1:$port" \
    SUMMARYD_KEY_PREFIX="$prefix" \
    SUMMARYD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    SUMMARYD_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$BENCH_DB" \
    SUMMARYD_SHUTDOWN_GRACE_MS=5000 \
    SUMMARYD_LOG_FORMAT=json \
    "$bin" serve --roles api >"$workdir/summaryd.log" 2>&1 &
pid=$!

# Migrations on a new database take a second or two; 60 s bounds a service that hangs.
deadline=$((SECONDS + 60))
until [[ "$(http_status "$port" /readyz || true)" == "200" ]]; do
    if ! kill -0 "$pid" 2>/dev/null; then
        tail -n 20 "$workdir/summaryd.log" >&2 || true
        pid=""
        die "summaryd exited before it became ready (log above)"
    fi
    ((SECONDS < deadline)) || die "summaryd not ready within 60 s; see $workdir/summaryd.log"
    sleep 0.2
done

# --- load -----------------------------------------------------------------------------
# wrk stops by itself after -d; `timeout` only guards against a wedged client.
run_wrk() { # $1 = script, $2 = duration s, $3 = nonce, $4 = output file
    timeout $(($2 + 60)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"$2s" --timeout 5s --latency \
        -s "$1" "$url" -- "$3" >"$4"
}
log "warm-up (2 s)"
run_wrk bench/post_unique_keys.lua 2 "warm${nonce}" "$workdir/warmup.txt"
log "unique keys: ${THREADS} threads, ${CONNECTIONS} connections, ${DURATION_S} s"
run_wrk bench/post_unique_keys.lua "$DURATION_S" "$nonce" "$workdir/unique.txt"
log "replay: ${THREADS} threads, ${CONNECTIONS} connections, ${DURATION_S} s"
run_wrk bench/post_replay.lua "$DURATION_S" "$nonce" "$workdir/replay.txt"

stop_service

# --- report ---------------------------------------------------------------------------
field() { # $1 = wrk output file, $2 = key in the BENCH line
    sed -n 's/^BENCH //p' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
for f in unique replay; do
    [[ -n "$(field "$workdir/$f.txt" req_per_s)" ]] || die "no BENCH line from wrk ($f): $(cat "$workdir/$f.txt")"
done

printf '\n%-34s %12s %9s %9s %9s\n' scenario req/s "p50 ms" "p99 ms" non-2xx
for f in unique replay; do
    case $f in
        unique) name="POST /v1/summaries, unique keys" ;;
        replay) name="POST /v1/summaries, replayed key" ;;
    esac
    printf '%-34s %12s %9s %9s %9s\n' "$name" "$(field "$workdir/$f.txt" req_per_s)" \
        "$(field "$workdir/$f.txt" p50_ms)" "$(field "$workdir/$f.txt" p99_ms)" \
        "$(field "$workdir/$f.txt" non2xx)"
done
printf '%-34s %12s %9s %9s %9s\n' "redis SET (ceiling)" "$set_rps" "$(redis_field SET p50)" "$(redis_field SET p99)" -
printf '%-34s %12s %9s %9s %9s\n' "redis GET (ceiling)" "$get_rps" "$(redis_field GET p50)" "$(redis_field GET p99)" -
awk -v u="$(field "$workdir/unique.txt" req_per_s)" -v r="$(field "$workdir/replay.txt" req_per_s)" \
    -v s="$set_rps" -v g="$get_rps" \
    'BEGIN { printf "\nratio unique/SET = %.3f   replay/GET = %.3f\n", u / s, r / g }'
printf '(%d wrk threads, %d connections, %d s per run; socket errors: unique %s, replay %s)\n' \
    "$THREADS" "$CONNECTIONS" "$DURATION_S" \
    "$(field "$workdir/unique.txt" socket_errors)" "$(field "$workdir/replay.txt" socket_errors)"
