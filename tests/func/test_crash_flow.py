"""Crash tests for triggers and flow: SIGKILL while runs wait for events or
children, while events queue, during cron ticks; and eviction of parked runs."""
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SkillsTestCase, kill9, wait_until  # noqa: E402


class CrashFlowTest(SkillsTestCase):
    config = None

    def test_waiting_runs_get_an_event_sent_while_the_engine_was_dead(self):
        self.skill("waiter", """
return { id = "waiter", run = function(ctx)
  ctx.step.run("before", function() return http.get_json(env.STANDIN .. "/before").n end)
  local ev = ctx.step.wait_for_event("go", { event = "go", match = "data.k" })
  ctx.step.run("after", function() return http.get_json(env.STANDIN .. "/after").n end)
  return ev.data.v
end }""")
        p = self.serve()
        for k in range(3):
            self.w.ml("invoke", "waiter", "--data", json.dumps({"k": k}), check=0)
        wait_until(lambda: len(self.runs_of("waiter", "waiting")) == 3, what="three waiting runs")
        kill9(p)
        for k in range(3):
            self.w.ml("send", "go", "--data", json.dumps({"k": k, "v": k * 10}), check=0)
        self.serve()
        wait_until(lambda: len(self.runs_of("waiter", "completed")) == 3, what="all delivered")
        self.assertEqual(sorted(r["output"] for r in self.runs_of("waiter")), [0, 10, 20])
        self.assertEqual(self.si.count("/before"), 3)  # not run again by the replays
        self.assertEqual(self.si.count("/after"), 3)

    def test_failed_steps_and_invokes_replay_as_they_ran(self):
        self.skill("child", """
return { id = "child", retries = 0, run = function(ctx)
  if ctx.input.mode == "fail" then error("child broke") end
  ctx.step.sleep("long", "1h")
end }""")
        self.skill("parent", """
return { id = "parent", backoff = "10ms", run = function(ctx)
  local _, slow = pcall(ctx.step.invoke, "slow", { skill = "child", data = { mode = "sleep" }, timeout = "300ms" })
  local _, bad = pcall(ctx.step.invoke, "bad", { skill = "child", data = { mode = "fail" } })
  local _, flaky = pcall(ctx.step.run, "flaky", function() error("nope", 0) end, { retries = 1 })
  ctx.step.sleep("nap", "2s")
  return { slow = tostring(slow), bad = tostring(bad), flaky = tostring(flaky) }
end }""")
        p = self.serve()
        rid = self.w.ml("invoke", "parent", check=0).stdout.strip()
        wait_until(lambda: [s for s in self.w.trace(rid)["steps"] if s["id"] == "nap"], what="the nap")
        kill9(p)  # the replay goes through both failed invokes again
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["output"]["slow"], "step 'slow' failed: child run did not end within its timeout")
        self.assertRegex(t["output"]["bad"], r"^step 'bad' failed: child run \w+ failed: .*child broke$")
        self.assertEqual(t["output"]["flaky"], "step 'flaky' failed: nope (after 2 attempts)")
        steps = {s["id"]: s for s in t["steps"]}
        self.assertEqual(steps["slow"]["status"], "failed")
        self.assertEqual(steps["slow"]["error"], "child run did not end within its timeout")
        self.assertEqual(steps["bad"]["status"], "failed")
        self.assertIn("child broke", steps["bad"]["error"])
        self.assertEqual(steps["bad"]["output"]["status"], "failed")
        self.assertIn("error child run did not end within its timeout",
                      self.w.ml("trace", rid, check=0).stdout)
        self.assertEqual(len(self.runs_of("child")), 2)  # not started again by the replay

    def test_parent_waiting_on_a_child_survives_kills(self):
        self.skill("child", """
return { id = "child", run = function(ctx)
  -- Asleep through both kills (a kill while "work" is in flight would run
  -- it again: a step that had not completed), even on a loaded machine.
  ctx.step.sleep("nap", "5s")
  return ctx.step.run("work", function() return http.get_json(env.STANDIN .. "/child").n end)
end }""")
        self.skill("parent", """
return { id = "parent", run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a").n end)
  local c = ctx.step.invoke("c", { skill = "child" })
  return { a = a, c = c }
end }""")
        p = self.serve()
        self.w.ml("invoke", "parent", check=0)
        wait_until(lambda: self.runs_of("child", "sleeping"), what="the child asleep")
        kill9(p)
        p = self.serve()
        time.sleep(0.3)
        kill9(p)
        self.serve()
        wait_until(lambda: self.runs_of("parent", "completed"), timeout=20, what="the parent")
        self.assertEqual(self.runs_of("parent")[0]["output"], {"a": 1, "c": 1})
        self.assertEqual(len(self.runs_of("child")), 1)  # one child, not one per replay
        self.assertEqual(self.si.count("/child"), 1)
        self.assertEqual(self.si.count("/a"), 1)

    def test_events_queued_during_kills_start_exactly_one_run_each(self):
        self.skill("count", """
return { id = "count", triggers = { { event = "tick" } }, run = function(ctx)
  return ctx.step.run("call", function()
    return http.post_json(env.STANDIN .. "/got/" .. ctx.event.id, {}).n
  end)
end }""")
        p = self.serve()
        sent = []
        for i in range(40):
            sent.append(self.w.ml("send", "tick", "--data", json.dumps({"i": i}), check=0).stdout.strip())
            if i % 10 == 5:
                kill9(p)
                p = self.serve()
        wait_until(lambda: len(self.runs_of("count", "completed")) == 40, timeout=40, what="40 runs")
        by_event = {}
        for r in self.runs_of("count"):
            by_event.setdefault(r["trigger"]["event"]["id"], []).append(r["id"])
        self.assertEqual(sorted(by_event), sorted(sent))
        self.assertTrue(all(len(v) == 1 for v in by_event.values()))

    def test_kill_during_a_cron_tick_commit(self):
        self.skill("tick", """
return { id = "tick", triggers = { { cron = "* * * * * *" } }, run = function(ctx)
  return ctx.trigger.tick
end }""")
        p = self.serve()
        wait_until(lambda: len(self.runs_of("tick")) >= 1, what="a tick")
        kill9(p)
        self.w.env["MOONLOOP_FAULT"] = "commit=400"  # commits linger: kills land inside them
        for _ in range(3):
            p = self.serve()
            time.sleep(1.3)
            kill9(p)
        del self.w.env["MOONLOOP_FAULT"]
        self.serve()
        wait_until(lambda: all(r["status"] == "completed" for r in self.runs_of("tick")), timeout=20,
                   what="every tick run to complete")
        ticks = [r["trigger"]["tick"] for r in self.runs_of("tick")]
        self.assertEqual(len(ticks), len(set(ticks)), "a tick fired twice")

    PARALLEL = """
return { id = "par", retries = 0, run = function(ctx)
  local r = ctx.step.parallel("p", {
    function() return http.get_json(env.STANDIN .. "/b1").n end,
    function() return http.get_json(env.STANDIN .. "/b2").n end,
  })
  local ok, err = pcall(ctx.step.parallel, "q", {
    function() return 1 end,
    function() error(fatal("branch two broke")) end,
  })
  ctx.step.sleep("nap", "2s")
  local after = ctx.step.run("after", function() return http.get_json(env.STANDIN .. "/after").n end)
  return { r = r, after = after, caught = tostring(err), step = type(err) == "table" and err.step or nil }
end }"""

    def check_parallel_run(self, rid):
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "completed", t.get("error"))
        self.assertEqual(t["output"], {"r": [1, 1], "after": 1, "step": "q/2",
                                       "caught": "step 'q' failed: step 'q/2' failed: branch two broke"})
        self.assertEqual([s["id"] for s in t["steps"]], ["p", "p/1", "p/2", "q", "q/1", "q/2", "nap", "after"])
        # The replay ran no completed body again, and nothing after the parallels twice.
        self.assertEqual((self.si.count("/b1"), self.si.count("/b2"), self.si.count("/after")), (1, 1, 1))

    def test_a_run_past_completed_and_failed_parallels_survives_kill_9(self):
        self.skill("par", self.PARALLEL)
        p = self.serve()
        rid = self.w.ml("invoke", "par", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        kill9(p)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), what="the run's end")
        self.check_parallel_run(rid)

    def test_a_run_past_completed_and_failed_parallels_survives_a_clean_restart(self):
        self.skill("par", self.PARALLEL)
        p = self.serve()
        rid = self.w.ml("invoke", "par", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), what="the run's end")
        self.check_parallel_run(rid)

    def test_a_replay_that_leaves_the_journal_fails_even_inside_pcall(self):
        # Code outside steps that is not deterministic (here: a step id
        # made from the clock) reaches another step on replay; a pcall around it must not let
        # the run go on mixing two histories.
        self.skill("coin", """
return { id = "coin", run = function(ctx)
  local id = string.format("s%d%06d", os.time(), math.floor(os.clock() * 1e6))
  local ok, err = pcall(ctx.step.run, id, function() return 1 end)
  ctx.step.sleep("nap", "2s")
  ctx.step.run("after", function() return http.get_json(env.STANDIN .. "/after").n end)
  return tostring(err)
end }""")
        p = self.serve()
        rid = self.w.ml("invoke", "coin", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        kill9(p)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), what="the run's end")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "failed", t.get("output"))
        self.assertRegex(t["error"]["message"], r"^skills/coin.lua:4: the code no longer matches this run's journal: "
                         r"step 1 is 's\d+' \(run\) in the journal, but the code reached 's\d+' \(run\)$")
        self.assertEqual(self.si.count("/after"), 0)

    def test_a_step_cut_by_kills_shows_its_interrupted_attempts_and_the_rerun(self):
        self.skill("cut", """
return { id = "cut", retries = 0, run = function(ctx)
  return ctx.step.run("call", function()
    return { n = http.get_json(env.STANDIN .. "/slow").n, attempt = ctx.attempt }
  end)
end }""")
        answer = threading.Event()

        def slow(h, b, n):
            if n < 3:  # the first two calls never get their answer: the engine is killed
                answer.wait(30)
            return 200, {"n": n}
        self.si.routes["/slow"] = slow
        p = self.serve()
        rid = self.w.ml("invoke", "cut", check=0).stdout.strip()
        for calls in (1, 2):
            wait_until(lambda: self.si.count("/slow") == calls, what="call %d" % calls)
            wait_until(lambda: self.w.trace(rid)["steps"], what="the step's running row")
            kill9(p)
            p = self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=20, what="the run")
        answer.set()
        t = self.w.trace(rid)
        # retries = 0, yet it completed: interrupted attempts are no failures.
        self.assertEqual(t["output"], {"n": 3, "attempt": 3})
        atts = t["steps"][0]["attempts"]
        self.assertEqual([(a["n"], a["status"]) for a in atts],
                         [(1, "interrupted"), (2, "interrupted"), (3, "completed")])
        self.assertIn("stopped before it ended", atts[0]["error"])
        # Each attempt shows when it started: the rerun at the time it ran again.
        self.assertLess(atts[0]["started_at"], atts[1]["started_at"])
        self.assertLess(atts[1]["started_at"], atts[2]["started_at"])
        self.assertEqual(atts[0]["retry_at"], atts[1]["started_at"])
        self.assertIsNone(atts[0]["ended_at"])
        text = self.w.ml("trace", rid, check=0).stdout
        self.assertIn("attempt 1 interrupted: the process running this attempt stopped", text)
        self.assertIn("attempt 3 completed", text)

    def test_steps_that_failed_to_start_raise_the_same_error_on_replay(self):
        # An invoke of a skill that did not exist, and an event over the
        # limit: both failed steps. A replay raises their errors again; it
        # does not try again (here the skill exists by then).
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN" }, limits = { event = "1KB" } }')
        self.skill("p", """
return { id = "p", run = function(ctx)
  local _, inv = pcall(ctx.step.invoke, "c", { skill = "later" })
  local _, sent = pcall(ctx.step.send_event, "s", { name = "x", data = string.rep("a", 2000) })
  ctx.step.sleep("nap", "2s")
  return { inv = tostring(inv), sent = tostring(sent) }
end }""")
        p = self.serve()
        rid = self.w.ml("invoke", "p", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        kill9(p)
        self.skill("later", 'return { id = "later", run = function(ctx) return 1 end }')
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), what="the run's end")
        t = self.w.trace(rid)
        self.assertEqual(t["output"], {
            "inv": "step 'c' failed: cannot invoke 'later': no skill 'later' is registered",
            "sent": "step 's' failed: event 1 is 2.0 KB, over the limit of 1.0 KB (limits.event)"})
        self.assertEqual([s["status"] for s in t["steps"]], ["failed", "failed", "completed"])
        self.assertEqual(self.runs_of("later"), [])

    def test_evicted_parked_runs_wake_by_replay(self):
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN" }, limits = { parked_runs = 20 } }')
        self.skill("nap", """
return { id = "nap", triggers = { { event = "start" } }, run = function(ctx)
  local a = ctx.step.run("a", function() return http.get_json(env.STANDIN .. "/a").n end)
  ctx.step.sleep("nap", "1500ms")
  local ev = ctx.step.wait_for_event("go", { event = "go", timeout = "60s" })
  return ctx.run_id
end }""")
        p = self.serve()
        # The hundred runs start at once (one request), however slow the CLI is.
        req = urllib.request.Request(p.url + "/v1/events", method="POST",
                                     data=json.dumps([{"name": "start"}] * 100).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            self.assertEqual(r.status, 202)
        wait_until(lambda: len(self.runs_of("nap", "waiting")) == 100, timeout=30, what="all waiting")
        self.w.ml("send", "go", check=0)
        wait_until(lambda: len(self.runs_of("nap", "completed")) == 100, timeout=30, what="all done")
        self.assertEqual(self.si.count("/a"), 100)  # replays did not run bodies again
        for r in self.runs_of("nap"):
            self.assertEqual(r["output"], r["id"])

    # A body that posts its ctx.step_key to the stand-in at /key.
    KEYED = """
return { id = "kid", retries = 0, run = function(ctx)
  return ctx.step.run("call", function()
    return http.post_json(env.STANDIN .. "/key", { key = ctx.step_key }).n
  end)
end }"""

    def keys_posted(self):
        return [json.loads(b)["key"] for b in self.si.bodies.get("/key", [])]

    def check_no_phantom(self, skill):
        """Every run a body ran in is in the database, and the body ran
        under one step key only."""
        keys = self.keys_posted()
        ids = {r["id"] for r in self.runs_of(skill)}
        self.assertEqual(len(ids), 1, ids)
        self.assertEqual(set(keys), {"%s:call" % ids.pop()}, keys)

    def test_a_child_runs_no_step_before_its_creation_is_durable(self):
        # Each commit is held open 400 ms: the group that creates the child
        # is in flight when the child's body would run. A kill as soon as the
        # body calls out must find the child in the database, so that the
        # parent's replay goes on with it instead of creating another.
        self.skill("kid", self.KEYED)
        self.skill("par", """
return { id = "par", run = function(ctx)
  ctx.step.sleep("nap", "300ms")
  return ctx.step.invoke("kid", { skill = "kid" })
end }""")
        p = self.w.serve("--workspace", "skills", env={"MOONLOOP_FAULT": "commit=400"})
        rid = self.w.ml("invoke", "par", check=0).stdout.strip()
        wait_until(lambda: self.si.count("/key") >= 1, what="the child's call")
        kill9(p)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=30,
                   what="the parent's end")
        self.assertEqual(self.w.trace(rid)["status"], "completed")
        self.check_no_phantom("kid")

    def test_an_on_failure_run_runs_no_step_before_its_creation_is_durable(self):
        self.skill("kid", """
return { id = "kid", retries = 0, run = function(ctx)
  ctx.step.sleep("nap", "300ms")
  error("no")
end, on_failure = function(ctx, err)
  return ctx.step.run("call", function()
    return http.post_json(env.STANDIN .. "/key", { key = ctx.step_key }).n
  end)
end }""")
        p = self.w.serve("--workspace", "skills", env={"MOONLOOP_FAULT": "commit=400"})
        rid = self.w.ml("invoke", "kid", check=0).stdout.strip()
        wait_until(lambda: self.si.count("/key") >= 1, what="on_failure's call")
        kill9(p)
        self.serve()
        wait_until(lambda: [r for r in self.runs_of("kid") if r["id"] != rid and r["status"] == "completed"],
                   timeout=30, what="the on_failure run's end")
        self.assertEqual(self.w.trace(rid)["status"], "failed")
        keys = self.keys_posted()
        ids = {r["id"] for r in self.runs_of("kid")} - {rid}
        self.assertEqual(len(ids), 1, ids)
        self.assertEqual(set(keys), {"%s:call" % ids.pop()}, keys)

    def test_an_event_a_wait_took_reaches_its_step_across_a_kill(self):
        # Ending a wait and completing its step are one durable fact: a kill
        # between the two (each commit is held open 300 ms) must not leave
        # the event taken by the wait and the step without it.
        self.skill("w", """
return { id = "w", run = function(ctx)
  local ev = ctx.step.wait_for_event("go", { event = "go", timeout = "20s" })
  return ev and ev.data or "no event"
end }""")
        p = self.w.serve("--workspace", "skills", env={"MOONLOOP_FAULT": "commit=300"})
        rid = self.w.ml("invoke", "w", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "waiting", what="the wait")

        def ended_not_completed():
            # The step still waits, and the wait's end is durable: its row is
            # gone, or (when the row stays until the step completes) a commit
            # the engine handed over after the delivery landed: each commit
            # renews the lease (15 s) from the moment it is handed over, and
            # nothing else commits here meanwhile.
            s = self.w.sql("SELECT status FROM steps WHERE run_id = ? AND seq = 1", (rid,))
            if not s or s[0][0] != "waiting":
                return False
            w = self.w.sql("SELECT delivered_at FROM waits WHERE run_id = ? AND seq = 1", (rid,))
            if not w:
                return True
            lease = self.w.sql("SELECT max(expires_at) FROM leases")[0][0] or 0
            return w[0][0] is not None and lease - 15000 > w[0][0]
        self.w.ml("send", "go", "--data", '{"v": 7}', check=0)
        wait_until(ended_not_completed, interval=0.005, what="the wait ended, its step not completed")
        kill9(p)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=40, what="the run's end")
        t = self.w.trace(rid)
        self.assertEqual(t["output"], {"v": 7})
        self.assertEqual(t["steps"][0]["output"]["data"], {"v": 7})


