#!/usr/bin/env bash
# What confirmed accepts cost: POST throughput and latency of one summaryd binary with
# SUMMARYD_REDIS_MIN_REPLICAS_ACK=0 and =1, measured in alternation on one machine:
#
#   bench/ab_replicas.sh [BIN]        # default target/release/summaryd
#
# A private Redis primary and one replica of it (loopback, no persistence, disk-based
# initial sync); two api processes of the same binary against that primary, their own
# database and key prefix, one with acks 0 (the 202 after the primary's write) and one with
# acks 1 (after WAIT 1 confirms the write reached the replica). wrk hits them in turn,
# AB_ROUNDS times, swapping the order every round; each round's ratio acks1/acks0 compares
# two runs seconds apart. Prints req/s, p50 and p99 per run, then the medians and the
# median ratio. A 503 of the acks-1 process (the replica too slow for
# SUMMARYD_REDIS_ACK_TIMEOUT_MS) is counted, not fatal: it is what the setting does.
#
# Settings (environment): AB_ROUNDS (5), AB_DURATION_S (8), AB_CONNECTIONS (32),
# AB_THREADS (2), AB_ACK_TIMEOUT_MS (100).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

bin=$(realpath "${1:-target/release/summaryd}")
ROUNDS=${AB_ROUNDS:-5}
DURATION_S=${AB_DURATION_S:-8}
CONNECTIONS=${AB_CONNECTIONS:-32}
THREADS=${AB_THREADS:-2}
ACK_TIMEOUT_MS=${AB_ACK_TIMEOUT_MS:-100}
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

workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-ab-replicas.XXXXXX")
nonce=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
pids=()
primary_pid=""
replica_pid=""
dbs=()
psql_admin() { psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }
cleanup() {
    local rc=$?
    for p in "${pids[@]}" $replica_pid $primary_pid; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for db in "${dbs[@]}"; do
        psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    done
    if [[ $rc -eq 0 ]]; then rm -rf "$workdir"; else log "logs kept in $workdir"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$workdir/primary" "$workdir/replica"
start_private_redis 16600 "$workdir/primary" --repl-diskless-sync no
primary_pid=$redis_pid
primary_port=$rport
primary_url=$redis_url
start_private_redis 16800 "$workdir/replica" --replicaof 127.0.0.1 "$primary_port" \
    --repl-diskless-sync no
replica_pid=$redis_pid
replica_port=$rport
for _ in $(seq 200); do
    redis-cli -p "$replica_port" INFO replication | grep -q 'master_link_status:up' && break
    sleep 0.1
done
redis-cli -p "$replica_port" INFO replication | grep -q 'master_link_status:up' ||
    die "the replica did not come in sync; see $workdir/replica/redis.log"

declare -A url=()
# $1 = scenario name, $2 = SUMMARYD_REDIS_MIN_REPLICAS_ACK
start() {
    local name=$1 acks=$2 port db
    port=$(free_port $((18500 + ${#pids[@]} * 10)))
    db="summaryd_ab_${name}_$nonce"
    dbs+=("$db")
    env SUMMARYD_LISTEN="127.0.0.1:$port" SUMMARYD_KEY_PREFIX="ab:$name:" \
        SUMMARYD_REDIS_URL="$primary_url" SUMMARYD_DATABASE_URL="$PG_BASE/$db" \
        SUMMARYD_REDIS_MIN_REPLICAS_ACK="$acks" SUMMARYD_REDIS_ACK_TIMEOUT_MS="$ACK_TIMEOUT_MS" \
        SUMMARYD_LOG_FORMAT=json SUMMARYD_MAIL_PROVIDER=log \
        "$bin" serve --roles api >"$workdir/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do
        _deps_tcp_open 127.0.0.1 "$port" && break
        sleep 0.1
    done
    _deps_tcp_open 127.0.0.1 "$port" || die "$name did not start; see $workdir/$name.log"
    url[$name]="http://127.0.0.1:$port"
}
start acks0 0
start acks1 1
scenarios=(acks0 acks1)
sleep 1

declare -A rps=() p50=() p99=() refused=()
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
    refused[$1,$2]=$(field non2xx)
    printf 'round %s  %-6s %9.1f req/s  p50 %7.3f ms  p99 %7.3f ms  non-2xx %s\n' "$2" "$1" \
        "${rps[$1,$2]}" "${p50[$1,$2]}" "${p99[$1,$2]}" "${refused[$1,$2]}"
}

log "warm-up"
for s in "${scenarios[@]}"; do
    wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s bench/post_unique_keys.lua "${url[$s]}" \
        -- "warm-$nonce-$s" "" >/dev/null
done
redis-cli -p "$primary_port" CONFIG RESETSTAT >/dev/null
for ((r = 1; r <= ROUNDS; r++)); do
    order=("${scenarios[@]}")
    ((r % 2 == 0)) && order=(acks1 acks0)
    for s in "${order[@]}"; do run "$s" "$r"; done
    # Freed in the background, and waited for: a replica freeing a round's keys in its
    # main thread acknowledges nothing meanwhile, and the next round's first seconds would
    # measure that instead.
    redis-cli -p "$primary_port" FLUSHALL ASYNC >/dev/null
    redis-cli -p "$primary_port" WAIT 1 10000 >/dev/null
done
waits=$(redis-cli -p "$primary_port" INFO commandstats | sed -n 's/^cmdstat_wait:calls=\([0-9]*\),.*/\1/p')

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
of() { # $1 = array name, $2 = scenario: the rounds' values, one a line
    local -n a=$1
    for ((r = 1; r <= ROUNDS; r++)); do echo "${a[$2,$r]}"; done
}
echo
echo "connections $CONNECTIONS, $ROUNDS rounds of ${DURATION_S} s, ack timeout ${ACK_TIMEOUT_MS} ms, medians:"
for s in "${scenarios[@]}"; do
    printf '%-6s %9.1f req/s  p50 %7.3f ms  p99 %7.3f ms  non-2xx %s in all\n' "$s" \
        "$(of rps "$s" | median)" "$(of p50 "$s" | median)" "$(of p99 "$s" | median)" \
        "$(of refused "$s" | paste -sd+ | bc)"
done
ratios=$(for ((r = 1; r <= ROUNDS; r++)); do
    awk -v a="${rps[acks1,$r]}" -v b="${rps[acks0,$r]}" 'BEGIN { printf "%.3f\n", a / b }'
done)
printf 'acks1/acks0 req/s median %s  (rounds: %s)\n' "$(median <<<"$ratios")" "$(tr '\n' ' ' <<<"$ratios")"
echo "WAIT calls on the primary during the rounds: ${waits:-0}"
