# http_lib.sh: sourced by the http_*.sh benchmarks. Starts `moonloop serve`
# on a temporary database and a free port with a trivial skill, and stops it
# on exit. Sets URL, TMP, SERVE_PID. Environment: MOONLOOP_BIN (default
# build/moonloop), DURABILITY (full|normal, default full).
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${MOONLOOP_BIN:-$ROOT/build/moonloop}
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
[ -x "$BIN" ] || { echo "bench: no moonloop binary at $BIN (make build, or set MOONLOOP_BIN)" >&2; exit 2; }
command -v wrk >/dev/null || { echo "bench: wrk is missing (scripts/deps.sh installs it)" >&2; exit 2; }

TMP=$(mktemp -d /tmp/moonloop-bench.XXXXXX)
SERVE_PID=""
http_cleanup() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -TERM "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap http_cleanup EXIT INT TERM

mkdir -p "$TMP/skills"
cat >"$TMP/skills/bench.lua" <<'LUA'
-- A trivial skill: one durable step, started by invoke or by a bench.run event.
return {
  id = "bench",
  triggers = { { event = "bench.run" } },
  run = function(ctx)
    return ctx.step.run("echo", function() return { n = ctx.input and ctx.input.n } end)
  end,
}
LUA

(cd "$TMP" && MOONLOOP_DB="$TMP/bench.db" MOONLOOP_DURABILITY="${DURABILITY:-full}" \
  exec "$BIN" serve --listen 127.0.0.1:0 --workspace skills 2>"$TMP/serve.log") &
SERVE_PID=$!
URL=""
i=0
while [ $i -lt 100 ]; do
  URL=$(sed -n 's/^moonloop: listening on \(http:[^ ]*\).*/\1/p' "$TMP/serve.log" | head -n 1)
  [ -n "$URL" ] && break
  kill -0 "$SERVE_PID" 2>/dev/null || { cat "$TMP/serve.log" >&2; echo "bench: serve died" >&2; exit 1; }
  sleep 0.1
  i=$((i + 1))
done
[ -n "$URL" ] || { cat "$TMP/serve.log" >&2; echo "bench: serve did not start" >&2; exit 1; }
echo "bench: moonloop serve at $URL (durability ${DURABILITY:-full}, database $TMP/bench.db)"

# http_wrk LABEL SCRIPT PATH [wrk options...]: run wrk with a Lua script
# whose done() prints a "RESULT ..." line; fail when no request succeeded
# or any failed.
FAILED=0
http_wrk() {
  label=$1 script=$2 path=$3
  shift 3
  echo "== $label"
  wrk --latency "$@" -s "$HERE/$script" "$URL$path" >"$TMP/wrk.out" 2>&1 || true
  grep -E "Latency|Req/Sec|requests in|Non-2xx|Socket errors|50%|90%|99%" "$TMP/wrk.out" | sed 's/^/   /'
  result=$(grep '^RESULT' "$TMP/wrk.out" || true)
  echo "   $result"
  case "$result" in
    *" errors=0"*) ;;
    *) echo "   FAILED: some requests failed (see above)"; FAILED=1 ;;
  esac
  case "$result" in
    *"requests=0 "*|"") echo "   FAILED: no request completed"; FAILED=1 ;;
  esac
  if ! kill -0 "$SERVE_PID" 2>/dev/null; then
    echo "   FAILED: moonloop serve is gone; its last words:"
    tail -n 5 "$TMP/serve.log" | sed 's/^/     /'
    FAILED=1
  fi
}

# The engine's own counters after a benchmark.
http_metrics() {
  curl -s "$URL/metrics" 2>/dev/null | grep -E '^moonloop_(commits_total|committed_entries_total|http_requests_total)' | sed 's/^/   /'
}
