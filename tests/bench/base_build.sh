# base_build.sh: sourced by the client-path benchmarks (client_path.sh,
# instructions.sh), which compare two builds. Needs HERE (the benchmark's
# folder). Sets ROOT (the checkout) and BIN (MOONLOOP_BIN, default
# build/moonloop), checks it and build/bench_http are there; with
# BASE=<commit> set, builds that commit in a temporary folder (git worktree
# add, removed on exit) and sets BINS to its binary; otherwise BINS is empty.
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${MOONLOOP_BIN:-$ROOT/build/moonloop}
[ -x "$BIN" ] || { echo "bench: no moonloop binary at $BIN (make build, or set MOONLOOP_BIN)" >&2; exit 2; }
[ -x "$ROOT/build/bench_http" ] || { echo "bench: no build/bench_http (make build)" >&2; exit 2; }
BINS=""
if [ -n "${BASE:-}" ]; then
  PREV=$(mktemp -d /tmp/moonloop-prev.XXXXXX)
  trap 'git -C "$ROOT" worktree remove --force "$PREV/src" >/dev/null 2>&1; rm -rf "$PREV"' EXIT INT TERM
  echo "bench: building $BASE in $PREV (for the figures before)"
  git -C "$ROOT" worktree add --detach "$PREV/src" "$BASE" >/dev/null
  cmake -S "$PREV/src" -B "$PREV/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$PREV/build" -j 2 --target moonloop >"$PREV/build.log" 2>&1 ||
    { tail -20 "$PREV/build.log"; exit 1; }
  BINS="$PREV/build/moonloop"
fi
