#!/usr/bin/env python3
"""Benchmark: where the wall time of single-run starts goes, by thread.

For each binary given, on a fresh `moonloop serve` (durability "full"):
500 warm-up starts, then N single-run starts of a skill with no step from
100 connections (build/bench_http), and prints

  - the wall time and latency (bench_http's RESULT);
  - the groups committed during them and their size (/metrics:
    moonloop_commits_total, moonloop_committed_entries_total);
  - for each of the serve's threads that ran: its CPU time, the time it
    waited for a core while ready (schedstat's run-queue time: other
    jobs on the machine, or the serve's own threads and the client), and
    its voluntary and involuntary context switches.

The loop thread is the busiest `moonloop` thread; the commit jobs run on
libuv's pool, four threads taking turns. Run the binaries alternately
(ROUNDS) on a shared machine: one run moves by tens of percent.

Usage: start_threads.py BIN [BIN...]   (environment: N=10000, ROUNDS=1)
"""
import os
import re
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_path as cp  # noqa: E402


def threads(pid):
    out = {}
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            base = "/proc/%d/task/%s/" % (pid, t)
            run, wait, _ = map(int, open(base + "schedstat").read().split())
            st = open(base + "status").read()
            vol = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", st, re.M).group(1))
            inv = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", st, re.M).group(1))
            out[t] = (run, wait, vol, inv)
        except (OSError, AttributeError, ValueError):
            pass
    return out


def commits(srv):
    text = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode()
    get = lambda n: float(re.search(r"^%s (\S+)" % n, text, re.M).group(1))  # noqa: E731
    return get("moonloop_commits_total"), get("moonloop_committed_entries_total")


def one(binary, n):
    srv = cp.Serve(binary)
    body = '{"data":{"n":1}}'
    try:
        cp.blast(srv, "/v1/skills/noop/invoke", 500, 100, body)
        srv.settle()
        t0, m0 = threads(srv.p.pid), commits(srv)
        r = cp.blast(srv, "/v1/skills/noop/invoke", n, 100, body)
        t1, m1 = threads(srv.p.pid), commits(srv)
        srv.settle()
    finally:
        srv.close()
    nc, ne = m1[0] - m0[0], m1[1] - m0[1]
    print("  wall %.2f s (%.0f/s)  p50 %.1f ms  p99 %.1f ms  errors %d  commits %d  entries/commit %.1f"
          % (r["seconds"], r["req_per_s"], r["p50_ms"], r["p99_ms"], r["errors"], nc, ne / max(nc, 1)))
    total = 0
    for t in sorted(t1, key=lambda t: t0.get(t, (0,) * 4)[0] - t1[t][0]):
        a = t0.get(t, (0,) * 4)
        run, wait = (t1[t][0] - a[0]) / 1e9, (t1[t][1] - a[1]) / 1e9
        total += run
        if run >= 0.005:
            print("    thread %-8s ran %.2f s (%2.0f%% of the wall)  waited for a core %.2f s  "
                  "switches %d voluntary, %d not" % (t, run, 100 * run / r["seconds"], wait,
                                                     t1[t][2] - a[2], t1[t][3] - a[3]))
    print("    all threads %.2f s: %.0f us per start" % (total, total / n * 1e6))


def main():
    bins = [os.path.abspath(b) for b in sys.argv[1:]]
    if not bins:
        raise SystemExit(__doc__)
    n, rounds = int(os.environ.get("N", "10000")), int(os.environ.get("ROUNDS", "1"))
    for k in range(rounds):
        for b in bins:
            print("bench: %s (round %d)" % (b, k + 1), flush=True)
            one(b, n)
        with open("/proc/loadavg") as f:
            print("load average: %s" % " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    main()
