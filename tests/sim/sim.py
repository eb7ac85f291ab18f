#!/usr/bin/env python3
"""sim: generated cases against real engines (docs/simulation.md).

  python3 tests/sim/sim.py --seed N [--mode b]    replay one seed (every mode, or one after (a))
  python3 tests/sim/sim.py --time 300             random seeds for five minutes
  python3 tests/sim/sim.py --budget               the fixed seeds `make test` runs

Each seed is a world of generated skills and root runs (gen.py); each mode
runs it against real `moonloop` processes (case.py), and the checks
(check.py) compare every mode with the uninterrupted one. MOONLOOP_BIN
names the binary (default build/moonloop); SIM_KNOWN (or --known) lists
known failure classes to report without failing (check.py describes
them; none is known at the moment).
"""
import argparse
import os
import random
import signal
import sys
import time
import traceback

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import case as casemod  # noqa: E402
from check import KNOWN_CLASSES, check, classify, iso_ms, outcomes  # noqa: E402
from gen import generate  # noqa: E402

MODES = "abcde"
MODE_NAMES = {
    "a": "uninterrupted",
    "b": "SIGKILL and restart",
    "c": "every parked run evicted",
    "d": "run --resume after kills",
    "e": "takeover of a frozen engine",
}
# `make test`'s budget: (seed, modes), about a minute on the normal build.
# Seed 9 covers most of the grammar (31 of the features listed at the end
# of a run); seed 16 adds uncaught failures, failing children and parallel
# branches, events nobody listens to. Both have flow control (gen.py's
# flow(): concurrency per key and a shared scope, throttle, idempotency,
# singleton), seed 9 with a scope limit of 1. Seeds 9 and 2 rewrite skill
# files while runs are in flight (gen.py's live_edits()); in seed 2's mode
# b, runs of an edited skill are replayed after kills (a build that
# replayed them on the live version failed it). The sanitized build runs
# seed 9 (cases wait on sleeps and the stand-in more than on the CPU, so it
# takes about as long as on the normal build).
BUDGET = [(9, "abcde"), (16, "ab"), (2, "ab")]
# On PostgreSQL (ctest's sim-pg/budget, on the cluster of the func-pg
# tests): seed 2 killed and taken over, and seed 368181 evicted, whose
# children were cancelled for the wrong reason in 3 of 4 runs before the
# fix of `stale-wait` (docs/simulation.md); about 45 s.
BUDGET_PG = [(2, "abe"), (368181, "c")]
BUDGET_ASAN = [(9, "abcde")]


class Totals:
    def __init__(self):
        self.cases = self.skills = self.kills = self.freezes = self.steps = self.runs = 0
        self.resumes = self.replays = self.evictions = self.quarantined = 0
        self.violations = 0
        self.known = {}
        self.features = set()
        self.step_kinds = set()
        self.failed = []        # (seed, mode)
        self.known_where = {}   # class -> set of (seed, mode)


def run_seed(seed, modes, opts, tot):
    world = generate(seed)
    tot.skills += len(world.skills)
    ref = None
    results = {}
    for mode in "a" + "".join(m for m in modes if m != "a"):
        c = casemod.Case(world, mode, opts)
        try:
            res = c.run()
        except Exception:
            res = None
            err = traceback.format_exc()
            c.abort()
        except BaseException:
            c.abort()  # interrupted: leave no engine behind
            c.cleanup(keep=opts.keep)
            raise
        if res is None:
            print("seed %d mode %s: the harness failed:\n%s" % (seed, mode, err), flush=True)
            tot.violations += 1
            tot.failed.append((seed, mode))
            c.cleanup(keep=True)
            continue
        V = check(world, mode, res, ref)
        classify(V, world, mode, res, opts.known)
        if mode == "a":
            ref = outcomes(res)
        tot.features |= covered(world, mode, res)
        for t in res["traces"].values():
            for st in (t or {}).get("steps") or []:
                tot.step_kinds.add(st["kind"])
        results[mode] = res
        nsteps = sum(len((t or {}).get("steps") or []) for t in res["traces"].values())
        tot.cases += 1
        tot.kills += res["stats"]["kills"]
        tot.freezes += res["stats"]["freezes"]
        tot.resumes += res["stats"]["resumes"]
        tot.replays += res.get("replays") or 0
        if mode == "c":
            tot.evictions += res.get("replays") or 0
        tot.steps += nsteps
        tot.quarantined += res.get("quarantined") or 0
        tot.runs += len(res["traces"])
        new = [v for v in V if not v.known]
        known = [v for v in V if v.known]
        for v in known:
            tot.known[v.known] = tot.known.get(v.known, 0) + 1
            tot.known_where.setdefault(v.known, set()).add((seed, mode))
        tot.violations += len(new)
        line = "seed %d mode %s (%s): %d runs, %d steps, %d calls, %d kills, %d freezes%s, %.1fs: %s" % (
            seed, mode, MODE_NAMES[mode], len(res["traces"]), nsteps, len(res["calls"]), res["stats"]["kills"],
            res["stats"]["freezes"], ", %d replays" % res["replays"] if res.get("replays") else "",
            res["elapsed"], "%d VIOLATIONS" % len(new) if new else "ok")
        if res.get("quarantined"):
            line += " (%d run%s quarantined after three kills: expected)" % (
                res["quarantined"], "" if res["quarantined"] == 1 else "s")
        if known:
            kinds = sorted({v.known for v in known})
            line += " (%d known: %s)" % (len(known), ", ".join(kinds))
        print(line, flush=True)
        if opts.verbose and known and not new:
            for v in known[:5]:
                print("    %s" % str(v).replace("\n", "\n    "))
        if new:
            tot.failed.append((seed, mode))
            report(world, mode, res, new, known, opts)
        c.cleanup(keep=opts.keep or bool(new))
        if opts.stop_at and time.monotonic() > opts.stop_at:
            break
    return results


