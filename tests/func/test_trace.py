"""The trace: every field of the run record for runs that retried, failed,
slept, waited, invoked and were cancelled; engine notes; prune; runs --follow."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, TestCase, kill9, metrics, wait_until  # noqa: E402


class TraceTest(TestCase):
    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))

    def serve(self):
        p = self.w.serve("--workspace", "skills")
        return p

    def test_retried_and_failed_runs(self):
        self.si.routes["/x"] = lambda h, b, n: (503, "busy") if n < 3 else (200, {"n": n})
        self.w.write("r.lua", """
return { id = "r", backoff = "10ms", run = function(ctx)
  log.warn("starting")
  local n = ctx.step.run("call", function() log.info("try", ctx.attempt); return http.get_json(env.STANDIN .. "/x").n end)
  ctx.step.run("boom", function() error("kaput") end, { retries = 1 })
end }""")
        r = self.w.ml("run", "r.lua", check=1)
        t = self.w.trace(self.run_id_of(r))
        self.assertEqual(t["status"], "failed")
        self.assertEqual(t["error"]["step"], "boom")
        self.assertIn("kaput", t["error"]["message"])
        self.assertIn("r.lua:5", t["error"]["traceback"])
        self.assertEqual(t["logs"][0]["level"], "warn")
        self.assertEqual(t["logs"][0]["msg"], "starting")
        call, boom = t["steps"]
        self.assertEqual([a["status"] for a in call["attempts"]], ["failed", "failed", "completed"])
        for a in call["attempts"][:2]:
            self.assertIn("returned 503", a["error"])
            self.assertIn("traceback", a)
            self.assertTrue(a["retry_at"] >= a["ended_at"])
        self.assertEqual([l["msg"] for l in call["logs"]], ["try 1", "try 2", "try 3"])
        self.assertEqual(call["output"], 3)
        self.assertEqual(boom["status"], "failed")
        self.assertEqual(len(boom["attempts"]), 2)
        self.assertIn("kaput", boom["error"])
        for k in ("started_at", "ended_at"):
            self.assertTrue(boom[k].endswith("Z"))
            self.assertTrue(t[k].endswith("Z"))
        self.assertLessEqual(t["started_at"], boom["started_at"])

    def test_a_parallels_branches_hang_under_it(self):
        # A step the skill named "p/1" after the parallel "p" read as one of
        # its branches: they were all on one level.
        self.w.write("par.lua", """
return { id = "par", run = function(ctx)
  ctx.step.parallel("p", { function() return 1 end, function() return 2 end })
  ctx.step.run("p/1", function() return 3 end)
  ctx.step.parallel("q", { function() return 4 end })
end }""")
        r = self.w.ml("run", "par.lua", check=0)
        text = self.w.ml("trace", self.run_id_of(r), check=0).stdout
        rows = [ln.split("\u2713")[0] + ln.split("\u2713")[1].split()[0] for ln in text.splitlines()
                if "\u2713" in ln and not ln.startswith("run ")]
        self.assertEqual(rows, ["  \u251c\u2500 p", "  \u2502  \u251c\u2500 p/1", "  \u2502  \u2514\u2500 p/2",
                                "  \u251c\u2500 p/1", "  \u2514\u2500 q", "     \u2514\u2500 q/1"])

    def test_slept_waited_invoked_cancelled_and_triggers(self):
        self.w.write("skills/child.lua", 'return { id = "child", run = function(ctx) return ctx.input.x + 1 end }')
        self.w.write("skills/flow.lua", """
