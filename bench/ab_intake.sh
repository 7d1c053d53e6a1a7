#!/usr/bin/env bash
# POST throughput of two summaryd binaries, measured in alternation on one machine:
#
#   bench/ab_intake.sh BASELINE_BIN CANDIDATE_BIN
#
# A shared machine drifts by tens of percent over minutes (bench/run.sh's sweep takes ten),
# which hides a 10 % difference between two sequential runs. Here both binaries run side by
# side (api role, the same private Redis, their own database and key prefix) and wrk hits
# them in turn, AB_ROUNDS times, with the order swapped every round; each round's ratio
# candidate/baseline compares two runs seconds apart. Prints one line per run and the
# median ratio per scenario, for req/s and for the CPU one POST costs the service (its
# utime + stime from /proc/PID/stat over the run ÷ the requests wrk completed).
#
# Scenarios: `new key` (every request its own Idempotency-Key) for the baseline and the
# candidate as they are (no tokens file, so no tenant limits), and, with AB_LIMITS=1, the
# candidate twice more in token mode: without limits (what authentication costs), and with
# rate_per_s, burst and max_in_flight all set (far above what the machine can send, so every
# check runs and none refuses). With AB_BUDGET=1, the candidate in token mode without and
# with a token budget (budget_tokens far above what a run spends, so every job's worst case
# is counted and reserved and none is refused), and the ratio of the two per round: what
# budgets cost on the same build (pass the same binary twice to measure only that).
#
# Settings (environment): AB_ROUNDS (5), AB_DURATION_S (8), AB_CONNECTIONS ("32"),
# AB_THREADS (2), AB_LIMITS (0), AB_BUDGET (0).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

