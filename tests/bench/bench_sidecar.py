"""bench_sidecar: how fast a saved skill file is live, and whether runs in
flight notice.

Starts `moonloop serve` on a temporary workspace, keeps RUNNERS runs busy
with quick durable steps, and rewrites a skill file CHANGES times. For each
change: the time from the write (open, write, close) to GET /v1/skills/{id}
answering the file's SHA-256 as the live version (polled every 2 ms). Beside
it, the engine's step rate (/metrics resumes, sampled every 50 ms): over a
quiet baseline, and while the changes happen; the slowest 100 ms window of
each shows a pause if there is one.

Usage: python3 bench_sidecar.py [MOONLOOP_BIN] [CHANGES]
Prints the figures; asserts nothing about speed.
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MOONLOOP_BIN", "build/moonloop")
CHANGES = int(sys.argv[2]) if len(sys.argv) > 2 else 100
RUNNERS = int(os.environ.get("RUNNERS", "100"))
BASELINE_S = 3.0

STEPPER = """
-- Quick durable steps until the time in its input.
return {
  id = "stepper",
  run = function(ctx)
    local n = 0
    while true do
      local t = ctx.step.run("s", function() return time.now() end)
      n = n + 1
      if t > ctx.input["until"] then return n end
    end
  end,
}
"""

TARGET = """-- the file the benchmark rewrites: change %d
return {
  id = "target",
  description = "change %d",
  run = function(ctx) return ctx.step.run("x", function() return %d end) end,
}
"""


def main():
    tmp = tempfile.mkdtemp(prefix="moonloop-bench-sidecar-")
    ws = os.path.join(tmp, "skills")
    os.makedirs(ws)
    with open(os.path.join(ws, "stepper.lua"), "w") as f:
        f.write(STEPPER)
    target = os.path.join(ws, "target.lua")
    with open(target, "w") as f:
        f.write(TARGET % (0, 0, 0))
    env = dict(os.environ, MOONLOOP_DB=os.path.join(tmp, "bench.db"), NO_COLOR="1")
    env.pop("MOONLOOP_URL", None)
    p = subprocess.Popen([os.path.abspath(BIN), "serve", "--workspace", "skills", "--listen",
                          "127.0.0.1:0"], cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = None
        for line in p.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if not port:
            sys.exit("bench: serve did not start")
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        run(port, target)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def conn(port):
    return http.client.HTTPConnection("127.0.0.1", port, timeout=30)


def get(c, path):
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def resumes(c):
    st, body = get(c, "/metrics")
    m = re.search(rb"^moonloop_resumes_total (\d+)", body, re.M)
    return int(m.group(1))


def run(port, target):
    c = conn(port)
    # Runs in flight during the whole benchmark.
    until = time.time() + 2 * BASELINE_S + CHANGES * 0.3 + 30
    for _ in range(RUNNERS):
        c.request("POST", "/v1/skills/stepper/invoke", json.dumps({"data": {"until": until}}))
        r = c.getresponse()
        r.read()
        if r.status >= 300:
            sys.exit("bench: invoke failed: %d" % r.status)
    samples = []  # (monotonic time, resumes)
    stop = threading.Event()

    def sampler():
        sc = conn(port)
        while not stop.is_set():
            samples.append((time.monotonic(), resumes(sc)))
            time.sleep(0.05)
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    time.sleep(BASELINE_S)
    # Control: the same polling as below, without any change, so the figures
    # below separate the cost of the changes from the cost of being asked.
    t_poll = time.monotonic()
    while time.monotonic() - t_poll < BASELINE_S:
        get(c, "/v1/skills/target")
        time.sleep(0.002)
    t_changes = time.monotonic()
    lat = []
    for i in range(1, CHANGES + 1):
        text = TARGET % (i, i, i)
        want = hashlib.sha256(text.encode()).hexdigest().encode()
        t0 = time.monotonic()
        with open(target, "w") as f:
            f.write(text)
        while True:
            st, body = get(c, "/v1/skills/target")
            if want in body and json.loads(body)["version"] == want.decode():
                break
            if time.monotonic() - t0 > 10:
                sys.exit("bench: change %d not live after 10 s" % i)
            time.sleep(0.002)
        lat.append((time.monotonic() - t0) * 1000)
    t_end = time.monotonic()
    stop.set()
    th.join()

    def rates(a, b):
        """Steps per second over each 100 ms window of samples within [a, b)."""
        pts = [s for s in samples if a <= s[0] < b]
        out = []
        for k in range(0, len(pts) - 2, 2):
            (t1, r1), (t2, r2) = pts[k], pts[k + 2]
            if t2 > t1:
                out.append((r2 - r1) / (t2 - t1))
        total = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else 0
        return total, out

    base, base_w = rates(t_poll - BASELINE_S + 0.5, t_poll)
    polled, polled_w = rates(t_poll, t_changes)
    during, during_w = rates(t_changes, t_end)
    lat.sort()
    q = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))]
    print("%d changes of a skill file, from the write to the version being live (GET /v1/skills/{id}):"
          % len(lat))
    print("  median %.0f ms, p90 %.0f ms, worst %.0f ms, best %.0f ms (debounce %d ms included)"
          % (statistics.median(lat), q(0.9), lat[-1], lat[0], 100))
    print("runs in flight (%d runs of quick durable steps) while the changes went live:" % RUNNERS)
    mn = lambda w: min(w) if w else 0
    print("  steps/s, quiet: %.0f (slowest 100 ms window %.0f)" % (base, mn(base_w)))
    print("  steps/s, polled every 2 ms, no change: %.0f (slowest 100 ms window %.0f)"
          % (polled, mn(polled_w)))
    print("  steps/s, polled and changed: %.0f (slowest 100 ms window %.0f)" % (during, mn(during_w)))
    stalls = sum(1 for r in during_w if r == 0)
    print("  100 ms windows with no step at all during the changes: %d of %d" % (stalls, len(during_w)))


if __name__ == "__main__":
    main()
