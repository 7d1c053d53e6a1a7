#!/usr/bin/env bash
# Make sure the services summaryd and its tests need are up, and that cargo exists:
#   Postgres at 127.0.0.1:5432 (user postgres, trust auth over local TCP)
#   Redis    at 127.0.0.1:6379
#
# Run it (scripts/deps.sh) or source it (. scripts/deps.sh); either way it changes nothing
# when both services already answer, which is the common case. Otherwise, on Debian/Ubuntu,
# it installs what is missing from the distribution's packages and starts it WITHOUT
# systemd (containers and CI have none). A running service is never restarted or
# reconfigured. pg_hba.conf is only touched on a cluster this script installed or created.
#
# With SUMMARYD_DEPS_FUNCTIONS_ONLY=1, sourcing only defines the _deps_* helpers.
#
# Overrides (for CI images whose services live elsewhere):
#   SUMMARYD_DEPS_PG_HOST / SUMMARYD_DEPS_PG_PORT          default 127.0.0.1 / 5432
#   SUMMARYD_DEPS_REDIS_HOST / SUMMARYD_DEPS_REDIS_PORT    default 127.0.0.1 / 6379
#   SUMMARYD_DEPS_TIMEOUT_S   how long to wait for a started service (default 60)

# Put rustup's default location on PATH when the shell did not (non-login shells, sudo).
# Done outside the subshell below so that a sourcing script sees cargo too.
if ! command -v cargo >/dev/null 2>&1 && [[ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]]; then
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

_deps_log() { printf 'deps: %s\n' "$*" >&2; }
_deps_die() {
    printf 'deps: ERROR: %s\n' "$*" >&2
    exit 1
}

# Run a command as root: directly when we are root, through sudo when it exists.
_deps_as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        _deps_die "need root to run '$*' (not root and no sudo); install/start it yourself"
    fi
}

_DEPS_APT_UPDATED=0
_deps_apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        _deps_die "'$*' is missing and this is not a Debian/Ubuntu system (no apt-get); install it yourself"
    if [[ "$_DEPS_APT_UPDATED" -eq 0 ]]; then
        _deps_log "apt-get update"
        _deps_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        _DEPS_APT_UPDATED=1
    fi
    _deps_log "apt-get install -y $*"
    _deps_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# True when something accepts TCP connections on host:port. bash's /dev/tcp needs no tools;
# `timeout` bounds a connect that hangs (a filtered port never answers).
# shellcheck disable=SC2016 # $0/$1 expand in the child bash, on purpose
_deps_tcp_open() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
}

_deps_pg_answers() {
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
    else
        _deps_tcp_open "$PG_HOST" "$PG_PORT"
    fi
}