def covered(world, mode, res):
    """What a case exercised: the generator's features of the sites that
    have a step record, and what the runs' records show."""
    out = set()
    traces = [t for t in res["traces"].values() if t]
    for t in traces:
        for s in t.get("steps") or []:
            site = world.site(s["id"])
            if site:
                out |= site.features
        kind = (t.get("trigger") or {}).get("kind")
        out.add("run started by %s" % kind)
        err = (t.get("error") or {}).get("message") or ""
        if err.startswith("cancelled by event"):
            out.add("cancel_on")
        elif err.startswith("cancelled from the command line"):
            out.add("cancelled with moonloop cancel")
        elif err.startswith("cancelled over HTTP"):
            out.add("cancelled over HTTP")
        elif "its parent run ended" in err:
            out.add("child cancelled with its parent")
        elif "timed out after" in err:
            out.add("run timeout fires")
        if t["skill"] in world.skills and world.skills[t["skill"]].timeout and world.skills[t["skill"]].role == "main":
            out.add("run timeout (long)")
    if any("moonloop send" in a for _, a in res["actions"]):
        out.add("events sent with moonloop send --id")
    if any("over HTTP" in a and a.startswith("sent") for _, a in res["actions"]):
        out.add("event batches over POST /v1/events")
    if any("sent twice" in a for _, a in res["actions"]):
        out.add("event batches sent twice (same ids)")
    if any("while the engine is down" in a for _, a in res["actions"]):
        out.add("events sent while the engine is down")
    # Live edits: runs on a rewritten file's version, and runs in flight
    # (created before, ended after) while their skill's file was rewritten.
    if any(isinstance(t.get("output"), dict) and t["output"].get("ver") not in (None, "e0") for t in traces):
        out.add("runs on a rewritten skill file's version")
    for at, sid, _ in res.get("edits", []):
        w = (res["t0_wall"] + at) * 1000
        if any(t["skill"] == sid and iso_ms(t.get("created_at")) and iso_ms(t.get("ended_at")) and
               iso_ms(t["created_at"]) < w < iso_ms(t["ended_at"]) for t in traces):
            out.add("a run in flight while its skill file was rewritten")
    return out


def report(world, mode, res, new, known, opts):
    out = ["", "=" * 78,
           "VIOLATION: seed %d, mode %s (%s)" % (world.seed, mode, MODE_NAMES[mode]),
           "replay:    make sim SEED=%d MODE=%s" % (world.seed, mode),
           "workdir:   %s (kept: engine logs, the database)" % res["dir"], "",
           "violated checks:"]
    for v in new[:40]:
        out.append("  " + str(v).replace("\n", "\n  "))
    if len(new) > 40:
        out.append("  ... and %d more" % (len(new) - 40))
    if known:
        out.append("(and %d violations of known classes: %s)" % (len(known), ", ".join(sorted({v.known for v in known}))))
    out += ["", "schedule (seconds from the case's start):"]
    for t, a in res["actions"]:
        out.append("  %7.3f  %s" % (t, a))
    out += ["", "roots:"]
    for r in world.roots:
        out.append("  %s: %s by %s, data %s" % (r["tag"], ",".join(r["skills"]), r["start"], r["data"]))
    out += ["", "skills:", world.describe(), "=" * 78, ""]
    print("\n".join(out), flush=True)


