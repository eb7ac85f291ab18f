#!/usr/bin/env python3
"""Benchmark: flow control. RUNS runs (default 10,000) of two skills that
share a concurrency limit of 10 (scope "shared") and each have a throttle,
all queued at once: throughput, the time from a slot freeing to the next
run starting (median, p99), and the memory the queue holds (the engine's
RSS while the runs wait, per queued run; the queue's rows in the store).

Each run's one step calls a local stand-in that answers after HOLD_MS (5),
so a run holds its slot that long. The runs are created by events (POST
/v1/events, 500 at a time) while the engine runs. The throttle is set
loose (THROTTLE per second per skill, default 5000, burst 100) so that the
concurrency limit is what binds; THROTTLE=200 makes the throttle bind
instead. It prints its figures and asserts no speed, only that the limit
of 10 was never exceeded (from the run records).

Usage: flow_control.py [RUNS] [BIN]
"""
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
BIN = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "moonloop")
HOLD = float(os.environ.get("HOLD_MS", "5")) / 1000
THROTTLE = int(os.environ.get("THROTTLE", "5000"))


class Hold(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else a delayed ACK adds 40 ms to each call

    def log_message(self, *a):
        pass

    def do_GET(self):
        ARRIVALS.append(time.time() * 1000)  # list.append is atomic
        time.sleep(HOLD)
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ARRIVALS = []


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


SKILL = """
return { id = "%s", triggers = { { event = "bench.go" } },
  concurrency = { limit = 10, scope = "shared" },
  throttle = { limit = %d, period = "1s", burst = 100 },
  run = function(ctx)
    return ctx.step.run("call", function() return http.get_json(env.STANDIN .. "/x").ok end)
  end }
"""


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def ms(t):
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000


def main():
    si = Server(("127.0.0.1", 0), Hold)
    threading.Thread(target=si.serve_forever, daemon=True).start()
    d = tempfile.mkdtemp(prefix="ml-flow-bench-")
    os.makedirs(os.path.join(d, "skills"))
    for name in ("bench-a", "bench-b"):
        with open(os.path.join(d, "skills", name + ".lua"), "w") as f:
            f.write(SKILL % (name, THROTTLE))
    with open(os.path.join(d, "moonloop.conf.lua"), "w") as f:
        f.write('return { env = { "STANDIN" }, durability = "full" }\n')
    env = dict(os.environ, MOONLOOP_DB=os.path.join(d, "moonloop.db"), NO_COLOR="1",
               STANDIN="http://127.0.0.1:%d" % si.server_address[1])
    env.pop("MOONLOOP_URL", None)
    p = subprocess.Popen([BIN, "serve", "--workspace", "skills", "--listen", "127.0.0.1:0"], cwd=d,
                         env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url = None
    for line in p.stderr:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    base_rss = rss_kb(p.pid)
    con = sqlite3.connect(os.path.join(d, "moonloop.db"), timeout=30)

    t0 = time.time()
    for i in range(0, N, 500):
        evs = [{"name": "bench.go", "data": {"i": j}} for j in range(i, min(N, i + 500))]
        req = urllib.request.Request(url + "/v1/events", data=json.dumps(evs).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
    sent = time.time() - t0
    # Half of them each to bench-a and bench-b: an event starts a run of each.
    total = 2 * N
    peak_rss, peak_queued, peak_rows = base_rss, 0, 0
    while True:
        done = con.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchone()[0]
        queued = con.execute("SELECT count(*) FROM runs WHERE status = 'queued'").fetchone()[0]
        r = rss_kb(p.pid)
        if queued > peak_queued:
            peak_rss, peak_queued = max(peak_rss, r), queued
        peak_rows = max(peak_rows, con.execute("SELECT count(*) FROM slot_queue").fetchone()[0])
        if done >= total:
            break
        if time.time() - t0 > 1800:
            sys.exit("the runs did not finish in 30 minutes (%d of %d)" % (done, total))
        time.sleep(0.2)
    wall = time.time() - t0
    queue_bytes = None
    try:
        queue_bytes = con.execute("SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'slot_queue%'").fetchone()[0]
    except sqlite3.Error:
        pass
    rows = con.execute("SELECT created_at, started_at, ended_at FROM runs WHERE status = 'completed'").fetchall()
    p.terminate()
    p.wait(timeout=30)
    si.shutdown()

    # Concurrency never over 10, from the records; and the time from each
    # slot freeing to the next start: while runs wait, the k-th start past
    # the first 10 takes the slot of the k-th end.
    events = sorted([(s, 1) for _, s, _ in rows] + [(e, -1) for _, _, e in rows], key=lambda x: (x[0], x[1]))
    live = most = 0
    for _, dlt in events:
        live += dlt
        most = max(most, live)
    starts = sorted(s for _, s, _ in rows)
    ends = sorted(e for _, _, e in rows)
    gaps = [starts[10 + k] - ends[k] for k in range(len(starts) - 10)]
    gaps = [g for g in gaps if g >= 0]
    gaps.sort()
    first, last = starts[0], ends[-1]
    print("runs: %d (%d events, each starting a run of 2 skills sharing a limit of 10; throttle %d/s each, burst 100)"
          % (total, N, THROTTLE))
    print("events accepted in %.1f s" % sent)
    print("throughput: %.0f runs/s (first start to last end: %.1f s; all, from the first event: %.1f s)"
          % (total / ((last - first) / 1000), (last - first) / 1000, wall))
    print("most runs executing at once: %d (limit 10)" % most)
    durs = sorted(e - s for _, s, e in rows)
    print("a run, started to ended: median %.1f ms, p99 %.1f ms (its step holds the slot %.0f ms)"
          % (statistics.median(durs), durs[int(len(durs) * 0.99)], HOLD * 1000))
    print("slot freed -> next run started (store: a run's end to the grant in its release's"
          " transaction): median %.1f ms, p99 %.1f ms, max %.1f ms (%d hand-overs; ms timestamps)"
          % (statistics.median(gaps), gaps[int(len(gaps) * 0.99)], gaps[-1], len(gaps)))
    arr = sorted(ARRIVALS)
    calls = [arr[10 + k] - ends[k] for k in range(min(len(arr), len(ends)) - 10)]
    calls = sorted(c for c in calls if c >= 0)
    print("slot freed -> next run's step reaching the stand-in (its end, the release commit granting it,"
          " resume, request): median %.1f ms, p99 %.1f ms"
          % (statistics.median(calls), calls[int(len(calls) * 0.99)]))
    print("engine RSS: %.1f MB idle, %.1f MB at peak with %d runs queued: %.1f KB per queued run"
          % (base_rss / 1024, peak_rss / 1024, peak_queued,
             (peak_rss - base_rss) / max(peak_queued, 1)))
    print("queue rows in the store: at most %d slot_queue rows%s" % (
        peak_rows, "" if queue_bytes is None else ", %d bytes of pages at the end" % queue_bytes))
    shutil.rmtree(d, ignore_errors=True)
    if most > 10:
        sys.exit("the limit was exceeded")


if __name__ == "__main__":
    main()
