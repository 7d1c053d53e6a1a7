#!/usr/bin/env bash
# Fair scheduling between tenants (bench/fairness.rs), on a private Redis and the local
# Postgres:
#
#   bench/fairness.sh
#
# Prints how long tenant b's jobs take behind tenant a's backlog against the same jobs alone
# (b_ratio), and tenant a's jobs/s alone through its lane against the same jobs put straight
# on the job stream, the path before lanes (a_ratio). Nothing asserts a time: the ratios are
# what to compare across commits. Builds the benchmark in the release profile first (minutes
# on a cold target directory).
#
# Settings (environment): BENCH_CONSUMERS (8), BENCH_LATENCY_MS (200), BENCH_A_JOBS (2000),
# BENCH_B_JOBS (10).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
PG_BASE="postgres://postgres@127.0.0.1:${SUMMARYD_DEPS_PG_PORT:-5432}"

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=bench/private_redis.sh
. bench/private_redis.sh
workdir=$(mktemp -d "${TMPDIR:-/tmp}/summaryd-fairness.XXXXXX")
redis_pid=""
trap 'kill $redis_pid 2>/dev/null; rm -rf "$workdir"' EXIT

echo "bench: cargo bench --bench fairness --no-run" >&2
bin=$(cargo bench --locked --bench fairness --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*fairness[^"]*\)".*/\1/p' | tail -n 1)
[[ -n "$bin" && -x "$bin" ]] || {
    echo "bench: ERROR: could not build the fairness benchmark" >&2
    exit 1
}
start_private_redis 16800 "$workdir"
BENCH_PG_URL="$PG_BASE" BENCH_REDIS_URL="$redis_url" timeout 1800 "$bin" --bench
