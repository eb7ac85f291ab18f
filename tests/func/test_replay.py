"""moonloop replay RUN_ID...: recorded runs replayed from their journals
against their own versions, as an engine does after a crash, without
running anything."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase  # noqa: E402



# What a divergence of a replay that ended early says to do.
HINT = ("A step's body does not run again on replay: a variable it set keeps its old value, so return what "
        "the code after it needs from the body (local v = ctx.step.run(...))")

class ReplayTest(TestCase):
    def run_file(self, name, src, timeout=60):
        self.w.write(name, src)
        r = self.w.ml("run", name, timeout=timeout)
        return self.run_id_of(r)

    def test_runs_that_follow_their_journal_pass_and_one_that_does_not_names_its_line(self):
        done = self.run_file("good.lua", """
return { id = "good", retries = 1, backoff = "10ms", run = function(ctx)
  local a = ctx.step.run("a", function() return 1 end)
  local _, err = pcall(ctx.step.run, "flaky", function() error("no", 0) end)
  local p = ctx.step.parallel("p", { function() return 2 end, function() return 3 end })
  ctx.step.sleep("nap", "10ms")
  return { sum = a + p[1] + p[2], err = tostring(err) }
end }""")
        failed = self.run_file("bad.lua", """
return { id = "bad", retries = 0, run = function(ctx)
  ctx.step.run("boom", function() error("broke", 0) end)
end }""")
        clock = self.run_file("clock.lua", """
return { id = "clock", run = function(ctx)
  local id = string.format("s%d%06d", os.time(), math.floor(os.clock() * 1e6))
  local x = ctx.step.run(id, function() return 1 end)
  return x
end }""")
        r = self.w.ml("replay", done, failed, clock, "01NOSUCHRUN000000000000000")
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "%s  ok        6 steps replayed; it ends completed as recorded" % done)
        self.assertEqual(lines[1], "%s  ok        1 step replayed; it ends failed as recorded" % failed)
        self.assertRegex(lines[2], r"^%s  diverged  clock.lua:4: the code no longer matches this run's "
                                   r"journal: step 1 is 's\d+' \(run\) in the journal, but the code "
                                   r"reached 's\d+' \(run\)$" % clock)
        self.assertEqual(lines[3], "01NOSUCHRUN000000000000000  error     no run with id "
                                   "'01NOSUCHRUN000000000000000'")
        doc = json.loads(self.w.ml("replay", done, "--json", check=0).stdout)
        self.assertEqual(doc, [{"run_id": done, "ok": True,
                                "message": "6 steps replayed; it ends completed as recorded"}])
        self.assertEqual(self.w.ml("replay").returncode, 2)

    def test_a_run_in_flight_goes_on_live_where_its_journal_ends(self):
        self.w.write("slow.lua", """
return { id = "slow", run = function(ctx)
  ctx.step.run("a", function() return 1 end)
  ctx.step.sleep("nap", "1h")
  return 1
end }""")
        p = self.w.start("run", "slow.lua")
        from mltest import wait_until, kill9
        wait_until(lambda: self.w.runs(status="sleeping"), what="the nap")
        rid = self.w.runs()[0]["id"]
        kill9(p)
        r = self.w.ml("replay", rid, check=0)
        self.assertEqual(r.stdout.strip(), "%s  ok        2 steps replayed; it goes on live at step 'nap'" % rid)

    def test_a_replay_that_ends_before_its_journal_does_diverged(self):
        # The step body set a flag the code after it reads: on replay the
        # body does not run, so the run returns before its second step.
        flag = self.run_file("flag.lua", """
return { id = "flag", run = function(ctx)
  local seen = {}
  ctx.step.run("collect", function() seen[#seen + 1] = "a"; return true end)
  if #seen > 0 then ctx.step.run("process", function() return #seen end) end
  return "done"
end }""")
        # Branches on the clock: the run (before the stamp) took a step, the
        # replay (after it) returns at once.
        stamp = int(time.time()) + 2
        early = self.run_file("early.lua", """
return { id = "early", run = function(ctx)
  if os.time() <= %d then
    ctx.step.run("even", function() return 1 end)
    return "even"
  end
  return "odd"
end }""" % stamp)
        while time.time() <= stamp + 1:
            time.sleep(0.2)
        r = self.w.ml("replay", flag, early, check=1)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "%s  diverged  flag.lua:4: the code no longer matches this run's journal: "
                                   "the run returned after step 1 'collect' (the last step it reached, at this "
                                   "line), but the journal goes on to step 2 'process' (run). " % flag + HINT)
        self.assertEqual(lines[1], "%s  diverged  early.lua:2: the code no longer matches this run's journal: "
                                   "the run returned without reaching any step of it, but the journal goes on "
                                   "to step 1 'even' (run). " % early + HINT)

    def test_an_engine_resuming_a_run_that_ends_before_its_journal_fails_it(self):
        self.w.write("nap.lua", """
return { id = "nap", run = function(ctx)
  local seen = false
  ctx.step.run("a", function() seen = true; return 1 end)
  if seen then ctx.step.sleep("nap", "3s") end
  return "woke"
end }""")
        p = self.w.start("run", "nap.lua")
        from mltest import wait_until, kill9
        wait_until(lambda: self.w.runs(status="sleeping"), what="the nap")
        rid = self.w.runs()[0]["id"]
        kill9(p)
        r = self.w.ml("replay", rid, check=1)
        self.assertIn("diverged  nap.lua:4: the code no longer matches", r.stdout)
        # The sleeping run is replayed when its nap is over.
        self.w.ml("run", "--resume", rid, check=1)
        run = self.w.trace(rid)
        self.assertEqual(run["status"], "failed")
        self.assertIn("nap.lua:4: the code no longer matches this run's journal: the run returned after step 1 "
                      "'a' (the last step it reached, at this line), but the journal goes on to step 2 'nap' "
                      "(sleep)", json.dumps(run["error"]))
