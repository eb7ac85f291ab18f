#!/bin/sh
# make demo: run the example loop end to end on the embedded SQLite default,
# against local stand-ins for the outside services, kill the engine in the
# middle of a run, and show the run resuming from its last completed step.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
BIN="$top/build/moonloop"
work=$(mktemp -d /tmp/moonloop-demo-XXXXXX)
cleanup() {
  [ -n "$standin" ] && kill "$standin" 2>/dev/null || true
  [ -n "$runner" ] && kill -9 "$runner" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
cd "$work"

if [ -t 1 ]; then
  say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  say() { printf '\n== %s\n' "$*"; }
fi
runs_json() { "$BIN" runs --json; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

python3 "$top/scripts/standins.py" > port.txt &
standin=$!
while [ ! -s port.txt ]; do sleep 0.05; done
port=$(cat port.txt)
export METRICS_URL="http://127.0.0.1:$port" CHAT_WEBHOOK="http://127.0.0.1:$port/chat"
cat > moonloop.conf.lua <<CONF
return { env = { "METRICS_URL", "CHAT_WEBHOOK" } }
CONF
cp "$top/skills/service_check.lua" .

say "1. Check the skill file (moonloop check)"
"$BIN" check service_check.lua

say "2. Run it to its end (moonloop run service_check.lua -v)"
echo "   The metrics stand-in fails its first request: watch the retry."
"$BIN" run service_check.lua -v
first=$(runs_json | field 'd[0]["id"]')

say "3. Its trace (moonloop trace $first)"
"$BIN" trace "$first"

say "4. Durability: start another run and kill -9 the engine during its sleep"
"$BIN" run service_check.lua --quiet > /dev/null 2>&1 &
runner=$!
i=0
while [ "$(runs_json | field 'd[0]["status"]')" != "sleeping" ]; do
  sleep 0.1; i=$((i + 1)); [ $i -lt 100 ] || { echo "the run never slept"; exit 1; }
done
second=$(runs_json | field 'd[0]["id"]')
kill -9 "$runner"; wait "$runner" 2>/dev/null || true; runner=""
echo "   killed with SIGKILL while run $second was sleeping; what the database holds:"
"$BIN" trace "$second" | sed -n '1,12p'

say "5. Resume it (moonloop run --resume $second)"
"$BIN" run --resume "$second" -v
echo
echo "   Chat messages posted (one per run, none twice):"
python3 -c "
import json, urllib.request
msgs = json.load(urllib.request.urlopen('$CHAT_WEBHOOK'))
for m in msgs: print('   -', m['text'], '(key', m['key'] + ')')
assert len(msgs) == 2, 'expected exactly 2 chat messages, got %d' % len(msgs)
"

say "6. All runs (moonloop runs)"
"$BIN" runs
echo
echo "demo: ok"
