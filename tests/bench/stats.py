#!/usr/bin/env python3
"""Benchmark: `moonloop stats` over a database of 1,000,000 runs (default).

The database is created by moonloop itself (schema and migrations, with
its indexes), then filled directly with SQLite in the engine's schema:
RUNS runs of 10 skills over the last DAYS days (default 30), newest last,
each with a real ULID for its creation time and three steps (a fetch, an
LLM call with token usage that is retried now and then, a notification
that fails in the failed runs); about 1% of the runs are parked (sleeping
or waiting), the last few hundred still running; three versions of each
skill were loaded over the period (deploy markers).

The rows go in underneath the engine, so its rollup of the figures
(store_rollup.c) is then built as an older database's is: by migration 10,
run by the next command (timed and printed).

Then it times the commands an operator runs, as they run them (a process
start included): median of 7, in ms. The target is under 200 ms for
`moonloop stats` over the 7-day default window. Usage:
  stats.py [RUNS] [BIN] [DAYS]        (KEEP=1 keeps the database and prints where;
                                       DB=path times a kept one instead of filling)
"""
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import schema  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000
BIN = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "moonloop")
DAYS = float(sys.argv[3]) if len(sys.argv) > 3 else 30
SKILLS = ["skill-%d" % i for i in range(10)]
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

REUSE = os.environ.get("DB")
d = os.path.dirname(os.path.abspath(REUSE)) if REUSE else tempfile.mkdtemp(prefix="ml-stats-bench-")
db = os.path.abspath(REUSE) if REUSE else os.path.join(d, "moonloop.db")
env = dict(os.environ, MOONLOOP_DB=db, NO_COLOR="1")
env.pop("MOONLOOP_URL", None)
if not REUSE:
    subprocess.run([BIN, "runs"], env=env, cwd=d, check=True, capture_output=True)

rnd = random.Random(1)


def ulid(ms):
    """A ULID for time ms: 48 bits of time, 80 random, in Crockford's base 32."""
    v = (ms << 80) | rnd.getrandbits(80)
    return "".join(CROCKFORD[(v >> (5 * (25 - i))) & 31] for i in range(26))


now = int(time.time() * 1000)
span = int(DAYS * 86400000)
start = now - span
usage = '{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"calls":1}'


def rows():
    for i in range(N):
        created = start + i * span // N
        rid = ulid(created)
        skill = SKILLS[i % 10]
        wait = 0 if rnd.random() < 0.8 else rnd.randint(1, 2000)
        started = created + wait
        age = now - created
        r = rnd.random()
        if age < 60000 and r < 0.5:
            status = "running"
        elif r < 0.005:
            status = "sleeping"
        elif r < 0.01:
            status = "waiting"
        elif r < 0.08:
            status = "failed"
        elif r < 0.09:
            status = "cancelled"
        else:
            status = "completed"
        # Step durations: fetch 20-200 ms, llm 300 ms-8 s (one slow skill), notify 10-50 ms.
        slow = 4 if skill == "skill-7" else 1
        d1 = rnd.randint(20, 200)
        d2 = int(rnd.lognormvariate(7, 0.6)) * slow
        d3 = rnd.randint(10, 50)
        ended = started + d1 + d2 + d3 if status in ("completed", "failed", "cancelled") else None
        steps = [(rid, 1, "fetch", "run", "completed", None, 1, started, started + d1)]
        p, c = rnd.randint(200, 2000), rnd.randint(20, 400)
        steps.append((rid, 2, "llm-classify", "run", "completed", usage % (p, c, p + c),
                      2 if rnd.random() < 0.1 else 1, started + d1, started + d1 + d2))
        if status in ("completed", "failed"):
            steps.append((rid, 3, "notify", "run", status, None, 3 if status == "failed" else 1,
                          started + d1 + d2, ended))
        # What the engine keeps on an ended run (store__run_ended): the sums of its steps.
        summary = (len(steps), int(status == "failed"), sum(s[6] - 1 for s in steps),
                   p + c) if ended else (None, None, None, None)
        yield (rid, skill, "v" * 64, status, '{"kind":"cron","cron":"*/5 * * * *"}', "{}",
               '{"ok":true}' if status == "completed" else None,
               '{"message":"boom","step":"notify"}' if status == "failed" else None,
               created, started, ended) + summary, steps


