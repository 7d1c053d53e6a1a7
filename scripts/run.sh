#!/usr/bin/env bash
# Run summaryd locally with every role (api, worker, relay) in one process, the builtin
# extractive summariser (no network, no API key) and the log mailer (emails go to the log):
# the built-in defaults of src/config/, so nothing here overrides a config file.
#
#   scripts/run.sh                      # http://127.0.0.1:8080
#   scripts/run.sh --listen 127.0.0.1:9090 --consumers 2
#
# Extra arguments go to `summaryd serve`. On start it creates the `summaryd` database if
# missing and applies migrations (pass --no-migrate to skip that).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
exec cargo run --release --locked -- serve "$@"
