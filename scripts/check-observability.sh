#!/usr/bin/env bash
# Check the monitoring that ships with summaryd: the Prometheus alert rules
# (deploy/prometheus/summaryd-rules.yaml: syntax, and the unit tests in
# deploy/prometheus/tests/ that make each alert fire and stay quiet) and the Grafana
# dashboard (deploy/grafana/summaryd.json: valid JSON, every query valid PromQL naming only
# metrics summaryd exports). Part of CI (.ci/run).
#
#   scripts/check-observability.sh
#
# Needs promtool (Debian package `prometheus`), python3 and PyYAML. Run as root, it installs
# whichever is missing with apt-get; when all are present it takes about a second. Note that
# on a host running systemd, installing the `prometheus` package also enables and starts a
# Prometheus server on port 9090 (in containers the package's service is not started).
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

install_missing() {
    local missing=()
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    python3 -c 'import yaml' >/dev/null 2>&1 || missing+=(python3-yaml)
    ((${#missing[@]} == 0)) && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "check-observability: missing ${missing[*]}; install with:" >&2
        echo "  apt-get install --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
    # Refresh the package lists only when apt does not know a package yet (a fresh image
    # ships without lists); the update is the slow part of an install.
    local pkg candidate
    for pkg in "${missing[@]}"; do
        candidate=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ { print $2 }')
        if [[ -z $candidate || $candidate == "(none)" ]]; then
            apt-get update -qq
            break
        fi
    done
    echo "check-observability: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

install_missing
echo "check-observability: promtool check rules" >&2
promtool check rules deploy/prometheus/summaryd-rules.yaml
echo "check-observability: promtool test rules" >&2
promtool test rules deploy/prometheus/tests/*.yaml
echo "check-observability: dashboard and rule conventions" >&2
python3 scripts/check-observability.py
