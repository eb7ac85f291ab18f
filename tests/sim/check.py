"""check: what must hold after a case, and which known bug explains a failure.

Checks (each violation names its class):
  outcome        every run has the same final status, output and error as in
                 the uninterrupted mode (a), matched by (tag, skill, entry);
                 outputs are compared without the stand-in's call numbers
                 (c, n) and with run and event ids blanked
  missing-run, extra-run
                 the same runs exist as in (a); every root exists
  event-lost     every event an engine or `moonloop send` accepted is in
                 the database, under the id it was accepted with
  event-once     every accepted event started its runs once; no run twice
  body-rerun     a step body that got a successful answer ran again with no
                 kill or freeze of the process that ran it in between (a
                 completed body runs once; one in flight at a kill at most
                 once more per kill); or ran again after the harness had
                 seen the step completed in the database
  phantom-run    a step body ran in a run the database never held
  delivery-lost  no wait took an event (a delivery) that its step never got
  calls          more calls of a body than its failures, retries and the
                 kills and freezes during them explain (without kills or
                 freezes: exactly as many as expected)
  recorded-output
                 every completed run step's recorded output is the answer
                 the stand-in gave that call, the last one it gave that key
  consumed       every answer a run's output shows it used is the one its
                 journal records for that step
  replayed       mode a: no run body starts twice (no crash, no eviction)
  stuck          every run ended within the bound
  orphan         no unfinished run is owned by a lease that no longer exists
                 (looked at once every engine has stopped)
  integrity      PRAGMA integrity_check is ok
  sanitizer      no sanitizer report; engine: no engine exited by itself
  harness        the harness's own requests behaved (an event id accepted
                 twice as two events, ...)

Known classes (SIM_KNOWN, comma-separated) turn matching violations into
"known" ones, counted and shown but not failing:
  parallel-replay  a run failed on replay ("the code no longer matches this
                   run's journal", in its error, or in its output when a
                   pcall in the skill caught it) after a completed
                   step.parallel: every violation in that run's tree (its
                   root, children, on_failure runs)
  parallel-failed-replay
                   a step.parallel that failed (caught with pcall): on
                   replay everything after it runs again, live (bodies,
                   children, events): every violation in a tree with a
                   failed parallel step
  fencing          mode e: violations about a step key called by two
                   engines, one of which was frozen, and the outcomes of
                   the runs holding such keys; an engine that crashed (or
                   a sanitizer report) in lease_lost's abort of its runs
  fenced-ack       an engine whose commit group was fenced ("lease lost")
                   had already acknowledged the events in it: the events
                   are lost (event-lost), and so is what they started or
                   answered (violations in those trees)
  frozen-lock      mode e: an engine gave up with "database is locked"
                   while another was frozen holding the write lock
  wait-end-lost    the engine died between ending a wait (its row, with the
                   event it took, deleted) and completing the step: the
                   replay waits again and the event is never found (it is
                   marked taken): every violation in that tree
  phantom-run      a step body ran in a run that never became durable (a
                   child or on_failure run started before the group that
                   creates it committed, then a kill): its replacement runs
                   the body again under another ctx.step_key
"""
import json
import re

from gen import TERMINAL

ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
CANCEL = re.compile(r"cancelled (from the command line|over HTTP)")
MISMATCH = "the code no longer matches this run's journal"
SLACK = 1.0
KNOWN_CLASSES = ("parallel-replay", "parallel-failed-replay", "fencing", "fenced-ack", "frozen-lock", "phantom-run",
                 "wait-end-lost")


def norm(v):
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items() if k not in ("c", "n")}
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, str):
        return CANCEL.sub("cancelled by the harness", ULID.sub("<id>", v))
    return v


def run_key(t):
    inp = t.get("input") if isinstance(t.get("input"), dict) else {}
    kind = (t.get("trigger") or {}).get("kind")
    return (inp.get("tag"), t["skill"], "on_failure" if kind == "on_failure" else "run")


def outcome(t):
    err = t.get("error")
    return {"status": t["status"], "output": norm(t.get("output")),
            "error": norm(err.get("message")) if isinstance(err, dict) else None}


def tree_of_idem(idem):
    """The root tag in a harness idempotency id (start:r3, r3:m1:sig4:1, cancel:r2/i1)."""
    head, _, rest = idem.partition(":")
    return tree_of(rest if head in ("start", "cancel") else head)


def tree_of(tag):
    return tag.split("/")[0] if isinstance(tag, str) else None


