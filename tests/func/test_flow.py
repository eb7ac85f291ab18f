"""Triggers and flow: events, waits, invoke, parallel, send_event, cancel, rerun, concurrency, cron."""
import json
import os
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SkillsTestCase, freeze_between_commits, kill9, wait_until  # noqa: E402


class FlowTest(SkillsTestCase):
    def test_events_sent_before_an_engine_runs_are_delivered_once_and_idempotent(self):
        self.skill("greet", """
return { id = "greet", triggers = { { event = "user.signup" } }, run = function(ctx)
  return "welcome " .. ctx.event.data.name
end }""")
        # Register the skill, then stop the engine.
        p = self.serve()
        p.terminate()
        p.wait(timeout=10)
        a = self.w.ml("send", "user.signup", "--data", '{"name":"ada"}', "--id", "k1", check=0).stdout.strip()
        b = self.w.ml("send", "user.signup", "--data", '{"name":"ada"}', "--id", "k1", check=0).stdout.strip()
        self.assertEqual(a, b)  # a repeat is accepted and ignored
        self.w.ml("send", "user.signup", "--data", '{"name":"bo"}', check=0)
        self.assertEqual(self.runs_of("greet"), [])
        self.serve()
        wait_until(lambda: len(self.runs_of("greet", "completed")) == 2, what="two runs")
        outs = sorted(r["output"] for r in self.runs_of("greet"))
        self.assertEqual(outs, ["welcome ada", "welcome bo"])
        run = self.runs_of("greet")[-1]
        self.assertEqual(run["trigger"]["kind"], "event")
        self.assertEqual(run["trigger"]["event"]["name"], "user.signup")
        self.assertEqual(run["trigger"]["event"]["id"], a)

    def test_event_size_limit(self):
        self.w.write("moonloop.conf.lua", 'return { limits = { event = "100B" } }')
        r = self.w.ml("send", "big", "--data", json.dumps({"x": "y" * 200}), check=2)
        self.assertIn("over the limit of 100 B", r.stderr)

    def test_wait_for_event_with_match_timeout_and_no_race(self):
        self.skill("approve", """
return { id = "approve", triggers = { { event = "order.placed" } }, run = function(ctx)
  ctx.step.run("prepare", function() return 1 end)
  local ev = ctx.step.wait_for_event("approval", { event = "order.approved", match = "data.order",
    timeout = ctx.event.data.timeout or "10s" })
  return ev and ev.data.by or "timed out"
end }""")
        self.serve()
        self.w.ml("send", "order.placed", "--data", '{"order": 1}', check=0)
        self.w.ml("send", "order.placed", "--data", '{"order": 2, "timeout": "300ms"}', check=0)
        # An approval for order 3 sent in the same breath as the order itself:
        # it may arrive before the run reaches its wait, and still counts.
        self.w.ml("send", "order.placed", "--data", '{"order": 3}', check=0)
        self.w.ml("send", "order.approved", "--data", '{"order": 3, "by": "early"}', check=0)
        wait_until(lambda: len(self.runs_of("approve", "waiting")) >= 1, what="a waiting run")
        self.w.ml("send", "order.approved", "--data", '{"order": 99, "by": "nobody"}', check=0)
        self.w.ml("send", "order.approved", "--data", '{"order": 1, "by": "ann"}', check=0)
        wait_until(lambda: len(self.runs_of("approve", "completed")) == 3, what="three runs")
        by = {r["input"]["order"]: r["output"] for r in self.runs_of("approve")}
        self.assertEqual(by, {1: "ann", 2: "timed out", 3: "early"})

    def test_one_event_resumes_many_waiting_runs(self):
        self.skill("waiter", """
return { id = "waiter", run = function(ctx)
  return ctx.step.wait_for_event("go", { event = "go" }).data.n
end }""")
        self.serve()
        for _ in range(5):
            self.w.ml("invoke", "waiter", check=0)
        wait_until(lambda: len(self.runs_of("waiter", "waiting")) == 5, what="five waiting runs")
        self.w.ml("send", "go", "--data", '{"n": 7}', check=0)
        wait_until(lambda: len(self.runs_of("waiter", "completed")) == 5, what="all resumed")
        self.assertEqual({r["output"] for r in self.runs_of("waiter")}, {7})

    def test_invoke_returns_the_child_result_and_raises_its_failure(self):
        self.skill("child", """
return { id = "child", retries = 0, run = function(ctx)
  if ctx.input.fail then ctx.step.run("boom", function() error("child exploded") end) end
  return ctx.step.run("double", function() return ctx.input.x * 2 end)
end }""")
        self.skill("parent", """
return { id = "parent", run = function(ctx)
  local v = ctx.step.invoke("ok", { skill = "child", data = { x = 21 } })
  local ok, err = pcall(ctx.step.invoke, "bad", { skill = "child", data = { fail = true } })
  return { v = v, ok = ok, err = tostring(err) }
end }""")
        self.serve()
        r = self.w.ml("invoke", "parent", "--wait", check=0)
        out = json.loads(r.stdout)
        self.assertEqual(out["v"], 42)
        self.assertFalse(out["ok"])
        self.assertIn("child exploded", out["err"])
        parent = self.runs_of("parent")[0]
        children = self.w.runs(skill="child")
        self.assertEqual(len(children), 2)
        for c in children:
            self.assertEqual(c["parent_id"], parent["id"])
        failed = [c for c in children if c["status"] == "failed"][0]
        self.assertIn(failed["id"], out["err"])  # the child's run id is named

    def test_a_skill_that_invokes_itself_ends_at_the_invoke_depth(self):
        # Without an end it made runs at thousands a second, and a cancel of
        # the first could not catch up with the last.
        self.w.write("moonloop.conf.lua", "return { limits = { invoke_depth = 5 } }\n")
        self.skill("chain", """
return { id = "chain", retries = 0, run = function(ctx)
  return ctx.step.invoke("down", { skill = "chain", data = {} })
end }""")
        self.serve()
        r = self.w.ml("invoke", "chain", "--wait", check=1)
        self.assertIn("cannot invoke 'chain': this run is 5 deep in runs that invoke runs, the most "
                      "limits.invoke_depth allows (5); a skill that invokes itself needs an end", r.stderr)
        runs = self.runs_of("chain")
        self.assertEqual(len(runs), 6)  # the first and five below it
        self.assertEqual({x["status"] for x in runs}, {"failed"})
        depths = sorted(x["trigger"].get("depth", 0) for x in runs)
        self.assertEqual(depths, [0, 1, 2, 3, 4, 5])

    def test_a_skill_that_invokes_itself_from_parallel_ends_at_the_run_tree(self):
        # Three children a level: 3^depth runs within the depth limit. It made
        # 150,000 runs in 30 s, failed other skills' runs (Lua memory full)
        # and crashed the engine. The tree of one root starts at most
        # limits.run_tree runs; the invoke past it fails, naming it.
        self.w.write("moonloop.conf.lua", "return { limits = { run_tree = 30 } }\n")
        self.skill("bomb", """
return { id = "bomb", retries = 0, run = function(ctx)
  local fns = {}
  for i = 1, 3 do
    fns[i] = function() return ctx.step.invoke("c", { skill = "bomb", data = {} }) end
  end
  return ctx.step.parallel("fan", fns)
end }""")
        self.skill("other", 'return { id = "other", run = function(ctx) return "fine" end }')
        self.serve()
        r = self.w.ml("invoke", "bomb", "--wait", check=1, timeout=120)
        self.assertIn("the most limits.run_tree allows", r.stderr)
        wait_until(lambda: all(x["status"] in ("failed", "cancelled", "completed") for x in self.runs_of("bomb")),
                   timeout=60, what="the tree to end")
        runs = self.runs_of("bomb")
        self.assertEqual(len(runs), 31, len(runs))  # the root and the 30 it may start
        roots = {x["trigger"].get("root") for x in runs if x["trigger"].get("by") == "skill"}
        self.assertEqual(len(roots), 1)
        # Another skill goes on as before.
        self.assertEqual(json.loads(self.w.ml("invoke", "other", "--wait", check=0).stdout.splitlines()[-1]), "fine")

    def test_parallel_and_send_event_fan_out(self):
        self.skill("fan", """
return { id = "fan", run = function(ctx)
  local r = ctx.step.parallel("calls", {
    function() return http.get_json(env.STANDIN .. "/a").path end,
    function() return http.get_json(env.STANDIN .. "/b").path end,
  })
  local ids = ctx.step.send_event("notify", { { name = "done", data = { n = 1 } }, { name = "done", data = { n = 2 } } })
  return { r = r, ids = #ids }
end }""")
        self.skill("listener", """
return { id = "listener", triggers = { { event = "done" } }, run = function(ctx) return ctx.event.data.n end }""")
        def slow(h, b, n):
            with self.si.track("fan"):
                time.sleep(0.3)
            return 200, {"path": h.path}
        self.si.routes["/a"] = slow
        self.si.routes["/b"] = slow
        self.serve()
        r = self.w.ml("invoke", "fan", "--wait", check=0)
        self.assertEqual(json.loads(r.stdout), {"r": ["/a", "/b"], "ids": 2})
        self.assertEqual(self.si.max_inflight["fan"], 2)  # both bodies at once
        wait_until(lambda: len(self.runs_of("listener", "completed")) == 2, what="fan-out runs")
        t = self.w.trace(self.runs_of("fan")[0]["id"])
        self.assertEqual([s["id"] for s in t["steps"]], ["calls", "calls/1", "calls/2", "notify"])
        self.assertEqual(t["steps"][0]["kind"], "parallel")
        self.assertEqual(t["steps"][3]["kind"], "send")

    def test_cancel_a_waiting_run_and_its_children(self):
        self.skill("child", """
return { id = "child", run = function(ctx) ctx.step.sleep("long", "1h") end }""")
        self.skill("parent", """
return { id = "parent", run = function(ctx) return ctx.step.invoke("c", { skill = "child" }) end }""")
        self.serve()
        pid = self.w.ml("invoke", "parent", check=0).stdout.strip()
        wait_until(lambda: self.runs_of("child", "sleeping"), what="the child to sleep")
        r = self.w.ml("cancel", pid, check=0)
        self.assertTrue(r.stdout.startswith("cancel"))
        wait_until(lambda: self.w.trace(pid)["status"] == "cancelled", what="the parent cancelled")
        wait_until(lambda: self.runs_of("child")[0]["status"] == "cancelled", what="the child cancelled")
        self.assertEqual(self.w.trace(pid)["error"]["message"], "cancelled: cancelled from the command line")
        r = self.w.ml("cancel", pid, check=1)
        self.assertIn("already cancelled", r.stderr)
        self.assertIn("no run", self.w.ml("cancel", "01NOSUCHRUN000000000000000", check=1).stderr)

    def test_cancel_while_no_engine_runs_ends_the_runs_at_once(self):
        self.skill("child", """
return { id = "child", run = function(ctx) ctx.step.sleep("long", "1h") end }""")
        self.skill("parent", """
return { id = "parent", run = function(ctx) return ctx.step.invoke("c", { skill = "child" }) end }""")
        p = self.serve()
        pid = self.w.ml("invoke", "parent", check=0).stdout.strip()
        wait_until(lambda: self.runs_of("child", "sleeping"), what="the child to sleep")
        p.send_signal(signal.SIGTERM)  # stops, releasing its lease: nobody holds the runs
        self.assertEqual(p.wait(timeout=30), 0)
        r = self.w.ml("cancel", pid, check=0)
        self.assertEqual(r.stdout.strip(), "cancelled " + pid)
        parent = self.w.trace(pid)
        self.assertEqual(parent["status"], "cancelled")
        self.assertEqual(parent["steps"][0]["status"], "cancelled")
        child = self.w.trace(parent["children"][0]["id"])
        self.assertEqual(child["status"], "cancelled")
        # The words an engine holding them would have given.
        for t in (parent, child):
            self.assertEqual(t["error"]["message"], "cancelled: cancelled from the command line")
        self.assertEqual(child["steps"][0]["status"], "cancelled")
        self.assertTrue(child["steps"][0]["ended_at"])
        # An engine that starts later finds nothing to resume.
        self.serve()
        time.sleep(0.5)
        self.assertEqual([r["status"] for r in self.w.runs()], ["cancelled", "cancelled"])

    def test_a_second_cancel_keeps_the_first_reason(self):
        # A is stopped (within its lease: it still holds the run) while B
        # takes a cancel over HTTP, then `moonloop cancel` asks again: when A
        # resumes it ends the run with the reason asked first.
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN" }, lease = "60s" }')
        self.skill("nap", 'return { id = "nap", run = function(ctx) ctx.step.sleep("long", "1h") end }')
        pa = self.serve()
        rid = self.w.ml("invoke", "nap", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "sleeping", what="the nap")
        freeze_between_commits(pa.pid, self.w.db)
        try:
            pb = self.serve()
            req = urllib.request.Request(pb.url + "/v1/runs/%s/cancel" % rid, method="POST", data=b"{}",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                self.assertEqual(json.loads(r.read())["status"], "cancelling")
            self.assertIn("cancelling", self.w.ml("cancel", rid, check=0).stdout)
        finally:
            os.kill(pa.pid, signal.SIGCONT)
        wait_until(lambda: self.w.trace(rid)["status"] == "cancelled", what="the run cancelled")
        self.assertEqual(self.w.trace(rid)["error"]["message"], "cancelled: cancelled over HTTP")

    def test_cancel_on_event(self):
        self.skill("triage", """
return { id = "triage", triggers = { { event = "incident" } },
  cancel_on = { { event = "incident.resolved", match = "data.service" } },
  run = function(ctx) ctx.step.sleep("think", "1h") end }""")
        self.serve()
        self.w.ml("send", "incident", "--data", '{"service": "api"}', check=0)
        self.w.ml("send", "incident", "--data", '{"service": "db"}', check=0)
        wait_until(lambda: len(self.runs_of("triage", "sleeping")) == 2, what="two sleeping runs")
        self.w.ml("send", "incident.resolved", "--data", '{"service": "api"}', check=0)
        wait_until(lambda: self.runs_of("triage", "cancelled"), what="the api run cancelled")
        time.sleep(0.3)
        st = {r["input"]["service"]: r["status"] for r in self.runs_of("triage")}
        self.assertEqual(st, {"api": "cancelled", "db": "sleeping"})
        self.assertIn("incident.resolved", self.runs_of("triage", "cancelled")[0]["error"]["message"])

    def test_cancel_on_as_one_table_is_a_list_of_one(self):
        # As concurrency takes one limit or a list of them.
        self.skill("triage1", """
return { id = "triage1", triggers = { { event = "incident" } },
  cancel_on = { event = "incident.resolved", match = "data.service" },
  run = function(ctx) ctx.step.sleep("think", "1h") end }""")
        self.serve()
        self.w.ml("send", "incident", "--data", '{"service": "api"}', check=0)
        self.w.ml("send", "incident", "--data", '{"service": "db"}', check=0)
        wait_until(lambda: len(self.runs_of("triage1", "sleeping")) == 2, what="two sleeping runs")
        self.w.ml("send", "incident.resolved", "--data", '{"service": "api"}', check=0)
        wait_until(lambda: self.runs_of("triage1", "cancelled"), what="the api run cancelled")
        st = {r["input"]["service"]: r["status"] for r in self.runs_of("triage1")}
        self.assertEqual(st, {"api": "cancelled", "db": "sleeping"})

    def test_a_bad_cancel_on_is_refused_naming_the_keys(self):
        cases = [
            ('cancel_on = { { evnt = "x" } }',
             "unknown key 'evnt' in cancel_on 1 (did you mean 'event'?); the keys are event and match"),
            ('cancel_on = { evnt = "x" }',
             "unknown key 'evnt' in cancel_on (did you mean 'event'?); the keys are event and match"),
            ('cancel_on = { event = "x", match = "data.k", { event = "y" } }',
             "'cancel_on' is a list of {event=, match=}, so it cannot also have the key 'event'"),
            ('cancel_on = { match = "data.k" }', "cancel_on needs an 'event' name"),
            ('cancel_on = "x.stop"', "'cancel_on' must be a table {event=, match=} or a list of them"),
        ]
        for opt, want in cases:
            path = self.w.write("bad.lua", 'return { id = "bad", %s, run = function() end }' % opt)
            r = self.w.ml("check", path)
            self.assertEqual(r.returncode, 1, opt)
            self.assertIn(want, r.stderr + r.stdout, opt)

    def test_rerun_starts_again_with_the_same_input(self):
        self.skill("echo", 'return { id = "echo", run = function(ctx) return ctx.input end }')
        self.serve()
        self.w.ml("invoke", "echo", "--data", '{"a": 1}', "--wait", check=0)
        first = self.runs_of("echo")[0]["id"]
        new = self.w.ml("rerun", first, check=0).stdout.strip()
        wait_until(lambda: self.w.trace(new)["status"] == "completed", what="the rerun")
        t = self.w.trace(new)
        self.assertEqual(t["input"], {"a": 1})
        self.assertEqual(t["trigger"], {"kind": "rerun", "run_id": first})

    def test_a_rerun_of_an_events_run_gets_that_event(self):
        # A skill with two event triggers branches on ctx.event.name: its
        # rerun (after a fix) must take the same path, not see a stand-in
        # named moonloop.rerun.
        self.skill("gate", """
return { id = "gate", triggers = { { event = "gate.open" }, { event = "gate.close" } },
  run = function(ctx) return { name = ctx.event.name, data = ctx.event.data } end }""")
        self.serve()
        self.w.ml("send", "gate.close", "--data", '{"door": 7}', check=0)
        wait_until(lambda: self.runs_of("gate", "completed"), what="the event's run")
        first = self.runs_of("gate")[0]
        new = self.w.ml("rerun", first["id"], check=0).stdout.strip()
        wait_until(lambda: self.w.trace(new)["status"] == "completed", what="the rerun")
        t = self.w.trace(new)
        self.assertEqual(t["output"], {"name": "gate.close", "data": {"door": 7}})
        self.assertEqual(t["trigger"]["kind"], "rerun")
        self.assertEqual(t["trigger"]["event"], first["trigger"]["event"])

    def test_concurrency_limit_per_key_holds_and_other_keys_run_in_parallel(self):
        self.skill("one", """
return { id = "one", concurrency = { limit = 1, key = "event.data.service" }, run = function(ctx)
  return ctx.step.run("call", function()
    return http.get_json(env.STANDIN .. "/svc/" .. ctx.input.service).ok
  end)
end }""")
        def call(h, b, n):
            svc = h.path.rsplit("/", 1)[1]
            with self.si.track(svc), self.si.track("all"):
                time.sleep(0.2)
            return 200, {"ok": True}
        self.si.route_prefix("/svc/", call)
        self.serve()
        # All six at once, so the two keys' queues overlap however slow the CLI is.
        invokes = [self.w.start("invoke", "one", "--data", json.dumps({"service": svc}))
                   for svc in ["a", "a", "a", "b", "b", "b"]]
        for p in invokes:
            self.assertEqual(p.wait(timeout=60), 0, p.stderr.read())
        wait_until(lambda: len(self.runs_of("one", "completed")) == 6, timeout=30, what="six runs")
        self.assertEqual(self.si.max_inflight["a"], 1)
        self.assertEqual(self.si.max_inflight["b"], 1)
        self.assertEqual(self.si.max_inflight["all"], 2)  # the keys ran side by side

    def test_cron_fires_each_second_and_catches_up_once(self):
        from datetime import datetime
        self.skill("tick", """
return { id = "tick", triggers = { { cron = "* * * * * *" } }, run = function(ctx)
  return ctx.trigger.tick
end }""")
        p = self.serve()
        wait_until(lambda: len(self.runs_of("tick", "completed")) >= 2, timeout=10, what="two ticks")
        kill9(p)
        before = {r["id"] for r in self.runs_of("tick")}
        time.sleep(3.5)  # three ticks missed
        self.serve()
        wait_until(lambda: len(self.runs_of("tick")) >= len(before) + 3, timeout=10, what="ticks again")
        runs = self.runs_of("tick")
        ticks = [r["trigger"]["tick"] for r in runs]
        self.assertEqual(len(ticks), len(set(ticks)))  # never twice the same tick
        self.assertEqual(runs[0]["trigger"]["kind"], "cron")
        ts = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        last_before = max(ts(r["trigger"]["tick"]) for r in runs if r["id"] in before)
        new = sorted((r for r in runs if r["id"] not in before), key=lambda r: r["trigger"]["tick"])
        catch_up = [r for r in new if r["trigger"].get("catch_up")]
        # One catch-up run, for the latest missed tick; not one per missed tick:
        # at least three ticks passed while no engine ran, and only one of them ran.
        self.assertEqual(len(catch_up), 1, [r["trigger"] for r in new])
        self.assertIs(new[0], catch_up[0])
        self.assertGreaterEqual(ts(new[0]["trigger"]["tick"]) - last_before, 3)
        self.assertEqual(ts(new[1]["trigger"]["tick"]) - ts(new[0]["trigger"]["tick"]), 1)
        self.assertNotIn("catch_up", new[1]["trigger"])
        text = self.w.ml("trace", new[0]["id"], check=0).stdout
        self.assertIn("tick %s (catch-up after downtime)" % new[0]["trigger"]["tick"], text)


    def test_a_trigger_paused_while_the_engine_runs_does_not_catch_up(self):
        # Pausing a job by changing its schedule, or by removing its file,
        # then putting it back, fired a "catch-up" run at once for a tick
        # skipped on purpose: only ticks missed while no engine ran catch up.
        src = """
return { id = "tick", triggers = { { cron = "%s" } }, run = function(ctx)
  return ctx.trigger.tick
end }"""
        every, yearly = "* * * * * *", "0 0 1 1 *"

        def live(expr):
            rec = json.loads(self.w.ml("skills", "--json", check=0).stdout)
            return [s for s in rec if s["id"] == "tick" and s["version"] and s["triggers"] == [{"cron": expr}]]
        self.skill("tick", src % every)
        self.serve()
        wait_until(lambda: len(self.runs_of("tick")) >= 2, what="two ticks")
        for pause in ("schedule", "file"):
            if pause == "schedule":
                self.skill("tick", src % yearly)
                wait_until(lambda: live(yearly), what="the paused schedule")
            else:
                os.remove(os.path.join(self.w.path, "skills", "tick.lua"))
                wait_until(lambda: not live(every), what="the skill to go")
            n = len(self.runs_of("tick"))
            time.sleep(2.5)  # ticks of the paused trigger pass
            self.skill("tick", src % every)
            wait_until(lambda: len(self.runs_of("tick")) >= n + 2, what="ticks again after the %s" % pause)
            self.assertEqual([r["trigger"] for r in self.runs_of("tick") if r["trigger"].get("catch_up")], [])


    def test_a_skill_says_when_its_cron_fires_next(self):
        # The operator's "when does this loop run next?": next_fire is the
        # soonest match of the skill's cron triggers, in their time zones;
        # null for a skill without one. `moonloop skills` shows it as NEXT.
        from datetime import datetime, timedelta, timezone
        from zoneinfo import ZoneInfo
        self.skill("weekly", """
return { id = "weekly", triggers = { { cron = "30 9 * * 1", tz = "Europe/Paris" },
  { cron = "0 0 1 1 *" }, { event = "nudge" } }, run = function(ctx) return 1 end }""")
        self.skill("plain", 'return { id = "plain", triggers = { { event = "x" } }, run = function(ctx) return 1 end }')
        self.serve()
        t0 = time.time()
        rec = {s["id"]: s for s in json.loads(self.w.ml("skills", "--json", check=0).stdout)}
        self.assertIsNone(rec["plain"]["next_fire"])
        self.assertEqual(rec["weekly"]["triggers"][0], {"cron": "30 9 * * 1", "tz": "Europe/Paris"})
        at = datetime.fromisoformat(rec["weekly"]["next_fire"].replace("Z", "+00:00"))
        # Expected: the sooner of the next Monday 09:30 in Paris (UTC+1 or
        # +2 by the date) and the next New Year's midnight UTC.
        paris, now = ZoneInfo("Europe/Paris"), datetime.fromtimestamp(t0, timezone.utc)
        day = now.astimezone(paris).replace(hour=9, minute=30, second=0, microsecond=0)
        while day.weekday() != 0 or day <= now:
            day = (day + timedelta(days=1)).replace(hour=9, minute=30, tzinfo=paris)
        new_year = datetime(now.year + 1, 1, 1, tzinfo=timezone.utc)
        self.assertEqual(at, min(day, new_year))
        table = self.w.ml("skills", check=0).stdout
        self.assertIn("NEXT", table.splitlines()[0])
        row = [line for line in table.splitlines() if line.startswith("weekly")][0]
        self.assertRegex(row, r"\bin \d+(d|h|m)")
        plain = [line for line in table.splitlines() if line.startswith("plain")][0]
        self.assertNotRegex(plain, r"\bin \d")


class CronFromEnvTest(SkillsTestCase):
    env_names = ("STANDIN", "CRON")

    def test_a_catch_up_after_a_restart_follows_the_live_triggers(self):
        # The expression comes from env: the same source is the same version,
        # whatever its triggers. A restart with another expression must not
        # catch up the ticks of the one the last start had.
        self.skill("tick", """
return { id = "tick", triggers = { { cron = env.CRON } }, run = function(ctx)
  return ctx.trigger.cron
end }""")
        every_second, yearly = "* * * * * *", "0 0 1 1 *"
        p = self.w.serve("--workspace", "skills", env={"CRON": every_second})
        wait_until(lambda: len(self.runs_of("tick", "completed")) >= 2, what="two ticks")
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        before = len(self.runs_of("tick"))
        time.sleep(2.5)  # ticks missed
        p = self.w.serve("--workspace", "skills", env={"CRON": yearly})
        time.sleep(2)
        runs = self.runs_of("tick")
        self.assertEqual(len(runs), before, [r["trigger"] for r in runs])
        # The version keeps the triggers its latest load produced.
        rec = json.loads(self.w.ml("skills", "--json", check=0).stdout)
        tick = [s for s in (rec if isinstance(rec, list) else rec["skills"]) if s["id"] == "tick"][0]
        self.assertEqual(tick["triggers"], [{"cron": yearly}])
        self.assertEqual(tick["versions"][-1]["triggers"], [{"cron": yearly}])
        p.terminate()
        self.assertEqual(p.wait(timeout=20), 0)
        # Back to every second: the live expression catches up once.
        time.sleep(1.5)
        self.w.serve("--workspace", "skills", env={"CRON": every_second})
        wait_until(lambda: [r for r in self.runs_of("tick") if r["trigger"].get("catch_up")],
                   what="the catch-up of the live expression")
        catch_up = [r for r in self.runs_of("tick") if r["trigger"].get("catch_up")]
        self.assertEqual([r["trigger"]["cron"] for r in catch_up], [every_second])
