#!/bin/sh
# client_path.sh: the client path's figures (tests/bench/client_path.py):
# engine CPU per request (run record, run list, start, attach) and
# requests/s, 10,000 single-run starts from 100 connections, a lone
# 10-step run from start to result, and 10,000 sleeping runs' memory.
#
# BASE=<commit> also builds that commit in a temporary folder (git worktree
# add) and runs the same benchmark against it first, so the figures before
# and after print side by side in one run:
#   BASE=59c778a sh tests/bench/client_path.sh
# Environment: MOONLOOP_BIN (default build/moonloop), QUICK=1 (fewer requests).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
command -v wrk >/dev/null || { echo "bench: wrk is missing (scripts/deps.sh installs it)" >&2; exit 2; }
. "$HERE/base_build.sh"
BENCH_HTTP="$ROOT/build/bench_http" python3 "$HERE/client_path.py" $BINS "$BIN"
