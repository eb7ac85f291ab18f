"""Flow control: several concurrency limits per skill, limits shared across
skills (scope), the `queued` status with its reason, and the limits held
across kill -9 and two engines on one database (docs/skills.md, "Flow
control")."""
import json
import os
import re
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SkillsTestCase, kill9, ms, wait_until  # noqa: E402

# A skill whose one step calls the stand-in at /svc/<tag>/<run id>: the
# stand-in sees which runs are in flight at once.
CALLER = """
return { id = "%(id)s", concurrency = %(conc)s, run = function(ctx)
  return ctx.step.run("call", function()
    return http.get_json(env.STANDIN .. "/svc/%(tag)s/" .. ctx.run_id .. "?k=" .. tostring(ctx.input.k)).ok
  end)
end }"""


class Gauge:
    """In-flight runs per key, counted by run id, not by request: a killed
    engine's request may still be in flight at the stand-in while its run
    takes the step again under the next engine."""

    def __init__(self, hold=0.3):
        self.lock = threading.Lock()
        self.inflight = {}
        self.most = {}
        self.starts = []  # (time, tag, run id, k)
        self.hold = hold
        self.release = None  # an Event: hold until it is set
        self.gone = set()  # (key, run) of requests a killed engine left in flight

    def killed(self):
        """The engine holding the requests in flight now was killed: they
        hold no slot any more (the runs are taken over, and may take
        their step again), so they count no more."""
        with self.lock:
            for key, runs in self.inflight.items():
                for run in list(runs):
                    self.gone.add((key, run))
                    del runs[run]

    def handler(self, keys_of):
        def call(h, b, n):
            path, _, query = h.path.partition("?")
            _, _, tag, run = path.split("/")
            k = query.partition("=")[2]
            keys = keys_of(tag, k)
            with self.lock:
                self.starts.append((time.time(), tag, run, k))
                for key in keys:
                    runs = self.inflight.setdefault(key, {})
                    runs[run] = runs.get(run, 0) + 1
                    self.most[key] = max(self.most.get(key, 0), len(runs))
            if self.release is not None:
                self.release.wait(30)
            else:
                time.sleep(self.hold)
            with self.lock:
                for key in keys:
                    runs = self.inflight[key]
                    if (key, run) in self.gone:
                        # A killed engine's request ended (or, first, the
                        # run's new one: the other then counts down).
                        self.gone.discard((key, run))
                        continue
                    runs[run] -= 1
                    if not runs[run]:
                        del runs[run]
            return 200, {"ok": True}
        return call


