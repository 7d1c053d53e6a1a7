#!/usr/bin/env bash
# How fast a worker drains a backlog with an instant model, and what each job costs it,
# for two builds measured in alternation on one machine, next to the Postgres commit
# ceiling measured in the same run:
#
#   bench/ab_drain.sh [BASE_BIN] [NEW_BIN]
#   AB_ROUNDS=3 bench/ab_drain.sh                    # main (built here) against target/release
#   AB_NEW_REV=gc bench/ab_drain.sh                  # main against branch gc, both built here
#
# BASE_BIN defaults to a release build of AB_BASE_REV (main), made in a temporary checkout
# with CARGO_TARGET_DIR=target/bench-base and kept there as target/bench-base/summaryd-<sha>
# (built once per commit); NEW_BIN to target/release/summaryd (built if missing), or to a
# build of AB_NEW_REV the same way when that is set.
#
# Each round runs both builds, the order swapped every other round, then pgbench. A run of
# one build:
#   1. a private Redis of its own (bench/private_redis.sh) and a fresh database;
#   2. BENCH_JOBS jobs accepted through that build's API (`serve --roles api`, token mode,
#      16 tenants taken in turn, `bench/scaling.py fill`), then the api process stopped: the
#      jobs wait in their lanes as a backlog;
#   3. one `serve --roles worker` process with AB_CONSUMERS consumers and the builtin
#      summariser (an instant model: no network, no waiting), timed from its spawn until
#      the summaries table holds every job (the relay is not run: its CPU would count as
#      the worker's, and the drain ends at the commit);
#   4. the worker process's CPU (utime + stime, /proc/PID/stat) at that moment ÷ jobs, and
#      Redis's work in between (bench/redis_counts.sh): commands per job (INFO commandstats:
#      script-run commands count too), read events per job and Redis's CPU per job.
# Then pgbench runs bench/commit_txn.sql (one job's commit) with min(AB_CONSUMERS, 32)
# clients for AB_PGBENCH_S seconds: the most jobs/s that many consumers can commit one
# transaction per job. Before the rounds, each build drains AB_MONITOR_JOBS jobs once more,
# untimed, under MONITOR: the commands its clients send per job (round trips at most),
# apart from those its scripts run.
#
# Prints each run, each round's ratios new/base, then medians and the median of the
# rounds' ratios. "jobs/s per core" is 1000 ÷ CPU ms per job: what one core of the worker
# process would drain; the goal is twice the baseline's. "÷ ceiling" is jobs/s
# ÷ the round's pgbench tps.
#
# Settings (environment): AB_ROUNDS (5), BENCH_JOBS (10000: at 3000 a drain of this build
# lasted half a second, and the worker's start-up was a fifth of it), AB_CONSUMERS (16),
# AB_MONITOR_JOBS (BENCH_JOBS, so the worker's start-up weighs as much as in the timed
# runs; 0 skips the MONITOR sample), AB_PGBENCH_S (5), AB_BASE_REV (main),
# AB_NEW_REV (unset), AB_TENANTS (16).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

ROUNDS=${AB_ROUNDS:-5}
JOBS=${BENCH_JOBS:-10000}
CONSUMERS=${AB_CONSUMERS:-16}
MONITOR_JOBS=${AB_MONITOR_JOBS:-$JOBS}
PGBENCH_S=${AB_PGBENCH_S:-5}
BASE_REV=${AB_BASE_REV:-main}
NEW_REV=${AB_NEW_REV:-}
TENANTS=${AB_TENANTS:-16}
PG_PORT=${SUMMARYD_DEPS_PG_PORT:-5432}
PG_BASE="postgres://postgres@127.0.0.1:$PG_PORT"
# The worker commits on at most this many Postgres connections (src/infra/connections.rs),
# so the ceiling is measured with at most as many pgbench clients.
PG_POOL_CAP=32
TARGET_DIR=${CARGO_TARGET_DIR:-$repo_root/target}
BASE_DIR=$TARGET_DIR/bench-base

log() { printf 'ab: %s\n' "$*" >&2; }
die() {
    printf 'ab: ERROR: %s\n' "$*" >&2
    exit 1
}
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=bench/private_redis.sh
. bench/private_redis.sh
# shellcheck source=bench/redis_counts.sh
. bench/redis_counts.sh
command -v pgbench >/dev/null 2>&1 || _deps_apt_install postgresql-client
command -v redis-cli >/dev/null 2>&1 || _deps_apt_install redis-tools

