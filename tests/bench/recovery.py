#!/usr/bin/env python3
"""Benchmark: restart to all done after a kill -9 (issue 17's fourth
workload, the peers' "200 x 20-step runs, kill -9 mid-way").

For each binary given (the previous build first, so both print side by
side in one run): `moonloop serve` on a fresh database (durability
"full"), 200 runs of a 20-step skill started over HTTP, SIGKILL once
half of all their steps are durable, then `moonloop serve` started again
on the same database. It prints, from the moment the second serve is
spawned:

  listening  the HTTP port answers (the process is up, skills loaded)
  all done   every run has ended (read from the database file, every 2 ms)

and how many step records were durable at the kill (the range over the
rounds), as the median and range over ROUNDS rounds (default 5). Every
run must end completed with exactly RUNS x STEPS step records, or the
bench says so. (That no durable step runs again is the crash tests' to
check: tests/func/test_crash*.py, tests/sim.)

Usage: recovery.py BIN [BIN...]   (environment: RUNS=200 STEPS=20 ROUNDS=5)
"""
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

RUNS = int(os.environ.get("RUNS", "200"))
STEPS = int(os.environ.get("STEPS", "20"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))

SKILL = '''return { id = "twenty", triggers = { { event = "go" } }, run = function(ctx)
  local n = 0
  for i = 1, %d do n = n + ctx.step.run("s" .. i, function() return i end) end
  return n
end }''' % STEPS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from vocab import RUN_ENDED_SQL  # noqa: E402


def spawn(binary, d, log):
    env = dict(os.environ, MOONLOOP_DB=os.path.join(d, "bench.db"), MOONLOOP_DURABILITY="full",
               NO_COLOR="1")
    env.pop("MOONLOOP_URL", None)
    t0 = time.time()
    p = subprocess.Popen([binary, "serve", "--workspace", "skills", "--listen", "127.0.0.1:0"],
                         cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=log)
    return p, t0


def url_of(logname, p, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        with open(logname) as f:
            m = re.search(r"listening on (http://\S+)", f.read())
        if m:
            return m.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.001)
    raise SystemExit("bench: serve did not start: " + open(logname).read())


def count(db, sql):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=5)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def one_round(binary):
    d = tempfile.mkdtemp(prefix="ml-recovery-bench-")
    try:
        os.makedirs(os.path.join(d, "skills"))
        with open(os.path.join(d, "skills", "twenty.lua"), "w") as f:
            f.write(SKILL)
        db = os.path.join(d, "bench.db")
        log = open(os.path.join(d, "serve.log"), "w+")
        p, _ = spawn(binary, d, log)
        url = url_of(log.name, p)
        # The runs all start at once (one request of RUNS events, one
        # commit) and go on side by side; the kill comes once half their
        # steps are durable, read through one connection every 0.5 ms.
        body = json.dumps([{"name": "go", "data": {"i": i}} for i in range(RUNS)]).encode()
        req = urllib.request.Request(url + "/v1/events", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
        half = RUNS * STEPS // 2
        con = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=5)
        end = time.time() + 60
        while time.time() < end:
            if con.execute("SELECT count(*) FROM steps WHERE status = 'completed'").fetchone()[0] >= half:
                break
            time.sleep(0.0005)
        con.close()
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        before = count(db, "SELECT count(*) FROM steps WHERE status = 'completed'")
        log.seek(0)
        log.truncate()
        p, t0 = spawn(binary, d, log)
        url_of(log.name, p)
        t_listen = time.time() - t0
        end = time.time() + 120
        while time.time() < end:
            if count(db, "SELECT count(*) FROM runs WHERE status NOT IN " + RUN_ENDED_SQL) == 0:
                break
            time.sleep(0.002)
        t_done = time.time() - t0
        total = count(db, "SELECT count(*) FROM steps WHERE status = 'completed'")
        bad = count(db, "SELECT count(*) FROM runs WHERE status != 'completed'")
        p.terminate()
        p.wait(timeout=30)
        log.close()
        if bad:
            raise SystemExit("bench: %d runs did not complete" % bad)
        if total != RUNS * STEPS:
            raise SystemExit("bench: %d step records, expected %d" % (total, RUNS * STEPS))
        return t_listen, t_done, before
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    bins = [os.path.abspath(b) for b in sys.argv[1:]]
    if not bins:
        raise SystemExit(__doc__)
    print("%d runs x %d steps, kill -9 once half the steps are durable, then serve again;"
          " ms from the second serve's spawn, median [range] over %d rounds" % (RUNS, STEPS, ROUNDS))
    print("%-40s %22s %22s %14s" % ("binary", "listening", "all done", "steps durable"))
    for b in bins:
        rs = [one_round(b) for _ in range(ROUNDS)]
        li = [r[0] * 1000 for r in rs]
        dn = [r[1] * 1000 for r in rs]
        print("%-40s %8.0f [%4.0f-%4.0f] %8.0f [%4.0f-%4.0f] %14s" % (
            b[-40:], statistics.median(li), min(li), max(li), statistics.median(dn), min(dn),
            max(dn), "%d-%d" % (min(r[2] for r in rs), max(r[2] for r in rs))))


if __name__ == "__main__":
    main()
