#!/usr/bin/env python3
"""Benchmark: the client path of `moonloop serve`, seen from the engine.

For each binary given (the previous build first, then this one, so both
print side by side in one run), it starts `moonloop serve` on a fresh
database (durability "full") and measures:

  record    GET /v1/runs/{id} of a known 10-step run: engine CPU per
            request and requests/s (wrk, 4 connections)
  list      GET /v1/runs?limit=50 (the dashboard's page) over 1,000 runs
  start     POST /v1/skills/{id}/invoke, one run per request, 10,000 from
            100 connections (wrk): the wall time, and the engine CPU per
            start until every run has ended (a skill with no step: the
            start and the run's own overhead; and a one-step skill)
  keyed     the same with a unique idempotency key per request
  attach    learning that a run ended: 3,000 runs waiting for an event,
            each with a client waiting on GET /v1/runs/{id}?wait=30 over a
            connection it already has (a build without attach answers at
            once: the client then polls every 100 ms, as clients had to),
            until one event ends them all; the engine CPU of the same
            window set up the same way (the connections open, every run
            waiting, the same event) without the attaches is subtracted
            (median of five pairs, with their range); and
            attaches whose 0.2 s wait runs out on runs asleep for a
            minute, where nothing else happens in the window
  lone      one client, one 10-step run at a time: start to result
            (POST invoke {"wait": 30}), median and p90
  flow      1,000 runs x 10 steps, 50 in flight, each started then
            attached to (or polled every 5 ms): steps/s seen by the
            client, engine CPU per step
  sleeping  10,000 runs sleeping 2 s at once: the engine's peak memory

Engine CPU is the serve process's CPU time (its threads' schedstat run
times, all threads) across the measured window. The clients (wrk, this script)
run on the same machine and are not counted.

Usage: client_path.py BIN [BIN...]   (environment: QUICK=1 for fewer requests)
"""
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
QUICK = os.environ.get("QUICK") == "1"
TICK = os.sysconf("SC_CLK_TCK")

SKILLS = {
    "noop": 'return { id = "noop", run = function(ctx) return 1 end }',
    "bench": '''return { id = "bench", run = function(ctx)
  return ctx.step.run("echo", function() return { n = ctx.input and ctx.input.n } end)
end }''',
    "ten": '''return { id = "ten", run = function(ctx)
  local n = 0
  for i = 1, 10 do n = n + ctx.step.run("s" .. i, function() return i end) end
  return n
end }''',
    "hold": '''return { id = "hold", run = function(ctx)
  ctx.step.wait_for_event("go", { event = "go." .. ctx.input.k })
  return "released"
end }''',
    "nap": '''return { id = "nap", run = function(ctx)
  ctx.step.sleep("nap", ctx.input and ctx.input.s or 2)
  return "rested"
end }''',
}

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from vocab import RUN_ENDED as TERMINAL  # noqa: E402


def cpu(pid):
    """The process's CPU seconds, all threads: the sum of its threads'
    schedstat run times (nanoseconds; the engine's threads live as long as
    it does), or user+system time from /proc/PID/stat (10 ms ticks)."""
    try:
        total = 0
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICK


def peak_rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0


