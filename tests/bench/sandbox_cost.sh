#!/bin/sh
# sandbox_cost.sh: what the runaway-code budget costs skill code.
#
# Skill code runs with the JIT off (LuaJIT never calls hooks from compiled
# traces) under a count hook. This runs the same skill steps, timed with
# os.clock inside the step bodies, in four builds of moonloop:
#
#   design        JIT off for skill code + count hook (the shipped binary)
#   jit-on        JIT on, no hook (what skill code would cost unbounded)
#   jit-off       JIT off, no hook (the JIT's share of the cost)
#   jit-on+hook   JIT on + hook (the hook's share; runaway code is NOT
#                 stopped: the hook never fires in compiled loops)
#
# The three other builds are compiled with -DLRT_BENCH_BUDGET=N into
# build-bench-N/ (benchmark builds only: they print a warning at start).
#
# usage: tests/bench/sandbox_cost.sh [REPEATS]     (from the source folder)
# env:   MOONLOOP_BIN  the design build (default build-sbx/moonloop, else build/moonloop)
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
REPEATS=${1:-5}
DESIGN=${MOONLOOP_BIN:-}
if [ -z "$DESIGN" ]; then
  if [ -x "$SRC/build-sbx/moonloop" ]; then DESIGN=$SRC/build-sbx/moonloop; else DESIGN=$SRC/build/moonloop; fi
fi

build() { # $1 = LRT_BENCH_BUDGET value
  dir=$SRC/build-bench-$1
  cmake -S "$SRC" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOONLOOP_FAULTS=OFF \
    "-DCMAKE_C_FLAGS=-DLRT_BENCH_BUDGET=$1" >/dev/null
  cmake --build "$dir" -j2 --target moonloop >/dev/null
  echo "$dir/moonloop"
}

echo "building the benchmark variants..." >&2
JITON=$(build 0)
JITOFF=$(build 1)
JITHOOK=$(build 2)

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/moonloop.conf.lua" <<'EOF'
return { limits = { run_seconds_between_yields = 600, run_memory = "1GB" } }
EOF
cat >"$WORK/bench.lua" <<'EOF'
-- Each workload runs in its own step; the result is the best of REPEATS
-- os.clock timings, in milliseconds.
local REPEATS = tonumber(REPEATS_VALUE)

local function numeric()
  local x = 0
  for i = 1, 50000000 do x = x + i * 0.5 end
  return x
end

local function numeric_mod()
  local x = 0
  for i = 1, 20000000 do x = (x + i * 3) % 1000003 end
  return x
end

local function concat_key(prefix, i) return prefix .. i end
local function mixed()
  local total = 0
  for round = 1, 200 do
    local t = {}
    for i = 1, 1000 do t[#t + 1] = concat_key("key", i) end
    for _, v in ipairs(t) do total = total + #v:upper() end
    local parts = {}
    for i = 1, #t, 10 do table.insert(parts, t[i]) end
    local s = table.concat(parts, ",")
    total = total + #s + #string.format("%d:%s", round, tostring(total))
    local m = {}
    for k = 1, 200 do m["f" .. k] = k end
    for k, v in pairs(m) do total = total + v end
  end
  return total
end

local function patterns()
  local line = "2024-01-02T03:04:05Z level=info msg=\"hello world\" user=ada id=12345"
  local n = 0
  for i = 1, 50000 do
    local y, mo, d = line:match("^(%d+)-(%d+)-(%d+)")
    local user = line:match("user=(%w+)")
    local s = line:gsub("%s+", " ")
    if line:find("msg=", 1, true) then n = n + 1 end
    n = n + #y + #user + #s
  end
  return n
end

local function best(f)
  local b
  for r = 1, REPEATS do
    local t0 = os.clock()
    f()
    local dt = (os.clock() - t0) * 1000
    if not b or dt < b then b = dt end
  end
  return b
end

return { run = function(ctx)
  return {
    numeric = ctx.step.run("numeric", function() return best(numeric) end),
    numeric_mod = ctx.step.run("numeric_mod", function() return best(numeric_mod) end),
    mixed = ctx.step.run("mixed", function() return best(mixed) end),
    patterns = ctx.step.run("patterns", function() return best(patterns) end),
  }
end }
EOF
sed -i "s/REPEATS_VALUE/$REPEATS/" "$WORK/bench.lua"

measure() { # $1 = binary -> JSON on stdout
  (cd "$WORK" && rm -f bench.db && MOONLOOP_DB=bench.db "$1" run bench.lua 2>/dev/null)
}

D=$(measure "$DESIGN")
A=$(measure "$JITON")
B=$(measure "$JITOFF")
C=$(measure "$JITHOOK")

python3 - "$D" "$A" "$B" "$C" <<'EOF'
import json, sys
d, a, b, c = (json.loads(x) for x in sys.argv[1:5])
print("best of the runs, ms, measured with os.clock inside a skill step")
print("%-12s %12s %12s %12s %12s %14s" % ("workload", "design", "jit-on", "jit-off", "jit-on+hook", "design/jit-on"))
for k in ("numeric", "numeric_mod", "mixed", "patterns"):
    print("%-12s %12.1f %12.1f %12.1f %12.1f %13.1fx" % (k, d[k], a[k], b[k], c[k], d[k] / a[k]))
print("numeric: x = x + i * 0.5, 5e7 times; numeric_mod: x = (x + i * 3) % 1000003, 2e7 times;")
print("mixed: string concat/upper/format, table insert/concat, ipairs/pairs, calls; patterns: match/gsub/find")
EOF
