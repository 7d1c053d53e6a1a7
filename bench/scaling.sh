#!/usr/bin/env bash
# Scaling of the intake and of the drain with the number of processes, against one Redis and
# against a local 3-master Redis Cluster, each curve next to a ceiling measured in the same
# run; writes a CSV and two charts (docs/scaling.md reads them):
#
#   bench/scaling.sh                              # both targets, ~8 min each after the build
#   BENCH_TARGETS=single bench/scaling.sh         # one Redis only
#   BENCH_TARGETS=cluster BENCH_CSV=bench/results/scaling-2026-12-03.csv bench/scaling.sh
#                                                 # add the cluster rows to an earlier CSV
#
# For each target, on loopback:
#   intake  1..4 api processes (`serve --roles api`, each its own port), one wrk per process
#           posting new keys for BENCH_TENANTS tenants in turn (token mode, so a sharded
#           layout spreads them); accepted req/s summed, p50/p99 from the merged latency
#           histograms of all the wrk runs. Ceiling: redis-benchmark of the enqueue script
#           (bench/enqueue_call.sh) with as many clients, on every primary at once.
#   drain   BENCH_JOBS jobs accepted through the API first (builtin summariser), then 1..4
#           worker processes (`serve --roles worker`, BENCH_CONSUMERS consumers each) started
#           together; jobs/s between 10 % and 90 % of the summaries committed (start-up and
#           tail left out). Ceiling: pgbench of the worker's commit (bench/commit_txn.sql) at
#           as many clients as consumers (32 at most, the pool cap).
# Every point also gives the CPU, in cores, of Redis (every node), of the summaryd processes
# and of the whole machine, so a curve that flattens says which core ran out.
#
# Targets: `single` is a private redis-server started here on a free port, with
# SUMMARYD_STREAM_SHARDS=1; `sharded` is the same with SUMMARYD_STREAM_SHARDS=
# BENCH_CLUSTER_SHARDS (what the shards' layout costs on one node); `cluster` is six
# redis-server (three primaries, one replica each) started by scripts/redis-cluster.sh, with
# a redis+cluster:// URL and SUMMARYD_STREAM_SHARDS=BENCH_CLUSTER_SHARDS. Postgres is the
# shared one; every database created here is dropped at the end.
#
# Settings (environment):
#   BENCH_TARGETS          "single cluster" (and/or sharded)
#   BENCH_PROCESSES        process counts to sweep, ascending ("1 2 3 4")
#   BENCH_ROUNDS           sweeps per target (3); each point is the median of its rounds,
#                          and every other round visits the points in reverse order
#   BENCH_DURATION_S       seconds per intake point (10)
#   BENCH_CONNECTIONS      wrk connections in all, split over the api processes (64)
#   BENCH_TENANTS          tenants, one bearer token each (16; with the cluster target rounded
#                          up so every shard has as many)
#   BENCH_JOBS             backlog per drain point (3000)
#   BENCH_CONSUMERS        consumers per worker process (4)
#   BENCH_CLUSTER_SHARDS   SUMMARYD_STREAM_SHARDS on the cluster and `sharded` (3)
#   BENCH_REDIS_REQUESTS   redis-benchmark calls per ceiling run (150000)
#   BENCH_PGBENCH_S        seconds per pgbench run (5)
#   BENCH_SUMMARYD_BIN     a prebuilt binary instead of building target/release/summaryd
#   BENCH_OUT              where the charts go (bench/results)
#   BENCH_CEILINGS_ONLY    1: only the same-run ceilings of each target (no summaryd), e.g.
#                          to see what the cluster's nodes carry on this machine
#   BENCH_CLUSTER_SCRIPT   the cluster starter (scripts/redis-cluster.sh)
#   BENCH_SHARD_TAG        printf format of shard i's hash tag (s%d), to spread the shards
#                          over the primaries
#   BENCH_CSV              the CSV (BENCH_OUT/scaling-<UTC date>.csv); rows of targets not
#                          run now are kept from an existing file, so the halves can run apart
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

