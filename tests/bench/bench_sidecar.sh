#!/bin/sh
# bench_sidecar.sh: the sidecar's figures (tests/bench/bench_sidecar.py):
# the time from a skill file's write to its version being live, median and
# worst over CHANGES (default 100) changes, and the step rate of runs in
# flight meanwhile. Environment: MOONLOOP_BIN (default build/moonloop).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${MOONLOOP_BIN:-$ROOT/build/moonloop}
[ -x "$BIN" ] || { echo "bench: no moonloop binary at $BIN (make build, or set MOONLOOP_BIN)" >&2; exit 2; }
exec python3 "$HERE/bench_sidecar.py" "$BIN" "${CHANGES:-100}"