# PING over a raw socket, so a Redis without redis-cli on this machine still counts.
# shellcheck disable=SC2016 # $0/$1 expand in the child bash, on purpose
_deps_redis_answers() {
    local reply
    reply=$(timeout 2 bash -c '
        exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "PING\r\n" >&3
        IFS= read -r line <&3 && printf "%s" "$line"' "$REDIS_HOST" "$REDIS_PORT" 2>/dev/null) || return 1
    [[ "$reply" == "+PONG"* ]]
}

# Poll until "$1" succeeds, at most DEPS_TIMEOUT_S seconds.
_deps_wait_for() {
    local check=$1 what=$2 deadline=$((SECONDS + DEPS_TIMEOUT_S))
    until "$check"; do
        if ((SECONDS >= deadline)); then
            _deps_die "$what did not answer within ${DEPS_TIMEOUT_S}s"
        fi
        sleep 0.5
    done
    _deps_log "$what is up"
}

# Newest PostgreSQL major version whose server binaries are installed, or nothing.
_deps_pg_version() {
    local d
    for d in /usr/lib/postgresql/*/bin/postgres; do
        [[ -x "$d" ]] || continue
        d=${d#/usr/lib/postgresql/}
        printf '%s\n' "${d%%/*}"
    done | sort -V | tail -n 1
}

# Trust for local TCP clients: the tests and `scripts/run.sh` connect as user postgres
# without a password. Prepended, because the first matching pg_hba line wins.
_deps_pg_trust_local_tcp() {
    local hba=$1 tmp
    tmp=$(mktemp)
    {
        echo '# added by summaryd scripts/deps.sh: passwordless TCP from this machine (dev/CI only)'
        echo 'host    all    all    127.0.0.1/32    trust'
        echo 'host    all    all    ::1/128         trust'
        _deps_as_root cat "$hba"
    } >"$tmp"
    _deps_as_root cp "$tmp" "$hba"
    rm -f "$tmp"
    _deps_log "configured trust auth for 127.0.0.1 and ::1 in $hba"
}

_deps_ensure_postgres() {
    if _deps_pg_answers; then
        _deps_log "postgres answers on $PG_HOST:$PG_PORT"
        return 0
    fi
    local fresh=0 ver
    ver=$(_deps_pg_version)
    if [[ -z "$ver" ]]; then
        _deps_apt_install postgresql
        fresh=1
        ver=$(_deps_pg_version)
        [[ -n "$ver" ]] || _deps_die "postgresql installed but no server found under /usr/lib/postgresql"
    fi
    command -v pg_ctlcluster >/dev/null 2>&1 ||
        _deps_die "PostgreSQL $ver is installed without Debian's postgresql-common (no pg_ctlcluster); start it yourself on $PG_HOST:$PG_PORT"
    if [[ ! -f "/etc/postgresql/$ver/main/postgresql.conf" ]]; then
        _deps_log "creating cluster $ver/main on port $PG_PORT"
        _deps_as_root pg_createcluster --port "$PG_PORT" "$ver" main
        fresh=1
    fi
    if [[ "$fresh" -eq 1 ]]; then
        _deps_pg_trust_local_tcp "/etc/postgresql/$ver/main/pg_hba.conf"
        # apt's postinst may already have started the cluster (where a service manager
        # exists); it must re-read pg_hba.conf, or password auth stays in force.
        _deps_as_root pg_ctlcluster "$ver" main reload 2>/dev/null || true
    fi
    _deps_log "starting postgres cluster $ver/main"
    # Fails when the cluster already runs (e.g. on another port); the wait below then
    # reports that nothing answers where we expect it.
    _deps_as_root pg_ctlcluster "$ver" main start || true
    _deps_wait_for _deps_pg_answers "postgres on $PG_HOST:$PG_PORT (cluster $ver/main; check its port in /etc/postgresql/$ver/main/postgresql.conf)"
}

# Redis 6.2+ understands "-::1" (bind IPv6 loopback if it exists); older ones would refuse it.
_deps_redis_bind() {
    local v
    v=$(redis-server --version 2>/dev/null | sed -n 's/.*v=\([0-9]*\.[0-9]*\).*/\1/p')
    if [[ -n "$v" ]] && printf '6.2\n%s\n' "$v" | sort -V -C; then
        echo "127.0.0.1 -::1"
    else
        echo "127.0.0.1"
    fi
}

_deps_ensure_redis() {
    if _deps_redis_answers; then
        _deps_log "redis answers on $REDIS_HOST:$REDIS_PORT"
        return 0
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        _deps_apt_install redis-server
    fi
    # apt's postinst may have started one already (where a service manager exists).
    if ! _deps_redis_answers; then
        _deps_log "starting redis-server on port $REDIS_PORT"
        # No persistence: this instance is for development and tests only.
        # shellcheck disable=SC2046 # the bind list is meant to split into words
        redis-server --daemonize yes --bind $(_deps_redis_bind) --port "$REDIS_PORT" \
            --save "" --appendonly no
    fi
    _deps_wait_for _deps_redis_answers "redis on $REDIS_HOST:$REDIS_PORT"
}

# The TLS and durability tests start servers of their own (tests/support/servers.rs): a
# redis-server built with TLS (Debian's is) and PostgreSQL's initdb/pg_ctl. Needed even when
# the shared services run elsewhere (SUMMARYD_DEPS_*_HOST), so checked separately.
_deps_ensure_test_servers() {
    if ! command -v redis-server >/dev/null 2>&1; then
        _deps_apt_install redis-server
    fi
    # A build without TLS rejects the directive; one with TLS exits because, with both
    # ports 0, it has nothing to listen on.
    local probe ver
    probe=$(timeout 5 redis-server --port 0 --tls-port 0 --save "" 2>&1 || true)
    if [[ "$probe" != *"listen anywhere"* ]]; then
        _deps_log "WARNING: this redis-server may lack TLS support; the rediss:// tests need it"
    fi
    if [[ -z "$(_deps_pg_version)" ]]; then
        _deps_apt_install postgresql
    fi
    ver=$(_deps_pg_version)
    [[ -x "/usr/lib/postgresql/$ver/bin/initdb" ]] ||
        _deps_die "no initdb under /usr/lib/postgresql/$ver/bin; the Postgres TLS tests need it"
    # Postgres refuses to run as root; the tests then run initdb as the postgres user.
    if [[ "$(id -u)" -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
        _deps_die "running as root without a postgres user; the Postgres TLS tests need one"
    fi
}

# Trust auth is what the tests assume; say so clearly instead of failing later in a test.
_deps_check_pg_login() {
    command -v psql >/dev/null 2>&1 || return 0
    if ! psql -X -q -w -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
        _deps_log "WARNING: user postgres cannot log in to $PG_HOST:$PG_PORT without a password;" \
            "the tests expect 'host all all 127.0.0.1/32 trust' in pg_hba.conf (or set TEST_PG_URL)"
    fi
}

_deps_ensure_cargo() {
    command -v cargo >/dev/null 2>&1 && return 0
    _deps_die "cargo not found. summaryd needs a Rust toolchain (see rust-version in Cargo.toml):
  install rustup from your distribution or https://rustup.rs, then 'rustup default stable'
  and 'rustup component add rustfmt clippy'; make sure ~/.cargo/bin is on PATH."
}

# The browser tests (tests/support/browser.rs) drive Debian's chromium through chromedriver.
# The script exits at once when both are installed; the tests also run it themselves.
_deps_ensure_browser() {
    "$(dirname "${BASH_SOURCE[0]}")/browser-deps.sh"
}

_deps_main() {
    PG_HOST=${SUMMARYD_DEPS_PG_HOST:-127.0.0.1}
    PG_PORT=${SUMMARYD_DEPS_PG_PORT:-5432}
    REDIS_HOST=${SUMMARYD_DEPS_REDIS_HOST:-127.0.0.1}
    REDIS_PORT=${SUMMARYD_DEPS_REDIS_PORT:-6379}
    # A cold Postgres start after an install takes a few seconds; 60 s leaves room for a
    # slow CI disk while still failing a broken setup in bounded time.
    DEPS_TIMEOUT_S=${SUMMARYD_DEPS_TIMEOUT_S:-60}
    _deps_ensure_cargo
    _deps_ensure_postgres
    _deps_check_pg_login
    _deps_ensure_redis
    _deps_ensure_test_servers
    _deps_ensure_browser
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    _deps_main
elif [[ "${SUMMARYD_DEPS_FUNCTIONS_ONLY:-0}" == 1 ]]; then
    # Sourced by another script for its helpers only (e.g. _deps_apt_install), without
    # starting or checking any service.
    :
else
    # Sourced: run in a subshell so strict mode and `exit` on error stay out of the caller.
    (
        set -euo pipefail
        _deps_main
    ) || return $?
fi
