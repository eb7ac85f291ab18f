"""Child runs started in parallel: step.invoke in the functions of
step.parallel (parent links, derived ids, cancellation, failures, timeouts,
retries), and a kill -9 in the middle of a fan-out."""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import SkillsTestCase, kill9, wait_until  # noqa: E402

CHILD = """
return { id = "child", retries = 0, run = function(ctx)
  ctx.step.sleep("nap", ctx.input.nap or 0)
  if ctx.input.fail then error("child " .. ctx.input.n .. " broke") end
  local n = ctx.step.run("call", function()
    return http.get_json(env.STANDIN .. "/child/" .. ctx.input.n).n
  end)
  return { n = ctx.input.n, calls = n }
end }"""

FAN = """
return { id = "fan", run = function(ctx)
  local fns = {}
  for i = 1, ctx.input.n do
    fns[i] = function()
      local out = ctx.step.invoke("c", { skill = "child", timeout = ctx.input.timeout,
        data = { n = i, nap = ctx.input.nap, fail = ctx.input.fail == i } })
      return out.n * 10
    end
  end
  local all = ctx.step.parallel("fan", fns, { timeout = ctx.input.step_timeout })
  local after = ctx.step.run("after", function() return http.get_json(env.STANDIN .. "/after").n end)
  return { all = all, after = after }
end }"""