# A release binary of commit $1, built in a temporary checkout into BASE_DIR (which keeps
# the dependencies between builds, so a second commit recompiles only summaryd); prints its
# path. The binary is kept per commit, so a later run does not build it again.
build_rev() {
    local sha dir out
    sha=$(git rev-parse --verify "$1^{commit}") || die "no commit $1"
    out="$BASE_DIR/summaryd-$sha"
    if [[ ! -x "$out" ]]; then
        dir="$BASE_DIR/checkout-$sha"
        mkdir -p "$BASE_DIR"
        [[ -d "$dir" ]] || git worktree add --detach "$dir" "$sha" >&2
        log "cargo build --release of $1 ($sha) into $BASE_DIR"
        (cd "$dir" && CARGO_TARGET_DIR="$BASE_DIR" cargo build --release --locked --bin summaryd) >&2 ||
            die "building $1 failed"
        cp "$BASE_DIR/release/summaryd" "$out"
        git worktree remove --force "$dir" >&2
    fi
    echo "$out"
}

if (($# >= 1)); then base_bin=$(realpath "$1"); else base_bin=$(build_rev "$BASE_REV"); fi
if (($# >= 2)); then
    new_bin=$(realpath "$2")
elif [[ -n "$NEW_REV" ]]; then
    new_bin=$(build_rev "$NEW_REV")
else
    if [[ ! -x "$TARGET_DIR/release/summaryd" ]]; then
        log "cargo build --release"
        cargo build --release --locked --bin summaryd >&2
    fi
    new_bin=$TARGET_DIR/release/summaryd
fi
for bin in "$base_bin" "$new_bin"; do [[ -x "$bin" ]] || die "$bin is not an executable"; done
bins=("$base_bin" "$new_bin")
names=(base new)
log "base $base_bin"
log "new  $new_bin"

workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-ab-drain.XXXXXX")
nonce=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
service_pid=""
watch_pid=""
redis_pid=""
monitor_pid=""
dbs=()
psql_admin() { psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }

# Stop process $1 with SIGTERM, SIGKILL after $2 seconds.
stop_pid() {
    local p=$1 grace=$2 deadline
    [[ -n "$p" ]] || return 0
    if kill -0 "$p" 2>/dev/null; then
        kill -TERM "$p" 2>/dev/null || true
        deadline=$((SECONDS + grace))
        while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    redis_monitor_stop
    stop_pid "$watch_pid" 2
    stop_pid "$service_pid" 10
    stop_pid "$redis_pid" 10
    for db in "${dbs[@]}"; do
        psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    done
    if [[ $rc -eq 0 ]]; then rm -rf "$workdir"; else log "logs kept in $workdir"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

new_db() {
    dbs+=("$1")
    psql_admin -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null 2>&1
    psql_admin -c "CREATE DATABASE $1" >/dev/null
}
drop_db() { psql_admin -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null; }

# GET http://127.0.0.1:$1$2 and print the status code (bash's /dev/tcp, no curl needed).
# shellcheck disable=SC2016 # $0..$2 expand in the child bash, on purpose
http_status() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
        printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
        IFS=" " read -r _ code _ <&3 && printf "%s" "$code"' "$1" "$2" 2>/dev/null
}

# --- tenants: one bearer token each (the fill takes them in turn) ------------------------------
: >"$workdir/tokens.txt"
: >"$workdir/tokens.toml"
while IFS= read -r tenant; do
    token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    echo "$token" >>"$workdir/tokens.txt"
    printf '[tenants.%s]\ntoken_sha256 = "%s"\n\n' "$tenant" "$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)" \
        >>"$workdir/tokens.toml"
done < <(python3 bench/scaling.py tenants "$TENANTS" 1)

# $1 = binary, $2 = roles, $3 = database, $4 = log file: starts summaryd (service_pid, port).
spawn() {
    port=$(free_port 18700)
    env SUMMARYD_LISTEN="127.0.0.1:$port" SUMMARYD_KEY_PREFIX="ab:$nonce:" \
        SUMMARYD_REDIS_URL="$redis_url" SUMMARYD_DATABASE_URL="$PG_BASE/$3?sslmode=disable" \
        SUMMARYD_AUTH_TOKENS_FILE="$workdir/tokens.toml" \
        SUMMARYD_LLM_PROVIDER=builtin SUMMARYD_MAIL_PROVIDER=log \
        SUMMARYD_WORKER_CONSUMERS="$CONSUMERS" SUMMARYD_SHUTDOWN_GRACE_MS=2000 \
        SUMMARYD_LOG_FORMAT=json "$1" serve --roles "$2" >"$4" 2>&1 &
    service_pid=$!
}

# The backlog: $1 = binary, $2 = database, $3 = jobs, $4 = run name. A private Redis and the
# database are fresh; the api process migrates the database, accepts the jobs and stops.
prepare() {
    local deadline
    mkdir -p "$workdir/$4"
    start_private_redis 16900 "$workdir/$4"
    new_db "$2"
    spawn "$1" api "$2" "$workdir/$4/api.log"
    deadline=$((SECONDS + 60))
    until [[ "$(http_status "$port" /readyz || true)" == 200 ]]; do
        kill -0 "$service_pid" 2>/dev/null || die "the api exited: $(tail -n 5 "$workdir/$4/api.log")"
        ((SECONDS < deadline)) || die "the api was not ready within 60 s; see $workdir/$4/api.log"
        sleep 0.1
    done
    python3 bench/scaling.py fill "http://127.0.0.1:$port" "$3" "$nonce-$4" "$workdir/tokens.txt" ||
        die "filling the backlog failed ($4)"
    stop_pid "$service_pid" 10
    service_pid=""
    [[ "$(psql -X -A -t -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$2" -c 'SELECT count(*) FROM summaries')" == 0 ]] ||
        die "summaries exist before the worker started ($4)"
}

# The drain: $1 = binary, $2 = database, $3 = jobs, $4 = run name. Starts the worker and
# returns once the summaries table holds $3 rows, the worker still running (the caller
# stops it). One psql session counts the rows every 20 ms (\watch), with Postgres's clock,
# into samples.txt: a process per poll would take CPU from the run it measures. Sets
# t_spawn (epoch s) and cpu_ticks (the worker's utime + stime when the count was seen).
drain() {
    local dir="$workdir/$4" deadline last n
    spawn "$1" worker "$2" "$dir/worker.log"
    t_spawn=$(date +%s.%N)
    : >"$dir/samples.txt"
    printf 'SELECT extract(epoch FROM clock_timestamp()), count(*) FROM summaries \\watch 0.02\n' |
        psql -X -A -t -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$2" -F ' ' >"$dir/samples.txt" 2>&1 &
    watch_pid=$!
    deadline=$((SECONDS + 600))
    while :; do
        last=$(tail -n 1 "$dir/samples.txt")
        n=${last#* }
        [[ -n "$last" && "$n" =~ ^[0-9]+$ ]] && ((n >= $3)) && break
        kill -0 "$service_pid" 2>/dev/null || die "the worker exited: $(tail -n 5 "$dir/worker.log")"
        kill -0 "$watch_pid" 2>/dev/null || die "the row count stopped: $(tail -n 5 "$dir/samples.txt")"
        ((SECONDS < deadline)) || die "the drain did not finish within 600 s ($n of $3; $4)"
        sleep 0.01
    done
    cpu_ticks=$(awk '{ print $14 + $15 }' "/proc/$service_pid/stat")
    stop_pid "$watch_pid" 2
    watch_pid=""
}

finish_run() { # $1 = database: stop the worker and Redis, drop the database
    stop_pid "$service_pid" 10
    service_pid=""
    stop_pid "$redis_pid" 10
    redis_pid=""
    drop_db "$1"
}

clk_tck=$(getconf CLK_TCK)
# One timed run: $1 = build index, $2 = round. Appends
# "jobs_per_s steady_jobs_per_s cpu_ms_per_job cmds_per_job reads_per_job redis_cpu_ms_per_job"
# to $workdir/<name>.runs and the Redis delta to $workdir/<name>.delta.
timed_run() {
    local i=$1 r=$2 name=${names[$1]} run db dir rates cmds
    run="$name-$r"
    db="summaryd_ab_drain_${name}_${r}_$nonce"
    dir="$workdir/$run"
    prepare "${bins[$i]}" "$db" "$JOBS" "$run"
    redis_counts_snapshot "$rport" "$dir/redis-before.txt"
    drain "${bins[$i]}" "$db" "$JOBS" "$run"
    redis_counts_snapshot "$rport" "$dir/redis-after.txt"
    finish_run "$db"
    redis_counts_delta "$dir/redis-before.txt" "$dir/redis-after.txt" >"$dir/redis-delta.txt"
    cat "$dir/redis-delta.txt" >>"$workdir/$name.delta"
    # jobs/s: from the spawn to the sample that saw every job. Steady: between the samples
    # that first saw 10 % and 90 % done (start-up and tail left out), as bench/scaling.sh.
    rates=$(awk -v t0="$t_spawn" -v jobs="$JOBS" '
        $2 ~ /^[0-9]+$/ {
            if (t10 == "" && $2 >= jobs * 0.1) { t10 = $1; n10 = $2 }
            if (t90 == "" && $2 >= jobs * 0.9) { t90 = $1; n90 = $2 }
            if ($2 >= jobs && tend == "") tend = $1
        }
        END { printf "%.1f %.1f", jobs / (tend - t0), (t90 > t10) ? (n90 - n10) / (t90 - t10) : jobs / (tend - t0) }' "$dir/samples.txt")
    cmds=$(redis_counts_summary "$dir/redis-delta.txt" "$JOBS" 0)
    printf '%s %s %s\n' "$rates" "$(awk -v t="$cpu_ticks" -v hz="$clk_tck" -v n="$JOBS" 'BEGIN { printf "%.3f", t / hz * 1000 / n }')" \
        "${cmds% *}" >>"$workdir/$name.runs"
    read -r rate steady cpu cpj rpj rcpu < <(tail -n 1 "$workdir/$name.runs")
    printf 'round %s  %-4s %8s jobs/s (10-90 %%: %8s)  worker %6s CPU ms/job  Redis: %6s cmds/job, %5s reads/job, %6s CPU ms/job  load %s\n' \
        "$r" "$name" "$rate" "$steady" "$cpu" "$cpj" "$rpj" "$rcpu" "$(cut -d' ' -f1 /proc/loadavg)"
}

# The MONITOR sample of build $1, untimed: its clients' requests per job.
monitor_run() {
    local i=$1 name=${names[$1]} run db dir
    run="$name-monitor"
    db="summaryd_ab_drain_${name}_monitor_$nonce"
    dir="$workdir/$run"
    prepare "${bins[$i]}" "$db" "$MONITOR_JOBS" "$run"
    redis_monitor_start "$rport" "$dir/monitor.txt"
    drain "${bins[$i]}" "$db" "$MONITOR_JOBS" "$run"
    redis_monitor_stop
    finish_run "$db"
    redis_monitor_summary "$dir/monitor.txt" "$MONITOR_JOBS" 8 >"$workdir/$name.monitor"
}

# --- the Postgres ceiling's database, once; emptied before each pgbench run -----------------
pg_db="summaryd_ab_drain_pgbench_$nonce"
new_db "$pg_db"
while IFS= read -r migration; do
    psql -X -q -w -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$pg_db" \
        -f "$migration" >/dev/null
done < <(find migrations -name 'V*__*.sql' | sort -V)
pg_clients=$((CONSUMERS < PG_POOL_CAP ? CONSUMERS : PG_POOL_CAP))
ceiling_run() { # $1 = round; appends the tps to $workdir/ceiling.runs
    psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$pg_db" -c 'TRUNCATE summaries, outbox' >/dev/null
    timeout $((PGBENCH_S + 60)) pgbench -n -M prepared -f bench/commit_txn.sql \
        -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$pg_clients" -j $((pg_clients < 2 ? 1 : 2)) \
        -T "$PGBENCH_S" "$pg_db" >"$workdir/pgbench-$1.txt" 2>&1 ||
        die "pgbench failed: $(tail -n 5 "$workdir/pgbench-$1.txt")"
    awk '/^tps = / { printf "%.0f\n", $3; exit }' "$workdir/pgbench-$1.txt" >>"$workdir/ceiling.runs"
    printf 'round %s  pgbench %s clients, bench/commit_txn.sql: %s tps\n' "$1" "$pg_clients" "$(tail -n 1 "$workdir/ceiling.runs")"
}

echo "drain of $JOBS jobs, $CONSUMERS consumers, builtin summariser, worker role only; $ROUNDS rounds"
if ((MONITOR_JOBS > 0)); then
    for i in 0 1; do monitor_run "$i"; done
fi
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then order=(0 1); else order=(1 0); fi
    for i in "${order[@]}"; do timed_run "$i" "$r"; done
    ceiling_run "$r"
    # This round's ratios new/base, from the last line of each build's runs.
    paste -d' ' <(tail -n 1 "$workdir/base.runs") <(tail -n 1 "$workdir/new.runs") |
        awk '{ printf "%.3f %.3f %.3f\n", $7 / $1, $9 / $3, $3 / $9 }' >>"$workdir/ratios.txt"
    read -r q_rate q_cpu q_core < <(tail -n 1 "$workdir/ratios.txt")
    printf 'round %s  new/base: jobs/s %s, worker CPU ms/job %s, jobs/s per core %s; ÷ this round'"'"'s ceiling: base %s, new %s\n' \
        "$r" "$q_rate" "$q_cpu" "$q_core" \
        "$(awk -v a="$(tail -n 1 "$workdir/base.runs" | cut -d' ' -f1)" -v c="$(tail -n 1 "$workdir/ceiling.runs")" 'BEGIN { printf "%.3f", a / c }')" \
        "$(awk -v a="$(tail -n 1 "$workdir/new.runs" | cut -d' ' -f1)" -v c="$(tail -n 1 "$workdir/ceiling.runs")" 'BEGIN { printf "%.3f", a / c }')"
done

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { cut -d' ' -f"$2" "$workdir/$1.runs" | median; } # $1 = base|new, $2 = column
ceiling=$(median <"$workdir/ceiling.runs")
echo
echo "medians of $ROUNDS rounds (pgbench ceiling at $pg_clients clients: median $ceiling tps; rounds: $(paste -sd' ' "$workdir/ceiling.runs")):"
printf '%-5s %10s %12s %12s %14s %10s %10s %11s %13s\n' build "jobs/s" "10-90% j/s" "CPU ms/job" "jobs/s/core" "÷ ceiling" "cmds/job" "reads/job" "Redis ms/job"
for name in base new; do
    printf '%-5s %10s %12s %12s %14.0f %10.3f %10s %11s %13s\n' "$name" "$(col "$name" 1)" "$(col "$name" 2)" \
        "$(col "$name" 3)" "$(awk -v c="$(col "$name" 3)" 'BEGIN { print 1000 / c }')" \
        "$(awk -v a="$(col "$name" 1)" -v b="$ceiling" 'BEGIN { print a / b }')" \
        "$(col "$name" 4)" "$(col "$name" 5)" "$(col "$name" 6)"
done
printf 'new/base, median of the rounds'"'"' ratios: jobs/s %s, worker CPU ms/job %s, jobs/s per core %s\n' \
    "$(cut -d' ' -f1 "$workdir/ratios.txt" | median)" "$(cut -d' ' -f2 "$workdir/ratios.txt" | median)" \
    "$(cut -d' ' -f3 "$workdir/ratios.txt" | median)"
echo
echo "Redis per job over every timed run (INFO commandstats, commands a script runs included; INFO stats read events):"
for name in base new; do
    read -r cpj rpj rcpu top < <(redis_counts_summary "$workdir/$name.delta" $((JOBS * ROUNDS)) 10)
    printf '  %-4s %s commands, %s reads, %s Redis CPU ms; most run: %s\n' "$name" "$cpj" "$rpj" "$rcpu" "$top"
done
if ((MONITOR_JOBS > 0)); then
    echo "Requests the worker sent per job (MONITOR over one untimed drain of $MONITOR_JOBS jobs; a MULTI … EXEC block once):"
    for name in base new; do
        read -r sent scripted top <"$workdir/$name.monitor"
        printf '  %-4s %s sent, %s run by scripts; most sent: %s\n' "$name" "$sent" "$scripted" "$top"
    done
fi