TARGETS=${BENCH_TARGETS:-"single cluster"}
PROCESSES=${BENCH_PROCESSES:-"1 2 3 4"}
ROUNDS=${BENCH_ROUNDS:-3}
DURATION_S=${BENCH_DURATION_S:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
TENANTS=${BENCH_TENANTS:-16}
JOBS=${BENCH_JOBS:-3000}
CONSUMERS=${BENCH_CONSUMERS:-4}
CLUSTER_SHARDS=${BENCH_CLUSTER_SHARDS:-3}
REDIS_REQUESTS=${BENCH_REDIS_REQUESTS:-150000}
PGBENCH_S=${BENCH_PGBENCH_S:-5}
OUT=${BENCH_OUT:-bench/results}
CSV=${BENCH_CSV:-$OUT/scaling-$(date -u +%F).csv}
PG_PORT=${SUMMARYD_DEPS_PG_PORT:-5432}
PG_BASE="postgres://postgres@127.0.0.1:$PG_PORT"
# The worker commits on at most this many Postgres connections (src/infra/connections.rs).
PG_POOL_CAP=32
CLUSTER_SCRIPT=${BENCH_CLUSTER_SCRIPT:-scripts/redis-cluster.sh}
# printf format of shard i's hash tag (src/infra/keys.rs): the slot spread_shards moves.
SHARD_TAG=${BENCH_SHARD_TAG:-s%d}
CEILINGS_ONLY=${BENCH_CEILINGS_ONLY:-0}
MATPLOTLIB_VERSION=3.9.2
CORES=$(nproc)

log() { printf 'scaling: %s\n' "$*" >&2; }
die() {
    printf 'scaling: ERROR: %s\n' "$*" >&2
    exit 1
}
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=bench/private_redis.sh
. bench/private_redis.sh
# shellcheck source=bench/enqueue_call.sh
. bench/enqueue_call.sh
command -v wrk >/dev/null 2>&1 || _deps_apt_install wrk
command -v redis-benchmark >/dev/null 2>&1 || _deps_apt_install redis-tools
command -v pgbench >/dev/null 2>&1 || _deps_apt_install postgresql-client
for t in $TARGETS; do
    case $t in
    single | sharded) ;;
    cluster)
        [[ -x "$CLUSTER_SCRIPT" ]] ||
            die "the cluster target needs $CLUSTER_SCRIPT (start DIR BASE_PORT / stop DIR)"
        ;;
    *) die "unknown target '$t' (single, sharded, cluster)" ;;
    esac
done
max_p=0
for p in $PROCESSES; do
    ((p > max_p)) || die "BENCH_PROCESSES must ascend: $PROCESSES"
    max_p=$p
done

if [[ "$CEILINGS_ONLY" == 1 ]]; then
    bin=""
elif [[ -n "${BENCH_SUMMARYD_BIN:-}" ]]; then
    bin=$BENCH_SUMMARYD_BIN
else
    log "cargo build --release"
    cargo build --release --locked --bin summaryd
    bin=target/release/summaryd
fi
[[ "$CEILINGS_ONLY" == 1 || -x "$bin" ]] || die "$bin is not an executable"

# matplotlib in a venv of its own under target/, pinned, so the charts do not depend on
# what the machine's Python has.
venv="${CARGO_TARGET_DIR:-$repo_root/target}/scaling-venv"
if ! "$venv/bin/python" -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$MATPLOTLIB_VERSION')" 2>/dev/null; then
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || _deps_apt_install python3 python3-venv
    log "installing matplotlib==$MATPLOTLIB_VERSION into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "matplotlib==$MATPLOTLIB_VERSION"
fi

nonce=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-scaling.XXXXXX")
mkdir -p "$OUT"
services=() # pids of the summaryd processes running now, their ports and log names
ports=()
names=()
dbs=()
redis_pid=""
cluster_dir=""

psql_admin() { psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }

