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
                 kill or freeze of the process that ran it in between, nor
                 a freeze of the process that ran it again (which, frozen
                 holding the write lock, kept the first one's result from
                 becoming durable before its lease ran out); a completed
                 body runs once, one in flight at a kill at most once more
                 per kill; or ran again after the harness had seen the step
                 completed in the database
  phantom-run    a step body ran in a run the database never held
  delivery-lost  no wait took an event (a delivery) that its step never got
                 (but a wait whose run was cancelled as it took it)
  calls          more calls of a body than its failures, retries and the
                 kills and freezes during them explain (without kills or
                 freezes: exactly as many as expected)
  recorded-output
                 every completed run step's recorded output is the answer
                 the stand-in gave that call, the last one it gave that key
  consumed       every answer a run's output shows it used is the one its
                 journal records for that step
  replayed       mode a: no run body starts twice (no crash, no eviction)
  quarantine     a run the engine quarantined (failed instead of resumed,
                 after three processes died while it was executing: see
                 sched_adopt) had three kills of a process after its last
                 completed step; the differences that follow from it (its
                 outcome, its on_failure run, its children's) are then
                 expected, not violations, and counted as "quarantined"
  stuck          every run ended within the bound
  orphan         no unfinished run is owned by a lease that no longer exists
                 (looked at once every engine has stopped)
  integrity      PRAGMA integrity_check is ok
  sanitizer      no sanitizer report; engine: no engine exited by itself
  harness        the harness's own requests behaved (an event id accepted
                 twice as two events, ...)
  flow-limit     never more runs of a flow skill in flight (its first step's
                 start to its last step's end, from the trace) per key or
                 scope than the limit; a singleton's key: one
  flow-admitted  every run of a flow skill completes, or was skipped by its
                 idempotency key or singleton (throttled runs all run)
  flow-idempotency
                 one run ran per idempotency key; which one may differ from
                 mode a, as may which runs a singleton skipped (the outcome
                 check lets those differ, and only those)

Known classes (SIM_KNOWN, comma-separated) turn violations that a known,
not yet fixed bug explains into "known" ones, counted and shown but not
failing: classify() recognises each class listed in KNOWN_CLASSES. There
is none at the moment; the classes found and fixed so far are listed in
docs/simulation.md.
"""
import datetime
import hashlib
import json
import re

from gen import TERMINAL

ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
CANCEL = re.compile(r"cancelled (from the command line|over HTTP)")
SLACK = 1.0
KNOWN_CLASSES = ()


def norm(v):
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items() if k not in ("c", "n", "ver")}
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


def iso_ms(ts):
    """An RFC 3339 time of a run record in ms since the epoch (None stays None)."""
    if not ts:
        return None
    return datetime.datetime.strptime(ts.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


def quarantined(traces, result):
    """The trees of runs the engine quarantined with cause (three kills after
    the run's last completed step), and the violations of those without."""
    trees, V = set(), []
    kills = [t for t, why, _ in result["interrupts"] if why != "freeze"]
    for t in traces.values():
        err = t.get("error")
        if t["status"] != "failed" or not isinstance(err, dict) or \
                not (err.get("message") or "").startswith("quarantined:"):
            continue
        done = [iso_ms(s.get("ended_at")) for s in t.get("steps") or [] if s["status"] == "completed"]
        since = (max([x for x in done if x] + [iso_ms(t.get("started_at")) or 0]) / 1000.0 -
                 result.get("t0_wall", 0))
        n = sum(1 for k in kills if k > since - SLACK)
        tree = tree_of(run_key(t)[0])
        if n >= 3:
            trees.add(tree)
        else:
            V.append(Violation("quarantine", "run %s %s was quarantined with %d kills since its last completed"
                               " step (at %.3f): %s" % (t["id"], run_key(t), n, since, err["message"]), tree))
    return trees, V


def flow_of(world, skill):
    """The flow control spec of a generated skill (gen.py's flow()), or None."""
    sk = world.skills.get(skill)
    return getattr(sk, "flow", None) if sk else None


def flow_either(world, key, a, b):
    """Whether two outcomes of a flow skill's run may differ: which run of an
    idempotency key or of a singleton's key is the one that runs depends on
    timing (check_flow judges those by invariants); a run that ran in both
    modes must still end the same."""
    spec = flow_of(world, key[1])
    if not spec or not ("idempotency" in spec or "singleton" in spec):
        return False
    return "skipped" in (a["status"], b["status"])


def in_flight(traces):
    """run id -> (start, end) ms of a run that executed: its first step's
    start to its last step's end. A flow skill's run only runs steps, so it
    held its slots over that whole span."""
    out = {}
    for t in traces.values():
        st = [iso_ms(s.get("started_at")) for s in t.get("steps") or []]
        en = [iso_ms(s.get("ended_at")) for s in t.get("steps") or []]
        st, en = [x for x in st if x], [x for x in en if x]
        if st and en:
            out[t["id"]] = (min(st), max(en))
    return out


def most_at_once(spans):
    """The most spans (start, end) open at one moment (an end at the
    moment another starts does not overlap it)."""
    ev = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda x: (x[0], x[1]))
    n = most = 0
    for _, d in ev:
        n += d
        most = max(most, n)
    return most


def check_flow(world, traces):
    """Flow control's invariants, judged from the runs' records in every
    mode: never more runs in flight per key or scope than the limit; every
    admitted run completes (throttled runs all run: nothing is skipped but
    by idempotency or a singleton); one run per idempotency key; a
    singleton's key never has two runs in flight."""
    V = []
    flow = [t for t in traces.values() if flow_of(world, t["skill"])]
    if not flow:
        return V
    spans = in_flight({t["id"]: t for t in flow})
    groups = {}  # (what, limit) -> [span]
    for t in flow:
        spec = flow_of(world, t["skill"])
        span = spans.get(t["id"])
        if span is None:
            continue
        g = (t.get("input") or {}).get("g")
        for c in spec.get("conc", []):
            if "scope" in c:
                groups.setdefault(("scope " + c["scope"], c["limit"]), []).append((span, t))
            elif "key" in c:
                groups.setdefault(("%s key g=%s" % (t["skill"], g), c["limit"]), []).append((span, t))
            else:
                groups.setdefault((t["skill"], c["limit"]), []).append((span, t))
        if "singleton" in spec:
            groups.setdefault(("%s singleton g=%s" % (t["skill"], g), 1), []).append((span, t))
    for (what, limit), xs in sorted(groups.items()):
        most = most_at_once([sp for sp, _ in xs])
        if most > limit:
            V.append(Violation("flow-limit", "%s: %d runs in flight at once, limit %d: %s" % (
                what, most, limit, ", ".join("%s %s %.0f..%.0f" % (t["id"], (t.get("input") or {}).get("tag"),
                                                                   sp[0] % 1e6, sp[1] % 1e6)
                                             for sp, t in sorted(xs, key=lambda x: x[0])))))
    by_idem = {}
    for t in flow:
        spec = flow_of(world, t["skill"])
        tag = (t.get("input") or {}).get("tag")
        err = ((t.get("error") or {}).get("message") or "") if isinstance(t.get("error"), dict) else ""
        ok_skip = ("idempotency" in spec and err.startswith("skipped by idempotency")) or \
                  ("singleton" in spec and err.startswith("skipped by singleton"))
        if t["status"] == "skipped" and not ok_skip:
            V.append(Violation("flow-admitted", "run %s (%s, %s) was skipped, which its limits never do: %s" % (
                t["id"], t["skill"], tag, err), tag))
        elif t["status"] not in ("completed", "skipped"):
            V.append(Violation("flow-admitted", "run %s (%s, %s) was admitted but ended %s: %s" % (
                t["id"], t["skill"], tag, t["status"], err), tag))
        if "idempotency" in spec:
            by_idem.setdefault((t["skill"], (t.get("input") or {}).get("idem")), []).append(t)
    for (skill, key), ts in sorted(by_idem.items(), key=str):
        ran = [t for t in ts if t["status"] != "skipped"]
        if len(ran) != 1:
            V.append(Violation("flow-idempotency", "%s idempotency key %s: %d runs ran (one expected): %s" % (
                skill, key, len(ran), [(t["id"], (t.get("input") or {}).get("tag"), t["status"]) for t in ts])))
    return V


def check_versions(world, traces):
    """Guarantee 5 under faults: a run executes the version it started on,
    to its end, whichever engine replays it and whatever was written to its
    file meanwhile. Each source the harness wrote has its MARK, which the
    run's output carries as `ver`: it must be the mark of the version its
    record names, and that version one the harness wrote for its skill."""
    V = []
    marks = {}
    for sid in world.skills:
        for mark in {"e0"} | {e["mark"] for e in world.edits if e["skill"] == sid}:
            src = world.source_of(sid, mark).encode()
            marks[hashlib.sha256(src).hexdigest()] = (sid, mark)
    for rid, t in sorted(traces.items()):
        if t["skill"] == "zb":
            continue
        have = marks.get(t.get("version"))
        if not have or have[0] != t["skill"]:
            V.append(Violation("version", "run %s of %s names version %s, which the harness never wrote"
                               " for that skill" % (rid, t["skill"], t.get("version")),
                               tree_of((t.get("input") or {}).get("tag") if isinstance(t.get("input"), dict) else None)))
            continue
        out = t.get("output")
        if isinstance(out, dict) and "ver" in out and out["ver"] != have[1]:
            V.append(Violation("version", "run %s of %s started on the source with MARK %s, but the code"
                               " that ended it had MARK %s" % (rid, t["skill"], have[1], out["ver"]),
                               tree_of(out.get("tag"))))
    return V


def check(world, mode, result, ref):
    """The violations of one case; ref is mode (a)'s outcomes (None for (a))."""
    V = []
    traces = {k: v for k, v in result["traces"].items() if v}
    calls = result["calls"]
    ints = sorted(result["interrupts"])
    interrupted = bool(ints)
    excused, qv = quarantined(traces, result)
    V += qv
    result["quarantined"] = len(excused)

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
            elif mine[key][0] != ref[key][0] and not flow_either(world, key, ref[key][0], mine[key][0]):
                V.append(Violation("outcome", "run %s ended differently:\n      (a):  %s\n      (%s):  %s" % (
                    key, json.dumps(ref[key][0], sort_keys=True), mode, json.dumps(mine[key][0], sort_keys=True)),
                    tree_of(key[0])))

    V += check_flow(world, traces)
    V += check_versions(world, traces)

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

    # -- an invoke with a key, sent again, answered the first run --
    for root in world.roots:
        ids = set(result.get("run_ids", {}).get(root["tag"], []))
        if root.get("key") and len(ids) > 1:
            V.append(Violation("event-once", "invokes of %s with key %s answered %d runs: %s" % (
                root["tag"], root["key"], len(ids), sorted(ids)), root["tag"]))

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
            # A freeze of the process that ran it again counts too: frozen
            # inside a transaction, it held the database's write lock, so the
            # first runner's commits waited and its lease ran out unrenewed
            # (seen on PostgreSQL: B frozen, A ran the bodies 50 ms later,
            # B thawed, took A's runs and ran them again, A lost its lease).
            if not a.answer["fail"] and not between(a.t, b.t, a.engine) and \
                    not (b.engine != a.engine and between(a.t, b.t, b.engine)):
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
        site = world.site(s["id"])
        if site is not None and site.kind == "inv":
            continue  # a branch of a parallel of invokes: its output is its child's
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
        if status == "cancelled" and t and t["status"] == "cancelled":
            # The run was cancelled while its wait took the event (a race
            # the harness makes: it sends a late event to a child whose
            # parent's invoke times out): the step ends cancelled, and the
            # event, which goes to every run that waits for it (once per
            # run), is lost to no one.
            continue
        V.append(Violation("delivery-lost", "run %s %s: its wait %s took event %s, but the step is %s without it" % (
            rid, run_key(t) if t else "", sid, eid, status), tree_of(run_key(t)[0]) if t else None))

    # -- runs left to a lease that no longer exists: nobody will ever run them --
    for rid, owner in sorted(result.get("orphans", {}).items()):
        t = traces.get(rid)
        V.append(Violation("orphan", "run %s %s is owned by %s, a lease that no longer exists: no engine"
                           " will ever run it" % (rid, run_key(t) if t else "", owner),
                           tree_of(run_key(t)[0]) if t else None))

    # -- what a justified quarantine explains: its tree ended otherwise than in (a) --
    V = [v for v in V if not (v.tree in excused and v.cls in ("outcome", "missing-run", "extra-run"))]

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
    """Mark violations that a known bug explains (v.known = its class, for
    each class of KNOWN_CLASSES in known). No class is known now: a fixed
    bug's class is removed, so the simulation holds it from then on."""
    return V
