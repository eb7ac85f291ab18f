#!/bin/sh
# make bench: build the benchmarks and print their figures.
set -e
top=$(cd "$(dirname "$0")/../.." && pwd)
echo "== core: durable steps/s, step overhead, parked-run memory"
"$top/build/bench_core" "${RUNS:-10000}" "${STEPS:-10}"
for extra in "$top"/tests/bench/sandbox_*.sh; do
  [ -f "$extra" ] || continue
  echo "== $(basename "$extra" .sh)"
  sh "$extra"
done