class ConcurrencyAcrossProcessesTest(SkillsTestCase):
    def test_the_limit_holds_across_two_engines_and_a_kill(self):
        self.w.write("skills/one.lua", """
return { id = "one", concurrency = { limit = 1, key = "event.data.service" }, run = function(ctx)
  return ctx.step.run("call", function()
    return http.get_json(env.STANDIN .. "/svc/" .. ctx.input.service .. "/" .. ctx.run_id).ok
  end)
end }""")
        lock = threading.Lock()
        inflight = {}  # service -> {run id: requests in flight}
        most = {}

        def call(h, b, n):
            _, _, svc, run = h.path.split("/")
            with lock:
                runs = inflight.setdefault(svc, {})
                runs[run] = runs.get(run, 0) + 1
                # Runs, not requests: a killed engine's request may still be
                # in flight here while the run it belongs to takes its step again.
                most[svc] = max(most.get(svc, 0), len(runs))
            time.sleep(0.3)
            with lock:
                runs[run] -= 1
                if not runs[run]:
                    del runs[run]
            return 200, {"ok": True}
        self.si.route_prefix("/svc/", call)
        a = self.w.serve("--workspace", "skills")
        b = self.w.serve("--workspace", "skills")  # a second engine on the same database
        for _ in range(6):
            self.w.ml("invoke", "one", "--data", '{"service": "a"}', check=0)
        wait_until(lambda: sum(v for k, v in self.si.all_calls().items() if k.startswith("/svc/a/")) >= 2,
                   what="some calls")
        kill9(a)  # the slot holder may die: the limit holds, and the runs go on
        c = self.w.serve("--workspace", "skills")
        wait_until(lambda: len(self.w.runs(skill="one", status="completed")) == 6, timeout=40,
                   what="six runs")
        self.assertEqual(most["a"], 1)
        for p in (b, c):
            p.terminate()