def summary(tot, elapsed):
    print()
    print("simulation: %d cases in %.0fs; %d skills generated; %d kills, %d freezes, %d run --resume; "
          "%d steps, %d runs%s" % (tot.cases, elapsed, tot.skills, tot.kills, tot.freezes, tot.resumes,
                                   tot.steps, tot.runs, "; %d replays (%d after evictions)" % (tot.replays, tot.evictions)
                                   if tot.replays else ""))
    if tot.quarantined:
        print("quarantined: %d runs, each after three kills while it was executing (expected)" % tot.quarantined)
    print("violations: %d%s" % (tot.violations, " (%s)" % ", ".join("seed %d mode %s" % f for f in tot.failed)
                                if tot.failed else ""))
    for k in sorted(tot.known):
        where = sorted(tot.known_where[k])
        print("known, not counted: %s: %d violations in %s" % (
            k, tot.known[k], ", ".join("%d%s" % w for w in where[:30]) + (" ..." if len(where) > 30 else "")))
    print("step kinds recorded: %s" % ", ".join(sorted(tot.step_kinds)))
    print("covered: %s" % "; ".join(sorted(tot.features)))


def interrupted(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


def main():
    signal.signal(signal.SIGTERM, interrupted)  # ctest's timeout, a kill: stop the case's engines
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, help="run this seed only")
    ap.add_argument("--mode", default="", help="modes to run (letters of abcde); (a) always runs first")
    ap.add_argument("--time", type=float, default=180, help="without --seed: seconds of random seeds")
    ap.add_argument("--budget", action="store_true", help="the fixed seeds of `make test`")
    ap.add_argument("--known", default=os.environ.get("SIM_KNOWN", ""),
                    help="known failure classes, comma-separated: " + ", ".join(KNOWN_CLASSES))
    ap.add_argument("--keep", action="store_true", help="keep every case's folder")
    ap.add_argument("--pg", action="store_true",
                    help="every case on a PostgreSQL database (a private cluster the run starts)")
    ap.add_argument("-v", "--verbose", action="count", default=0)
    opts = ap.parse_args()
    opts.known = {k.strip() for k in opts.known.split(",") if k.strip()}
    bad = opts.known - set(KNOWN_CLASSES)
    if bad:
        ap.error("unknown class in SIM_KNOWN: %s (known: %s)" % (", ".join(sorted(bad)), ", ".join(KNOWN_CLASSES)))
    modes = opts.mode or MODES
    if set(modes) - set(MODES):
        ap.error("--mode takes letters of abcde")
    opts.stop_at = None
    if not os.path.exists(casemod.BIN):
        sys.exit("sim: no binary at %s (make build)" % casemod.BIN)
    tot = Totals()
    t0 = time.monotonic()
    opts.cluster = None  # the PostgreSQL cluster's description (pgcluster.py), with --pg
    pgdir = None
    if opts.pg:
        import tempfile
        import pgcluster
        if os.environ.get("MOONLOOP_TEST_PG"):  # ctest's cluster (its pg fixture)
            opts.cluster = pgcluster.load(os.environ["MOONLOOP_TEST_PG"])
        else:
            pgdir = tempfile.mkdtemp(prefix="mlsim-pg-")
            opts.cluster = pgcluster.start(pgdir)
    print("sim: %s%s%s" % (casemod.BIN, " on PostgreSQL" if opts.pg else "",
                           "; known classes skipped: " + ",".join(sorted(opts.known)) if opts.known else ""),
          flush=True)
    try:
        if opts.seed is not None:
            run_seed(opts.seed, modes, opts, tot)
        elif opts.budget:
            for seed, ms in (BUDGET_PG if opts.pg else BUDGET_ASAN if casemod.ASAN else BUDGET):
                run_seed(seed, ms, opts, tot)
        else:
            opts.stop_at = t0 + opts.time
            rng = random.Random()
            while time.monotonic() < opts.stop_at:
                run_seed(rng.randint(1000, 10 ** 6), modes, opts, tot)
    finally:
        if pgdir:
            import pgcluster
            pgcluster.stop(pgdir)
    summary(tot, time.monotonic() - t0)
    sys.exit(1 if tot.violations else 0)


if __name__ == "__main__":
    main()
