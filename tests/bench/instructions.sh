#!/bin/sh
# instructions.sh: the client path's cost in instructions (callgrind), per
# start, per step of a flow and per run record (tests/bench/instructions.py):
# figures that do not move with the machine's load, for A/B of the engine's
# own work.
#
# BASE=<commit> also builds that commit and measures it first, so before and
# after print side by side in one run, with the change:
#   BASE=HEAD~1 sh tests/bench/instructions.sh
# Environment: MOONLOOP_BIN (default build/moonloop).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
command -v valgrind >/dev/null || { echo "bench: valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
. "$HERE/base_build.sh"
BENCH_HTTP="$ROOT/build/bench_http" python3 "$HERE/instructions.py" $BINS "$BIN"
