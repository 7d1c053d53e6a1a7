#!/usr/bin/env bash
# Run the whole test suite (unit tests and the integration binary tests/it) against the
# real Postgres and Redis that scripts/deps.sh makes sure are running.
#
#   scripts/test.sh                     # everything
#   scripts/test.sh --test it relay     # extra arguments go to `cargo test`
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
exec cargo test --locked "$@"
