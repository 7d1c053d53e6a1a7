# The private Redis every benchmark script runs against: a redis-server on a free loopback
# port, without persistence (like the shared one), that no other client loads. Sourced by
# bench/run.sh, bench/ab_intake.sh, bench/ab_e2e.sh and bench/ab_drain.sh after scripts/deps.sh.

# First loopback port in [$1, $1 + 200) that nothing listens on (bounded: 200 tries).
free_port() {
    local p
    for ((p = $1; p < $1 + 200; p++)); do
        if ! _deps_tcp_open 127.0.0.1 "$p"; then
            echo "$p"
            return 0
        fi
    done
    printf 'bench: ERROR: no free port in %s-%s\n' "$1" "$(($1 + 199))" >&2
    return 1
}

# Start redis-server on the first free port from $1, with its files in $2 and any further
# arguments passed on; wait until it answers PING (20 s at most). Sets rport, redis_pid and
# redis_url; stopping it (redis_pid) is the caller's cleanup.
start_private_redis() {
    local first=$1 dir=$2
    shift 2
    command -v redis-server >/dev/null 2>&1 || _deps_apt_install redis-server
    rport=$(free_port "$first")
    redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no \
        --dir "$dir" --logfile "$dir/redis.log" "$@" &
    redis_pid=$!
    redis_url="redis://127.0.0.1:$rport"
    local deadline=$((SECONDS + 20))
    until [[ "$(redis-cli -h 127.0.0.1 -p "$rport" PING 2>/dev/null || true)" == PONG ]]; do
        if ((SECONDS >= deadline)); then
            printf 'bench: ERROR: private redis-server did not answer within 20 s; see %s\n' \
                "$dir/redis.log" >&2
            return 1
        fi
        sleep 0.1
    done
}