class FanOutTest(SkillsTestCase):
    def children(self):
        return sorted(self.runs_of("child"), key=lambda r: r["input"]["n"])

    def test_children_start_at_once_each_linked_to_its_parent(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 3, "nap": "1s"}), check=0).stdout.strip()
        # All three children are asleep at the same time: they run at once.
        wait_until(lambda: len(self.runs_of("child", "sleeping")) == 3, what="three children asleep at once")
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=20, what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "completed", t.get("error"))
        self.assertEqual(t["output"], {"all": [10, 20, 30], "after": 1})
        kids = self.children()
        self.assertEqual(len(kids), 3)
        for i, k in enumerate(kids, 1):
            self.assertEqual(k["parent_id"], rid)
            self.assertEqual(k["status"], "completed")
            self.assertEqual(k["trigger"]["step"], "fan/%d/c" % i)
        self.assertEqual([s["id"] for s in t["steps"]], ["fan", "fan/1", "fan/2", "fan/3", "after"])

    def test_a_failed_child_fails_its_branch_and_the_parallel(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 3, "fail": 2}), check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=20, what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "failed")
        self.assertRegex(t["error"]["message"],
                         r"^step 'fan' failed: step 'fan/2' failed: child run \w+ failed: .*child 2 broke")
        steps = {s["id"]: s for s in t["steps"]}
        self.assertEqual(steps["fan/2"]["status"], "failed")
        self.assertEqual(len(steps["fan/2"]["attempts"]), 1)  # a failed child is final: no retry
        self.assertEqual(steps["fan/1"]["status"], "completed")
        self.assertEqual(len(self.runs_of("child")), 3)

    def test_cancelling_the_parent_cancels_every_child(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 3, "nap": "1h"}), check=0).stdout.strip()
        wait_until(lambda: len(self.runs_of("child", "sleeping")) == 3, what="three children asleep")
        self.w.ml("cancel", rid, check=0)
        wait_until(lambda: len(self.runs_of("child", "cancelled")) == 3, what="every child cancelled")
        wait_until(lambda: self.w.trace(rid)["status"] == "cancelled", what="the parent cancelled")

    def test_an_invoke_past_its_timeout_cancels_its_child(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 2, "nap": "1h", "timeout": "300ms"}),
                        check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=20, what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "failed")
        self.assertIn("child run did not end within its timeout", t["error"]["message"])
        wait_until(lambda: len(self.runs_of("child", "cancelled")) == 2, what="both children cancelled")
        self.assertIn("its parent stopped waiting", self.runs_of("child")[0]["error"]["message"])

    def test_the_parallel_step_timeout_ends_a_branch_waiting_for_its_child(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 1, "nap": "1h", "step_timeout": "300ms"}),
                        check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=20, what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "failed")
        self.assertRegex(t["error"]["message"],
                         r"step 'fan/1' timed out after 300ms while waiting for its child run \w+")
        wait_until(lambda: self.runs_of("child", "cancelled"), what="the child cancelled")

    def test_a_retried_branch_awaits_its_child_again_without_starting_it_again(self):
        self.skill("child", CHILD)
        self.skill("retry", """
return { id = "retry", backoff = "10ms", run = function(ctx)
  return ctx.step.parallel("fan", {
    function()
      local out = ctx.step.invoke("c", { skill = "child", data = { n = 7 } })
      -- fails on its first attempt, after the child completed
      local n = http.get_json(env.STANDIN .. "/flaky").n
      if n == 1 then error("flaky") end
      return out.n
    end,
  }, { retries = 2 })
end }""")
        self.serve()
        rid = self.w.ml("invoke", "retry", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=20, what="the run")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "completed", t.get("error"))
        self.assertEqual(t["output"], [7])
        self.assertEqual(len(self.runs_of("child")), 1)
        self.assertEqual(self.si.count("/child/7"), 1)
        self.assertEqual(self.si.count("/flaky"), 2)

    def test_invoke_in_a_step_run_body_names_parallel(self):
        self.skill("nested", """
return { id = "nested", run = function(ctx)
  local fn = function() return ctx.step.invoke("c", { skill = "child" }) end
  return ctx.step.run("outer", fn)
end }""")
        self.skill("child", CHILD)
        self.serve()
        rid = self.w.ml("invoke", "nested", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] == "failed", what="the run")
        msg = self.w.trace(rid)["error"]["message"]
        self.assertIn("steps cannot be nested: step.invoke('c') was called inside the body of step 'outer'", msg)
        self.assertIn("in a function of step.parallel", msg)

    def test_check_accepts_invoke_in_parallel_functions_only(self):
        self.skill("lit", """
return { id = "lit", run = function(ctx)
  return ctx.step.parallel("p", {
    function() return ctx.step.invoke("a", { skill = "child" }) end,
    function() return ctx.step.invoke("b", { skill = "child" }) end,
  })
end }""")
        self.assertEqual(self.w.ml("check", "skills/lit.lua", check=0).returncode, 0)
        self.skill("bad", """
return { id = "bad", run = function(ctx)
  return ctx.step.run("r", function() return ctx.step.invoke("a", { skill = "child" }) end)
end }""")
        r = self.w.ml("check", "skills/bad.lua", check=1)
        self.assertIn("or in a function of step.parallel", r.stdout + r.stderr)

    def test_kill_9_during_a_fan_out_runs_every_child_once(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        gate = threading.Event()

        def slow(handler, body, n):
            gate.wait(20)  # the children's calls hang until the engine was killed
            return 200, {"n": n}
        self.si.route_prefix("/child/", slow)
        p = self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 4}), check=0).stdout.strip()
        wait_until(lambda: sum(self.si.count("/child/%d" % i) for i in range(1, 5)) == 4,
                   what="four children in their calls")
        kill9(p)
        gate.set()
        p = self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=30, what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "completed", t.get("error"))
        self.assertEqual(t["output"], {"all": [10, 20, 30, 40], "after": 1})
        kids = self.children()
        self.assertEqual([k["input"]["n"] for k in kids], [1, 2, 3, 4])  # one child each, not one per replay
        self.assertTrue(all(k["status"] == "completed" and k["parent_id"] == rid for k in kids))
        self.assertEqual(self.si.count("/after"), 1)
        # A second kill once they ended: the parent's replay starts none again.
        kill9(p)
        self.serve()
        self.assertEqual(len(self.runs_of("child")), 4)

    def test_kill_9_while_branches_wait_for_children_that_end_meanwhile(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)
        p = self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 3, "nap": "2s"}), check=0).stdout.strip()
        wait_until(lambda: len(self.runs_of("child", "sleeping")) == 3, what="three children asleep")
        kill9(p)
        self.serve()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=30, what="the parent")
        t = self.w.trace(rid)
        self.assertEqual(t["status"], "completed", t.get("error"))
        self.assertEqual(t["output"]["all"], [10, 20, 30])
        self.assertEqual(len(self.runs_of("child")), 3)
        for i in range(1, 4):
            self.assertEqual(self.si.count("/child/%d" % i), 1)

    def test_moonloop_test_runs_branch_invokes_on_the_virtual_clock(self):
        self.w.write("t/fan.lua", FAN.replace("http.get_json(env.STANDIN .. \"/after\").n", "1"))
        self.w.write("t/fan_test.lua", """local t = test.skill("fan.lua")
t:case("children by skill, one branch by its key", function(c)
  c:child("child", function(data) return { n = data.n } end, { after = "2h" })
  c:mock("fan/2/c", { n = 9 })
  c:eq(c:run({ n = 3 }), { all = { 10, 90, 30 }, after = 1 })
  c:eq(c:step("fan").duration, 7200)
  c:eq(#c:invoked(), 3)
  c:eq(c:invoked()[3].step, "fan/3/c")
end)
t:case("every branch's invoke by its own id", function(c)
  c:mock("c", { n = 4 })
  c:eq(c:run({ n = 2 }).all, { 40, 40 })
end)
t:case("the parallel's timeout ends a branch waiting for its child", function(c)
  c:child("child", { n = 1 }, { after = "1h" })
  c:run({ n = 1, step_timeout = "10m" })
  c:err("step 'fan/1' timed out after 10m00s while waiting for its child run")
  c:eq(c:step("fan/1").ended_at - c:step("fan/1").started_at, 600)
end)
t:case("the invoke's own timeout", function(c)
  c:child("child", { n = 1 }, { after = "1h" })
  c:run({ n = 2, timeout = "5m" })
  c:err("step 'fan/1' failed: child run did not end within its timeout")
end)
t:case("an unmocked child fails its branch", function(c)
  c:run({ n = 1 })
  c:err("child skill 'child' is not mocked in this test")
end)
return t
""")
        r = self.w.ml("test", "t", check=0)
        self.assertIn("5 passed, 0 failed", r.stdout, r.stdout + r.stderr)

    def test_a_replayed_branch_keeps_its_invokes_timeout(self):
        self.skill("child", CHILD)
        self.skill("fan", FAN)

        def timeouts(rid):
            return self.w.sql("SELECT seq, timeout_at, owner FROM waits WHERE run_id = ? AND kind = 'child'"
                              " ORDER BY seq", (rid,))
        p = self.serve()
        rid = self.w.ml("invoke", "fan", "--data", json.dumps({"n": 2, "nap": "1h", "timeout": "1h"}),
                        check=0).stdout.strip()
        wait_until(lambda: len(timeouts(rid)) == 2, what="two branches waiting")
        before = timeouts(rid)
        kill9(p)
        self.serve()
        # Registered again by the new engine (a new owner), with the same timeout.
        wait_until(lambda: all(o != before[0][2] for _, _, o in timeouts(rid)), what="the waits taken over")
        self.assertEqual([(s, t) for s, t, _ in timeouts(rid)], [(s, t) for s, t, _ in before])
        self.assertEqual(len(self.runs_of("child")), 2)

    def test_a_list_given_to_invoke_says_how_to_start_several(self):
        self.skill("list", """
return { id = "list", run = function(ctx)
  return ctx.step.invoke("fan", { { skill = "a" }, { skill = "b" } })
end }""")
        r = self.w.ml("check", "skills/list.lua", check=1)
        self.assertIn("step.invoke: takes one child {skill=, data=, timeout=}, not a list; for several at once, "
                      "call it in the functions of step.parallel", r.stdout + r.stderr)

    def test_a_branch_whose_time_is_up_starts_no_child(self):
        self.skill("child", CHILD)
        self.skill("late", """
return { id = "late", run = function(ctx)
  return ctx.step.parallel("fan", {
    function()
      pcall(http.get, env.STANDIN .. "/slow")   -- cut by the step's timeout, and caught
      return ctx.step.invoke("c", { skill = "child", data = { n = 1 } })
    end,
  }, { timeout = "300ms", retries = 0 })
end }""")
        gate = threading.Event()
        self.si.routes["/slow"] = lambda h, body, n: (gate.wait(10), (200, {}))[1]
        self.serve()
        rid = self.w.ml("invoke", "late", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(rid)["status"] in ("completed", "failed"), timeout=20, what="the run")
        gate.set()
        self.assertIn("step 'fan/1' timed out before its child run started", self.w.trace(rid)["error"]["message"])
        self.assertEqual(self.runs_of("child"), [])
