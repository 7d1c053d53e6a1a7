# shellcheck shell=bash
# shellcheck disable=SC2154 # the globals are bench/scaling.sh's
# Helpers of bench/scaling.sh, sourced by it after its settings, workdir and tokens: CPU
# accounting, the Redis targets (one server, or a local cluster with its shards spread over
# the primaries) and their same-run ceiling, the summaryd processes, and the load generator.
# They read and set the script's globals (workdir, services, ports, primaries, …).

# --- CPU accounting ---------------------------------------------------------------------------
clk_tck=$(getconf CLK_TCK)
# CPU seconds the processes given have used (user + system; /proc/PID/stat fields 14, 15).
procs_cpu_s() {
    local p total=0 ticks
    for p in "$@"; do
        ticks=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)
        total=$((total + ticks))
    done
    awk -v t="$total" -v hz="$clk_tck" 'BEGIN { printf "%.3f", t / hz }'
}
# CPU seconds every Redis node of the target has used (INFO cpu, its threads included).
redis_cpu_s() {
    local port
    for port in "${redis_ports[@]}"; do
        redis-cli -h 127.0.0.1 -p "$port" INFO cpu | tr -d '\r' |
            awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { print s + 0 }'
    done | awk '{ s += $1 } END { printf "%.3f", s }'
}
# "busy total" jiffies of the whole machine (/proc/stat's first line; idle and iowait idle).
machine_jiffies() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
cpu_mark() { # sets the mark_* variables
    mark_wall=$(date +%s.%N)
    mark_redis=$(redis_cpu_s)
    mark_service=$(procs_cpu_s "${services[@]}")
    read -r mark_busy mark_total < <(machine_jiffies)
}
# Cores in use since the last mark: redis, summaryd, machine; then the 1-minute load average
# (other work on the machine shows there).
cpu_since_mark() {
    local wall redis service busy total
    wall=$(awk -v a="$mark_wall" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    redis=$(redis_cpu_s)
    service=$(procs_cpu_s "${services[@]}")
    read -r busy total < <(machine_jiffies)
    awk -v w="$wall" -v r0="$mark_redis" -v r1="$redis" -v s0="$mark_service" -v s1="$service" \
        -v b0="$mark_busy" -v b1="$busy" -v t0="$mark_total" -v t1="$total" -v n="$CORES" \
        -v l="$(cut -d' ' -f1 /proc/loadavg)" \
        'BEGIN { printf "%.2f %.2f %.2f %s\n", (r1 - r0) / w, (s1 - s0) / w, (t1 > t0) ? (b1 - b0) / (t1 - t0) * n : 0, l }'
}

# --- targets ------------------------------------------------------------------------------------
# Sets redis_url, shards, primaries (ports) and redis_ports (every node's port).
start_target() {
    case $1 in
    single | sharded)
        mkdir -p "$workdir/redis"
        start_private_redis 16700 "$workdir/redis"
        shards=1
        [[ $1 == sharded ]] && shards=$CLUSTER_SHARDS
        primaries=("$rport")
        redis_ports=("$rport")
        ;;
    cluster)
        cluster_dir="$workdir/cluster"
        mkdir -p "$cluster_dir"
        local base
        base=$(cluster_base_port 17100)
        "$CLUSTER_SCRIPT" start "$cluster_dir" "$base" >"$workdir/cluster-start.log" 2>&1 ||
            die "$CLUSTER_SCRIPT start failed: $(tail -n 5 "$workdir/cluster-start.log")"
        redis-cli -h 127.0.0.1 -p "$base" CLUSTER NODES | tr -d '\r' >"$workdir/cluster-nodes.txt"
        mapfile -t primaries < <(awk '$3 ~ /master/ && $3 !~ /fail/ { split($2, a, "[:@]"); print a[2] }' "$workdir/cluster-nodes.txt")
        mapfile -t redis_ports < <(awk '{ split($2, a, "[:@]"); print a[2] }' "$workdir/cluster-nodes.txt")
        ((${#primaries[@]} >= 2)) || die "the cluster has ${#primaries[@]} primaries: $(cat "$workdir/cluster-nodes.txt")"
        redis_url="redis+cluster://127.0.0.1:$base"
        shards=$CLUSTER_SHARDS
        spread_shards
        ;;
    esac
    log "target $1: $redis_url (primaries: ${primaries[*]}; SUMMARYD_STREAM_SHARDS=$shards)"
}
# First port from $1 (in steps of 10) where the cluster's six ports and their bus ports
# (+10000) are all free.
cluster_base_port() {
    local base i busy
    for ((base = $1; base < $1 + 1000; base += 10)); do
        busy=0
        for ((i = 0; i < 6; i++)); do
            if _deps_tcp_open 127.0.0.1 $((base + i)) || _deps_tcp_open 127.0.0.1 $((base + i + 10000)); then
                busy=1
                break
            fi
        done
        ((busy)) || {
            echo "$base"
            return 0
        }
    done
    die "no free range of cluster ports from $1"
}
flush_target() {
    local port
    for port in "${primaries[@]}"; do redis-cli -h 127.0.0.1 -p "$port" FLUSHALL >/dev/null; done
}

# The primary (port) serving slot $1, from $workdir/cluster-nodes.txt.
slot_owner() {
    awk -v slot="$1" '$3 ~ /master/ { split($2, a, "[:@]")
        for (i = 9; i <= NF; i++) { split($i, r, "-"); if (r[2] == "") r[2] = r[1]
            if (slot >= r[1] && slot <= r[2]) { print a[2]; exit } } }' "$workdir/cluster-nodes.txt"
}
node_id() { awk -v port="$1" '{ split($2, a, "[:@]") } a[2] == port { print $1; exit }' "$workdir/cluster-nodes.txt"; }

# Shard i's keys share the hash tag s<i>, and a tag's slot is fixed (CRC16 of "s<i>"): on a
# fresh three-primary cluster s0 and s1 fall to the same primary and none to the second. So
# that the curve measures three primaries, each shard's (still empty) slot is moved to a
# primary of its own, round-robin, before any key exists; the owners are logged.
# shellcheck disable=SC2059 # SHARD_TAG is a format on purpose
spread_shards() {
    local i slot owner want src_id dst_id port
    for ((i = 0; i < shards; i++)); do
        slot=$(redis-cli -h 127.0.0.1 -p "${primaries[0]}" CLUSTER KEYSLOT "$(printf "$SHARD_TAG" "$i")")
        owner=$(slot_owner "$slot")
        want=${primaries[$((i % ${#primaries[@]}))]}
        if [[ "$owner" != "$want" ]]; then
            src_id=$(node_id "$owner")
            dst_id=$(node_id "$want")
            redis-cli -h 127.0.0.1 -p "$want" CLUSTER SETSLOT "$slot" IMPORTING "$src_id" >/dev/null
            redis-cli -h 127.0.0.1 -p "$owner" CLUSTER SETSLOT "$slot" MIGRATING "$dst_id" >/dev/null
            for port in "${primaries[@]}"; do
                redis-cli -h 127.0.0.1 -p "$port" CLUSTER SETSLOT "$slot" NODE "$dst_id" >/dev/null
            done
            redis-cli -h 127.0.0.1 -p "${primaries[0]}" CLUSTER NODES | tr -d '\r' >"$workdir/cluster-nodes.txt"
        fi
        log "shard $i (tag $(printf "$SHARD_TAG" "$i"), slot $slot): primary $(slot_owner "$slot")"
    done
    local deadline=$((SECONDS + 30))
    until redis-cli --cluster check "127.0.0.1:${primaries[0]}" >"$workdir/cluster-check.log" 2>&1; do
        ((SECONDS < deadline)) || die "the cluster did not settle after moving the shards' slots: $(tail -n 5 "$workdir/cluster-check.log")"
        sleep 0.5
    done
}

# A hash tag whose slot the primary on port $1 serves (single node: any tag).
tag_for_primary() {
    local port=$1 n slot
    [[ ${#primaries[@]} -gt 1 ]] || {
        echo ref
        return 0
    }
    for ((n = 0; n < 10000; n++)); do
        slot=$(redis-cli -h 127.0.0.1 -p "$port" CLUSTER KEYSLOT "{ref$n}")
        if awk -v port="$port" -v slot="$slot" '{ split($2, a, "[:@]") }
            a[2] == port { for (i = 9; i <= NF; i++) { split($i, r, "-"); if (r[2] == "") r[2] = r[1]
                if (slot >= r[1] && slot <= r[2]) found = 1 } }
            END { exit !found }' "$workdir/cluster-nodes.txt"; then
            echo "ref$n"
            return 0
        fi
    done
    die "no hash tag found for the primary on port $port"
}

# Intake ceiling: the enqueue script on every primary at once, CONNECTIONS clients in all,
# each primary's calls under a hash tag it serves. Prints the summed calls/s.
intake_ceiling() {
    local port sha tag i=0 j pid per=$((CONNECTIONS / ${#primaries[@]})) pids=()
    ((per > 0)) || per=1
    for port in "${primaries[@]}"; do
        sha=$(redis-cli -h 127.0.0.1 -p "$port" SCRIPT LOAD "$(cat src/stream/enqueue_once.lua)")
        [[ ${#sha} -eq 40 ]] || die "SCRIPT LOAD failed on $port: $sha"
        tag=$(tag_for_primary "$port")
        enqueue_call_args "$sha" "{$tag}:" "{$tag}:idem:__rand_int__" "{$tag}:job:__rand_int__"
        timeout 300 redis-benchmark -h 127.0.0.1 -p "$port" --csv -c "$per" \
            -n $((REDIS_REQUESTS / ${#primaries[@]})) -r 100000000000 "${enqueue_call[@]}" \
            >"$workdir/ceiling-$i.csv" 2>&1 &
        pids+=($!)
        i=$((i + 1))
    done
    for pid in "${pids[@]}"; do wait "$pid" || die "redis-benchmark failed: $(cat "$workdir"/ceiling-*.csv)"; done
    flush_target
    for ((j = 0; j < i; j++)); do
        redis_benchmark_field "$workdir/ceiling-$j.csv" rps
    done | awk '{ s += $1 } END { printf "%.0f", s }'
}

# $1 = roles, $2 = database, $3 = log name: starts one summaryd (not waiting for it); its pid
# goes to `services`, its port to `ports`.
spawn_summaryd() {
    local roles=$1 db=$2 name=$3 port
    # Processes spawned together are not listening yet: each searches from its own base.
    port=$(free_port $((18500 + ${#services[@]} * 10)))
    env SUMMARYD_LISTEN="127.0.0.1:$port" SUMMARYD_KEY_PREFIX="scale:$nonce:" \
        SUMMARYD_REDIS_URL="$redis_url" SUMMARYD_STREAM_SHARDS="$shards" \
        SUMMARYD_DATABASE_URL="$PG_BASE/$db?sslmode=disable" \
        SUMMARYD_AUTH_TOKENS_FILE="$workdir/tokens.toml" \
        SUMMARYD_LLM_PROVIDER=builtin SUMMARYD_MAIL_PROVIDER=log \
        SUMMARYD_WORKER_CONSUMERS="$CONSUMERS" SUMMARYD_SHUTDOWN_GRACE_MS=2000 \
        SUMMARYD_LOG_FORMAT=json "$bin" serve --roles "$roles" >"$workdir/$name.log" 2>&1 &
    services+=("$!")
    ports+=("$port")
    names+=("$name")
}
# Wait until every spawned summaryd answers /readyz 200 (60 s at most each).
wait_ready() {
    local i deadline
    for i in "${!services[@]}"; do
        deadline=$((SECONDS + 60))
        until [[ "$(http_status "${ports[$i]}" /readyz || true)" == 200 ]]; do
            kill -0 "${services[$i]}" 2>/dev/null ||
                die "summaryd ${names[$i]} exited before it was ready: $(tail -n 5 "$workdir/${names[$i]}.log")"
            ((SECONDS < deadline)) || die "summaryd ${names[$i]} not ready within 60 s; see $workdir/${names[$i]}.log"
            sleep 0.1
        done
    done
}
# Every summaryd spawned is still running (a worker that died would stall the drain).
all_alive() {
    local i
    for i in "${!services[@]}"; do
        kill -0 "${services[$i]}" 2>/dev/null ||
            die "summaryd ${names[$i]} exited: $(tail -n 5 "$workdir/${names[$i]}.log")"
    done
}
api_urls() {
    local port
    for port in "${ports[@]}"; do echo "http://127.0.0.1:$port"; done
}
summaries_count() { psql -X -A -t -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$1" -c 'SELECT count(*) FROM summaries'; }
new_db() {
    dbs+=("$1")
    psql_admin -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null 2>&1
    psql_admin -c "CREATE DATABASE $1" >/dev/null
}

# p50 and p99 in ms of the merged "microseconds count" histograms given.
merged_percentiles() {
    cat "$@" | awk '{ c[$1] += $2 } END { for (v in c) print v, c[v] }' | sort -n |
        awk '{ v[NR] = $1; n[NR] = $2; t += $2 }
        END { for (i = 1; i <= NR; i++) { a += n[i]
                if (p50 == "" && a >= t * 0.50) p50 = v[i]
                if (p99 == "" && a >= t * 0.99) p99 = v[i] }
              printf "%.3f %.3f\n", p50 / 1000, p99 / 1000 }'
}
wrk_field() { sed -n 's/^BENCH //p' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# One wrk against each of the first $1 api processes, all at once; $2 = seconds, $3 = run name.
run_wrk_all() {
    local n=$1 secs=$2 name=$3 i pid pids=() threads conns urls
    mapfile -t urls < <(api_urls)
    threads=$((n == 1 ? 2 : 1))
    conns=$((CONNECTIONS / n))
    for ((i = 0; i < n; i++)); do
        BENCH_HIST_FILE="$workdir/$name-$i.hist" timeout $((secs + 60)) \
            wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 5s -s bench/post_tenants.lua \
            "${urls[$i]}" -- "$nonce-$name-$i" "${tokens[@]}" >"$workdir/$name-$i.txt" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || die "wrk failed ($name): $(cat "$workdir/$name"-*.txt)"; done
}
