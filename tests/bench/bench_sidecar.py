"""bench_sidecar: how fast a saved skill file is live, and whether runs in
flight notice.

Starts `moonloop serve` on a temporary workspace, keeps RUNNERS runs busy
with quick durable steps, and rewrites a skill file CHANGES times. For each
change: the time from the write (open, write, close) to GET /v1/skills/{id}
answering the file's SHA-256 as the live version (polled every 2 ms). Beside
it, the engine's step rate (/metrics resumes) while each change goes live,
against a window of the same polling without a change just before it (the
pairing keeps the machine's drift out of the comparison); the slowest
window shows a pause if there is one.

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
    c, mc = conn(port), conn(port)
    # Runs in flight during the whole benchmark.
    until = time.time() + CHANGES * 0.6 + 30
    for _ in range(RUNNERS):
        c.request("POST", "/v1/skills/stepper/invoke", json.dumps({"data": {"until": until}}))
        r = c.getresponse()
        r.read()
        if r.status >= 300:
            sys.exit("bench: invoke failed: %d" % r.status)
    time.sleep(1.0)  # the runs get going
    # Each change is paired with a control window of the same polling and no
    # change just before it, so the machine's drift affects both alike.
    lat, quiet, changed = [], [], []  # quiet/changed: (steps, seconds) per window
    for i in range(1, CHANGES + 1):
        t0, r0 = time.monotonic(), resumes(mc)
        while time.monotonic() - t0 < 0.12:
            get(c, "/v1/skills/target")
            time.sleep(0.002)
        t1, r1 = time.monotonic(), resumes(mc)
        quiet.append((r1 - r0, t1 - t0))
        text = TARGET % (i, i, i)
        want = hashlib.sha256(text.encode()).hexdigest()
        t1 = time.monotonic()
        with open(target, "w") as f:
            f.write(text)
        while True:
            st, body = get(c, "/v1/skills/target")
            if json.loads(body)["version"] == want:
                break
            if time.monotonic() - t1 > 10:
                sys.exit("bench: change %d not live after 10 s" % i)
            time.sleep(0.002)
        t2 = time.monotonic()
        lat.append((t2 - t1) * 1000)
        r2 = resumes(mc)
        changed.append((r2 - r1, time.monotonic() - t1))
    lat.sort()
    q = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))]
    rate = lambda ws: sum(n for n, _ in ws) / sum(t for _, t in ws)
    slowest = lambda ws: min(n / t for n, t in ws)
    print("%d changes of a skill file, from the write to the version being live (GET /v1/skills/{id}):"
          % len(lat))
    print("  median %.0f ms, p90 %.0f ms, worst %.0f ms, best %.0f ms (debounce %d ms included)"
          % (statistics.median(lat), q(0.9), lat[-1], lat[0], 100))
    print("runs in flight (%d runs of quick durable steps), steps/s (engine's resumes):" % RUNNERS)
    print("  while a change goes live: %.0f (slowest window %.0f)" % (rate(changed), slowest(changed)))
    print("  in the quiet window before each change: %.0f (slowest window %.0f)"
          % (rate(quiet), slowest(quiet)))
    print("  windows with no step at all while a change went live: %d of %d"
          % (sum(1 for n, _ in changed if n == 0), len(changed)))


if __name__ == "__main__":
    main()
