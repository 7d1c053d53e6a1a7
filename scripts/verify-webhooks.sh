#!/usr/bin/env bash
# Verify webhook requests with the Standard Webhooks reference library (`standardwebhooks`
# from PyPI), for the tests (tests/support/standard_webhooks.rs): JSON lines in on stdin,
# one verdict per line out on stdout; scripts/verify-webhooks.py says what a line holds.
#
#   printf '%s\n' '{"secret": "whsec_...", "headers": {...}, "body": "..."}' \
#       | scripts/verify-webhooks.sh
#
# The library is installed when missing into a Python venv under $SUMMARYD_TEST_TOOLS
# (default ~/.cache/summaryd/test-tools), python3 and its venv module from apt when the
# machine has none. A second run reinstalls nothing. Tests run this concurrently, so the
# check and the install happen under a lock on a file in that directory.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

tools=${SUMMARYD_TEST_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/summaryd/test-tools}
# Pinned so a new upstream release cannot change what verifies. 1.1.0 has no dependencies.
requirements=(standardwebhooks==1.1.0)

say() { echo "verify-webhooks: $*" >&2; }

mkdir -p "$tools"
venv="$tools/webhooks-venv"
stamp="$venv/.requirements"
# Held until the venv is known to be complete; released before the verifier runs, so
# concurrent calls only wait for an install, never for each other.
exec 9>"$tools/webhooks-venv.lock"
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
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input "${requirements[@]}"
    echo "${requirements[*]}" >"$stamp"
fi
flock -u 9
exec 9>&-

exec "$venv/bin/python" "$repo_root/scripts/verify-webhooks.py"