return { id = "flow", triggers = { { event = "go" } }, run = function(ctx)
  ctx.step.sleep("nap", "300ms")
  local ev = ctx.step.wait_for_event("ok", { event = "ok", timeout = "10s" })
  local c = ctx.step.invoke("child", { skill = "child", data = { x = ev.data.v } })
  return c
end }""")
        self.w.write("skills/stuck.lua", 'return { id = "stuck", run = function(ctx) ctx.step.sleep("forever", "1h") end }')
        self.serve()
        eid = self.w.ml("send", "go", "--data", '{"k": 1}', check=0).stdout.strip()
        run = wait_until(lambda: [r for r in self.w.runs(skill="flow") if r["status"] == "waiting"],
                         what="the wait")[0]
        t = self.w.trace(run["id"])
        self.assertEqual(t["trigger"]["kind"], "event")
        self.assertEqual(t["trigger"]["event"]["id"], eid)
        self.assertEqual(t["trigger"]["event"]["data"], {"k": 1})
        self.assertEqual(t["input"], {"k": 1})
        self.assertEqual(t["steps"][0]["kind"], "sleep")
        self.assertEqual(t["steps"][0]["status"], "completed")
        self.assertEqual(t["steps"][1]["kind"], "wait")
        self.assertEqual(t["steps"][1]["status"], "waiting")
        self.assertIn("wake_at", t["steps"][1])  # its timeout
        self.w.ml("send", "ok", "--data", '{"v": 41}', check=0)
        wait_until(lambda: self.w.trace(run["id"])["status"] == "completed", what="the flow")
        t = self.w.trace(run["id"])
        self.assertEqual(t["output"], 42)
        self.assertEqual(t["steps"][1]["output"]["data"], {"v": 41})
        inv = t["steps"][2]
        self.assertEqual(inv["kind"], "invoke")
        self.assertEqual(inv["output"]["status"], "completed")
        child = self.w.trace(inv["output"]["run_id"])
        self.assertEqual(child["parent_id"], run["id"])
        self.assertEqual(child["trigger"]["kind"], "invoke")
        self.assertEqual(child["trigger"]["step"], "child")
        text = self.w.ml("trace", child["id"], check=0).stdout
        self.assertIn("trigger  invoke by step child of the parent run", text)
        self.assertIn("parent   " + run["id"], text)
        text = self.w.ml("trace", run["id"], check=0).stdout
        self.assertIn("trigger  event go (id %s)" % eid, text)
        self.assertIn("child    %s  child  completed" % child["id"], text)
        self.assertEqual(t["children"], [{"id": child["id"], "skill": "child", "status": "completed"}])
        stuck = self.w.ml("invoke", "stuck", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(stuck)["status"] == "sleeping", what="the sleeping run")
        self.w.ml("cancel", stuck, check=0)
        wait_until(lambda: self.w.trace(stuck)["status"] == "cancelled", what="the cancel")
        t = self.w.trace(stuck)
        self.assertIn("cancelled", t["error"]["message"])
        self.assertTrue(t["ended_at"])
        # Its sleep ended with it: not shown asleep forever.
        self.assertEqual(t["steps"][0]["status"], "cancelled")
        self.assertEqual(t["steps"][0]["ended_at"], t["ended_at"])
        self.assertNotIn("wake_at", t["steps"][0])
        rerun = self.w.ml("rerun", run["id"], check=0).stdout.strip()
        # A rerun of an event's run carries that event (ctx.event).
        self.assertEqual(self.w.trace(rerun)["trigger"], {"kind": "rerun", "run_id": run["id"],
                                                          "event": run["trigger"]["event"]})
        text = self.w.ml("trace", rerun, check=0).stdout
        self.assertIn("trigger  rerun of run %s" % run["id"], text)

    def test_a_takeover_is_noted_in_the_trace(self):
        self.si.routes["/hang"] = lambda h, b, n: (time.sleep(30 if n == 1 else 0), (200, {}))[1]
        self.w.write("h.lua", 'return { run = function(ctx) ctx.step.run("h", function() return http.get_json(env.STANDIN .. "/hang") end) end }')
        p = self.w.start("run", "h.lua")
        wait_until(lambda: self.si.count("/hang") == 1, what="the hanging step")
        kill9(p)
        run_id = self.w.runs()[0]["id"]
        self.w.ml("run", "--resume", run_id, check=0)
        logs = self.w.trace(run_id)["logs"]
        self.assertTrue(any("resumed by" in l["msg"] for l in logs), logs)

    def test_prune_deletes_old_finished_runs_only(self):
        self.w.write("q.lua", 'return { run = function(ctx) return ctx.step.run("a", function() return 1 end) end }')
        for _ in range(3):
            self.w.ml("run", "q.lua", check=0)
        self.w.write("skills/long.lua", 'return { id = "long", run = function(ctx) ctx.step.sleep("z", "1h") end }')
        p = self.serve()
        live = self.w.ml("invoke", "long", check=0).stdout.strip()
        wait_until(lambda: self.w.trace(live)["status"] == "sleeping", what="a live run")
        p.terminate()
        p.wait(timeout=10)
        # Age everything by a week.
        self.w.sql("UPDATE runs SET created_at = created_at - 7*86400000,"
                   " ended_at = ended_at - 7*86400000, started_at = started_at - 7*86400000")
        self.assertIn("pruned 3 runs", self.w.ml("prune", "--older-than", "2d", check=0).stdout)
        runs = self.w.runs()
        self.assertEqual([r["id"] for r in runs], [live])  # the live run stays, whatever its age
        self.assertEqual(self.w.sql("SELECT count(*) FROM steps WHERE run_id != ?", (live,))[0][0], 0)
        self.assertEqual(self.w.ml("prune", "--older-than", "soon", check=2).returncode, 2)
        # Through a server it cannot: the message says how to leave it out.
        self.w.env["MOONLOOP_URL"] = "http://127.0.0.1:9"
        r = self.w.ml("prune", "--older-than", "2d", check=2)
        self.assertIn("prune works on the database file, not through a server (http://127.0.0.1:9, from "
                      "$MOONLOOP_URL): run it where the database is, with MOONLOOP_URL unset", r.stderr)
        del self.w.env["MOONLOOP_URL"]
        r = self.w.ml("prune", "--older-than", "2d", "--server", "http://127.0.0.1:9", check=2)
        self.assertIn("(http://127.0.0.1:9, from --server): run it where the database is, without --server",
                      r.stderr)

    def follow_a_run(self, *flags):
        """What `moonloop runs --follow FLAGS` printed while a short run ran, and its id."""
        self.w.write("q.lua", 'return { run = function(ctx) ctx.step.sleep("z", "300ms") return 1 end }')
        self.w.ml("runs", check=0)  # the database exists before following
        p = subprocess.Popen([BIN, "runs", "--follow"] + list(flags), cwd=self.w.path, env=self.w.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.4)
            rid = self.run_id_of(self.w.ml("run", "q.lua", check=0))
            time.sleep(0.8)
        finally:
            p.terminate()
        return p.communicate(timeout=10)[0], rid

    def test_runs_follow_shows_starts_and_ends(self):
        out, rid = self.follow_a_run()
        lines = [l for l in out.splitlines() if rid in l]
        self.assertTrue(any("completed" in l for l in lines), out)
        self.assertTrue(any("sleeping" in l or "running" in l for l in lines), out)

    def test_runs_follow_json_prints_one_object_per_line(self):
        out, rid = self.follow_a_run("--json")
        objs = [json.loads(l) for l in out.splitlines()]  # every line is JSON, nothing else
        mine = [o for o in objs if o["run"]["id"] == rid]
        self.assertEqual(mine[0]["change"], "started", out)
        self.assertEqual(mine[-1]["change"], "ended", out)
        self.assertEqual(mine[-1]["run"]["status"], "completed")
        self.assertEqual(mine[-1]["run"]["skill"], "q")
        self.assertTrue(all(o["at"].endswith("Z") for o in mine), out)
        self.assertTrue(all(o["change"] == "status" for o in mine[1:-1]), out)


class MetricsTest(TestCase):
    def test_metrics_count_runs_steps_and_takeovers(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/m.lua", """
return { id = "m", retries = 0, run = function(ctx)
  ctx.step.run("a", function() return 1 end)
  if ctx.input and ctx.input.fail then ctx.step.run("b", function() error("no") end) end
end }""")
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        url = p.url
        self.w.ml("invoke", "m", "--wait", check=0)
        self.w.ml("invoke", "m", "--data", '{"fail": true}', "--wait", check=1)
        samples = metrics(url)
        self.assertEqual(samples['moonloop_runs{status="completed"}'], 1)
        self.assertEqual(samples['moonloop_runs{status="failed"}'], 1)
        self.assertEqual(samples['moonloop_runs_finished_total{status="failed"}'], 1)
        self.assertEqual(samples["moonloop_step_duration_seconds_count"], 3)
        self.assertEqual(samples['moonloop_step_duration_seconds_bucket{le="+Inf"}'], 3)
        self.assertIn("moonloop_lease_takeovers_total", samples)
        self.assertIn("moonloop_ready_tasks", samples)
