"""pg_engines: durable steps per second and a lone run's latency with 1, 2
and 3 engines (`moonloop serve`) sharing one PostgreSQL database, next to
one engine on a SQLite file.

Each configuration gets a fresh database. Throughput: RUNS runs of a
10-step skill are started by events ("go", sent over HTTP to the engines in
turn, RUNS of them as fast as they are accepted); whichever engine
dispatches an event creates the run unowned, and the engines claim runs
from the database (FOR UPDATE SKIP LOCKED). The figure is 10 x RUNS
durable steps over the time from the first event to the last run's end.
Latency: one run at a time (POST /v1/skills/ten/invoke {"wait": true}),
LONE times: from the request to the answer with the run's output (its
creation, 10 durable steps and its end committed).

The PostgreSQL cluster is a private one (tests/lib/pgcluster.py: initdb in
a temporary folder, fsync on, synchronous_commit on), or the database of
$BENCH_PG_URL (a URL without the database name: each configuration makes
its own there). Durability "full" throughout.

Usage: python3 pg_engines.py [MOONLOOP_BIN]    (RUNS=2000 LONE=30 ENGINES=1,2,3)
Prints its figures; asserts nothing about speed.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import pgcluster  # noqa: E402

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.environ.get("MOONLOOP_BIN", os.path.join(HERE, "..", "..", "build", "moonloop")))
RUNS = int(os.environ.get("RUNS", "2000"))
LONE = int(os.environ.get("LONE", "30"))
ENGINES = [int(x) for x in os.environ.get("ENGINES", "1,2,3").split(",")]

TEN = """
return { id = "ten", triggers = { { event = "go" } }, run = function(ctx)
  local n = 0
  for i = 1, 10 do n = n + ctx.step.run("s", function() return i end) end
  return n
end }"""


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


def start_engine(tmp, db):
    env = dict(os.environ, MOONLOOP_DB=db, NO_COLOR="1")
    env.pop("MOONLOOP_URL", None)
    p = subprocess.Popen([BIN, "serve", "--workspace", "skills", "--listen", "127.0.0.1:0"],
                         cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    for line in p.stderr:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            p.url = m.group(1)
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p
    sys.exit("bench: serve did not start (%s)" % p.wait())


def count_completed(tmp, db):
    """How many runs of "ten" completed, asked of the database itself."""
    q = "SELECT count(*) FROM runs WHERE skill = 'ten' AND status = 'completed'"
    if not db.startswith("postgres"):
        import sqlite3
        con = sqlite3.connect(db, timeout=30)
        try:
            return con.execute(q).fetchone()[0]
        finally:
            con.close()
    out = subprocess.run([os.path.join(pgcluster.bindir(), "psql"), "-X", "-A", "-t", "-d", db,
                          "-c", q], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def measure(label, db, n):
    tmp = tempfile.mkdtemp(prefix="moonloop-bench-pg-")
    os.makedirs(os.path.join(tmp, "skills"))
    with open(os.path.join(tmp, "skills", "ten.lua"), "w") as f:
        f.write(TEN)
    engines = [start_engine(tmp, db) for _ in range(n)]
    try:
        # The lone run's latency, one at a time, on the engines in turn.
        lat = []
        for k in range(LONE):
            t0 = time.perf_counter()
            code, body = post(engines[k % n].url + "/v1/skills/ten/invoke", {"data": {}, "wait": True})
            lat.append((time.perf_counter() - t0) * 1000)
            if code != 200 or body.get("output") != 55:
                sys.exit("bench: a lone run answered %s %s" % (code, body))
        base = count_completed(tmp, db)
        # Throughput: RUNS events, sent by 8 clients over the engines.
        t0 = time.perf_counter()
        sent = [0]
        lock = threading.Lock()

        def client(c):
            while True:
                with lock:
                    if sent[0] >= RUNS:
                        return
                    sent[0] += 1
                    i = sent[0]
                post(engines[(c + i) % n].url + "/v1/events", {"name": "go", "data": {"i": i}})
        ts = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        accepted = time.perf_counter() - t0
        while count_completed(tmp, db) < base + RUNS:
            time.sleep(0.1)
        took = time.perf_counter() - t0
        lat.sort()
        print("%-28s %7.0f durable steps/s (%d runs x 10 steps in %.2f s; events accepted in %.2f s)"
              % (label, RUNS * 10 / took, RUNS, took, accepted))
        print("%-28s lone 10-step run: median %.1f ms, p90 %.1f ms, best %.1f ms (%d runs)" % (
            "", statistics.median(lat), lat[int(len(lat) * 0.9) - 1], lat[0], len(lat)))
        sys.stdout.flush()
    finally:
        for p in engines:
            p.terminate()
        for p in engines:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    tmp = tempfile.mkdtemp(prefix="moonloop-bench-cluster-")
    os.chmod(tmp, 0o755)
    info = None
    url = os.environ.get("BENCH_PG_URL")
    try:
        if not url:
            info = pgcluster.start(os.path.join(tmp, "cluster"))
            url = info["url"]
        print("%d runs of 10 steps started by events; the lone run: invoke with wait, %d times"
              % (RUNS, LONE))
        measure("SQLite, 1 engine", os.path.join(tmp, "bench.db"), 1)
        for n in ENGINES:
            name = "bench_%d_%d" % (os.getpid(), n)
            if info:
                pgcluster.psql(info, 'CREATE DATABASE "%s"' % name)
            else:
                subprocess.run(["psql", url + "/postgres", "-c", 'CREATE DATABASE "%s"' % name],
                               check=True, capture_output=True)
            measure("PostgreSQL, %d engine%s" % (n, "s" if n > 1 else ""), url + "/" + name, n)
    finally:
        if info:
            pgcluster.stop(info["dir"])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