class FlowControlTest(SkillsTestCase):
    def api(self, p, path):
        with urllib.request.urlopen(p.url + path, timeout=10) as r:
            return json.loads(r.read())

    def test_several_limits_per_skill_and_a_scope_shared_across_skills(self):
        # one: at most 1 per customer and 3 overall; two and three share
        # the scope "openai" of 2 (two also has a limit of its own of 5).
        self.skill("one", CALLER % {"id": "one", "tag": "one",
                                    "conc": '{ {limit = 1, key = "event.data.k"}, {limit = 3} }'})
        self.skill("two", CALLER % {"id": "two", "tag": "two",
                                    "conc": '{ {limit = 2, scope = "openai"}, {limit = 5} }'})
        self.skill("three", CALLER % {"id": "three", "tag": "three",
                                      "conc": '{limit = 2, scope = "openai"}'})
        g = Gauge(hold=0.3)

        def keys_of(tag, k):
            if tag == "one":
                return ["one", "one:" + k]
            return ["openai", tag]
        self.si.route_prefix("/svc/", g.handler(keys_of))
        p = self.serve()
        p.terminate()
        p.wait(timeout=10)
        # All queued before an engine runs, so they all compete at once:
        # a's runs wait for their key, and b, c, d go past them.
        for k in ["a", "a", "a", "b", "b", "c", "c", "d"]:
            self.w.ml("invoke", "one", "--data", json.dumps({"k": k}), check=0)
        for s in ["two", "three"] * 4:
            self.w.ml("invoke", s, "--data", "{}", check=0)
        self.serve()
        wait_until(lambda: len(self.w.runs(status="completed")) == 16, timeout=60, what="sixteen runs")
        for k in "abcd":
            self.assertEqual(g.most["one:" + k], 1, "customer %s" % k)
        self.assertEqual(g.most["one"], 3)  # the overall limit, reached: keys ran side by side
        self.assertEqual(g.most["openai"], 2)  # two skills, one shared limit
        self.assertGreaterEqual(g.most["two"] + g.most["three"], 2)

    def test_a_key_that_is_an_object_counts_the_same_whatever_its_keys_order(self):
        # {"a":1,"b":2} and {"b":2,"a":1} are one value of the key: the
        # limit of 1 holds, and a singleton skips the second.
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": '{ limit = 1, key = "event.data.g" }'})
        self.skill("solo", CALLER % {"id": "solo", "tag": "solo", "conc": 'nil, singleton = { key = "data.g" }'})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: [tag]))
        self.serve()
        try:
            for skill in ("one", "solo"):
                first = self.w.ml("invoke", skill, "--data", '{"g": {"a": 1, "b": {"x": 1, "y": 2}}}',
                                  check=0).stdout.strip()
                wait_until(lambda: any(s[2] == first for s in g.starts), what="the first run's call")
                second = self.w.ml("invoke", skill, "--data", '{"g": {"b": {"y": 2, "x": 1}, "a": 1}}',
                                   check=0).stdout.strip()
                if skill == "one":
                    # queued: null is a run no engine has taken yet.
                    wait_until(lambda: (self.w.trace(second)["queued"] or {}).get("reason") == "concurrency",
                               what="the second queued for the slot")
                    self.assertEqual(self.w.trace(second)["queued"]["key"],
                                     'event.data.g={"a":1,"b":{"x":1,"y":2}}')
                else:
                    wait_until(lambda: self.w.trace(second)["status"] == "skipped", what="the second skipped")
                    self.assertIn("skipped by singleton: run %s" % first, self.w.trace(second)["error"]["message"])
        finally:
            g.release.set()
        wait_until(lambda: len(self.runs_of("one", "completed")) == 2, what="both runs of one")
        self.assertEqual(g.most["one"], 1)

    def test_a_run_waiting_for_a_slot_is_queued_with_its_reason_and_not_started(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one",
                                    "conc": '{ {limit = 1, scope = "llm", key = "event.data.k"} }'})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        p = self.serve()
        first = self.w.ml("invoke", "one", "--data", '{"k": "x"}', check=0).stdout.strip()
        wait_until(lambda: len(g.starts) == 1, what="the first run's call")
        second = self.w.ml("invoke", "one", "--data", '{"k": "x"}', check=0).stdout.strip()
        # Made queued, it asks for its slot in the next group: then it has its reason.
        wait_until(lambda: self.w.trace(second)["queued"] is not None, what="the second run queued")
        # The record: status queued, no started_at, the reason.
        rec = self.w.trace(second)
        self.assertIsNone(rec["started_at"])
        # The record of one run also says its place in the queue (1: next).
        self.assertEqual(rec["queued"], {"reason": "concurrency", "scope": "llm",
                                         "key": 'event.data.k="x"', "limit": 1, "position": 1})
        self.assertIsNone(self.w.trace(first)["queued"])
        third = self.w.ml("invoke", "one", "--data", '{"k": "x"}', check=0).stdout.strip()
        wait_until(lambda: self.w.trace(third)["queued"] is not None, what="the third run queued")
        self.assertEqual(self.w.trace(third)["queued"]["position"], 2)
        self.assertIn('queued   waiting: concurrency limit 1 of scope llm, key event.data.k="x", number 2 in the queue',
                      self.w.ml("trace", third, check=0).stdout)
        # The API, `moonloop runs` and `moonloop trace` say so too.
        self.assertEqual(self.api(p, "/v1/runs/" + second)["queued"]["scope"], "llm")
        listed = {r["id"]: r for r in self.api(p, "/v1/runs?skill=one")["runs"]}
        self.assertEqual(listed[second]["status"], "queued")
        self.assertEqual(listed[second]["queued"]["limit"], 1)
        with urllib.request.urlopen(p.url + "/metrics", timeout=10) as m:
            self.assertIn('moonloop_runs_queued{reason="concurrency"} 2', m.read().decode())
        table = self.w.ml("runs", "--skill", "one", check=0).stdout
        line = [ln for ln in table.splitlines() if ln.startswith(second)][0]
        self.assertIn("queued", line)
        self.assertIn('waiting: concurrency limit 1 of scope llm, key event.data.k="x"', line)
        text = self.w.ml("trace", second, check=0).stdout
        self.assertIn('queued   waiting: concurrency limit 1 of scope llm, key event.data.k="x", number 1 in the queue', text)
        self.assertIn("started  not yet", text)
        # Another key is not held up.
        other = self.w.ml("invoke", "one", "--data", '{"k": "y"}', check=0).stdout.strip()
        wait_until(lambda: len(g.starts) == 2, what="the other key's call")
        self.assertEqual(self.w.trace(other)["status"], "running")
        time.sleep(0.3)
        self.assertEqual(len(g.starts), 2)  # the queued run did not start
        # A queued run cancelled waits for nothing: its record, the list and
        # the trace no longer give a reason to wait.
        self.w.ml("cancel", third, check=0)
        wait_until(lambda: self.w.trace(third)["status"] == "cancelled", what="the third run cancelled")
        self.assertIsNone(self.w.trace(third)["queued"])
        self.assertIsNone({r["id"]: r for r in self.api(p, "/v1/runs?skill=one")["runs"]}[third]["queued"])
        self.assertNotIn("waiting:", self.w.ml("trace", third, check=0).stdout)
        g.release.set()
        wait_until(lambda: self.w.trace(second)["status"] == "completed", what="the queued run's end")
        a, b = self.w.trace(first), self.w.trace(second)
        self.assertIsNone(b["queued"])
        # It started when the first ended, not when it was created.
        self.assertGreaterEqual(b["started_at"], a["ended_at"])
        self.assertLess(b["created_at"], a["ended_at"])

    def test_runs_blocked_on_one_key_do_not_hold_up_other_keys_or_skills(self):
        # one: 2 at once across the scope "api", 1 per key; two: the scope only.
        self.skill("one", CALLER % {"id": "one", "tag": "one",
                                    "conc": '{ {limit = 2, scope = "api"}, {limit = 1, key = "event.data.k"} }'})
        self.skill("two", CALLER % {"id": "two", "tag": "two", "conc": '{limit = 2, scope = "api"}'})
        lock = threading.Lock()
        started = []
        hold = {k: threading.Event() for k in "abc"}

        def call(h, b, n):
            path, _, query = h.path.partition("?")
            k = query.partition("=")[2]
            with lock:
                started.append(path.rsplit("/", 1)[1])
            hold[k].wait(30)
            return 200, {"ok": True}
        self.si.route_prefix("/svc/", call)
        try:
            self.serve()

            def invoke(skill, k):
                return self.w.ml("invoke", skill, "--data", json.dumps({"k": k}), check=0).stdout.strip()
            a1 = invoke("one", "a")
            wait_until(lambda: a1 in started, what="a1's call")
            a2, a3 = invoke("one", "a"), invoke("one", "a")
            wait_until(lambda: self.w.trace(a3)["status"] == "queued", what="a3 queued")
            # Key a is full, the scope is not: b1 starts at once, past a2 and a3.
            b1 = invoke("one", "b")
            wait_until(lambda: b1 in started, what="b1 started while a's runs wait")
            b2, c1 = invoke("one", "b"), invoke("two", "c")
            # (A run is "queued" with no reason until flow control has seen
            # it: created, not yet taken by the engine.)
            wait_until(lambda: (self.w.trace(c1)["queued"] or {}).get("scope"), what="c1 queued")
            self.assertEqual(self.w.trace(c1)["status"], "queued")
            self.assertEqual(self.w.trace(c1)["queued"]["scope"], "api")
            # b1's end frees a place in the scope: a2 and a3 still cannot
            # have key a, so b2 (then, after b2, c1 of the other skill) goes.
            hold["b"].set()
            hold["c"].set()
            wait_until(lambda: self.w.trace(c1)["status"] == "completed", timeout=30, what="c1's end")
            self.assertEqual(self.w.trace(b2)["status"], "completed")
            self.assertNotIn(a2, started)
            self.assertEqual([self.w.trace(r)["status"] for r in (a1, a2, a3)], ["running", "queued", "queued"])
            hold["a"].set()
            wait_until(lambda: len(self.runs_of("one", "completed")) == 5, timeout=30, what="every run of one")
            self.assertEqual([r for r in started if r in (a1, a2, a3)], [a1, a2, a3])
        finally:
            for ev in hold.values():
                ev.set()

    def test_a_fan_out_to_itself_under_limit_1_fails_saying_why_instead_of_waiting_forever(self):
        self.skill("fan", """
return { id = "fan", concurrency = { limit = 1 }, run = function(ctx)
  if ctx.input.depth > 0 then return "leaf" end
  return ctx.step.parallel("kids", {
    function() return ctx.step.invoke("a", { skill = "fan", data = { depth = 1 } }) end,
    function() return ctx.step.invoke("b", { skill = "fan", data = { depth = 1 } }) end,
  })
end }""")
        self.skill("solo", """
return { id = "solo", concurrency = { limit = 1 }, run = function(ctx)
  if ctx.input.depth > 0 then return "leaf" end
  return ctx.step.invoke("one", { skill = "solo", data = { depth = 1 } })
end }""")
        self.serve()
        parent = self.w.ml("invoke", "fan", "--data", '{"depth": 0}', check=0).stdout.strip()
        wait_until(lambda: self.w.trace(parent)["status"] == "failed", timeout=30, what="the parent's end")
        kids = [r for r in self.runs_of("fan") if r["id"] != parent]
        self.assertTrue(kids)
        for k in kids:
            self.assertEqual(k["status"], "failed")
            self.assertIn("cannot start: its parent run %s holds the only slot of concurrency limit 1 of skill fan"
                          % parent, k["error"]["message"])
        self.assertIn("cannot start", json.dumps(self.w.trace(parent)["error"]))
        # A plain step.invoke parks, giving its slot back: the child runs.
        solo = self.w.ml("invoke", "solo", "--data", '{"depth": 0}', check=0).stdout.strip()
        wait_until(lambda: self.w.trace(solo)["status"] == "completed", timeout=30, what="solo's end")
        self.assertEqual(self.w.trace(solo)["output"], "leaf")

    def test_a_runs_timeout_counts_from_its_start_not_its_time_queued(self):
        self.skill("slow", """
return { id = "slow", timeout = "2s", concurrency = { limit = 1 }, run = function(ctx)
  return ctx.step.run("call", function()
    return http.get_json(env.STANDIN .. "/hold/" .. tostring(ctx.input.n)).ok
  end)
end }""")
        release = threading.Event()

        def hold(h, b, n):
            if h.path.endswith("/0"):
                release.wait(30)  # the first run holds the slot past its timeout
            else:
                time.sleep(1.0)  # half the second's timeout: more than it has left counted from creation
            return 200, {"ok": True}
        self.si.route_prefix("/hold/", hold)
        try:
            self.serve()
            first = self.w.ml("invoke", "slow", "--data", '{"n": 0}', check=0).stdout.strip()
            wait_until(lambda: self.w.trace(first)["status"] == "running", what="the first run")
            second = self.w.ml("invoke", "slow", "--data", '{"n": 1}', check=0).stdout.strip()
            wait_until(lambda: self.w.trace(first)["status"] == "failed", timeout=30, what="the first's timeout")
            self.assertEqual(self.w.trace(first)["error"]["message"], "the run timed out after 2.0s (its timeout)")
            # The second waited queued about as long as the timeout, then
            # had its whole timeout to run in.
            wait_until(lambda: self.w.trace(second)["status"] in ("completed", "failed"), timeout=30,
                       what="the second's end")
            t = self.w.trace(second)
            self.assertEqual(t["status"], "completed", t.get("error"))
        finally:
            release.set()

    def test_a_limited_runs_first_sleep_and_wait_last_as_long_as_asked(self):
        # Such a run is made before it has its slot: its clock must start
        # when it starts, not at 0 (the sleep and the wait's timeout were
        # over at once). Lower bounds only: a loaded machine lengthens them.
        self.skill("nap", """
return { id = "nap", concurrency = { limit = 1 }, run = function(ctx)
  local e = ctx.step.wait_for_event("w", { event = "never.sent", timeout = "1500ms" })
  ctx.step.sleep("s", "1500ms")
  return e == nil
end }""")
        self.serve()
        rid = self.w.ml("invoke", "nap", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30, what="the nap")
        t = self.w.trace(rid)
        self.assertIs(t["output"], True)
        for s in t["steps"]:
            self.assertIsNotNone(s["started_at"], s)  # (it was 0, 1970, and shown as none)
            took = ms(s["ended_at"]) - ms(s["started_at"])
            self.assertGreaterEqual(took, 1500, "%s took %d ms" % (s["id"], took))

    def test_a_queued_runs_timeout_holds_across_kill_9(self):
        self.skill("slow", """
return { id = "slow", timeout = "3s", concurrency = { limit = 1 }, run = function(ctx)
  return ctx.step.run("call", function() return http.get_json(env.STANDIN .. "/hold").ok end)
end }""")
        release = threading.Event()
        self.si.routes["/hold"] = lambda h, b, n: (release.wait(30), (200, {"ok": True}))[1]
        try:
            p = self.serve()
            run = self.w.ml("invoke", "slow", "--data", "{}", check=0).stdout.strip()
            wait_until(lambda: self.si.count("/hold") >= 1, what="the run's call")
            kill9(p)
            self.serve()  # takes it over: its deadline is its start plus its timeout
            wait_until(lambda: self.w.trace(run)["status"] == "failed", timeout=30, what="the timeout")
            t = self.w.trace(run)
            self.assertEqual(t["error"]["message"], "the run timed out after 3.0s (its timeout)")
        finally:
            release.set()

    def test_limits_hold_across_kill_9_and_two_engines(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one",
                                    "conc": '{ {limit = 2, scope = "shared"}, {limit = 1, key = "event.data.k"} }'})
        self.skill("two", CALLER % {"id": "two", "tag": "two", "conc": '{limit = 2, scope = "shared"}'})
        g = Gauge(hold=0.4)

        def keys_of(tag, k):
            return ["shared"] + (["one:" + k] if tag == "one" else [])
        self.si.route_prefix("/svc/", g.handler(keys_of))
        a = self.serve()
        b = self.serve()  # a second engine on the same database
        for i in range(6):
            self.w.ml("invoke", "one", "--data", json.dumps({"k": "ab"[i % 2]}), check=0)
            self.w.ml("invoke", "two", "--data", "{}", check=0)
        wait_until(lambda: len(g.starts) >= 3, what="some calls")
        kill9(a)  # slot holders may die: their runs keep their slots until they end
        wait_until(lambda: len(g.starts) >= 6, timeout=30, what="more calls")
        kill9(b)
        c = self.serve()
        wait_until(lambda: len(self.w.runs(status="completed")) == 12, timeout=60, what="twelve runs")
        self.assertEqual(g.most["shared"], 2)
        self.assertEqual(g.most["one:a"], 1)
        self.assertEqual(g.most["one:b"], 1)
        c.terminate()

    def test_a_slot_held_by_a_run_cancelled_while_its_engine_is_dead_goes_to_the_next_run(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": '{limit = 1}'})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        a = self.serve()
        r1 = self.w.ml("invoke", "one", "--data", "{}", check=0).stdout.strip()
        r2 = self.w.ml("invoke", "one", "--data", "{}", check=0).stdout.strip()
        wait_until(lambda: len(g.starts) == 1 and self.w.trace(r2)["status"] == "queued", what="r1 in, r2 queued")
        kill9(a)
        g.release.set()  # the dead engine's call ends, answered to nobody
        wait_until(lambda: not g.inflight.get("all"), what="the call ended")
        # Cancelled with no engine up: r1's end hands its slot to r2.
        self.assertEqual(self.w.ml("cancel", r1, check=0).returncode, 0)
        self.assertEqual(self.w.trace(r1)["status"], "cancelled")
        self.serve()
        wait_until(lambda: self.w.trace(r2)["status"] == "completed", timeout=30, what="r2 completed")
        self.assertEqual(g.most["all"], 1)
        self.assertEqual([s[2] for s in g.starts], [r1, r2])

    def test_queued_runs_keep_their_order(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": '{limit = 1}'})
        g = Gauge(hold=0.05)
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        p = self.serve()
        p.terminate()
        p.wait(timeout=10)
        # Queued with no engine running: they start in the order they were made.
        ids = [self.w.ml("invoke", "one", "--data", json.dumps({"k": i}), check=0).stdout.strip()
               for i in range(8)]
        self.serve()
        wait_until(lambda: len(self.runs_of("one", "completed")) == 8, timeout=30, what="eight runs")
        self.assertEqual([s[2] for s in g.starts], ids)
        self.assertEqual(g.most["all"], 1)

    def test_a_scope_given_two_limits_is_refused_naming_the_other_skill(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": '{limit = 2, scope = "api"}'})
        self.skill("two", CALLER % {"id": "two", "tag": "two", "conc": '{limit = 3, scope = "api"}'})
        self.serve()

        def skills():
            return {x["id"]: x for x in self.w.json("skills", "--json")}

        def refused():
            return [x for x in skills().values() if x.get("error")]
        wait_until(lambda: len(skills()) == 2 and refused(), what="a refusal")
        bad = refused()
        self.assertEqual(len(bad), 1)
        other, mine = ("one", 3) if bad[0]["id"] == "two" else ("two", 2)
        self.assertIn("concurrency scope 'api' has limit %d here, but skill '%s'" % (mine, other),
                      bad[0]["error"]["message"])
        self.assertIn("every skill naming a scope must give it the same limit", bad[0]["error"]["message"])
        # Both files changed to one new limit: both load, whichever goes first.
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": '{limit = 4, scope = "api"}'})
        self.skill("two", CALLER % {"id": "two", "tag": "two", "conc": '{limit = 4, scope = "api"}'})
        wait_until(lambda: len(skills()) == 2 and not refused() and all(
            x.get("version") for x in skills().values()), what="both loaded", timeout=20)
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["api"]))
        try:
            for i in range(3):
                self.w.ml("invoke", "one", "--data", "{}", check=0)
                self.w.ml("invoke", "two", "--data", "{}", check=0)
            # Four run at once, across both skills; the other two wait.
            wait_until(lambda: g.most.get("api", 0) >= 4 and len(self.w.runs(status="queued")) == 2,
                       timeout=30, what="four running, two queued")
        finally:
            g.release.set()
        wait_until(lambda: len(self.w.runs(status="completed")) == 6, timeout=30, what="six runs")
        self.assertEqual(g.most["api"], 4)

    def test_a_scope_given_two_limits_through_two_engines_at_once_is_refused_by_the_store(self):
        # Each engine checks the registry before it writes; with every
        # commit held 2 s, both PUTs pass that check before either is
        # written. The store judges when it writes: one of them is refused.
        faults = {"MOONLOOP_FAULT": "commit=2000"}
        a = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", env=faults)
        b = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", env=faults)
        answers = {}

        def put(p, sid, limit):
            src = CALLER % {"id": sid, "tag": sid, "conc": '{limit = %d, scope = "api"}' % limit}
            req = urllib.request.Request(p.url + "/v1/skills/" + sid, method="PUT", data=src.encode(),
                                         headers={"Content-Type": "text/x-lua"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    answers[sid] = (r.status, json.loads(r.read()))
            except urllib.error.HTTPError as err:
                answers[sid] = (err.code, json.loads(err.read()))
        ts = [threading.Thread(target=put, args=x) for x in ((a, "one", 2), (b, "two", 3))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        codes = sorted(c for c, _ in answers.values())
        self.assertEqual(codes, [200, 409], answers)
        bad = [sid for sid, (c, _) in answers.items() if c == 409][0]
        other, mine = ("two", 2) if bad == "one" else ("one", 3)
        msg = answers[bad][1]["error"]["message"]
        # (The other skill's file is named when the registry has it: the
        # PUT wrote it into the workspace, whose watcher may have seen it.)
        self.assertRegex(msg, r"concurrency scope 'api' has limit %d here, but skill '%s'( \(%s\.lua\))? "
                         r"gives it limit %d" % (mine, other, other, 5 - mine))
        self.assertIn("every skill naming a scope must give it the same limit", msg)
        # The refused skill has no live version, and says why.
        skills = {x["id"]: x for x in self.w.json("skills", "--json")}
        self.assertIsNone(skills[bad].get("version"))
        self.assertIn("every skill naming a scope must give it the same limit", skills[bad]["error"]["message"])
        self.assertTrue(skills[other].get("version"))

    def test_bad_limits_are_refused_naming_the_fix(self):
        cases = [
            ('{ {limit = 1}, {limit = 2} }', "concurrency 2 repeats the skill's own limit without a key"),
            ('{ {limit = 1, scope = "Open AI"} }', "'concurrency.scope' must be a name such as \"openai\""),
            ('{ {limit = 1, scop = "x"} }', "unknown key 'scop' in 'concurrency' (did you mean 'scope'?)"),
            ('{ {limit = 1}, limit = 2 }', "'concurrency' is a list of limits, so it cannot also have the key 'limit'"),
            ('{ {limit = 0} }', "'concurrency.limit' must be a whole number of at least 1, got 0"),
            ('{ {limit = 1}, 5 }', "concurrency 2 must be a table {limit=, key=, scope=}, got 5"),
            ('{}', "'concurrency.limit' must be a whole number of at least 1, got nil"),
        ]
        for conc, want in cases:
            path = self.w.write("bad.lua", 'return { id = "bad", concurrency = %s, run = function() end }' % conc)
            r = self.w.ml("check", path)
            self.assertEqual(r.returncode, 1, conc)
            self.assertIn(want, r.stderr + r.stdout, conc)


# A skill whose one step tells the stand-in it started: /start/<run id>?k=
STARTER = """
return { id = "%(id)s", %(flow)s, run = function(ctx)
  return ctx.step.run("start", function()
    return http.get_json(env.STANDIN .. "/start/" .. ctx.run_id .. "?k=" .. tostring(ctx.input.k)).ok
  end)
end }"""


def invoke_http(p, skill, k):
    """Invoke skill with {k} over engine p's HTTP API (faster than a CLI
    process each): the run's id."""
    req = urllib.request.Request(p.url + "/v1/skills/%s/invoke" % skill, method="POST",
                                 data=json.dumps({"data": {"k": k}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["run_id"]


class LimitChangeTest(SkillsTestCase):
    """A skill's concurrency limit changed (its file edited, hot-reloaded)
    governs every run from then on, the ones queued under the old limit
    too; the runs holding a slot keep it until they end or park."""

    def version(self, p):
        with urllib.request.urlopen(p.url + "/v1/skills/one", timeout=10) as r:
            return json.loads(r.read())["version"]

    def change(self, p, conc):
        old = self.version(p)
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": conc})
        wait_until(lambda: self.version(p) != old, what="the edited file live")

    def test_a_lowered_limit_holds_for_the_runs_queued_under_the_old_one(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": "{limit = 3}"})
        g = Gauge()
        held = g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        p = self.serve()
        ids = [invoke_http(p, "one", i) for i in range(7)]
        wait_until(lambda: len(g.starts) == 3 and len(self.runs_of("one", "queued")) == 4, what="3 in, 4 queued")
        self.change(p, "{limit = 1}")
        ids += [invoke_http(p, "one", i) for i in range(7, 9)]
        with g.lock:
            g.most = {}
            g.release, g.hold = None, 0.2
        held.set()  # the three runs holding a slot end
        wait_until(lambda: len(self.runs_of("one", "completed")) == 9, timeout=30, what="nine runs")
        self.assertEqual(g.most["all"], 1, "more runs than the new limit at once")
        self.assertEqual(sorted(s[2] for s in g.starts), sorted(ids))

    def test_a_raised_limit_starts_the_runs_queued_under_the_old_one_at_once(self):
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": "{limit = 1, key = 'event.data.k'}"})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        p = self.serve()
        for _ in range(4):
            invoke_http(p, "one", "a")
        wait_until(lambda: len(g.starts) == 1 and len(self.runs_of("one", "queued")) == 3, what="1 in, 3 queued")
        self.change(p, "{limit = 3, key = 'event.data.k'}")
        # The first run still holds its slot: two more start, not one.
        wait_until(lambda: len(g.starts) == 3, what="two queued runs started by the raised limit")
        time.sleep(0.3)
        self.assertEqual(len(g.starts), 3)
        q = self.runs_of("one", "queued")
        self.assertEqual(len(q), 1)
        g.release.set()
        wait_until(lambda: len(self.runs_of("one", "completed")) == 4, timeout=30, what="four runs")
        self.assertEqual(g.most["all"], 3)


class PerPeriodTest(SkillsTestCase):
    def record_starts(self):
        starts = {}  # run id -> (first start time, k)
        lock = threading.Lock()

        def start(h, b, n):
            path, _, query = h.path.partition("?")
            with lock:
                # The first call only: a replay after a kill calls again.
                starts.setdefault(path.rsplit("/", 1)[1], (time.time(), query.partition("=")[2]))
            return 200, {"ok": True}
        self.si.route_prefix("/start/", start)
        return starts

    def most_in_a_window(self, times, period):
        times = sorted(times)
        return max(sum(1 for u in times if t <= u < t + period) for t in times)

    def test_throttle_queues_the_excess_in_order_with_burst_across_kill_9(self):
        self.skill("thr", STARTER % {"id": "thr", "flow": 'throttle = { limit = 2, period = "1s", '
                                                          'key = "event.data.k", burst = 1 }'})
        starts = self.record_starts()
        p = self.serve()
        p.terminate()
        p.wait(timeout=10)
        ids = {"a": [], "b": []}
        for k in ["a"] * 10 + ["b"] * 3:
            ids[k].append(self.w.ml("invoke", "thr", "--data", json.dumps({"k": k}), check=0).stdout.strip())
        p = self.serve()
        last = ids["a"][-1]
        # Waiting, the last one says why and until when.
        wait_until(lambda: (self.w.trace(last)["queued"] or {}).get("reason") == "throttle", what="throttled")
        q = self.w.trace(last)["queued"]
        self.assertEqual((q["limit"], q["period"], q["key"]), (2, "1.0s", 'event.data.k="a"'))
        self.assertIn("until", q)
        self.assertIsNone(self.w.trace(last)["started_at"])
        self.assertIn("waiting: throttle limit 2 per 1.0s of skill thr, key event.data.k=\"a\", until ",
                      self.w.ml("runs", check=0).stdout)
        wait_until(lambda: len(starts) >= 4, what="some starts")
        kill9(p)  # the reservations are in the store: the next engine keeps to them
        killed_at = time.time()
        self.serve()
        wait_until(lambda: len(self.runs_of("thr", "completed")) == 13, timeout=60, what="thirteen runs")
        from datetime import datetime
        started = {r["id"]: datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")).timestamp()
                   for r in self.runs_of("thr")}
        for k in "ab":
            # Started in creation order, and never more than limit + burst
            # in a period while one engine runs them (the starts after the
            # kill: see the test below).
            self.assertEqual(sorted(ids[k], key=lambda r: started[r]), ids[k])
            before = [started[r] for r in ids[k] if started[r] < killed_at]
            self.assertLessEqual(self.most_in_a_window(before, 1.0), 3, k)
        # b's runs did not wait behind a's.
        self.assertLess(max(starts[r][0] for r in ids["b"]), starts[ids["a"][-1]][0])
        # Spread over at least (10 - 3) / 2 periods: the throttle held them.
        a = sorted(starts[r][0] for r in ids["a"])
        self.assertGreaterEqual(a[-1] - a[0], 3.0)

    def test_throttle_spaces_runs_whose_start_times_came_while_no_engine_was_up(self):
        # One start a second: six runs reserved one a second, then the
        # engine is killed and is down until every reserved time has passed.
        self.skill("thr", STARTER % {"id": "thr", "flow": 'throttle = { limit = 1, period = "1s" }'})
        starts = self.record_starts()
        p = self.serve()

        # Over HTTP, all six within far less than a period (a CLI process
        # each may take longer on a loaded machine).
        ids = [invoke_http(p, "thr", i) for i in range(6)]
        wait_until(lambda: (self.w.trace(ids[-1])["queued"] or {}).get("reason") == "throttle",
                   what="the last run throttled")
        wait_until(lambda: len(starts) >= 1, what="the first start")
        kill9(p)
        killed_at = time.time()
        from datetime import datetime

        def ts(t):
            return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        until = ts(self.w.trace(ids[-1])["queued"]["until"])
        time.sleep(max(0.0, until - time.time()) + 0.5)
        self.serve()
        wait_until(lambda: len(self.runs_of("thr", "completed")) == 6, timeout=60, what="six runs")
        started = {r["id"]: ts(r["started_at"]) for r in self.runs_of("thr")}
        late = sorted(started[r] for r in ids if started[r] > killed_at)
        self.assertGreaterEqual(len(late), 3)
        # Spaced again, one a second (half a period of slack for a loaded
        # machine; unspaced, they would all start within a few ms)...
        self.assertEqual(self.most_in_a_window(late, 0.5), 1, late)
        # ...and in creation order.
        self.assertEqual(sorted(ids, key=lambda r: started[r]), ids)

    def test_a_throttled_run_waiting_for_its_slot_is_not_counted_again_when_taken_over(self):
        # One start per 4 s and one at a time: b passes the throttle at its
        # time and waits for a's slot; c's time is one interval after b's.
        # a's engine dies and another takes the runs over: b asks again
        # and must not be counted a second time (which pushed c back a
        # whole interval, and b itself behind c's time).
        self.skill("thc", CALLER % {"id": "thc", "tag": "thc", "conc": '{limit = 1}, '
                                    'throttle = { limit = 1, period = "4s" }'})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        a = self.serve()
        b = self.serve()  # the engine that takes a's runs over
        try:
            r1, r2, r3 = [invoke_http(a, "thc", i) for i in range(3)]

            def queued(run):
                return self.w.trace(run)["queued"] or {}
            wait_until(lambda: queued(r2).get("reason") == "concurrency", timeout=20,
                       what=lambda: "b past its throttle, waiting for a's slot: %s" % queued(r2))
            before = queued(r3)
            self.assertEqual(before.get("reason"), "throttle")
            kill9(a)
            g.killed()
            # c asks when its time comes (b asked when it was taken over).
            wait_until(lambda: queued(r3) != before, timeout=30,
                       what=lambda: "c asked again: %s" % queued(r3))
            self.assertEqual(queued(r3).get("reason"), "concurrency", queued(r3))
            self.assertEqual(queued(r2).get("reason"), "concurrency", queued(r2))
        finally:
            g.release.set()
        wait_until(lambda: len(self.runs_of("thc", "completed")) == 3, timeout=30, what="three runs")
        started = {r["id"]: r["started_at"] for r in self.runs_of("thc")}
        self.assertEqual(sorted([r1, r2, r3], key=lambda r: started[r]), [r1, r2, r3])
        self.assertEqual(g.most["all"], 1)
        b.terminate()

    def test_rate_limit_skips_the_excess_and_records_each_skip(self):
        self.skill("rl", STARTER % {"id": "rl", "flow": 'triggers = { { event = "svc.alert" } }, '
                                                        'rate_limit = { limit = 2, period = "1h", key = "event.data.k" }'})
        starts = self.record_starts()
        p = self.serve()
        for k in ["a", "a", "a", "b", "a"]:
            self.w.ml("send", "svc.alert", "--data", json.dumps({"k": k}), check=0)
        wait_until(lambda: len([r for r in self.runs_of("rl") if r["status"] in ("completed", "skipped")]) == 5,
                   what="five runs ended")
        kill9(p)  # the count is in the store
        self.serve()
        self.w.ml("send", "svc.alert", "--data", json.dumps({"k": "a"}), check=0)
        wait_until(lambda: len([r for r in self.runs_of("rl") if r["status"] in ("completed", "skipped")]) == 6,
                   what="six runs ended")
        runs = self.runs_of("rl")
        done = [r for r in runs if r["status"] == "completed"]
        skipped = [r for r in runs if r["status"] == "skipped"]
        self.assertEqual(sorted(r["input"]["k"] for r in done), ["a", "a", "b"])
        self.assertEqual(len(skipped), 3)
        for r in skipped:
            self.assertEqual(r["error"]["message"],
                             'skipped by rate_limit: at most 2 runs per 1h00m, key event.data.k="a"')
            self.assertIsNone(r["started_at"])
            self.assertEqual(r["trigger"]["event"]["name"], "svc.alert")  # which event was skipped
        self.assertEqual(len(starts), 3)  # no code of a skipped run ran
        with urllib.request.urlopen(self.w.procs[-1].url + "/metrics", timeout=10) as m:
            metrics = m.read().decode()
        self.assertIn('moonloop_runs_skipped_total{skill="rl",reason="rate_limit"} 3', metrics)
        # The skip after the kill ended in this process: a finished run of its own status.
        self.assertIn('moonloop_runs_finished_total{status="skipped"} 1', metrics)
        self.assertIn('moonloop_runs_finished_total{status="cancelled"} 0', metrics)
        # Skips are not cancellations: they have a status of their own in
        # the CLI's filter, the API's and the figures.
        self.assertEqual(len(self.w.json("runs", "--status", "skipped")), 3)
        self.assertEqual(self.w.json("runs", "--status", "cancelled"), [])
        with urllib.request.urlopen(self.w.procs[-1].url + "/v1/runs?status=skipped", timeout=10) as r:
            self.assertEqual(len(json.loads(r.read())["runs"]), 3)
        t = self.w.json("stats", "rl", "--since", "1h")["totals"]
        self.assertEqual((t["started"], t["completed"], t["cancelled"], t["skipped"], t["failure_rate"]),
                         (6, 3, 0, 3, 0))
        self.assertIn("3 completed, 0 failed, 0 cancelled, 3 skipped, 0 active",
                      self.w.ml("stats", "rl", "--since", "1h", check=0).stdout)

    def test_bad_throttle_and_rate_limit_are_refused_naming_the_fix(self):
        cases = [
            ('throttle = { limit = 2 }', "'throttle' needs a 'period' such as \"1m\""),
            ('throttle = { limit = 2, period = "1m", burts = 1 }', "unknown key 'burts' in 'throttle' (did you mean 'burst'?)"),
            ('throttle = { limit = 2, period = "1m", burst = -1 }', "'throttle.burst' must be a whole number of at least 0"),
            ('rate_limit = { limit = 2, period = "1h", burst = 1 }', "unknown key 'burst' in 'rate_limit'"),
            ('rate_limit = { limit = 0.5, period = "1h" }', "'rate_limit.limit' must be a whole number of at least 1"),
            ('rate_limit = { limit = 1, period = "soon" }', "'rate_limit.period'"),
            ('rate_limit = 5', "'rate_limit' must be a table {limit=, period=, key=}, got 5"),
        ]
        for flow, want in cases:
            path = self.w.write("bad.lua", 'return { id = "bad", %s, run = function() end }' % flow)
            r = self.w.ml("check", path)
            self.assertEqual(r.returncode, 1, flow)
            self.assertIn(want, r.stderr + r.stdout, flow)
        for flow in ('concurrency = { limit = 1, key = "event.data.team" }',
                     'concurrency = { limit = 1, key = "data.team" }',
                     'singleton = { key = "name" }', 'idempotency = "event.id"'):
            path = self.w.write("good.lua", 'return { id = "good", %s, run = function() end }' % flow)
            self.assertEqual(self.w.ml("check", path).returncode, 0, flow)


class OnceTest(SkillsTestCase):
    def ended(self, skill, n):
        wait_until(lambda: len([r for r in self.runs_of(skill) if r["status"] in ("completed", "cancelled", "skipped")]) == n,
                   what="%d runs of %s ended" % (n, skill))
        return self.runs_of(skill)

    def test_idempotency_runs_once_per_key_across_kill_9(self):
        self.skill("pay", STARTER % {"id": "pay", "flow": 'triggers = { { event = "order.paid" } }, '
                                                          'idempotency = "event.data.k"'})
        p = self.serve()
        for k in ["o1", "o1", "o2"]:
            self.w.ml("send", "order.paid", "--data", json.dumps({"k": k}), check=0)
        runs = self.ended("pay", 3)
        first = [r for r in runs if r["status"] == "completed" and r["input"]["k"] == "o1"][0]["id"]
        kill9(p)
        self.serve()
        self.w.ml("send", "order.paid", "--data", json.dumps({"k": "o1"}), check=0)
        runs = self.ended("pay", 4)
        self.assertEqual(sorted(r["input"]["k"] for r in runs if r["status"] == "completed"), ["o1", "o2"])
        skipped = [r for r in runs if r["status"] == "skipped"]
        self.assertEqual(len(skipped), 2)
        for r in skipped:
            self.assertEqual(r["error"]["message"], 'skipped by idempotency: run %s already started for key '
                             'event.data.k="o1" (within 1d0h)' % first)
        self.assertEqual(self.si.count("/start/" + first), 1)

    def test_an_event_without_the_idempotency_key_is_not_deduplicated(self):
        # The field missing: every such event shared the key null, and all
        # but the first were skipped for the whole period.
        self.skill("pay", STARTER % {"id": "pay", "flow": 'idempotency = "event.data.id"'})
        self.serve()
        for data in ('{}', '{}', '{"id": null}', '{"id": "a"}', '{"id": "a"}'):
            self.w.ml("invoke", "pay", "--data", data, check=0)
        runs = self.ended("pay", 5)
        self.assertEqual(sorted(r["status"] for r in runs), ["completed"] * 4 + ["skipped"])
        keyless = [r for r in runs if not (r["input"] or {}).get("id")]
        self.assertEqual(len(keyless), 3)
        for r in keyless:
            logs = self.w.trace(r["id"]).get("logs") or []
            self.assertIn("idempotency: this run's event has no event.data.id (or it is null): the run is not "
                          "deduplicated", [l["msg"] for l in logs])

    def test_idempotency_period_ends(self):
        self.skill("pay", STARTER % {"id": "pay", "flow": 'idempotency = { key = "event.data.k", period = "1s" }'})
        self.serve()
        self.w.ml("invoke", "pay", "--data", '{"k": "x"}', check=0)
        self.w.ml("invoke", "pay", "--data", '{"k": "x"}', check=0)
        self.ended("pay", 2)
        time.sleep(1.1)
        self.w.ml("invoke", "pay", "--data", '{"k": "x"}', check=0)
        runs = self.ended("pay", 3)
        self.assertEqual(sorted(r["status"] for r in runs), ["completed", "completed", "skipped"])

    def singleton(self, mode):
        self.skill("one", CALLER % {"id": "one", "tag": "one", "conc": "nil, singleton = { key = \"event.data.k\", "
                                                                       "mode = \"%s\" }" % mode})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["k:" + k]))
        self.serve()
        first = self.w.ml("invoke", "one", "--data", '{"k": "a"}', check=0).stdout.strip()
        wait_until(lambda: len(g.starts) == 1, what="the first run's call")
        second = self.w.ml("invoke", "one", "--data", '{"k": "a"}', check=0).stdout.strip()
        other = self.w.ml("invoke", "one", "--data", '{"k": "b"}', check=0).stdout.strip()
        wait_until(lambda: any(s[3] == "b" for s in g.starts), what="the other key's call")
        return g, first, second, other

    def test_singleton_skip(self):
        g, first, second, other = self.singleton("skip")
        wait_until(lambda: self.w.trace(second)["status"] == "skipped", what="the second skipped")
        self.assertEqual(self.w.trace(second)["error"]["message"],
                         'skipped by singleton: run %s is running for key event.data.k="a"' % first)
        g.release.set()
        self.ended("one", 3)
        self.assertEqual(self.w.trace(first)["status"], "completed")
        self.assertEqual(self.w.trace(other)["status"], "completed")
        self.assertEqual(g.most["k:a"], 1)

    def test_singleton_cancel(self):
        g, first, second, other = self.singleton("cancel")
        wait_until(lambda: self.w.trace(first)["status"] == "cancelled", what="the first cancelled")
        self.assertIn("replaced by run %s (singleton, key event.data.k=\"a\")" % second,
                      self.w.trace(first)["error"]["message"])
        g.release.set()
        self.ended("one", 3)
        a, b = self.w.trace(first), self.w.trace(second)
        self.assertEqual(b["status"], "completed")
        # The new run waited for the old one's end. (The stand-in may still
        # hold the old run's request: the engine dropped it when the run
        # ended, so the stand-in's gauge cannot tell.)
        self.assertGreaterEqual(b["started_at"], a["ended_at"])

    def test_bad_singleton_and_idempotency_are_refused_naming_the_fix(self):
        cases = [
            ('singleton = { key = "event.data.k", mode = "replace" }', "'singleton.mode' must be \"skip\""),
            ('singleton = { kye = "x" }', "unknown key 'kye' in 'singleton' (did you mean 'key'?)"),
            ('idempotency = { period = "1h" }', "'idempotency' needs a key: a path such as \"event.data.order_id\""),
            ('idempotency = 5', "'idempotency' must be a path such as \"event.data.order_id\" or a table {key=, period=}"),
            # A key path that starts at no field of an event holds every
            # run under one value ("team" for "event.data.team").
            ('concurrency = { limit = 1, key = "team" }',
             "'concurrency.key' \"team\" names no field of an event (a path starts at data, name, id, ts): "
             "did you mean \"data.team\"?"),
            ('throttle = { limit = 1, period = "1s", key = "event.tenant" }',
             "'throttle.key' \"event.tenant\" names no field of an event"),
            ('singleton = { key = "service" }', "'singleton.key' \"service\" names no field of an event"),
            ('idempotency = "order_id"', "'idempotency.key' \"order_id\" names no field of an event"),
            ('debounce = { period = "1s", key = "incident" }', "'debounce.key' \"incident\" names no field"),
            ('batch = { max = 2, timeout = "1s", key = "tenant" }', "'batch.key' \"tenant\" names no field"),
        ]
        for flow, want in cases:
            path = self.w.write("bad.lua", 'return { id = "bad", %s, run = function() end }' % flow)
            r = self.w.ml("check", path)
            self.assertEqual(r.returncode, 1, flow)
            self.assertIn(want, r.stderr + r.stdout, flow)


class DebounceTest(SkillsTestCase):
    def test_debounce_starts_one_run_with_the_last_data_and_max_wait_bounds_a_burst(self):
        self.skill("deb", STARTER % {"id": "deb", "flow": 'triggers = { { event = "inc.update" } }, '
                                                          'debounce = { period = "600ms", key = "event.data.k", '
                                                          'max_wait = "2s" }'})
        starts = {}

        def start(h, b, n):
            path, _, query = h.path.partition("?")
            starts.setdefault(path.rsplit("/", 1)[1], (time.time(), query.partition("=")[2]))
            return 200, {"ok": True}
        self.si.route_prefix("/start/", start)
        p = self.serve()

        def send(p, data):
            req = urllib.request.Request(p.url + "/v1/events", data=json.dumps(data).encode(),
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()
        # A burst for "a": five updates 100 ms apart (over HTTP: a CLI
        # process per event can take longer than the period on a slow
        # build); one for "b".
        for i in range(5):
            send(p, {"name": "inc.update", "data": {"k": "a", "n": i}})
            time.sleep(0.1)
        send(p, {"name": "inc.update", "data": {"k": "b", "n": 9}})
        wait_until(lambda: len([r for r in self.runs_of("deb") if r["status"] in ("completed", "skipped")]) == 6,
                   what="six runs ended")
        runs = self.runs_of("deb")
        done = [r for r in runs if r["status"] == "completed"]
        self.assertEqual(sorted((r["input"]["k"], r["input"]["n"]) for r in done), [("a", 4), ("b", 9)])
        for r in runs:
            if r["status"] == "skipped":
                self.assertRegex(r["error"]["message"], r"debounced: a later event started run \w+")
                self.assertIsNone(r["started_at"])
        self.assertEqual(len(starts), 2)
        # A burst that never pauses for the period, across a kill -9: events
        # every 200 ms until a second after a run for "c" has started (at
        # most 30 s). Without max_wait no run could start while the burst
        # goes on; with it, one starts during the burst, and another after it
        # with the last data. (No upper bound on the time: a restart under
        # ASan on a loaded machine takes what it takes.)
        i = 0
        t0 = time.time()
        seen = None
        while i < 10 or ((seen is None or time.time() - seen < 1.0) and time.time() - t0 < 30):
            if seen is None and any(k == "c" for _, k in starts.values()):
                seen = time.time()
            if i == 8:
                kill9(p)
                p = self.serve()
            send(p, {"name": "inc.update", "data": {"k": "c", "n": i}})
            i += 1
            time.sleep(0.2)
        t_last = time.time()
        last = i - 1
        wait_until(lambda: any(r["input"]["k"] == "c" and r["input"]["n"] == last and r["status"] == "completed"
                               for r in self.runs_of("deb")), timeout=20, what="the burst's last run")
        c_starts = sorted(t for t, k in starts.values() if k == "c")
        self.assertGreaterEqual(len(c_starts), 2)
        self.assertLess(c_starts[0], t_last, "max_wait started no run while the burst went on")

    def test_a_debounced_run_waits_queued_with_its_reason(self):
        self.skill("deb", STARTER % {"id": "deb", "flow": 'debounce = { period = "3s" }'})
        self.serve()
        rid = self.w.ml("invoke", "deb", "--data", '{"k": "x"}', check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["queued"] is not None, what="queued")
        q = self.w.trace(rid)["queued"]
        self.assertEqual((q["reason"], q["skill"], q["period"]), ("debounce", "deb", "3.0s"))
        self.assertIn("queued   waiting: debounce 3.0s of skill deb, until ",
                      self.w.ml("trace", rid, check=0).stdout)


class PriorityTest(SkillsTestCase):
    def test_priority_orders_queued_runs_fifo_within_a_priority(self):
        self.skill("pri", CALLER % {"id": "pri", "tag": "pri", "conc": "{limit = 1}, priority = function(event)\n"
                                    "  if event.data.k == 'boom' then error('no plan') end\n"
                                    "  return event.data.k:sub(1, 3) == 'ent' and 100 or 0 end"})
        g = Gauge(hold=0.05)
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        p = self.serve()
        p.terminate()
        p.wait(timeout=10)
        order = ["free1", "free2", "ent1", "boom", "free3", "ent2"]
        ids = {k: self.w.ml("invoke", "pri", "--data", json.dumps({"k": k}), check=0).stdout.strip() for k in order}
        self.serve()
        wait_until(lambda: len(self.runs_of("pri", "completed")) == 6, timeout=30, what="six runs")
        started = [s[3] for s in g.starts]
        # free1 found the slot free; then the enterprise runs, in order; then
        # the rest in order (boom's function failed: priority 0).
        self.assertEqual(started, ["free1", "ent1", "ent2", "free2", "boom", "free3"])
        self.assertEqual(g.most["all"], 1)
        logs = self.w.trace(ids["boom"])["logs"]
        self.assertTrue(any("priority: " in l["msg"] and "no plan" in l["msg"] and "queued with priority 0" in l["msg"]
                            for l in logs), logs)

    def test_priority_is_computed_once_per_run_across_a_kill(self):
        # Each call of the function prints a line (the engine's stderr, or
        # a trace); boom's also fails (a warning in boom's trace). Runs
        # queued behind the first, then the engine is killed: the next one
        # takes them over with their recorded priorities, calling nothing.
        self.skill("pri", CALLER % {"id": "pri", "tag": "pri", "conc": "{limit = 1}, priority = function(event)\n"
                                    "  print('priority of ' .. event.data.k)\n"
                                    "  if event.data.k == 'boom' then error('no plan') end\n"
                                    "  return event.data.p end"})
        g = Gauge()
        g.release = threading.Event()
        self.si.route_prefix("/svc/", g.handler(lambda tag, k: ["all"]))
        a = self.serve()
        try:
            ids = {"first": self.w.ml("invoke", "pri", "--data", json.dumps({"k": "first", "p": 0}),
                                      check=0).stdout.strip()}
            wait_until(lambda: g.starts, what="the first run holding the slot")
            for k, pr in [("low", 1), ("boom", None), ("high", 5), ("zero", 0), ("mid", 3), ("high2", 5)]:
                ids[k] = self.w.ml("invoke", "pri", "--data", json.dumps({"k": k, "p": pr}), check=0).stdout.strip()
            wait_until(lambda: len(self.runs_of("pri", "queued")) == 6, what="six queued runs")
            dead = {o for (o,) in self.w.sql("SELECT owner FROM runs WHERE skill = 'pri'")}
            kill9(a)
            g.killed()
            b = self.serve()
            # b adopts the runs of a, the queued ones too; the first one
            # takes its step again (it kept its slot).
            wait_until(lambda: not {o for (o,) in self.w.sql("SELECT owner FROM runs WHERE skill = 'pri'")}
                       & (dead | {None}), what="every run taken over")
            wait_until(lambda: len(g.starts) >= 2, what="the first run taken over")
        finally:
            g.release.set()
        wait_until(lambda: len(self.runs_of("pri", "completed")) == 7, timeout=30, what="seven runs")
        # Higher first, in order of creation within a priority (boom's
        # failed: 0, like zero's).
        self.assertEqual([s[3] for s in g.starts if s[3] != "first"], ["high", "high2", "mid", "low", "boom", "zero"])
        warns = [l["msg"] for l in self.w.trace(ids["boom"])["logs"] if l["msg"].startswith("priority: ")]
        self.assertEqual(len(warns), 1, warns)
        self.assertIn("no plan", warns[0])
        calls = [l for l in a.stderr_lines + b.stderr_lines if "priority of " in l]
        for i in ids.values():
            calls += [l["msg"] for l in self.w.trace(i)["logs"] if "priority of " in l["msg"]]
        for k in ids:
            self.assertEqual(len([c for c in calls if c.rstrip().endswith("priority of " + k)]), 1, (k, calls))
        b.terminate()

    def test_priority_needs_a_function_and_a_limit(self):
        for flow, want in [('priority = 5, concurrency = {limit = 1}', "'priority' must be a function(event)"),
                           ('priority = function() return 1 end', "'priority' orders the runs waiting for a "
                                                                   "concurrency limit, and this skill has none")]:
            path = self.w.write("bad.lua", 'return { id = "bad", %s, run = function() end }' % flow)
            r = self.w.ml("check", path)
            self.assertEqual(r.returncode, 1, flow)
            self.assertIn(want, r.stderr + r.stdout, flow)


class BatchTest(SkillsTestCase):
    def test_batches_of_max_events_or_by_timeout_per_key(self):
        self.skill("bat", """
return { id = "bat", triggers = { { event = "row.new" } },
  batch = { max = 3, timeout = "1500ms", key = "event.data.t" },
  run = function(ctx)
    local ns = {}
    for i, ev in ipairs(ctx.events) do ns[i] = ev.data.n end
    return ctx.step.run("take", function() return { t = ctx.event.data.t, ns = ns } end)
  end }""")
        p = self.serve()
        t0 = time.time()
        for i in range(7):
            self.w.ml("send", "row.new", "--data", json.dumps({"t": "a", "n": i}), check=0)
        self.w.ml("send", "row.new", "--data", json.dumps({"t": "b", "n": 100}), check=0)
        wait_until(lambda: len([r for r in self.runs_of("bat") if r["status"] in ("completed", "skipped")]) == 8,
                   timeout=20, what="eight runs ended")
        runs = self.runs_of("bat")
        done = sorted((r["output"]["t"], r["output"]["ns"]) for r in runs if r["status"] == "completed")
        # Two full batches at once, then the rest when the timeout passed.
        self.assertEqual(done, [("a", [0, 1, 2]), ("a", [3, 4, 5]), ("a", [6]), ("b", [100])])
        for r in runs:
            if r["status"] == "skipped":
                self.assertRegex(r["error"]["message"], r"^batched into run \w+$")
        last = [r for r in runs if r["status"] == "completed" and r["output"]["ns"] == [6]][0]
        from datetime import datetime
        started = datetime.fromisoformat(last["started_at"].replace("Z", "+00:00")).timestamp()
        self.assertGreaterEqual(started - t0, 1.0)  # it waited for the timeout
        # Replayed after a kill, a batch run sees the same events.
        kill9(p)
        self.assertEqual(self.w.ml("replay", last["id"], check=0).returncode, 0)

    def test_a_debounce_and_a_batch_whose_engine_died_start_on_the_engine_that_takes_over(self):
        # Their start times are in the store, not only in the dead
        # engine's timers: the engine that takes the runs over arms them.
        self.skill("deb", STARTER % {"id": "deb", "flow": 'triggers = { { event = "inc.update" } }, '
                                                          'debounce = { period = "4s", key = "event.data.k" }'})
        self.skill("bat", """
return { id = "bat", triggers = { { event = "row.new" } },
  batch = { max = 10, timeout = "4s" },
  run = function(ctx)
    local ns = {}
    for i, ev in ipairs(ctx.events) do ns[i] = ev.data.n end
    return ctx.step.run("take", function() return { ns = ns } end)
  end }""")
        self.si.route_prefix("/start/", lambda h, b, n: (200, {"ok": True}))
        a = self.serve()

        def send(name, data):
            req = urllib.request.Request(a.url + "/v1/events", data=json.dumps({"name": name, "data": data}).encode(),
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()
        for i in range(3):
            send("inc.update", {"k": "a", "n": i})
            send("row.new", {"n": i})
        # Every run is a's, waiting on a's timers: the debounce's latest
        # and the batch's run queued, the others skipped.
        wait_until(lambda: len([r for r in self.runs_of("deb") + self.runs_of("bat")
                                if r["status"] in ("queued", "skipped")]) == 6, what="six runs queued or skipped")
        kill9(a)
        killed_at = time.time()
        b = self.serve()  # started after: the runs were a's
        wait_until(lambda: len(self.runs_of("deb", "completed")) == 1 and len(self.runs_of("bat", "completed")) == 1,
                   timeout=30, what="the debounced run and the batch's run completed on b")
        self.assertEqual(self.runs_of("deb", "completed")[0]["input"]["n"], 2)  # the last event's data
        self.assertEqual(self.runs_of("bat", "completed")[0]["output"]["ns"], [0, 1, 2])
        self.assertEqual(len(self.runs_of("deb", "skipped")) + len(self.runs_of("bat", "skipped")), 4)
        from datetime import datetime
        for r in self.runs_of("deb", "completed") + self.runs_of("bat", "completed"):
            # Started by b, once a was gone (4 s after the events).
            self.assertGreater(datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")).timestamp(), killed_at)
        b.terminate()

    def test_bad_batch_is_refused_naming_the_fix(self):
        for flow, want in [('batch = { max = 0, timeout = "1s" }', "'batch.max' must be a whole number from 1 to 10000"),
                           ('batch = { max = 10 }', "'batch' needs a 'timeout' such as \"5s\""),
                           ('batch = { max = 10, timeout = "1s", size = 2 }', "unknown key 'size' in 'batch'")]:
            path = self.w.write("bad.lua", 'return { id = "bad", %s, run = function() end }' % flow)
            r = self.w.ml("check", path)
            self.assertEqual(r.returncode, 1, flow)
            self.assertIn(want, r.stderr + r.stdout, flow)


# A skill that records its batch's events (ns) and input (n): which events
# reached a run. %(flow)s: its flow options.
TAKER = """
return { id = "%(id)s", triggers = { { event = "%(id)s.ev" } }, %(flow)s,
  run = function(ctx)
    local ns = {}
    for i, ev in ipairs(ctx.events) do ns[i] = ev.data.n end
    return ctx.step.run("take", function() return { n = ctx.input.n, ns = ns } end)
  end }"""


class OrderTest(SkillsTestCase):
    """The limits apply in the documented order: idempotency, batch,
    debounce, rate limit, singleton, throttle, concurrency. An event that
    joins a batch, is debounced into a later run, or repeats an
    idempotency key never meets the rate limit or the singleton as a run
    of its own; those judge the batch's (the debounced) run once."""

    def send_all(self, p, skill, datas):
        for d in datas:
            req = urllib.request.Request(p.url + "/v1/events", data=json.dumps({"name": skill + ".ev", "data": d}).encode(),
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()

    def ended(self, skill, n, timeout=20):
        wait_until(lambda: len([r for r in self.runs_of(skill) if r["status"] in ("completed", "skipped")]) == n,
                   timeout=timeout, what=lambda: "%d runs of %s ended: %s" % (
                       n, skill, [(r["status"], r.get("error")) for r in self.runs_of(skill)]))
        runs = self.runs_of(skill)
        done = [r for r in runs if r["status"] == "completed"]
        skips = sorted(re.sub(r"run [0-9A-Z]{26}", "run R", r["error"]["message"]) for r in runs if r["status"] == "skipped")
        return done, skips

    def test_a_batch_joins_its_events_before_the_rate_limit_judges_its_run(self):
        self.skill("brl", TAKER % {"id": "brl", "flow": 'batch = { max = 3, timeout = "2s" }, '
                                                         'rate_limit = { limit = 1, period = "1m" }'})
        p = self.serve()
        self.send_all(p, "brl", [{"n": n} for n in (1, 2, 3, 4)])
        done, skips = self.ended("brl", 4)
        self.assertEqual([r["output"]["ns"] for r in done], [[1, 2, 3]])
        # The fourth opened a batch of its own, whose run the rate limit skipped.
        self.assertEqual(skips, ["batched into run R", "batched into run R",
                                 "skipped by rate_limit: at most 1 run per 1m00s"])

    def test_a_batch_joins_its_events_before_the_singleton_judges_its_run(self):
        self.skill("bsg", TAKER % {"id": "bsg", "flow": 'batch = { max = 2, timeout = "1s" }, '
                                                         'singleton = { mode = "skip" }'})
        p = self.serve()
        self.send_all(p, "bsg", [{"n": 1}, {"n": 2}])
        done, skips = self.ended("bsg", 2)
        self.assertEqual([r["output"]["ns"] for r in done], [[1, 2]])
        self.assertEqual(skips, ["batched into run R"])

    def test_a_debounced_burst_meets_the_rate_limit_once_with_its_last_event(self):
        self.skill("drl", TAKER % {"id": "drl", "flow": 'debounce = { period = "1s" }, '
                                                         'rate_limit = { limit = 1, period = "1m" }'})
        p = self.serve()
        self.send_all(p, "drl", [{"n": n} for n in (1, 2, 3)])
        done, skips = self.ended("drl", 3)
        self.assertEqual([r["output"]["n"] for r in done], [3])  # the last event's data
        self.assertEqual(skips, ["debounced: a later event started run R"] * 2)

    def test_an_idempotent_repeat_is_skipped_by_idempotency_before_the_rate_limit(self):
        self.skill("irl", TAKER % {"id": "irl", "flow": 'idempotency = "event.data.id", '
                                                         'rate_limit = { limit = 1, period = "1m" }'})
        p = self.serve()
        self.send_all(p, "irl", [{"id": "x", "n": n} for n in (1, 2, 3)])
        done, skips = self.ended("irl", 3)
        self.assertEqual([r["output"]["n"] for r in done], [1])
        self.assertEqual(skips, ['skipped by idempotency: run R already started for key event.data.id="x" '
                                 '(within 1d0h)'] * 2)
        with urllib.request.urlopen(p.url + "/metrics", timeout=10) as m:
            metrics = m.read().decode()
        self.assertIn('moonloop_runs_skipped_total{skill="irl",reason="idempotency"} 2', metrics)
        self.assertNotIn('moonloop_runs_skipped_total{skill="irl",reason="rate_limit"}', metrics)

    def test_batch_and_debounce_together_are_refused(self):
        # A debounce would drop a batch's run, and the events batched into
        # it with it; batch's timeout already gathers a burst.
        path = self.w.write("bad.lua", TAKER % {"id": "bad", "flow": 'batch = { max = 3, timeout = "2s" }, '
                                                                      'debounce = { period = "1s" }'})
        r = self.w.ml("check", path)
        self.assertEqual(r.returncode, 1)
        self.assertIn("'batch' and 'debounce' cannot be combined", r.stderr + r.stdout)