class Serve:
    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="ml-client-bench-")
        os.makedirs(os.path.join(self.dir, "skills"))
        for name, src in SKILLS.items():
            with open(os.path.join(self.dir, "skills", name + ".lua"), "w") as f:
                f.write(src)
        # Clients here keep thousands of connections idle while the runs
        # get ready (longer than the default 10 s on a loaded machine).
        env = dict(os.environ, MOONLOOP_DB=os.path.join(self.dir, "bench.db"),
                   MOONLOOP_DURABILITY="full", NO_COLOR="1", MOONLOOP_HTTP_TIMEOUT="120s")
        env.pop("MOONLOOP_URL", None)
        self.err = open(os.path.join(self.dir, "serve.log"), "w+")
        self.p = subprocess.Popen([binary, "serve", "--workspace", "skills", "--listen",
                                   "127.0.0.1:0"], cwd=self.dir, env=env,
                                  stdout=subprocess.DEVNULL, stderr=self.err)
        end = time.time() + 30
        self.url = None
        while time.time() < end and not self.url:
            time.sleep(0.05)
            with open(self.err.name) as f:
                m = re.search(r"listening on (http://\S+)", f.read())
            if m:
                self.url = m.group(1)
            if self.p.poll() is not None:
                break
        if not self.url:
            raise SystemExit("bench: serve did not start: " + open(self.err.name).read())
        self.host, self.port = self.url[7:].rsplit(":", 1)
        self.port = int(self.port)
        # Whether this build answers a record without its steps (?steps=
        # false, 2026-12-02 on): 404 for an unknown run, 400 before.
        st, _ = self.call("GET", "/v1/runs/01J00000000000000000000000?steps=false")
        self.lean = "&steps=false" if st == 404 else ""

    def cpu(self):
        return cpu(self.p.pid)

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def counts(self):
        """Runs in the database by status (from /metrics)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        return {m.group(1): int(m.group(2)) for m in
                re.finditer(r'^moonloop_runs\{status="(\w+)"\} (\d+)', text, re.M)}

    def settle(self, timeout=120):
        """Wait until no run is unfinished."""
        end = time.time() + timeout
        while time.time() < end:
            c = self.counts()
            if not sum(c.get(s, 0) for s in ("queued", "running", "sleeping", "waiting")):
                return
            time.sleep(0.05)
        raise SystemExit("bench: runs did not finish")

    def close(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


BENCH_HTTP = os.environ.get("BENCH_HTTP") or os.path.join(HERE, "..", "..", "build", "bench_http")


def blast(srv, path, total, conns, body, keyed=False):
    """Send exactly total POSTs over conns connections (bench_http.c);
    returns its RESULT fields."""
    out = subprocess.run([BENCH_HTTP, "%s:%d" % (srv.host, srv.port), "POST", path, body,
                          str(total), str(conns), "1" if keyed else "0"],
                         capture_output=True, text=True).stdout
    m = re.search(r"^RESULT (.*)$", out, re.M)
    if not m:
        raise SystemExit("bench: bench_http printed no result:\n" + out)
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def wrk(srv, path, threads, conns, duration="5s", method="GET", body=None):
    """Run wrk; returns its RESULT fields as a dict (requests, seconds, ...)."""
    env = dict(os.environ, BENCH_DIR=HERE, METHOD=method, BODY=body or "")
    out = subprocess.run(["wrk", "--latency", "-t%d" % threads, "-c%d" % conns, "-d" + duration,
                          "-s", os.path.join(HERE, "client_path.lua"), srv.url + path],
                         env=env, capture_output=True, text=True).stdout
    m = re.search(r"^RESULT (.*)$", out, re.M)
    if not m:
        raise SystemExit("bench: wrk printed no result:\n" + out)
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


# ---- a small asyncio HTTP/1.1 client (for waits and flows wrk cannot drive) ----

class Conn:
    def __init__(self, srv):
        self.srv = srv
        self.r = self.w = None

    async def open(self):
        self.r, self.w = await asyncio.open_connection(self.srv.host, self.srv.port)

    async def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else b""
        self.w.write(("%s %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n" % (method, path, self.srv.host, self.srv.port,
                                                      len(data))).encode() + data)
        status = int((await self.r.readline()).split()[1])
        length = 0
        while True:
            line = await self.r.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            if k.lower() == "content-length":
                length = int(v)
        raw = await self.r.readexactly(length) if length else b""
        return status, json.loads(raw) if raw else None

    def close(self):
        if self.w:
            self.w.close()


async def wait_for_end(c, run_id, poll_s, query=""):
    """Attach (GET ?wait=30, with query after it: "&steps=false"); when an
    answer is not final (a build without attach answers at once), poll
    every poll_s. Returns the record and the number of requests made."""
    n = 0
    while True:
        st, rec = await c.call("GET", "/v1/runs/%s?wait=30%s" % (run_id, query))
        n += 1
        if rec and rec.get("status") in TERMINAL:
            return rec, n
        await asyncio.sleep(poll_s)


async def start_runs(srv, n, skill, data):
    conns = [Conn(srv) for _ in range(50)]
    await asyncio.gather(*(c.open() for c in conns))
    ids = []

    async def worker(c, k):
        for _ in range(k):
            st, ans = await c.call("POST", "/v1/skills/%s/invoke" % skill, {"data": data})
            ids.append(ans["run_id"])
    await asyncio.gather(*(worker(c, n // len(conns)) for c in conns))
    for c in conns:
        c.close()
    return ids


async def start_naps(srv, n, secs):
    return await start_runs(srv, n, "nap", {"s": secs})


async def attach_window(srv, n, attach, k, query=""):
    """Start n runs that wait for the event go.K (not measured), then
    measure the engine's CPU from before the attaches until all have ended:
    with a client attached to each run, or with none. Both windows are set
    up alike, so that only the attaches differ: the n connections are
    opened and used once either way (accepting them is not counted: clients
    attach over connections they already have), every run is waiting before
    the window opens, and the same one event ends them all, sent once the
    engine is idle again after the attaches were sent (each is registered),
    or at once without them; the window closes when every run has ended."""
    ids = await start_runs(srv, n, "hold", {"k": k})
    conns = [Conn(srv) for _ in ids]
    await asyncio.gather(*(c.open() for c in conns))
    await asyncio.gather(*(c.call("GET", "/v1/skills/hold") for c in conns))
    ev = Conn(srv)
    await ev.open()
    end = time.time() + 120
    while any(srv.counts().get(st, 0) for st in ("queued", "running", "sleeping")):
        if time.time() > end:
            raise SystemExit("bench: the runs did not reach their wait")
        await asyncio.sleep(0.05)
    await quiet(srv)
    t0, c0 = time.time(), srv.cpu()
    requests = 0
    waits = None
    if attach:
        waits = asyncio.gather(*(wait_for_end(c, i, 0.1, query) for c, i in zip(conns, ids)))
        await asyncio.sleep(0.1)
        await quiet(srv)
    st, _ = await ev.call("POST", "/v1/events", {"name": "go.%d" % k, "data": {}})
    assert st == 202, st
    if waits:
        res = await waits
        requests = sum(r[1] for r in res)
    srv.settle()
    c1 = srv.cpu()
    for c in conns + [ev]:
        c.close()
    return c1 - c0, time.time() - t0, requests


async def quiet(srv, idle=0.003):
    """Until the engine spends under idle s of CPU in 0.1 s."""
    end = time.time() + 60
    c = srv.cpu()
    while time.time() < end:
        await asyncio.sleep(0.1)
        c, was = srv.cpu(), c
        if c - was < idle:
            return


async def attach_timeouts(srv, n):
    """n runs asleep for a minute, one client each attached with a wait of
    0.2 s that runs out: the engine CPU of the window, in which nothing but
    the attaches happens (register, the timer, the record answered)."""
    ids = await start_naps(srv, n, 60)
    conns = [Conn(srv) for _ in ids]
    await asyncio.gather(*(c.open() for c in conns))
    await asyncio.gather(*(c.call("GET", "/v1/skills/nap") for c in conns))
    await asyncio.sleep(0.5)
    t0, c0 = time.time(), srv.cpu()
    res = await asyncio.gather(*(c.call("GET", "/v1/runs/%s?wait=0.2" % i) for c, i in zip(conns, ids)))
    c1 = srv.cpu()
    assert all(r[1]["status"] == "sleeping" for r in res), res[0]
    for c in conns:
        c.close()
    return c1 - c0


async def flow(srv, runs, inflight, poll_s):
    conns = [Conn(srv) for _ in range(inflight)]
    await asyncio.gather(*(c.open() for c in conns))
    t0, c0 = time.time(), srv.cpu()
    requests = [0]

    async def worker(c, k):
        for _ in range(k):
            st, ans = await c.call("POST", "/v1/skills/ten/invoke", {"data": {}})
            rec, n = await wait_for_end(c, ans["run_id"], poll_s, srv.lean)
            requests[0] += 1 + n
            assert rec["output"] == 55, rec
    await asyncio.gather(*(worker(c, runs // inflight) for c in conns))
    t1, c1 = time.time(), srv.cpu()
    for c in conns:
        c.close()
    return t1 - t0, c1 - c0, requests[0]


def us(x):
    return "%.1f" % (x * 1e6)


def bench(binary):
    rows = {}
    srv = Serve(binary)
    try:
        # A known 10-step run, and 1,000 runs for the list.
        st, ans = srv.call("POST", "/v1/skills/ten/invoke", {"data": {}, "wait": 30})
        ten = ans["run_id"]
        blast(srv, "/v1/skills/bench/invoke", 1000, 20, '{"data":{"n":1}}')
        srv.settle()
        d = "2s" if QUICK else "5s"
        for name, path in (("record", "/v1/runs/" + ten), ("list", "/v1/runs?limit=50")):
            c0 = srv.cpu()
            r = wrk(srv, path, 1, 4, d)
            rows[name] = (r["req_per_s"], (srv.cpu() - c0) / r["requests"], r["errors"])
        # Starts: 10,000 single-run requests from 100 connections.
        n = 2000 if QUICK else 10000
        for name, skill, keyed in (("start", "noop", False), ("start1", "bench", False),
                                   ("keyed", "noop", True)):
            c0 = srv.cpu()
            r = blast(srv, "/v1/skills/%s/invoke" % skill, n, 100,
                      '{"data":{"n":1},"key":"%K"}' if keyed else '{"data":{"n":1}}', keyed)
            srv.settle()
            rows[name] = (r["seconds"], (srv.cpu() - c0) / r["requests"], r["errors"],
                          r["requests"])
        # Attach: the median of five pairs of windows (each pair's order
        # alternates, so a drift of the machine's load favours neither),
        # answered with the record's steps, then without (?steps=false).
        n = 1000 if QUICK else 3000
        for name, query in (("attach", ""), ("attach_lean", srv.lean)):
            if name == "attach_lean" and not query:
                continue
            pairs = []
            for k in range(5):
                key = 2 * k + (10 if query else 0)
                if k % 2:
                    with_clients, secs, reqs = asyncio.run(attach_window(srv, n, True, key, query))
                    base, _, _ = asyncio.run(attach_window(srv, n, False, key + 1))
                else:
                    base, _, _ = asyncio.run(attach_window(srv, n, False, key))
                    with_clients, secs, reqs = asyncio.run(attach_window(srv, n, True, key + 1,
                                                                         query))
                pairs.append(((with_clients - base) / n, reqs / n))
            pairs.sort()
            rows[name] = (pairs[2][0], pairs[2][1], pairs[0][0], pairs[-1][0])
        # One 10-step run at a time, start to result.
        r = wrk(srv, "/v1/skills/ten/invoke", 1, 1, "3s" if QUICK else "5s", "POST",
                '{"data":{},"wait":30}')
        rows["lone"] = (r["p50_ms"], r["p90_ms"], r["errors"])
        # 1,000 runs x 10 steps, 50 in flight.
        runs = 300 if QUICK else 1000
        secs, c, reqs = asyncio.run(flow(srv, runs, 50, 0.005))
        rows["flow"] = (runs * 10 / secs, c / (runs * 10), reqs / runs, srv.lean)
        # Attaches whose wait runs out, last (their runs sleep on).
        n = 1000 if QUICK else 3000
        rows["attach_timeout"] = asyncio.run(attach_timeouts(srv, n)) / n
    finally:
        srv.close()
    # 10,000 sleeping runs at once, on a fresh engine: peak memory.
    srv = Serve(binary)
    try:
        base = peak_rss_mb(srv.p.pid)
        n = 2000 if QUICK else 10000
        blast(srv, "/v1/skills/nap/invoke", n, 100, '{"data":{"s":2}}')
        rows["sleeping"] = (base, peak_rss_mb(srv.p.pid), n)
        srv.settle()
        rows["sleeping"] = (base, peak_rss_mb(srv.p.pid), n)
    finally:
        srv.close()
    return rows


def main():
    bins = [os.path.abspath(b) for b in sys.argv[1:]]
    if not bins:
        raise SystemExit(__doc__)
    results = []
    for b in bins:
        print("bench: %s" % b, flush=True)
        results.append((b, bench(b)))
    for b, r in results:
        print("\n== %s" % b)
        print("   record   GET /v1/runs/{id} (10 steps): %8.0f req/s  engine %6s us/request  errors %d"
              % (r["record"][0], us(r["record"][1]), r["record"][2]))
        print("   list     GET /v1/runs?limit=50:        %8.0f req/s  engine %6s us/request  errors %d"
              % (r["list"][0], us(r["list"][1]), r["list"][2]))
        for k, what in (("start", "no step"), ("start1", "one step"), ("keyed", "no step, keyed")):
            s = r[k]
            print("   %-8s %d single-run starts (%s), 100 connections: %.2f s (%.0f/s)  "
                  "engine %s us/start  errors %d" % (k, s[3], what, s[0], s[3] / s[0], us(s[1]), s[2]))
        print("   attach   engine %s us per run waited for until it ended (pairs %s..%s; "
              "%.1f requests per run); %s us per attach whose wait ran out"
              % (us(r["attach"][0]), us(r["attach"][2]), us(r["attach"][3]), r["attach"][1],
                 us(r["attach_timeout"])))
        if "attach_lean" in r:
            a = r["attach_lean"]
            print("   attach   ?steps=false: engine %s us per run (pairs %s..%s; %.1f requests per run)"
                  % (us(a[0]), us(a[2]), us(a[3]), a[1]))
        print("   lone     one 10-step run, start to result: p50 %.2f ms  p90 %.2f ms  errors %d"
              % r["lone"])
        print("   flow     runs x 10 steps, 50 in flight: %.0f steps/s  engine %s us/step  "
              "%.1f requests per run  (attach%s)" % (r["flow"][0], us(r["flow"][1]), r["flow"][2],
                                                     " ?steps=false" if r["flow"][3] else ""))
        print("   sleeping %d runs asleep at once: peak %.0f MB (%.0f MB at start)"
              % (r["sleeping"][2], r["sleeping"][1], r["sleeping"][0]))


if __name__ == "__main__":
    main()
