#!/bin/sh
# http_invoke.sh: invoke-and-wait round trips over HTTP. POST
# /v1/skills/bench/invoke {"wait": true} starts a run of a one-step skill
# and answers with its output once it has ended: wrk's latency distribution
# is the round trip (queue, durable step, durable end, answer). One client
# first (pure latency), then CONNECTIONS clients at once (throughput).
# Exits non-zero if any request failed.
#   DURATION (10s) CONNECTIONS (16) DURABILITY (full|normal)
set -eu
. "$(dirname "$0")/http_lib.sh"
export BENCH_DIR="$HERE"
D=${DURATION:-10s} C=${CONNECTIONS:-16}
http_wrk "invoke --wait round trip, 1 client ($D)" http_invoke.lua /v1/skills/bench/invoke \
  -t1 -c1 -d"$D"
http_wrk "invoke --wait round trip, $C clients ($D)" http_invoke.lua /v1/skills/bench/invoke \
  -t2 -c"$C" -d"$D"
echo "== engine counters"
http_metrics
exit $FAILED
