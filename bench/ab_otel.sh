#!/usr/bin/env bash
# What trace export costs a POST when the collector is down or slow: POST throughput and
# latency of one summaryd binary with export off, with export on to a collector that is down
# (connection refused), and with export on to a slow collector (every export answered after
# 5 s), measured in alternation on one machine:
#
#   bench/ab_otel.sh [BIN]        # default target/release/summaryd
#
# Three api processes of the same binary (`serve --roles api`) against one private Redis,
# each with its own database and key prefix:
#   off   no OTLP endpoint: nothing of OpenTelemetry runs
#   down  SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT on a loopback port nothing listens on
#   slow  SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT on the tests' OTLP receiver
#         (scripts/otlp-receiver.sh --delay-s 5), which holds every export's answer 5 s
# Both exporting processes run with OTEL_BSP_SCHEDULE_DELAY=AB_SCHEDULE_DELAY_MS (1000: a
# batch a second, as a deployment would, rather than the tests' 100). wrk (a new
# Idempotency-Key per request, bench/post_unique_keys.lua) hits them in turn, AB_ROUNDS
# times, reversing the order every other round; each round's ratios on/off compare runs
# seconds apart. Prints req/s, p50 and p99 per run, the medians, and the median ratios of
# req/s and of p99 for down/off and slow/off. The goal: the p99 ratio at most 1.10 (export
# never slows a request: spans that cannot be sent are dropped and counted). Last, each
# process's `summaryd_otel_spans_dropped_total` and the slow receiver's exports answered.
#
# Settings (environment): AB_ROUNDS (5), AB_DURATION_S (8), AB_CONNECTIONS (32),
# AB_THREADS (2), AB_SCHEDULE_DELAY_MS (1000), AB_SLOW_DELAY_S (5).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

bin=$(realpath "${1:-target/release/summaryd}")
ROUNDS=${AB_ROUNDS:-5}
DURATION_S=${AB_DURATION_S:-8}
CONNECTIONS=${AB_CONNECTIONS:-32}
THREADS=${AB_THREADS:-2}
SCHEDULE_DELAY_MS=${AB_SCHEDULE_DELAY_MS:-1000}
SLOW_DELAY_S=${AB_SLOW_DELAY_S:-5}
PG_PORT=${SUMMARYD_DEPS_PG_PORT:-5432}
PG_BASE="postgres://postgres@127.0.0.1:$PG_PORT"

log() { printf 'ab: %s\n' "$*" >&2; }
die() {
    printf 'ab: ERROR: %s\n' "$*" >&2
    exit 1
}
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=bench/private_redis.sh
. bench/private_redis.sh
command -v wrk >/dev/null 2>&1 || _deps_apt_install wrk
[[ -x "$bin" ]] || die "$bin is not an executable (cargo build --release)"

workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-ab-otel.XXXXXX")
nonce=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
pids=()
redis_pid=""
dbs=()
psql_admin() { psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }
cleanup() {
    local rc=$?
    for p in "${pids[@]}" $redis_pid; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for db in "${dbs[@]}"; do
        psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    done
    if [[ $rc -eq 0 ]]; then rm -rf "$workdir"; else log "logs kept in $workdir"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_private_redis 16600 "$workdir"

# The slow collector. The script execs the receiver, so $! is the receiver's own pid. Its
# first run on a machine installs a venv from PyPI, hence the long wait for LISTENING.
scripts/otlp-receiver.sh --delay-s "$SLOW_DELAY_S" >"$workdir/receiver.out" 2>"$workdir/receiver.log" &
pids+=($!)
for _ in $(seq 3000); do
    grep -q '^LISTENING ' "$workdir/receiver.out" && break
    kill -0 "${pids[-1]}" 2>/dev/null || die "the OTLP receiver exited; see $workdir/receiver.log"
    sleep 0.1
done
receiver_port=$(sed -n 's/^LISTENING //p' "$workdir/receiver.out")
[[ -n "$receiver_port" ]] || die "the OTLP receiver did not listen; see $workdir/receiver.log"
slow_endpoint="http://127.0.0.1:$receiver_port"
# Down: a port from a range nothing else here uses, checked closed now; nothing opens it
# later, so every export's connect is refused.
down_endpoint="http://127.0.0.1:$(free_port 18700)"

declare -A url=()
# $1 = scenario name, $2 = OTLP endpoint or empty (export off)
start() {
    local name=$1 endpoint=$2 port db
    port=$(free_port $((18500 + ${#pids[@]} * 10)))
    db="summaryd_ab_otel_${name}_$nonce"
    dbs+=("$db")
    env SUMMARYD_LISTEN="127.0.0.1:$port" SUMMARYD_KEY_PREFIX="ab:$name:" \
        SUMMARYD_REDIS_URL="$redis_url" SUMMARYD_DATABASE_URL="$PG_BASE/$db" \
        SUMMARYD_LOG_FORMAT=json SUMMARYD_MAIL_PROVIDER=log \
        ${endpoint:+SUMMARYD_OTEL_EXPORTER_OTLP_ENDPOINT="$endpoint"} \
        ${endpoint:+OTEL_BSP_SCHEDULE_DELAY="$SCHEDULE_DELAY_MS"} \
        "$bin" serve --roles api >"$workdir/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do
        _deps_tcp_open 127.0.0.1 "$port" && break
        sleep 0.1
    done
    _deps_tcp_open 127.0.0.1 "$port" || die "$name did not start; see $workdir/$name.log"
    url[$name]="http://127.0.0.1:$port"
}
start off ""
start down "$down_endpoint"
start slow "$slow_endpoint"
scenarios=(off down slow)
sleep 1

declare -A rps=() p50=() p99=() non2xx=()
run() { # $1 = scenario, $2 = round
    local out="$workdir/$1-$2.txt" line
    timeout $((DURATION_S + 60)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION_S}s" \
        --timeout 5s -s bench/post_unique_keys.lua "${url[$1]}" -- "$nonce-$2-$1" "" >"$out"
    line=$(sed -n 's/^BENCH //p' "$out")
    [[ -n "$line" ]] || die "no BENCH line from wrk ($1): $(cat "$out")"
    field() { tr ' ' '\n' <<<"$line" | sed -n "s/^$1=//p"; }
    rps[$1,$2]=$(field req_per_s)
    p50[$1,$2]=$(field p50_ms)
    p99[$1,$2]=$(field p99_ms)
    non2xx[$1,$2]=$(field non2xx)
    # Export must never fail a request: a non-2xx answer is a finding, not noise.
    [[ "${non2xx[$1,$2]}" == 0 ]] || die "$1 answered ${non2xx[$1,$2]} non-2xx responses; see $workdir/$1.log"
    printf 'round %s  %-4s %9.1f req/s  p50 %7.3f ms  p99 %7.3f ms\n' "$2" "$1" \
        "${rps[$1,$2]}" "${p50[$1,$2]}" "${p99[$1,$2]}"
}

log "warm-up"
for s in "${scenarios[@]}"; do
    wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s bench/post_unique_keys.lua "${url[$s]}" \
        -- "warm-$nonce-$s" "" >/dev/null
done
for ((r = 1; r <= ROUNDS; r++)); do
    order=("${scenarios[@]}")
    # Reversed every other round, so drift favours no scenario.
    ((r % 2 == 0)) && order=(slow down off)
    for s in "${order[@]}"; do run "$s" "$r"; done
    redis-cli -p "$rport" FLUSHALL >/dev/null
done

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
of() { # $1 = array name, $2 = scenario: the rounds' values, one a line
    local -n a=$1
    for ((r = 1; r <= ROUNDS; r++)); do echo "${a[$2,$r]}"; done
}
ratios() { # $1 = array name, $2 = scenario: its value / off's, per round, one a line
    local -n a=$1
    for ((r = 1; r <= ROUNDS; r++)); do
        awk -v x="${a[$2,$r]}" -v y="${a[off,$r]}" 'BEGIN { printf "%.3f\n", x / y }'
    done
}
echo
echo "connections $CONNECTIONS, $ROUNDS rounds of ${DURATION_S} s, OTEL_BSP_SCHEDULE_DELAY=$SCHEDULE_DELAY_MS, slow collector ${SLOW_DELAY_S} s per export; medians:"
for s in "${scenarios[@]}"; do
    printf '%-4s %9.1f req/s  p50 %7.3f ms  p99 %7.3f ms\n' "$s" \
        "$(of rps "$s" | median)" "$(of p50 "$s" | median)" "$(of p99 "$s" | median)"
done
echo "median ratios to off (per round; goal: p99 at most 1.10):"
for s in down slow; do
    r_rps=$(ratios rps "$s")
    r_p99=$(ratios p99 "$s")
    printf '%s/off req/s %s (rounds: %s)  p99 %s (rounds: %s)\n' "$s" \
        "$(median <<<"$r_rps")" "$(tr '\n' ' ' <<<"$r_rps" | sed 's/ $//')" \
        "$(median <<<"$r_p99")" "$(tr '\n' ' ' <<<"$r_p99" | sed 's/ $//')"
done
for s in "${scenarios[@]}"; do
    dropped=$(curl -fsS "${url[$s]}/metrics" 2>/dev/null |
        sed -n 's/^summaryd_otel_spans_dropped_total\({[^}]*}\)\{0,1\} \([0-9.e+]*\)$/\2/p' | head -1)
    printf '%-4s summaryd_otel_spans_dropped_total %s\n' "$s" "${dropped:-(not exported by this build)}"
done
echo "slow collector: $(curl -fsS "$slow_endpoint/stats")"
