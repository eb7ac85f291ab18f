#!/bin/sh
# Installs the Debian packages moonloop needs to build, test and run its demo.
# Idempotent and silent when nothing is missing; uses sudo when not root.
# With --build, only what building it and its Debian package need (make deb).
set -e
# (lua-check: luacheck's parser, built into the binary for the static
# checks of skill files.)
pkgs="build-essential cmake pkg-config libluajit-5.1-dev libuv1-dev
libsqlite3-dev libpq-dev libcurl4-openssl-dev libcjson-dev libh2o-dev libssl-dev
libedit-dev lua-check dpkg-dev"
if [ "$1" != "--build" ]; then
pkgs="$pkgs python3 tzdata wrk clang libclang-rt-14-dev"
# The dashboard's browser test (tests/func/test_dashboard.py): Debian's
# Chromium, and Node.js with npm unless a node and an npm are already on the
# PATH (a machine may have them from elsewhere, such as Node 20).
pkgs="$pkgs chromium"
# The install tests (tests/func/test_install.py) and `make deb`: man renders
# moonloop(1), dpkg-shlibdeps names the package's dependencies, zsh parses
# the zsh completion (dpkg-dev is in the build set).
pkgs="$pkgs man-db zsh"
# The PostgreSQL store's tests (tests/func under MOONLOOP_TEST_BACKEND=pg)
# start a private cluster from Debian's server binaries (initdb, pg_ctl).
pkgs="$pkgs postgresql"
command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
fi
[ -n "$MOONLOOP_DEPS_EXTRA" ] && pkgs="$pkgs $MOONLOOP_DEPS_EXTRA"
missing=""
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # OpenResty's LuaJIT fork provides the same headers under another name.
    if [ "$p" = libluajit-5.1-dev ] && dpkg-query -W -f='${Status}' libluajit2-5.1-dev 2>/dev/null | grep -q "install ok installed"; then
      continue
    fi
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >&2