# Stop the processes given with SIGTERM, all at once, SIGKILL after $1 seconds.
stop_pids() {
    local grace=$1 p deadline
    shift
    (($# > 0)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    deadline=$((SECONDS + grace))
    for p in "$@"; do
        while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        if kill -0 "$p" 2>/dev/null; then
            log "pid $p did not stop within $grace s; killing it"
            kill -KILL "$p" 2>/dev/null || true
        fi
        wait "$p" 2>/dev/null || true
    done
}
stop_services() {
    stop_pids 15 "${services[@]}"
    services=()
    ports=()
    names=()
}
stop_target() {
    if [[ -n "$redis_pid" ]]; then stop_pids 10 "$redis_pid"; fi
    redis_pid=""
    if [[ -n "$cluster_dir" ]]; then "$CLUSTER_SCRIPT" stop "$cluster_dir" >/dev/null 2>&1 || true; fi
    cluster_dir=""
}
cleanup() {
    local rc=$?
    stop_services
    stop_target
    for db in "${dbs[@]}"; do
        psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    done
    if [[ $rc -eq 0 ]]; then rm -rf "$workdir"; else log "logs kept in $workdir"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# GET http://127.0.0.1:$1$2 and print the status code (bash's /dev/tcp, no curl needed).
# shellcheck disable=SC2016 # $0..$2 expand in the child bash, on purpose
http_status() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
        printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
        IFS=" " read -r _ code _ <&3 && printf "%s" "$code"' "$1" "$2" 2>/dev/null
}

# --- tenants: one bearer token each -----------------------------------------------------------
# A tenant's jobs all go to one shard, so the names are chosen to give every shard of the
# cluster as many tenants (the load generator takes them in turn).
: >"$workdir/tokens.txt"
: >"$workdir/tokens.toml"
tenant_shards=1
[[ " $TARGETS " == *" cluster "* || " $TARGETS " == *" sharded "* ]] && tenant_shards=$CLUSTER_SHARDS
while IFS= read -r tenant; do
    token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    echo "$token" >>"$workdir/tokens.txt"
    printf '[tenants.%s]\ntoken_sha256 = "%s"\n\n' "$tenant" "$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)" \
        >>"$workdir/tokens.toml"
done < <("$venv/bin/python" bench/scaling.py tenants "$TENANTS" "$tenant_shards")
mapfile -t tokens <"$workdir/tokens.txt"

# shellcheck source=bench/scaling_lib.sh
. bench/scaling_lib.sh

median_of() { sort -g "$1" | awk '{ v[NR] = $1 } END { printf "%.0f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The process counts in the order round $1 visits them: ascending, descending every other
# round, so a drift of the machine's load over the run favours neither end of the curve.
round_order() {
    if (($1 % 2)); then echo "$PROCESSES"; else tr ' ' '\n' <<<"$PROCESSES" | sort -rn | tr '\n' ' '; fi
}

# One drain: $3 = round. JOBS accepted through one api process (stopped again), then $2
# worker processes started together; jobs/s between 10 % and 90 % of the summaries
# committed, appended to $workdir/$1-drain-$2.rates.
drain_point() {
    local target=$1 p=$2 r=$3 db n i deadline rate samples
    db="summaryd_scaling_${target}_drain${p}_${r}_$nonce"
    samples="$workdir/$target-drain-$p-$r.samples"
    new_db "$db"
    flush_target
    spawn_summaryd api "$db" "$target-fill-$p-$r"
    wait_ready
    "$venv/bin/python" bench/scaling.py fill "$(api_urls)" "$JOBS" "$nonce-$target-$p-$r" \
        "$workdir/tokens.txt" || die "filling the backlog failed"
    stop_services
    [[ "$(summaries_count "$db")" == 0 ]] || die "summaries exist before the workers started"
    cpu_mark
    for ((i = 0; i < p; i++)); do spawn_summaryd worker "$db" "$target-worker-$p-$r-$i"; done
    echo "$(date +%s.%N) 0" >"$samples"
    deadline=$((SECONDS + 600))
    while :; do
        all_alive
        n=$(summaries_count "$db")
        echo "$(date +%s.%N) $n" >>"$samples"
        ((n >= JOBS)) && break
        ((SECONDS < deadline)) || die "the drain did not finish within 600 s ($n of $JOBS)"
        sleep 0.05
    done
    cpu_since_mark >>"$workdir/$target-drain-$p.cores"
    stop_services
    psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
    # The first sample is the workers' spawn with 0 done: a drain too quick for two samples
    # between 10 % and 90 % is measured from the spawn to the last job instead.
    rate=$(awk -v jobs="$JOBS" '
        NR == 1 { t0 = $1 }
        t10 == "" && $2 >= jobs * 0.1 { t10 = $1; n10 = $2 }
        t90 == "" && $2 >= jobs * 0.9 { t90 = $1; n90 = $2 }
        { t = $1; n = $2 }
        END { printf "%.1f", (t90 > t10) ? (n90 - n10) / (t90 - t10) : n / (t - t0) }' "$samples")
    echo "$rate" >>"$workdir/$target-drain-$p.rates"
    log "$target drain P=$p round $r: $JOBS jobs, $rate jobs/s"
}

# --- CSV ----------------------------------------------------------------------------------------
machine="$CORES cores ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo | tr -d ',')), redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), $(psql_admin -Atc 'SHOW server_version' | cut -d' ' -f1 | sed 's/^/postgres /')"
header="date,commit,machine,target,shards,phase,processes,per_process,load,throughput_per_s,throughput_min,throughput_max,rounds,ratio_to_first,p50_ms,p99_ms,ceiling_per_s,ceiling_kind,ratio_to_ceiling,redis_cores,summaryd_cores,machine_busy_cores,loadavg_1m,errors"
rows="$workdir/rows.csv"
: >"$rows"
declare -A first=() errors=()
# $1 target, $2 phase, $3 processes, $4 per_process, $5 load, $6 the point's file stem (one
# rate a line in .rates, one "redis summaryd machine loadavg" line in .cores, a line per
# round), $7 p50, $8 p99, $9 ceiling, $10 ceiling kind, $11 errors. The throughput is the
# median of the rounds; the cores and load average their mean.
add_row() {
    local key="$1,$2" rate lo hi rounds ratio_first ratio_ceiling cores
    read -r rate lo hi rounds < <(sort -g "$6.rates" | awk '{ v[NR] = $1 }
        END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%.1f %.1f %.1f %d\n", m, v[1], v[NR], NR }')
    [[ -n "${first[$key]:-}" ]] || first[$key]=$rate
    ratio_first=$(awk -v a="$rate" -v b="${first[$key]}" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }')
    ratio_ceiling=$(awk -v a="$rate" -v b="$9" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }')
    cores=$(awk '{ for (i = 1; i <= 4; i++) s[i] += $i } END { printf "%.2f,%.2f,%.2f,%.2f", s[1] / NR, s[2] / NR, s[3] / NR, s[4] / NR }' "$6.cores")
    printf '%s,%s,"%s",%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' \
        "$(date -u +%FT%H:%MZ)" "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" "$machine" \
        "$1" "$shards" "$2" "$3" "$4" "$5" "$rate" "$lo" "$hi" "$rounds" "$ratio_first" \
        "$7" "$8" "$9" "${10}" "$ratio_ceiling" "$cores" "${11}" >>"$rows"
    log "$1 $2 P=$3: $rate/s (rounds $lo..$hi; ratio to first $ratio_first, to ceiling $ratio_ceiling), p50 $7 ms, p99 $8 ms, cores redis,summaryd,machine,loadavg $cores, errors ${11}"
}

# --- Postgres commit ceiling, once: Postgres is the same for both targets --------------------
declare -A pg_tps=()
measure_commit_ceiling() {
    local p clients
    pg_db="summaryd_scaling_pgbench_$nonce"
    new_db "$pg_db"
    while IFS= read -r migration; do
        psql -X -q -w -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$pg_db" \
            -f "$migration" >/dev/null
    done < <(find migrations -name 'V*__*.sql' | sort -V)
    for p in $PROCESSES; do
        clients=$((p * CONSUMERS < PG_POOL_CAP ? p * CONSUMERS : PG_POOL_CAP))
        [[ -n "${pg_tps[$clients]:-}" ]] && continue
        timeout $((PGBENCH_S + 60)) pgbench -n -M prepared -f bench/commit_txn.sql \
            -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$clients" -j $((clients < 2 ? 1 : 2)) \
            -T "$PGBENCH_S" "$pg_db" >"$workdir/pgbench-$clients.txt" 2>&1 ||
            die "pgbench failed: $(tail -n 5 "$workdir/pgbench-$clients.txt")"
        pg_tps[$clients]=$(awk '/^tps = / { printf "%.0f", $3; exit }' "$workdir/pgbench-$clients.txt")
        log "pgbench, $clients clients: ${pg_tps[$clients]} commits/s"
    done
    psql_admin -c "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null
}
[[ "$CEILINGS_ONLY" == 1 ]] || measure_commit_ceiling

for target in $TARGETS; do
    start_target "$target"

    # --- intake -------------------------------------------------------------------------------
    # The ceiling is measured once per round, just before it; the median goes in the CSV.
    for ((r = 1; r <= (CEILINGS_ONLY == 1 ? ROUNDS : 1); r++)); do
        cpu_mark
        { intake_ceiling && echo; } >>"$workdir/$target-ceiling.rates"
        cpu_since_mark >>"$workdir/$target-ceiling.cores"
    done
    if [[ "$CEILINGS_ONLY" == 1 ]]; then
        add_row "$target" ceiling 0 "${#primaries[@]} primaries" "$CONNECTIONS clients" "$workdir/$target-ceiling" \
            "" "" "$(median_of "$workdir/$target-ceiling.rates")" "redis-benchmark enqueue script" 0
        stop_target
        continue
    fi
    # Every api process is started once; a point with P processes loads the first P of them
    # (an idle api process costs next to nothing), so the rounds can visit the points in any
    # order.
    db="summaryd_scaling_${target}_$nonce"
    new_db "$db"
    for ((i = 0; i < max_p; i++)); do spawn_summaryd api "$db" "$target-api-$i"; done
    wait_ready
    run_wrk_all "$max_p" 2 "$target-warm" # every process's first connections and scripts
    # Where the warm-up's keys went: with several shards every primary should hold some.
    log "$target: keys per primary after the warm-up: $(for port in "${primaries[@]}"; do
        printf '%s=%s ' "$port" "$(redis-cli -h 127.0.0.1 -p "$port" DBSIZE)"; done)"
    for ((r = 1; r <= ROUNDS; r++)); do
        ((r == 1)) || { intake_ceiling && echo; } >>"$workdir/$target-ceiling.rates"
        for p in $(round_order "$r"); do
            flush_target
            cpu_mark
            run_wrk_all "$p" "$DURATION_S" "$target-intake-$p-$r"
            cpu_since_mark >>"$workdir/$target-intake-$p.cores"
            rps=0
            for ((i = 0; i < p; i++)); do
                f="$workdir/$target-intake-$p-$r-$i.txt"
                [[ -n "$(wrk_field "$f" req_per_s)" ]] || die "no BENCH line from wrk: $(cat "$f")"
                rps=$(awk -v a="$rps" -v b="$(wrk_field "$f" req_per_s)" 'BEGIN { printf "%.1f", a + b }')
                errors[$target,$p]=$((${errors[$target,$p]:-0} + $(wrk_field "$f" non2xx) + $(wrk_field "$f" socket_errors)))
            done
            echo "$rps" >>"$workdir/$target-intake-$p.rates"
            log "$target intake P=$p round $r: $rps req/s"
        done
    done
    flush_target
    stop_services
    ceiling=$(median_of "$workdir/$target-ceiling.rates")
    log "$target: intake ceiling (median of the rounds) $ceiling enqueue calls/s"
    for p in $PROCESSES; do
        read -r p50 p99 < <(merged_percentiles "$workdir/$target-intake-$p"-*.hist)
        add_row "$target" intake "$p" api "$CONNECTIONS connections" "$workdir/$target-intake-$p" \
            "$p50" "$p99" "$ceiling" "redis-benchmark enqueue script" "${errors[$target,$p]}"
    done

    # --- drain --------------------------------------------------------------------------------
    for ((r = 1; r <= ROUNDS; r++)); do
        for p in $(round_order "$r"); do
            drain_point "$target" "$p" "$r"
        done
    done
    for p in $PROCESSES; do
        clients=$((p * CONSUMERS < PG_POOL_CAP ? p * CONSUMERS : PG_POOL_CAP))
        add_row "$target" drain "$p" "$CONSUMERS consumers" "$JOBS jobs" "$workdir/$target-drain-$p" \
            "" "" "${pg_tps[$clients]}" "pgbench worker commit at $clients clients" 0
    done
    stop_target
done

# --- write the CSV and the charts ----------------------------------------------------------------
{
    echo "$header"
    if [[ -f "$CSV" ]]; then
        # Keep the rows of targets not run now (the other half of an earlier run).
        tail -n +2 "$CSV" | while IFS= read -r line; do
            t=$(awk -F'"' '{ print $3 }' <<<"$line" | cut -d, -f2)
            [[ " $TARGETS " == *" $t "* ]] || echo "$line"
        done
    fi
    cat "$rows"
} >"$workdir/all.csv"
cp "$workdir/all.csv" "$CSV"
"$venv/bin/python" bench/scaling.py plot "$CSV" "$OUT" || die "plotting failed"
"$venv/bin/python" bench/scaling.py table "$CSV"
log "CSV $CSV, charts $OUT/scaling-intake.png and $OUT/scaling-drain.png"
