# shellcheck shell=bash
# What a piece of work costs Redis, counted on the server: sourced by bench/run.sh and
# bench/ab_drain.sh, which run against a private Redis (bench/private_redis.sh) that nothing
# else loads, so every command it serves is the service's.
#
# Two counts, because neither alone says how many times a job waits for Redis:
#   - `INFO commandstats`: every command Redis ran, those a Lua script runs (redis.call)
#     included, so it is the work Redis does per job, but not the number of requests.
#   - `MONITOR`: one line per command as it runs; a script's own commands are the lines
#     whose source is "lua", the client's requests are the others. Counting the others
#     gives the commands the clients sent (a MULTI … EXEC block counts once, since a
#     transaction travels as one pipeline). MONITOR slows Redis down, so it only ever
#     watches a sample run that is not timed.
# And a third, from the network's side: `INFO stats` total_reads_processed, the read events
# on client sockets. A pipeline arrives in one read, and so do requests of several tasks
# that a multiplexed connection writes together; reads ÷ jobs is therefore at most the
# commands sent per job.

# redis_counts_snapshot PORT FILE: the command counters and read events of the Redis on
# 127.0.0.1:PORT, and its CPU seconds, into FILE.
redis_counts_snapshot() {
    {
        redis-cli -h 127.0.0.1 -p "$1" INFO commandstats
        redis-cli -h 127.0.0.1 -p "$1" INFO stats | grep '^total_reads_processed:'
        redis-cli -h 127.0.0.1 -p "$1" INFO cpu | grep -E '^used_cpu_(sys|user):'
    } | tr -d '\r' >"$2"
}

# redis_counts_delta BEFORE AFTER: one line "COMMAND CALLS" per command that ran between the
# two snapshots, and the pseudo-commands @reads (read events) and @cpu_ms (Redis CPU). The
# snapshots' own INFO and any CONFIG are left out: they are the benchmark's, not the
# service's.
redis_counts_delta() {
    awk -F'[:=,]' '
        FNR == 1 { file++ }
        /^cmdstat_/ { name = toupper(substr($1, 9)); v = $3 }
        /^total_reads_processed:/ { name = "@reads"; v = $2 }
        /^used_cpu_(sys|user):/ { name = "@cpu_ms"; v = $2 * 1000 }
        /^(cmdstat_|total_reads_processed:|used_cpu_)/ {
            if (name == "INFO" || name ~ /^CONFIG/) next
            if (file == 1) before[name] += v; else after[name] += v
        }
        END { for (n in after) if (after[n] - before[n] > 0) printf "%s %.3f\n", n, after[n] - before[n] }
    ' "$1" "$2"
}

# redis_counts_summary DELTA_FILE JOBS [TOP]: from the "COMMAND CALLS" lines of one or more
# deltas (concatenated; the same command may appear in several), prints
# "cmds_per_job reads_per_job redis_cpu_ms_per_job top" where top lists the TOP (default 6)
# most frequent commands per job, as CMD=x.xx joined by commas.
redis_counts_summary() {
    awk -v jobs="$2" -v top="${3:-6}" '
        { c[$1] += $2 }
        END {
            for (n in c) if (n !~ /^@/) total += c[n]
            # The most frequent first: a selection, the lists are a few dozen long.
            for (k = 0; k < top; k++) {
                best = ""
                for (n in c) if (n !~ /^@/ && !(n in used) && (best == "" || c[n] > c[best])) best = n
                if (best == "") break
                used[best] = 1
                list = list sep best "=" sprintf("%.2f", c[best] / jobs); sep = ","
            }
            printf "%.2f %.2f %.3f %s\n", total / jobs, c["@reads"] / jobs, c["@cpu_ms"] / jobs, (list == "" ? "-" : list)
        }' "$1"
}

# redis_monitor_start PORT FILE: MONITOR of the Redis on PORT into FILE, in the background
# (pid in monitor_pid; stopping it is redis_monitor_stop's, or the caller's cleanup).
# Returns once MONITOR has answered OK, so no command after this call is missed.
redis_monitor_start() {
    redis-cli -h 127.0.0.1 -p "$1" MONITOR >"$2" 2>&1 &
    monitor_pid=$!
    local deadline=$((SECONDS + 10))
    until [[ -s "$2" ]]; do
        if ((SECONDS >= deadline)); then
            printf 'bench: ERROR: MONITOR did not start on port %s\n' "$1" >&2
            return 1
        fi
        sleep 0.05
    done
}
redis_monitor_stop() {
    [[ -n "${monitor_pid:-}" ]] || return 0
    kill "$monitor_pid" 2>/dev/null || true
    wait "$monitor_pid" 2>/dev/null || true
    monitor_pid=""
}

# redis_monitor_summary FILE JOBS [TOP]: from a MONITOR capture, prints
# "sent_per_job script_run_per_job top" where sent counts the clients' own requests (a
# MULTI … EXEC block once) and top lists the TOP (default 6) most frequent of them per job.
# A line is `<time> [<db> <source>] "CMD" args…`, <source> being the client's address or
# "lua" for a command a script ran.
redis_monitor_summary() {
    awk -v jobs="$2" -v top="${3:-6}" '
        $2 !~ /^\[/ { next }
        {
            cmd = toupper($4); gsub(/"/, "", cmd)
            if ($3 == "lua]") { script++; next }
            if (cmd == "MULTI") { in_multi[$3] = 1; sent++; c["MULTI…EXEC"]++; next }
            if (in_multi[$3]) { if (cmd == "EXEC" || cmd == "DISCARD") in_multi[$3] = 0; next }
            sent++; c[cmd]++
        }
        END {
            for (k = 0; k < top; k++) {
                best = ""
                for (n in c) if (!(n in used) && (best == "" || c[n] > c[best])) best = n
                if (best == "") break
                used[best] = 1
                list = list sep best "=" sprintf("%.2f", c[best] / jobs); sep = ","
            }
            printf "%.2f %.2f %s\n", sent / jobs, script / jobs, (list == "" ? "-" : list)
        }' "$1"
}