[[ $# -eq 2 ]] || {
    echo "usage: $0 BASELINE_BIN CANDIDATE_BIN" >&2
    exit 2
}
base_bin=$(realpath "$1")
cand_bin=$(realpath "$2")
ROUNDS=${AB_ROUNDS:-5}
DURATION_S=${AB_DURATION_S:-8}
CONNECTIONS=${AB_CONNECTIONS:-32}
THREADS=${AB_THREADS:-2}
LIMITS=${AB_LIMITS:-0}
BUDGET=${AB_BUDGET:-0}
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
for bin in "$base_bin" "$cand_bin"; do [[ -x "$bin" ]] || die "$bin is not an executable"; done

workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-ab.XXXXXX")
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

token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
token_hash=$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
printf '[tenants.bench]\ntoken_sha256 = "%s"\n' "$token_hash" >"$workdir/tokens-only.toml"
cat "$workdir/tokens-only.toml" - >"$workdir/tokens.toml" <<EOF
rate_per_s = 1000000.0
burst = 1000000
max_in_flight = 1000000000
EOF
cat "$workdir/tokens-only.toml" - >"$workdir/tokens-budget.toml" <<EOF
budget_tokens = 1000000000000000
budget_period = "month"
EOF

declare -A url=() bearer=() pid_of=()
# $1 = scenario name, $2 = binary, $3 = tokens file or empty
start() {
    local name=$1 bin=$2 tokens=$3 port db
    port=$(free_port $((18300 + ${#pids[@]} * 10)))
    db="summaryd_ab_${name//-/_}_$nonce"
    dbs+=("$db")
    env SUMMARYD_LISTEN="127.0.0.1:$port" SUMMARYD_KEY_PREFIX="ab:$name:" \
        SUMMARYD_REDIS_URL="$redis_url" SUMMARYD_DATABASE_URL="$PG_BASE/$db" \
        SUMMARYD_LOG_FORMAT=json SUMMARYD_MAIL_PROVIDER=log \
        ${tokens:+SUMMARYD_AUTH_TOKENS_FILE="$tokens"} \
        "$bin" serve --roles api >"$workdir/$name.log" 2>&1 &
    pids+=($!)
    pid_of[$name]=$!
    for _ in $(seq 300); do
        _deps_tcp_open 127.0.0.1 "$port" && break
        sleep 0.1
    done
    _deps_tcp_open 127.0.0.1 "$port" || die "$name did not start; see $workdir/$name.log"
    url[$name]="http://127.0.0.1:$port"
    bearer[$name]=${tokens:+$token}
}
start baseline "$base_bin" ""
start candidate "$cand_bin" ""
scenarios=(baseline candidate)
if [[ "$LIMITS" == 1 ]]; then
    start candidate-token "$cand_bin" "$workdir/tokens-only.toml"
    start candidate-limits "$cand_bin" "$workdir/tokens.toml"
    scenarios+=(candidate-token candidate-limits)
fi
if [[ "$BUDGET" == 1 ]]; then
    [[ "$LIMITS" == 1 ]] || {
        start candidate-token "$cand_bin" "$workdir/tokens-only.toml"
        scenarios+=(candidate-token)
    }
    start candidate-budget "$cand_bin" "$workdir/tokens-budget.toml"
    scenarios+=(candidate-budget)
fi
sleep 1

clk_tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/${pid_of[$1]}/stat"; }
declare -A results=() cpu_us=()
run() { # $1 = scenario, $2 = round
    local out="$workdir/$1-$2.txt" ticks_before ticks_after requests
    ticks_before=$(cpu_ticks "$1")
    timeout $((DURATION_S + 60)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION_S}s" \
        --timeout 5s -s bench/post_unique_keys.lua "${url[$1]}" -- "$nonce-$2-$1" "${bearer[$1]}" >"$out"
    ticks_after=$(cpu_ticks "$1")
    local rps non2xx
    rps=$(sed -n 's/^BENCH //p' "$out" | tr ' ' '\n' | sed -n 's/^req_per_s=//p')
    non2xx=$(sed -n 's/^BENCH //p' "$out" | tr ' ' '\n' | sed -n 's/^non2xx=//p')
    [[ -n "$rps" ]] || die "no BENCH line from wrk ($1): $(cat "$out")"
    [[ "$non2xx" == 0 ]] || die "$1 answered $non2xx non-2xx responses; see $workdir/$1.log"
    requests=$(sed -n 's/^BENCH //p' "$out" | tr ' ' '\n' | sed -n 's/^requests=//p')
    results[$1,$2]=$rps
    cpu_us[$1,$2]=$(awk -v t=$((ticks_after - ticks_before)) -v hz="$clk_tck" -v n="$requests" \
        'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
    printf 'round %s  %-17s %9.1f req/s %7s CPU us/POST\n' "$2" "$1" "$rps" "${cpu_us[$1,$2]}"
}

log "warm-up"
for s in "${scenarios[@]}"; do
    wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s bench/post_unique_keys.lua "${url[$s]}" \
        -- "warm-$nonce-$s" "${bearer[$s]}" >/dev/null
done
for ((r = 1; r <= ROUNDS; r++)); do
    order=("${scenarios[@]}")
    if ((r % 2 == 0)); then
        # Reverse the order every other round, so drift favours neither side.
        order=()
        for ((i = ${#scenarios[@]} - 1; i >= 0; i--)); do order+=("${scenarios[$i]}"); done
    fi
    for s in "${order[@]}"; do run "$s" "$r"; done
    redis-cli -p "$rport" FLUSHALL >/dev/null
done

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "connections $CONNECTIONS, $ROUNDS rounds of ${DURATION_S} s, ratios to the baseline of the same round:"
for s in "${scenarios[@]:1}"; do
    ratios=$(for ((r = 1; r <= ROUNDS; r++)); do
        awk -v a="${results[$s,$r]}" -v b="${results[baseline,$r]}" 'BEGIN { printf "%.3f\n", a / b }'
    done)
    printf '%-17s median %s  (rounds: %s)\n' "$s" "$(median <<<"$ratios")" "$(tr '\n' ' ' <<<"$ratios")"
done
echo "CPU us per POST (the service process), ratios to the baseline of the same round:"
for s in "${scenarios[@]}"; do
    own=$(for ((r = 1; r <= ROUNDS; r++)); do echo "${cpu_us[$s,$r]}"; done)
    ratios=$(for ((r = 1; r <= ROUNDS; r++)); do
        awk -v a="${cpu_us[$s,$r]}" -v b="${cpu_us[baseline,$r]}" 'BEGIN { printf "%.3f\n", a / b }'
    done)
    printf '%-17s median %s us, ratio %s  (rounds: %s)\n' "$s" "$(median <<<"$own")" \
        "$(median <<<"$ratios")" "$(tr '\n' ' ' <<<"$ratios")"
done
if [[ "$BUDGET" == 1 ]]; then
    ratios=$(for ((r = 1; r <= ROUNDS; r++)); do
        awk -v a="${results[candidate-budget,$r]}" -v b="${results[candidate-token,$r]}" 'BEGIN { printf "%.3f\n", a / b }'
    done)
    printf '%-17s median %s  (rounds: %s)\n' "budget/token" "$(median <<<"$ratios")" "$(tr '\n' ' ' <<<"$ratios")"
fi
