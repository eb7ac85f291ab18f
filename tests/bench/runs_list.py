#!/usr/bin/env python3
"""Benchmark: `moonloop runs` over a database of 100,000 runs (default).

Creates the database with moonloop itself (schema and migrations), fills it
with runs of 10 skills in every status, each with 3 steps, then times
`moonloop runs` with and without filters (median of 5, in ms, process start
included). Usage: runs_list.py [RUNS] [BIN]
"""
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
BIN = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "..", "build", "moonloop")

d = tempfile.mkdtemp(prefix="ml-runs-bench-")
db = os.path.join(d, "moonloop.db")
env = dict(os.environ, MOONLOOP_DB=db, NO_COLOR="1")
subprocess.run([BIN, "runs"], env=env, cwd=d, check=True, capture_output=True)

rnd = random.Random(1)
statuses = ["completed"] * 8 + ["failed", "cancelled", "sleeping", "waiting"]
now = int(time.time() * 1000)
con = sqlite3.connect(db)
t0 = time.time()
with con:
    for i in range(N):
        created = now - (N - i) * 60000  # one a minute, oldest first
        rid = "01%024d" % i
        st = rnd.choice(statuses)
        ended = created + 1500 if st in ("completed", "failed", "cancelled") else None
        con.execute("INSERT INTO runs(id, skill, version, status, trigger, input, output, error,"
                    " created_at, started_at, ended_at) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                    (rid, "skill-%d" % (i % 10), "v" * 64, st, '{"kind":"event","event":{"name":"tick"}}',
                     '{"n": %d}' % i, '{"ok": true}' if st == "completed" else None,
                     '{"message": "boom"}' if st == "failed" else None, created, created, ended))
        for seq in range(1, 4):
            con.execute("INSERT INTO steps(run_id, seq, id, kind, status, output, attempts, started_at,"
                        " ended_at) VALUES(?,?,?,?,?,?,?,?,?)",
                        (rid, seq, "step%d" % seq, "run", "completed", "{}", 1, created, created + 500))
con.close()
print("filled %d runs (3 steps each) in %.1f s" % (N, time.time() - t0))


def timed(*args):
    samples = []
    for _ in range(5):
        t = time.time()
        subprocess.run([BIN] + list(args), env=env, cwd=d, check=True, capture_output=True)
        samples.append((time.time() - t) * 1000)
    return statistics.median(samples)


for args in (["runs"], ["runs", "--skill", "skill-3"], ["runs", "--status", "failed"],
             ["runs", "--skill", "skill-3", "--status", "failed", "--since", "7d"],
             ["runs", "--json", "--limit", "1000"], ["trace", "01%024d" % (N // 2)]):
    print("moonloop %-50s median %6.1f ms" % (" ".join(args), timed(*args)))
subprocess.run(["rm", "-rf", d])
