#!/bin/sh
# Builds tests/fuzz/fuzz_request with clang's libFuzzer (ASan + UBSan) and
# runs it for FUZZ_TIME seconds (default 60) from the seed corpus. New
# inputs go to build/fuzz/corpus; crashes to build/fuzz/crash-*. Not part
# of `make test`: `make fuzz` runs it.
set -e
cd "$(dirname "$0")/../.."
OUT=build/fuzz
TIME=${FUZZ_TIME:-60}
CC=${FUZZ_CC:-clang}
command -v "$CC" >/dev/null || { echo "fuzz: $CC is missing (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
mkdir -p "$OUT/corpus"
# shellcheck disable=SC2046
"$CC" -g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I engine $(pkg-config --cflags libcjson) \
  tests/fuzz/fuzz_request.c engine/server/server_route.c engine/base/jsontext.c engine/base/vocab.c engine/base/err.c engine/base/units.c \
  -o "$OUT/fuzz_request" $(pkg-config --libs libcjson libcrypto) -lh2o -lm
echo "fuzz: running fuzz_request for ${TIME}s" >&2
exec "$OUT/fuzz_request" -max_total_time="$TIME" -max_len=65536 -timeout=10 \
  -dict=tests/fuzz/http.dict -artifact_prefix="$OUT/" "$OUT/corpus" tests/fuzz/corpus