class Violation:
    def __init__(self, cls, msg, tree=None, key=None):
        self.cls, self.msg, self.tree, self.key = cls, msg, tree, key
        self.known = None

    def __str__(self):
        return "[%s%s] %s" % (self.cls, " (known: %s)" % self.known if self.known else "", self.msg)


def outcomes(result):
    """(tag, skill, entry) -> outcome, for a case's runs (the ballast left out)."""
    out = {}
    for t in result["traces"].values():
        if t and t["skill"] != "zb":
            out.setdefault(run_key(t), []).append(outcome(t))
    return out


def check(world, mode, result, ref):
    """The violations of one case; ref is mode (a)'s outcomes (None for (a))."""
    V = []
    traces = {k: v for k, v in result["traces"].items() if v}
    calls = result["calls"]
    ints = sorted(result["interrupts"])
    interrupted = bool(ints)

    def between(t1, t2, engine=None):
        """Kills and freezes in (t1, t2], of that engine process if named.
        A call is logged when the stand-in reads it, which can be a moment
        after its engine sent it and was killed: a kill up to SLACK before
        the call counts."""
        return sum(1 for t, _, e in ints if t1 - SLACK < t <= t2 and (engine is None or e == engine))

    # -- the runs: once each, same outcome as (a) --
    mine = outcomes(result)
    for key, outs in mine.items():
        if len(outs) > 1:
            V.append(Violation("event-once", "%d runs for %s (one expected)" % (len(outs), key), tree_of(key[0])))
    for root in world.roots:
        for sk in root["skills"]:
            if (root["tag"], sk, "run") not in mine:
                V.append(Violation("missing-run", "root %s of %s never ran (started by %s)" % (
                    root["tag"], sk, root["start"]), root["tag"]))
    if ref is not None:
        for key in sorted(set(ref) | set(mine), key=str):
            if key not in mine:
                if key[2] == "run" and key[0] in {r["tag"] for r in world.roots}:
                    continue  # said above
                V.append(Violation("missing-run", "no run %s, which (a) had: %s" % (key, ref[key][0]), tree_of(key[0])))
            elif key not in ref:
                V.append(Violation("extra-run", "run %s, which (a) did not have: %s" % (key, mine[key][0]), tree_of(key[0])))
            elif mine[key][0] != ref[key][0]:
                V.append(Violation("outcome", "run %s ended differently:\n      (a):  %s\n      (%s):  %s" % (
                    key, json.dumps(ref[key][0], sort_keys=True), mode, json.dumps(mine[key][0], sort_keys=True)),
                    tree_of(key[0])))

    # -- without a crash or an eviction, no run is replayed --
    # (the engine counts the runs it replayed from their journals:
    # moonloop_replays_total, read before it stopped)
    if mode == "a" and result.get("replays"):
        V.append(Violation("replayed", "the engine replayed %d runs from their journals with no crash and"
                           " no eviction" % result["replays"], None))

    # -- accepted events are in the database --
    for idem, eid in sorted(result["accepted"].items()):
        if result["events"].get(idem) != eid:
            V.append(Violation("event-lost", "event %s was accepted as %s, the database %s" % (
                idem, eid, "holds %s" % result["events"][idem] if idem in result["events"] else "does not have it"),
                tree_of_idem(idem)))

    # -- accepted events started their runs once --
    by_event = {}
    for t in traces.values():
        ev = (t.get("trigger") or {}).get("event")
        if isinstance(ev, dict) and ev.get("id"):
            by_event.setdefault(ev["id"], []).append(t)
    for root in world.roots:
        eid = result["accepted"].get("start:" + root["tag"])
        if root["start"] != "event":
            continue
        if eid is None:
            V.append(Violation("harness", "the start event of %s was never accepted" % root["tag"], root["tag"]))
            continue
        got = sorted(t["skill"] for t in by_event.get(eid, []))
        if got != sorted(root["skills"]):
            V.append(Violation("event-once", "accepted event %s (start:%s) started %s, expected %s" % (
                eid, root["tag"], got or "nothing", sorted(root["skills"])), root["tag"]))
    for eid, ts in by_event.items():
        skills = [t["skill"] for t in ts]
        if len(skills) != len(set(skills)):
            V.append(Violation("event-once", "event %s started %s" % (eid, skills), tree_of(run_key(ts[0])[0])))

    # -- step bodies: how often they ran, what was recorded --
    steps = {}      # key -> (trace, step)
    for t in traces.values():
        for s in t.get("steps") or []:
            steps["%s:%s" % (t["id"], s["id"])] = (t, s)
    by_key, by_c = {}, {}
    for c in calls:
        by_key.setdefault(c.key, []).append(c)
        by_c[c.c] = c
    for key, cs in by_key.items():
        rid, _, sid = key.partition(":")
        t, s = steps.get(key, (traces.get(rid), None))
        tree = tree_of(run_key(t)[0]) if t else None
        site = world.site(sid)
        branch = int(sid.split("/")[1].split("#")[0]) if "/" in sid else None
        if t is None:
            V.append(Violation("phantom-run", "%s: a body ran in run %s, which the database never held (%r)" % (
                key, rid, cs), None, key))
            continue
        if site is None or (s is None and t["status"] == "completed"):
            V.append(Violation("calls", "call of %s, which is no step of its run" % key, tree, key))
            continue
        expected = site.expected_calls(branch)
        n = len(cs)
        if n > expected + between(cs[0].t - 1e-9, cs[-1].t):
            V.append(Violation("calls", "%s was called %d times (%d expected, %d kills or freezes meanwhile): %s" % (
                key, n, expected, between(cs[0].t - 1e-9, cs[-1].t), cs), tree, key))
        elif not interrupted and s and s["status"] in ("completed", "failed") and n != expected:
            V.append(Violation("calls", "%s was called %d times, %d expected: %s" % (key, n, expected, cs), tree, key))
        for a, b in zip(cs, cs[1:]):
            if not a.answer["fail"] and not between(a.t, b.t, a.engine):
                V.append(Violation("body-rerun", "%s ran again after its body had succeeded, with no kill or freeze"
                                   " of %s in between: %r then %r" % (key, a.engine, a, b), tree, key))
        seen = result["durable"].get(key)
        late = [x for x in cs if seen is not None and x.t > seen]
        if late:
            V.append(Violation("body-rerun", "%s ran again after the step was completed in the database (seen at"
                               " %.3f): %r" % (key, seen, late), tree, key))
    for key, (t, s) in steps.items():
        if s["kind"] != "run" or s["status"] != "completed":
            continue
        tree = tree_of(run_key(t)[0])
        out = s.get("output")
        c = by_c.get(out.get("c")) if isinstance(out, dict) else None
        if c is None:
            V.append(Violation("recorded-output", "%s recorded %s, which the stand-in never answered" % (
                key, json.dumps(out)), tree, key))
            continue
        if c.key != key or c.answer != out:
            V.append(Violation("recorded-output", "%s recorded %s, but call %d answered %s" % (
                key, json.dumps(out), c.c, json.dumps(c.answer)), tree, key))
        ok_calls = [x for x in by_key.get(key, []) if not x.answer["fail"]]
        if ok_calls and ok_calls[-1].c != c.c:
            V.append(Violation("recorded-output", "%s recorded the answer of %r, not of the last call %r" % (
                key, c, ok_calls[-1]), tree, key))

    # -- what the runs used is what their journals say --
    def walk(v, t):
        if isinstance(v, dict):
            if "k" in v and "c" in v and "v" in v and isinstance(v["k"], str):
                st = steps.get(v["k"])
                rec = st[1].get("output") if st else None
                got = rec.get("c") if isinstance(rec, dict) else None
                if got != v["c"]:
                    V.append(Violation("consumed", "run %s %s used call %s for %s, its journal records %s" % (
                        t["id"], run_key(t), v["c"], v["k"], got), tree_of(run_key(t)[0]), v["k"]))
            for x in v.values():
                walk(x, t)
        elif isinstance(v, list):
            for x in v:
                walk(x, t)
    for t in traces.values():
        if t["status"] == "completed":
            walk(t.get("output"), t)

    # -- events a wait took that its step never got --
    for rid, sid, eid, status in result.get("lost_deliveries", []):
        t = traces.get(rid)
        V.append(Violation("delivery-lost", "run %s %s: its wait %s took event %s, but the step is %s without it" % (
            rid, run_key(t) if t else "", sid, eid, status), tree_of(run_key(t)[0]) if t else None))

    # -- runs left to a lease that no longer exists: nobody will ever run them --
    for rid, owner in sorted(result.get("orphans", {}).items()):
        t = traces.get(rid)
        V.append(Violation("orphan", "run %s %s is owned by %s, a lease that no longer exists: no engine"
                           " will ever run it" % (rid, run_key(t) if t else "", owner),
                           tree_of(run_key(t)[0]) if t else None))

    # -- the rest --
    if result.get("stuck") is not None:
        live = [r for r in result["stuck"] if r[1] != "zb"]
        for r in live:
            V.append(Violation("stuck", "run %s (%s, %s) did not end: %s" % (r[0], r[1], r[3], r[2]), tree_of(r[3])))
        if not live:
            V.append(Violation("stuck", "the case did not settle (events not dispatched: %s)" % result.get("stuck_events")))
    if result["integrity"] != ["ok"]:
        V.append(Violation("integrity", "PRAGMA integrity_check: %s" % result["integrity"][:5]))
    for rep in result["sanitizer"]:
        V.append(Violation("sanitizer", rep[:3000]))
    for e in result["engine_errors"]:
        V.append(Violation("engine", e))
    for e in result["harness_errors"]:
        V.append(Violation("harness", e))
    return V


