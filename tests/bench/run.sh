#!/bin/sh
# make bench: run every benchmark and print its figures. Each prints what it
# measured; none asserts a speed. RUNS/STEPS scale the core benchmark.
set -e
top=$(cd "$(dirname "$0")/../.." && pwd)
b="$top/build"
echo "== core: durable steps/s, step overhead, parked-run memory"
"$b/bench_core" "${RUNS:-10000}" "${STEPS:-10}"
echo "== 100,000 parked runs: memory, and waking one"
"$b/bench_parked" 100000 10000
echo "== moonloop runs over 100,000 runs"
python3 "$top/tests/bench/runs_list.py" 100000 "$b/moonloop"
echo "== moonloop stats over 1,000,000 runs (target: under 200 ms)"
python3 "$top/tests/bench/stats.py" "${STATS_RUNS:-1000000}" "$b/moonloop"
echo "== flow control: 10,000 events (20,000 runs) under a shared limit of 10 and a throttle"
python3 "$top/tests/bench/flow_control.py" "${FLOW_RUNS:-10000}" "$b/moonloop"
echo "== HTTP: events accepted per second"
sh "$top/tests/bench/http_events.sh"
echo "== HTTP: invoke with wait"
sh "$top/tests/bench/http_invoke.sh"
echo "== the client path: reads, starts, attach (BASE=commit: before and after)"
sh "$top/tests/bench/client_path.sh"
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "== PostgreSQL: durable steps/s and a lone run's latency, 1 to 3 engines (a private cluster)"
  python3 "$top/tests/bench/pg_engines.py" "$b/moonloop"
fi
for extra in "$top"/tests/bench/sandbox_*.sh "$top"/tests/bench/bench_sidecar*.sh; do
  [ -f "$extra" ] || continue
  echo "== $(basename "$extra" .sh)"
  sh "$extra"
done
