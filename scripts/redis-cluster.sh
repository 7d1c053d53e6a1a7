#!/usr/bin/env bash
# A throwaway local Redis Cluster for tests and benchmarks: three masters, one replica each.
#
#   scripts/redis-cluster.sh start DIR BASE_PORT [REDIS_SERVER_ARG...]
#   scripts/redis-cluster.sh stop DIR
#   scripts/redis-cluster.sh restart-node DIR PORT [REDIS_SERVER_ARG...]
#
# `start` runs six redis-server processes on 127.0.0.1, ports BASE_PORT..BASE_PORT+5 (their
# cluster bus on the port + 10000, so both ranges must be free), each with its pidfile, log
# and nodes file in DIR; joins them with `redis-cli --cluster create --cluster-replicas 1`;
# and returns once every node reports cluster_state:ok and every replica is in sync with its
# master, so a failover right after start finds a replica that has the data. Extra arguments
# go to every redis-server (later arguments win). It prints nothing unless something fails;
# on failure it stops what it started and exits non-zero.
#
# `restart-node` starts one node of that cluster again (after a kill) with its nodes file,
# so it rejoins the cluster (as a replica, once another node has taken over its slots).
#
# `stop` kills the servers whose pidfiles are in DIR (TERM, then KILL after 10 s). Only
# processes that are still redis-server are signalled, so a stale pidfile whose pid was
# reused is left alone.
#
# Persistence is off and diskless replica sync is off (it was seen to hang on small CI
# machines). The node timeout is 1 s so a killed master is noticed quickly.
#
# Environment:
#   REDIS_CLUSTER_TIMEOUT_S  how long to wait for the cluster (default 60).
#   REDIS_CLUSTER_TLS=1      the node ports (and the cluster bus and replication) speak TLS
#                            only; pass the certificate files as REDIS_SERVER_ARGs
#                            (--tls-cert-file, --tls-key-file, --tls-ca-cert-file, and
#                            --tls-client-cert-file/--tls-client-key-file: the bus always
#                            asks the connecting node for a client certificate)
#   REDIS_CLUSTER_CLI_ARGS   extra redis-cli arguments for this script's own checks, e.g.
#                            "--cacert ca.pem" with TLS (word-split; no spaces in paths)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=6

die() {
    printf 'redis-cluster: ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    die "usage: $0 start DIR BASE_PORT [REDIS_SERVER_ARG...] | $0 stop DIR | $0 restart-node DIR PORT [REDIS_SERVER_ARG...]"
}

ensure_tools() {
    if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
        return 0
    fi
    # shellcheck source=scripts/deps.sh
    SUMMARYD_DEPS_FUNCTIONS_ONLY=1 . "$SCRIPT_DIR/deps.sh"
    _deps_apt_install redis-server redis-tools >&2
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 ||
        die "redis-server/redis-cli still missing after installing redis-server redis-tools"
}

# The pid in a pidfile, when that process is alive and is a redis-server.
live_redis_pid() {
    local pidfile=$1 pid comm
    [[ -f "$pidfile" ]] || return 1
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ "$comm" == redis-server* ]] || return 1
    printf '%s' "$pid"
}

cmd_stop() {
    local dir=$1 pidfile pid pids=() deadline
    [[ -d "$dir" ]] || return 0
    for pidfile in "$dir"/redis-*.pid; do
        [[ -e "$pidfile" ]] || continue
        if pid=$(live_redis_pid "$pidfile"); then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
        rm -f "$pidfile"
    done
    deadline=$((SECONDS + 10))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.1
        done
    done
}

# shellcheck disable=SC2016 # $0 expands in the child bash, on purpose
port_open() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"' "$1" 2>/dev/null
}

# shellcheck disable=SC2206 # word splitting of the extra arguments is meant
CLI_ARGS=(${REDIS_CLUSTER_CLI_ARGS:-})
if [[ "${REDIS_CLUSTER_TLS:-0}" == 1 ]]; then
    CLI_ARGS=(--tls "${CLI_ARGS[@]}")
fi

cli() {
    local port=$1
    shift
    redis-cli "${CLI_ARGS[@]}" -h 127.0.0.1 -p "$port" "$@"
}

cluster_ok_everywhere() {
    local port
    for port in "${PORTS[@]}"; do
        [[ "$(cli "$port" CLUSTER INFO 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p')" == ok ]] ||
            return 1
    done
}

replicas_in_sync() {
    local port info masters=0 synced=0
    for port in "${PORTS[@]}"; do
        info=$(cli "$port" INFO replication 2>/dev/null | tr -d '\r') || return 1
        case "$info" in
        *role:master*) masters=$((masters + 1)) ;;
        *role:slave*)
            [[ "$info" == *master_link_status:up* && "$info" != *master_sync_in_progress:1* ]] || return 1
            synced=$((synced + 1))
            ;;
        *) return 1 ;;
        esac
    done
    ((masters == NODES / 2 && synced == NODES / 2))
}

