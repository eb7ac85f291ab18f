#!/usr/bin/env python3
"""Benchmark: two builds of `moonloop stats` over the same runs, taking
turns command by command (so both meet the same load), each timed by wall
clock and by CPU (user + system, from wait4: on a busy machine the wall
time is mostly waiting for a CPU). Median of N, [best-worst], in ms.

A database kept by stats.py (KEEP=1) serves both; copy it first when the
builds differ in schema (the newer one migrates its copy on first use):
  stats_compare.py NAME_A BIN_A DB_A NAME_B BIN_B DB_B [N]
"""
import os
import statistics
import subprocess
import sys
import time

N = int(sys.argv[7]) if len(sys.argv) > 7 else 7
B = [(sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])),
     (sys.argv[4], os.path.abspath(sys.argv[5]), os.path.abspath(sys.argv[6]))]
cmds = [["stats"], ["stats", "skill-3"], ["stats", "skill-7", "--json"], ["stats", "--since", "24h"],
        ["stats", "skill-3", "--since", "1h"], ["stats", "--since", "30d"], ["stats", "skill-3", "--since", "30d"]]


def one(binary, db, args):
    env = dict(os.environ, MOONLOOP_DB=db, NO_COLOR="1"); env.pop("MOONLOOP_URL", None)
    t = time.time()
    p = subprocess.Popen([binary] + args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    assert status == 0
    return (time.time() - t) * 1000, (ru.ru_utime + ru.ru_stime) * 1000


print("load at start: %s" % open("/proc/loadavg").read().strip())
for args in cmds:
    res = {}
    for name, b, db in B:
        one(b, db, args)
    for _ in range(N):
        for name, b, db in B:
            res.setdefault(name, []).append(one(b, db, args))
    line = "moonloop %-28s" % " ".join(args)
    for name, _, _ in B:
        w = [x[0] for x in res[name]]; c = [x[1] for x in res[name]]
        line += "  %s: wall %6.0f ms [%4.0f-%4.0f], cpu %5.0f ms [%3.0f-%3.0f]" % (
            name, statistics.median(w), min(w), max(w), statistics.median(c), min(c), max(c))
    print(line, flush=True)
print("load at end: %s" % open("/proc/loadavg").read().strip())