def fill():
    con = sqlite3.connect(db)
    t0 = time.time()
    with con:
        batch_runs, batch_steps = [], []
        for run, steps in rows():
            batch_runs.append(run)
            batch_steps.extend(steps)
            if len(batch_runs) >= 20000:
                con.executemany("INSERT INTO runs(id, skill, version, status, trigger, input, output, error,"
                                " created_at, started_at, ended_at, steps, failed_steps, retries, tokens)"
                                " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", batch_runs)
                con.executemany("INSERT INTO steps(run_id, seq, id, kind, status, usage, attempts,"
                                " started_at, ended_at) VALUES(?,?,?,?,?,?,?,?,?)", batch_steps)
                batch_runs, batch_steps = [], []
        if batch_runs:
            con.executemany("INSERT INTO runs(id, skill, version, status, trigger, input, output, error,"
                            " created_at, started_at, ended_at, steps, failed_steps, retries, tokens)"
                                " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", batch_runs)
            con.executemany("INSERT INTO steps(run_id, seq, id, kind, status, usage, attempts,"
                            " started_at, ended_at) VALUES(?,?,?,?,?,?,?,?,?)", batch_steps)
        for s in SKILLS:
            for k in range(3):
                src = "-- %s version %d\nreturn { id = %r, run = function() end }\n" % (s, k, s)
                v = "%064x" % rnd.getrandbits(256)
                con.execute("INSERT INTO versions(version, skill, source, file, loaded_at) VALUES(?,?,?,?,?)",
                            (v, s, src, "/srv/skills/%s.lua" % s, start + (k + 1) * span // 4))
            con.execute("INSERT INTO skills(id, version, file, description, triggers, updated_at)"
                        " VALUES(?,?,?,?,?,?)", (s, v, "/srv/skills/%s.lua" % s, "", "[]", now))
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    size = os.path.getsize(db) / 1048576
    print("filled %d runs of %d skills over %g days (about %d runs, %d steps in the last 7 days)"
          " in %.0f s; the file is %.0f MB" % (N, len(SKILLS), DAYS, min(N, N * 7 / DAYS),
                                               3 * min(N, N * 7 / DAYS), time.time() - t0, size))
    # The rollup as migration 10 builds it for an older database: the
    # version set back to 9, the next command migrates.
    con = sqlite3.connect(db)
    schema.sqlite_rewind(con, 9)
    con.close()
    t = time.time()
    subprocess.run([BIN, "runs"], env=env, cwd=d, check=True, capture_output=True)
    print("migration 10 (the figures' rollup of %d runs) took %.1f s" % (N, time.time() - t))


if not REUSE:
    fill()


def timed(*args):
    samples = []
    for _ in range(7):
        t = time.time()
        subprocess.run([BIN] + list(args), env=env, cwd=d, check=True, capture_output=True)
        samples.append((time.time() - t) * 1000)
    return statistics.median(samples), min(samples)


subprocess.run([BIN, "stats"], env=env, cwd=d, check=True, capture_output=True)  # a warm cache
print("moonloop %-34s median %6.1f ms (best %.1f)" % ("--version (a process start)",
                                                        *timed("--version")))
for args in (["stats"], ["stats", "skill-3"], ["stats", "skill-7", "--json"],
             ["stats", "--since", "24h"], ["stats", "skill-3", "--since", "1h"],
             ["stats", "--since", "%gd" % DAYS], ["stats", "skill-3", "--since", "%gd" % DAYS]):
    print("moonloop %-34s median %6.1f ms (best %.1f)" % (" ".join(args), *timed(*args)))
if os.environ.get("KEEP") or REUSE:
    print("kept the database: MOONLOOP_DB=%s" % db)
else:
    subprocess.run(["rm", "-rf", d])