wait_until() {
    local check=$1 what=$2 deadline=$((SECONDS + ${REDIS_CLUSTER_TIMEOUT_S:-60}))
    until "$check"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

fail_start() {
    local dir=$1
    shift
    printf 'redis-cluster: ERROR: %s (logs in %s)\n' "$*" "$dir" >&2
    cmd_stop "$dir"
    exit 1
}

start_node() {
    local dir=$1 port=$2
    shift 2
    local ports=(--port "$port")
    if [[ "${REDIS_CLUSTER_TLS:-0}" == 1 ]]; then
        ports=(--port 0 --tls-port "$port" --tls-cluster yes --tls-replication yes)
    fi
    redis-server "${ports[@]}" --bind 127.0.0.1 --dir "$dir" \
        --cluster-enabled yes --cluster-config-file "$dir/nodes-$port.conf" \
        --cluster-node-timeout 1000 \
        --repl-diskless-sync no --save '' --appendonly no \
        --daemonize yes --pidfile "$dir/redis-$port.pid" --logfile "$dir/redis-$port.log" \
        "$@" >/dev/null 2>"$dir/start-$port.err" || return 1
    rm -f "$dir/start-$port.err"
}

cmd_restart_node() {
    local dir=$1 port=$2
    shift 2
    [[ -f "$dir/nodes-$port.conf" ]] || die "no node on port $port in $dir"
    dir=$(cd "$dir" && pwd)
    if live_redis_pid "$dir/redis-$port.pid" >/dev/null; then
        die "the node on port $port is still running"
    fi
    port_open "$port" && die "port $port is already in use"
    start_node "$dir" "$port" "$@" || die "redis-server on port $port did not start: $(cat "$dir/start-$port.err")"
    # shellcheck disable=SC2317 # called through wait_until
    pong() { [[ "$(cli "$port" PING 2>/dev/null)" == PONG ]]; }
    wait_until pong "port $port" || die "redis-server on port $port does not answer (log: $dir/redis-$port.log)"
}

cmd_start() {
    local dir=$1 base=$2 port i
    shift 2
    [[ "$base" =~ ^[0-9]+$ ]] && ((base >= 1 && base + NODES - 1 + 10000 <= 65535)) ||
        die "BASE_PORT must leave room for the cluster bus (port + 10000 <= 65535), got '$base'"
    ensure_tools
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    PORTS=()
    for ((i = 0; i < NODES; i++)); do
        PORTS+=($((base + i)))
    done
    for port in "${PORTS[@]}"; do
        # A server already listening there would answer our PINGs in place of the new node.
        if port_open "$port" || port_open $((port + 10000)); then
            die "port $port or its cluster bus port $((port + 10000)) is already in use"
        fi
        if live_redis_pid "$dir/redis-$port.pid" >/dev/null; then
            die "a redis-server from $dir/redis-$port.pid is still running; run '$0 stop $dir' first"
        fi
        # A nodes file from an earlier run would make this node rejoin that old cluster.
        rm -f "$dir/nodes-$port.conf" "$dir/redis-$port.log"
    done
    for port in "${PORTS[@]}"; do
        start_node "$dir" "$port" "$@" ||
            fail_start "$dir" "redis-server on port $port did not start: $(cat "$dir/start-$port.err")"
    done
    for port in "${PORTS[@]}"; do
        # shellcheck disable=SC2317 # called through wait_until
        pong() { [[ "$(cli "$port" PING 2>/dev/null)" == PONG ]]; }
        wait_until pong "port $port" || fail_start "$dir" "redis-server on port $port does not answer"
    done
    local addrs=()
    for port in "${PORTS[@]}"; do
        addrs+=("127.0.0.1:$port")
    done
    # redis-cli waits forever for nodes that cannot meet (e.g. a TLS bus that fails).
    timeout "${REDIS_CLUSTER_TIMEOUT_S:-60}" \
        redis-cli "${CLI_ARGS[@]}" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$dir/create.log" 2>&1 ||
        fail_start "$dir" "redis-cli --cluster create failed: $(tail -n 5 "$dir/create.log")"
    wait_until cluster_ok_everywhere "cluster_state:ok" ||
        fail_start "$dir" "cluster_state did not become ok on every node"
    wait_until replicas_in_sync "replicas in sync" ||
        fail_start "$dir" "replicas did not finish their first sync"
}

case "${1:-}" in
start)
    (($# >= 3)) || usage
    shift
    cmd_start "$@"
    ;;
stop)
    (($# == 2)) || usage
    cmd_stop "$2"
    ;;
restart-node)
    (($# >= 3)) || usage
    shift
    cmd_restart_node "$@"
    ;;
*) usage ;;
esac