class DebounceAcrossAKillTest(SkillsTestCase):
    def test_a_run_taken_over_after_a_later_events_run_is_debounced_by_it(self):
        # Engine a dies after it took event 1's run but before the run asked
        # its debounce: the run waits for a's lease to expire (a is made to
        # look as if it ran on another host, whose process no one can see
        # die), while engine b takes event 2's run, which starts once its
        # period passed. Taken over then, event 1's run asks late: it is
        # debounced by the later event's run, not a burst of its own (it
        # ran too, with the older data, after the newer).
        self.skill("deb", """
return { id = "deb", triggers = { { event = "inc.update" } },
  debounce = { period = "1s", key = "event.data.k" },
  run = function(ctx) return ctx.step.run("n", function() return ctx.input.n end) end }""")

        def send(p, n):
            req = urllib.request.Request(p.url + "/v1/events", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"name": "inc.update", "data": {"k": "a", "n": n}}).encode())
            urllib.request.urlopen(req, timeout=10).read()
        self.w.env["MOONLOOP_FAULT"] = "commit=800"  # commits linger: the kill lands inside one
        a = self.serve()
        del self.w.env["MOONLOOP_FAULT"]
        send(a, 1)

        def taken_not_asked():
            rows = self.w.sql("SELECT owner, flow_at FROM runs WHERE skill = 'deb'")
            return rows and rows[0][0] is not None and rows[0][1] is None
        wait_until(taken_not_asked, what="event 1's run taken by a, its debounce not asked")
        kill9(a)
        (first, owner, asked), = self.w.sql("SELECT id, owner, flow_at FROM runs WHERE skill = 'deb'")
        self.assertIsNone(asked, "the kill came after the run asked: no case to test")
        self.w.sql("UPDATE leases SET host = 'elsewhere', expires_at = ? WHERE owner = ?",
                   (int(time.time() * 1000) + 3000, owner))
        b = self.serve()
        send(b, 2)
        wait_until(lambda: [r["input"]["n"] for r in self.runs_of("deb", "completed")] == [2], timeout=20,
                   what="event 2's run completed")
        wait_until(lambda: self.w.trace(first)["status"] in ("completed", "skipped"), timeout=40,
                   what="event 1's run, taken over, ended")
        t = self.w.trace(first)
        self.assertEqual(t["status"], "skipped", "event 1's run ran after event 2's")
        self.assertRegex(t["error"]["message"], r"^debounced: a later event started run \w+$")
        self.assertEqual([r["input"]["n"] for r in self.runs_of("deb", "completed")], [2])
        b.terminate()
