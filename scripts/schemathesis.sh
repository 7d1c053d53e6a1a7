#!/usr/bin/env bash
# Fuzz a running summaryd against its own OpenAPI document with schemathesis (from PyPI):
# every response must be documented (status, content type, headers, schema) and none 5xx.
#
#   scripts/schemathesis.sh http://127.0.0.1:8080
#
# Installs a pinned schemathesis into target/schemathesis-venv on first use (python3 and
# its venv module come from apt on Debian/Ubuntu when missing). The run is reproducible:
# by default in schemathesis' deterministic mode, which generates the same cases every run
# in every phase (a fixed seed alone left the stateful phase drawing another case now and
# then, a surprise in CI). To explore beyond those cases, give a seed:
#   SCHEMATHESIS_SEED          seed: random generation from it instead (e.g. 20261201)
#   SCHEMATHESIS_MAX_EXAMPLES  test cases per operation and phase (default 50)
# The tests/chaos test `schemathesis_*` runs this against the real binary.
set -euo pipefail
base_url=${1:?usage: scripts/schemathesis.sh BASE_URL}
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=4.32.5
venv="${CARGO_TARGET_DIR:-$repo_root/target}/schemathesis-venv"

if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        # shellcheck source=scripts/deps.sh
        . "$repo_root/scripts/deps.sh"
        _deps_apt_install python3 python3-venv
    fi
    echo "schemathesis: installing schemathesis==$version into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

# schemathesis keeps a cache of past failures in the working directory: keep it in target/.
mkdir -p "$repo_root/target/schemathesis-report"
cd "$repo_root/target/schemathesis-report"
export SCHEMATHESIS_HOOKS=schemathesis_hooks
export PYTHONPATH="$repo_root/scripts${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n "${SCHEMATHESIS_SEED:-}" ]]; then
    generation=(--seed "$SCHEMATHESIS_SEED")
else
    generation=(--generation-deterministic)
fi
# /readyz is left out: it takes no input, and it answers 503 by design whenever Redis or
# Postgres is slow to answer its ping, which on a loaded machine says nothing about the
# API (its answers are checked in tests/it). Every other operation gets every check.
exec "$venv/bin/schemathesis" run "$base_url/openapi.json" \
    --checks all \
    --exclude-path /readyz \
    "${generation[@]}" \
    --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-50}" \
    --workers 1 \
    --request-timeout 10 \
    --suppress-health-check too_slow \
    --report junit --report-dir "$repo_root/target/schemathesis-report"
