# base_build.sh: sourced by the benchmarks that compare two builds. With
# BASE=<commit> set, it builds that commit in a temporary folder (git
# worktree add, removed on exit) and sets BINS to its binary; otherwise
# BINS is empty. Needs ROOT (the checkout).
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
