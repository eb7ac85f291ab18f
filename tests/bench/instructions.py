#!/usr/bin/env python3
"""Benchmark: the client path's cost in instructions, counted by callgrind.

Wall-clock CPU figures (client_path.py) move with the machine's load and
its disk: on the development VM the same binary's engine CPU per step
varies by half from one hour to the next. An instruction count does not:
valgrind's callgrind counts the instructions the engine executes, the
same for the same binary and inputs whatever else the machine does
(within 1-2 %: the number of 50 ms ticks in a window still depends on
time). So a change to the engine's own work (statements, encoding,
scheduling) is measured here, before and after, in one run; what the
kernel does for it (syncs, sockets) is not counted, and client_path.py
measures that.

For each binary given (the previous build first), it starts `moonloop
serve` under callgrind on a fresh database (durability "full"), warms up,
zeroes the counters, runs one workload, dumps them, and prints:

  start    1,000 single-run starts of a skill with no step (20
           connections): instructions per start until all have ended
  flow     300 runs x 10 steps, 50 in flight, each started then attached
           to (GET ?wait=30&steps=false): instructions per step
  record   2,000 GET /v1/runs/{id} of a 10-step run: per request

each split into the loop thread's share and the other threads' (the
commit thread, mostly), and the functions of the engine's own that take
the most, inclusive (the first workload's, for each binary).

Usage: instructions.py BIN [BIN...]   (needs valgrind; about 2 minutes a binary)
"""
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import client_path as cp  # noqa: E402


def wrapper(binary, out):
    """A script that starts binary under callgrind, for client_path.Serve."""
    path = os.path.join(out, "vg.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s/cg.%%p.out "
                "%s \"$@\"\n" % (out, binary))
    os.chmod(path, 0o755)
    return path


def counts(out, pid, top=0):
    """Instructions of the dump callgrind_control -d wrote for pid: total,
    those under a thread other than the main one, and the top functions of
    the engine's own (file under engine/), inclusive."""
    dumps = sorted(f for f in os.listdir(out) if f.startswith("cg.%d.out." % pid))
    path = os.path.join(out, dumps[-1])
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100",
                           path], capture_output=True, text=True).stdout
    total = threads = 0
    funcs = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S+)", line)
        if not m:
            continue
        n, where = int(m.group(1).replace(",", "")), m.group(2)
        if where == "PROGRAM":
            total = n
        elif where.endswith("pthread_create.c:start_thread"):
            threads = n
        elif "/engine/" in where and len(funcs) < top:
            name = where.split("/engine/", 1)[1]
            if name.split(":")[-1] not in WRAPPERS:
                funcs.append((n, name))
    os.unlink(path)
    return total, threads, funcs


# Functions that only hold everything below them (the loop, the commit
# thread's job, the store's dispatch): left out of the top list.
WRAPPERS = {"main", "cli_serve", "engine_run", "work_cb", "store_commit", "sqlite_commit",
            "idle_cb", "on_req", "server__answer"}


def control(pid, what):
    subprocess.run(["callgrind_control", what, str(pid)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)


async def gets(srv, path, n, conns=4):
    cs = [cp.Conn(srv) for _ in range(conns)]
    await asyncio.gather(*(c.open() for c in cs))

    async def worker(c):
        for _ in range(n // conns):
            st, _ = await c.call("GET", path)
            assert st == 200, st
    await asyncio.gather(*(worker(c) for c in cs))
    for c in cs:
        c.close()


def measure(binary):
    out = tempfile.mkdtemp(prefix="ml-instr-")
    rows = {}
    srv = cp.Serve(wrapper(binary, out))
    try:
        pid = srv.p.pid
        # Warm up every path once (statements prepared, code paged in).
        st, ans = srv.call("POST", "/v1/skills/ten/invoke", {"data": {}, "wait": 120})
        ten = ans["run_id"]
        cp.blast(srv, "/v1/skills/noop/invoke", 200, 20, '{"data":{"n":1}}')
        asyncio.run(cp.flow(srv, 50, 50, 0.005))
        srv.settle()
        control(pid, "-z")
        cp.blast(srv, "/v1/skills/noop/invoke", 1000, 20, '{"data":{"n":1}}')
        srv.settle()
        control(pid, "-d")
        rows["start"] = counts(out, pid, top=12) + (1000, "start")
        control(pid, "-z")
        asyncio.run(cp.flow(srv, 300, 50, 0.005))
        srv.settle()
        control(pid, "-d")
        rows["flow"] = counts(out, pid, top=12) + (3000, "step")
        control(pid, "-z")
        asyncio.run(gets(srv, "/v1/runs/" + ten, 2000))
        control(pid, "-d")
        rows["record"] = counts(out, pid, top=8) + (2000, "request")
    finally:
        srv.close()
        shutil.rmtree(out, ignore_errors=True)
    return rows


def main():
    bins = [os.path.abspath(b) for b in sys.argv[1:]]
    if not bins:
        raise SystemExit(__doc__)
    if not shutil.which("valgrind"):
        raise SystemExit("bench: valgrind is missing (apt-get install valgrind)")
    results = []
    for b in bins:
        print("bench: %s" % b, flush=True)
        results.append((b, measure(b)))
    for b, rows in results:
        print("\n== %s" % b)
        for name in ("start", "flow", "record"):
            total, threads, _, n, unit = rows[name]
            print("   %-7s %8.0f instructions/%-7s  loop thread %7.0f  other threads %7.0f"
                  % (name, total / n, unit, (total - threads) / n, threads / n))
        for name in ("start", "flow", "record"):
            total, _, funcs, n, unit = rows[name]
            print("   %s, the engine's own functions (inclusive, per %s):" % (name, unit))
            for k, where in funcs:
                print("      %8.0f  %s" % (k / n, where))
    if len(results) > 1:
        (a, ra), (b, rb) = results[0], results[-1]
        print("\n== change (last against first)")
        for name in ("start", "flow", "record"):
            x, y = ra[name][0] / ra[name][3], rb[name][0] / rb[name][3]
            print("   %-7s %8.0f -> %8.0f instructions/%s  (%+.1f %%)"
                  % (name, x, y, ra[name][4], (y - x) / x * 100))


if __name__ == "__main__":
    main()
