#!/usr/bin/env bash
# End-to-end throughput of two builds of the e2e benchmark (bench/e2e_jobs.rs), measured in
# alternation on one machine:
#
#   bench/ab_e2e.sh BASELINE_E2E_BIN CANDIDATE_E2E_BIN
#
# The binaries are what `cargo bench --bench e2e_jobs --no-run` prints as "Executable" in
# each checkout. For each consumer count, each round runs the baseline and then the
# candidate (the order swapped every other round) on the same Postgres and a private Redis,
# and prints jobs/s, when the last summary was committed, CPU ms per job and the ratio
# candidate/baseline; then the median ratio per count. Sequential sweeps (bench/run.sh
# twice) drift too much on a shared machine to resolve 10 %.
#
# Settings (environment): AB_CONSUMERS ("64 128 256"), AB_ROUNDS (3), AB_LATENCY_MS (200),
# AB_JOBS_PER_CONSUMER (25). The benchmark's own settings pass through to both builds, e.g.
# BENCH_RETENTION_S=1 (retention deleting sent rows during the run) or BENCH_PG_SSLMODE.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
[[ $# -eq 2 ]] || {
    echo "usage: $0 BASELINE_E2E_BIN CANDIDATE_E2E_BIN" >&2
    exit 2
}
bins=("$(realpath "$1")" "$(realpath "$2")")
CONSUMERS=${AB_CONSUMERS:-"64 128 256"}
ROUNDS=${AB_ROUNDS:-3}
LATENCY_MS=${AB_LATENCY_MS:-200}
PER_CONSUMER=${AB_JOBS_PER_CONSUMER:-25}
PG_BASE="postgres://postgres@127.0.0.1:${SUMMARYD_DEPS_PG_PORT:-5432}"

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=bench/private_redis.sh
. bench/private_redis.sh
workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-ab-e2e.XXXXXX")
redis_pid=""
trap 'kill $redis_pid 2>/dev/null; rm -rf "$workdir"' EXIT
start_private_redis 16700 "$workdir"

run() { # $1 = binary, $2 = consumers; prints jobs/s
    BENCH_JOBS=$(($2 * PER_CONSUMER)) BENCH_CONSUMERS=$2 BENCH_LATENCY_MS=$LATENCY_MS \
        BENCH_PG_URL="$PG_BASE" BENCH_REDIS_URL="$redis_url" \
        timeout 400 "$1" --bench >"$workdir/out.txt" 2>&1 ||
        {
            cat "$workdir/out.txt" >&2
            exit 1
        }
    field() { sed -n 's/^BENCH //p' "$workdir/out.txt" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    # A baseline built before a field existed prints "-" for it.
    printf '%s %s %s\n' "$(field jobs_per_s)" "$(field summarised_s || true)" \
        "$(field cpu_ms_per_job || true)" | awk '{ print $1, ($2 == "" ? "-" : $2), ($3 == "" ? "-" : $3) }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for c in $CONSUMERS; do
    ratios=""
    for ((r = 1; r <= ROUNDS; r++)); do
        if ((r % 2)); then order=(0 1); else order=(1 0); fi
        declare -A rate=() summarised=() cpu=()
        for i in "${order[@]}"; do
            read -r rate[$i] summarised[$i] cpu[$i] < <(run "${bins[$i]}" "$c")
        done
        ratio=$(awk -v a="${rate[1]}" -v b="${rate[0]}" 'BEGIN { printf "%.3f", a / b }')
        printf 'C=%-4s round %s  baseline %8s jobs/s (summarised %ss, %s CPU ms/job)  candidate %8s jobs/s (summarised %ss, %s CPU ms/job)  ratio %s\n' \
            "$c" "$r" "${rate[0]}" "${summarised[0]}" "${cpu[0]}" \
            "${rate[1]}" "${summarised[1]}" "${cpu[1]}" "$ratio"
        ratios+="$ratio"$'\n'
    done
    printf 'C=%-4s median ratio %s\n' "$c" "$(median <<<"${ratios%$'\n'}")"
done
