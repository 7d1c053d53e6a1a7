#!/usr/bin/env bash
# Make sure the browser tests (tests/support/browser.rs) have what they drive: Debian's
# headless-capable Chromium and its WebDriver server,
#   /usr/bin/chromium       (package chromium)
#   /usr/bin/chromedriver   (package chromium-driver, built from the same source, so the two
#                            versions always match)
#
# Silent and instant when both are there, which is the common case; scripts/deps.sh runs it
# and the browser test support runs it once per test binary, so `cargo test` alone works too.
# Otherwise it installs both with apt-get (through sudo when not root). An apt or dpkg run
# already in progress (an image build, unattended-upgrades, a parallel test binary) is waited
# for instead of failing on dpkg's lock; the index is refreshed (apt-get update) only when the
# first install attempt fails, because a fresh image has no index but a current one needs none.
#
#   SUMMARYD_BROWSER_DEPS_TIMEOUT_S   how long to wait for another apt/dpkg (default 900)
set -euo pipefail

chromium=/usr/bin/chromium
chromedriver=/usr/bin/chromedriver

installed() { [[ -x "$chromium" && -x "$chromedriver" ]]; }

installed && exit 0

say() { echo "browser-deps: $*" >&2; }
die() {
    echo "browser-deps: ERROR: $*" >&2
    exit 1
}

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run '$*' (not root and no sudo); install chromium and chromium-driver yourself"
    fi
}

command -v apt-get >/dev/null 2>&1 ||
    die "no $chromium or $chromedriver and this is not a Debian/Ubuntu system (no apt-get); install Chromium and a matching chromedriver there"

timeout_s=${SUMMARYD_BROWSER_DEPS_TIMEOUT_S:-900}

# Concurrent callers (several test binaries, deps.sh and a test) install once: the first
# holds this lock while it works, the others find the packages installed when they get it.
tools=${SUMMARYD_TEST_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/summaryd/test-tools}
mkdir -p "$tools"
exec 9>"$tools/browser-deps.lock"
flock -w "$timeout_s" 9 || die "another browser-deps.sh held $tools/browser-deps.lock for ${timeout_s}s"
installed && exit 0

# An install started elsewhere (perhaps of these very packages) is waited for; dpkg's own
# lock is an fcntl lock flock cannot see, hence looking for the processes, and apt's
# DPkg::Lock::Timeout below for the moment between one of them exiting and ours starting.
deadline=$((SECONDS + timeout_s))
waited=0
while pgrep -x apt-get >/dev/null || pgrep -x apt >/dev/null || pgrep -x dpkg >/dev/null ||
    pgrep -x unattended-upgr >/dev/null; do
    if ((SECONDS >= deadline)); then
        die "apt/dpkg still running after ${timeout_s}s; rerun when it is done"
    fi
    if [[ "$waited" -eq 0 ]]; then
        say "waiting for a running apt-get/dpkg to finish"
        waited=1
    fi
    sleep 2
done
installed && exit 0

apt_install() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        -o DPkg::Lock::Timeout="$timeout_s" chromium chromium-driver
}

say "installing chromium and chromium-driver (Debian packages; a few hundred MB, once)"
if ! apt_install; then
    say "install failed; refreshing the package index and trying once more"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout="$timeout_s"
    apt_install
fi
installed || die "apt-get installed chromium and chromium-driver but $chromium or $chromedriver is missing"
say "installed $("$chromium" --version 2>/dev/null || echo chromium) and $("$chromedriver" --version 2>/dev/null | cut -d' ' -f1-2)"
