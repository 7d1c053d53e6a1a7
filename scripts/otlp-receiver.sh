#!/usr/bin/env bash
# Start the OTLP/HTTP trace receiver of the tests and benchmarks
# (tests/support/otlp_receiver.py, which says what it serves); arguments go to it:
#
#   scripts/otlp-receiver.sh                 # prints `LISTENING <port>`, then serves
#   scripts/otlp-receiver.sh --delay-s 5     # a slow collector
#   scripts/otlp-receiver.sh --status 503    # a collector that refuses every export
#
# Its packages (`opentelemetry-proto` and `protobuf` from PyPI) are installed when missing
# into a Python venv under $SUMMARYD_TEST_TOOLS (default ~/.cache/summaryd/test-tools),
# python3 and its venv module from apt when the machine has none. A second run reinstalls
# nothing. Tests start receivers concurrently, so the check and the install happen under a
# lock on a file in that directory.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

tools=${SUMMARYD_TEST_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/summaryd/test-tools}
# Pinned together so a new upstream release cannot change what decodes: this
# opentelemetry-proto's generated classes require this protobuf runtime's major version.
requirements=(opentelemetry-proto==1.45.2 protobuf==7.36.2)

say() { echo "otlp-receiver: $*" >&2; }

mkdir -p "$tools"
venv="$tools/otlp-venv"
stamp="$venv/.requirements"
# Held until the venv is known to be complete; released before the receiver runs, so
# concurrent receivers only wait for an install, never for each other.
exec 9>"$tools/otlp-venv.lock"
flock 9
if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "${requirements[*]}" ]]; then
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        say "installing python3 and python3-venv (Debian packages)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    fi
    say "installing ${requirements[*]} into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # stdout is the receiver's (`LISTENING <port>`): pip's output goes to stderr.
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input "${requirements[@]}" >&2
    echo "${requirements[*]}" >"$stamp"
fi
flock -u 9
exec 9>&-

# -u: the LISTENING line must not wait in a buffer.
exec "$venv/bin/python" -u "$repo_root/tests/support/otlp_receiver.py" "$@"
