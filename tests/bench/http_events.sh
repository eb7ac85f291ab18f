#!/bin/sh
# http_events.sh: event ingestion over HTTP. Drives POST /v1/events with
# wrk, one event per request and then 100 per request, against `moonloop
# serve` on a temporary database, and prints requests/s, events/s and the
# latency distribution. An answer is 202 only once the events are durable
# (group commit), so this measures durable ingestion. Exits non-zero if any
# request failed.
#   DURATION (10s) CONNECTIONS (32) THREADS (2) DURABILITY (full|normal)
#   EVENT (bench.noop: no run; bench.run also starts a run per event)
set -eu
. "$(dirname "$0")/http_lib.sh"
export BENCH_DIR="$HERE"
D=${DURATION:-10s} C=${CONNECTIONS:-32} T=${THREADS:-2}
BATCH=1 http_wrk "POST /v1/events, 1 event per request ($C connections, $D)" \
  http_events.lua /v1/events -t"$T" -c"$C" -d"$D"
BATCH=100 http_wrk "POST /v1/events, 100 events per request ($C connections, $D)" \
  http_events.lua /v1/events -t"$T" -c"$C" -d"$D"
echo "== engine counters"
http_metrics
exit $FAILED