def classify(V, world, mode, result, known):
    """Mark violations that a known bug explains (see the module's comment)."""
    traces = {k: v for k, v in result["traces"].items() if v}
    if "parallel-replay" in known:
        trees = set()
        for t in traces.values():
            err = t.get("error")
            # The mismatch fails the run, or is caught by a pcall in the skill
            # and shows in its output.
            said = (err.get("message") or "" if isinstance(err, dict) else "") + json.dumps(t.get("output"))
            if MISMATCH in said and \
                    any(s["kind"] == "parallel" and s["status"] == "completed" for s in t.get("steps") or []):
                trees.add(tree_of(run_key(t)[0]))
        for v in V:
            if v.tree in trees and v.tree is not None:
                v.known = "parallel-replay"
    if "fencing" in known and mode == "e":
        engines_of = {}
        for c in result["calls"]:
            engines_of.setdefault(c.key, set()).add(c.engine)
        frozen = result["frozen"]
        fenced = {k for k, es in engines_of.items() if len(es) > 1 and es & frozen}
        fenced_trees = set()
        for k in fenced:
            t = traces.get(k.partition(":")[0])
            if t:
                fenced_trees.add(tree_of(run_key(t)[0]))
        for v in V:
            if v.known:
                continue
            if v.key in fenced or (v.cls in ("outcome", "consumed", "missing-run", "extra-run")
                                   and v.tree in fenced_trees):
                v.known = "fencing"
        # A stale engine's end of a run cancels "its children" with the run's
        # own id, and the run itself with them: a root run then ends
        # "cancelled: its parent run ended".
        for v in V:
            root = re.match(r"run \('([^'/]*)'", v.msg)
            if not v.known and v.cls == "outcome" and root and \
                    '"error": "cancelled: its parent run ended"' in v.msg.split("(e):")[-1] and \
                    result["fenced"] | result["frozen"]:
                v.known = "fencing"
        # A fenced engine claims runs under its dead lease (store_claim does
        # not check the lease): they are orphaned, and stuck.
        orphan_trees = {v.tree for v in V if v.cls == "orphan"}
        for v in V:
            if not v.known and (v.cls == "orphan" or (v.tree in orphan_trees and v.tree is not None)):
                v.known = "fencing"
    if "parallel-failed-replay" in known:
        trees = set()
        for t in traces.values():
            if any(s["kind"] == "parallel" and s["status"] == "failed" for s in t.get("steps") or []):
                trees.add(tree_of(run_key(t)[0]))
        for v in V:
            if not v.known and v.tree in trees and v.tree is not None:
                v.known = "parallel-failed-replay"
    if "fenced-ack" in known and result["fenced"]:
        trees = {v.tree for v in V if v.cls == "event-lost"}
        for v in V:
            if not v.known and (v.cls == "event-lost" or (v.tree in trees and v.tree is not None)):
                v.known = "fenced-ack"
    if "wait-end-lost" in known:
        trees = {v.tree for v in V if v.cls == "delivery-lost"}
        for v in V:
            if not v.known and (v.cls == "delivery-lost" or (v.tree in trees and v.tree is not None)):
                v.known = "wait-end-lost"
    if "phantom-run" in known:
        for v in V:
            if v.cls == "phantom-run":
                v.known = "phantom-run"
        # An engine that lost its lease dies in the abort of its runs (a
        # parallel's tasks freed while its commit group is still in flight:
        # on_durable uses them after lease_lost freed them).
        asan = any(v.cls == "sanitizer" and "lease_lost" in v.msg for v in V)
        for v in V:
            if not v.known and mode == "e" and (
                    (v.cls == "engine" and "lease lost" in v.msg and ("status -" in v.msg or asan)) or
                    (v.cls == "sanitizer" and "lease_lost" in v.msg)):
                v.known = "fencing"
    if "frozen-lock" in known and mode == "e":
        for v in V:
            if v.cls == "engine" and "database is locked" in v.msg and result["frozen"]:
                v.known = "frozen-lock"
    return V
