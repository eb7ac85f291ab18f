"""The runs and skills modules: run history for review loops, and the registry."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase  # noqa: E402


class ModulesTest(TestCase):
    def test_runs_list_and_get_for_a_review(self):
        self.w.write("work.lua", """
return { id = "work", retries = 0, run = function(ctx)
  ctx.step.run("do", function() if ctx.input.fail then error("bad day") end return 1 end)
  return "done"
end }""")
        for fail in (False, False, True):
            self.w.ml("run", "work.lua", "--data", json.dumps({"fail": fail}), check=1 if fail else 0)
        self.w.write("review.lua", """
return { id = "review", run = function(ctx)
  return ctx.step.run("stats", function()
    local all = runs.list{ skill = "work", since = "7d", limit = 50 }
    local failed = runs.list{ skill = "work", status = "failed" }
    local one = runs.get(failed[1].id)
    local none = runs.list{ skill = "work", since = "1970-01-01T00:00:00Z", ["until"] = 1 }
    return { total = #all, failed = #failed, rate = (#all - #failed) / #all,
             failed_step = one.steps[1].id, error = one.error.message, old = #none }
  end)
end }""")
        out = json.loads(self.w.ml("run", "review.lua", check=0).stdout)
        self.assertEqual(out["total"], 3)
        self.assertEqual(out["failed"], 1)
        self.assertAlmostEqual(out["rate"], 2 / 3)
        self.assertEqual(out["failed_step"], "do")
        self.assertIn("bad day", out["error"])
        self.assertEqual(out["old"], 0)

    def test_runs_list_is_strict(self):
        # A misspelt key or value used to match every run (skil=) or none
        # (status="bogus"): now each is an error naming it.
        self.w.write("work.lua", 'return { id = "work", run = function(ctx) return 1 end }')
        self.w.ml("run", "work.lua", check=0)
        self.w.write("review.lua", """
return { id = "review", run = function(ctx)
  return ctx.step.run("q", function()
    local out = {}
    for i, f in ipairs({ {skil = "work"}, {status = "bogus"}, {status = "complete"},
        {trigger = "manual"}, {trigger = "invok"}, {skill = 5}, {[1] = "work"} }) do
      local ok, e = pcall(runs.list, f)
      out[i] = ok and "ok" or tostring(e)
    end
    local all = runs.list{ skill = "work", status = "completed", trigger = "invoke", since = "1d",
      ["until"] = 4102444800, limit = 5 }
    out[#out + 1] = #all
    return out
  end)
end }""")
        out = json.loads(self.w.ml("run", "review.lua", check=0).stdout)
        keys = "; the keys are skill, status, trigger, parent, since, until, limit"
        statuses = "queued, running, sleeping, waiting, completed, failed, cancelled"
        kinds = "event, cron, invoke, rerun, on_failure"
        self.assertEqual(out, [
            "review.lua:7: runs.list: unknown key 'skil' (did you mean 'skill'?)" + keys,
            "review.lua:7: runs.list: status must be one of %s; got 'bogus'" % statuses,
            "review.lua:7: runs.list: status must be one of %s; got 'complete' (did you mean 'completed'?)" % statuses,
            "review.lua:7: runs.list: trigger must be one of %s; got 'manual'" % kinds,
            "review.lua:7: runs.list: trigger must be one of %s; got 'invok' (did you mean 'invoke'?)" % kinds,
            "review.lua:7: runs.list: skill must be a string, got number",
            "review.lua:7: runs.list: unknown key 1" + keys,
            1,
        ])

    def test_skills_check_get_and_deploy_rules(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("moonloop.conf.lua", 'return { deployers = { "updater" } }')
        self.w.write("skills/target.lua", 'return { id = "target", run = function() return 1 end }')
        p = self.w.serve("--workspace", "skills")
        p.terminate()
        p.wait(timeout=10)
        body = """
return { id = "%s", run = function(ctx)
  return ctx.step.run("deploy", function()
    local cur = skills.get("target")
    local bad = skills.check("return { id = 'target', retires = 1, run = function() end }")
    local good = skills.check(cur.source:gsub("return 1", "return 2"))
    local ok, err = pcall(skills.deploy, "target", cur.source:gsub("return 1", "return 2"))
    return { source = cur.source, bad = bad, good = good, ok = ok, err = err and tostring(err) }
  end)
end }"""
        self.w.write("updater.lua", body % "updater")
        self.w.write("intruder.lua", body % "intruder")
        out = json.loads(self.w.ml("run", "updater.lua", check=0).stdout)
        self.assertIn("return 1", out["source"])
        self.assertFalse(out["bad"]["ok"])
        self.assertIn("did you mean 'retries'", out["bad"]["error"])
        self.assertEqual(out["good"], {"ok": True, "id": "target"})
        self.assertTrue(out["ok"], out["err"])
        with open(os.path.join(self.w.path, "skills", "target.lua")) as f:
            self.assertIn("return 2", f.read())  # written where the sidecar watches
        out = json.loads(self.w.ml("run", "intruder.lua", check=0).stdout)
        self.assertFalse(out["ok"])
        self.assertIn("not allowed to deploy", out["err"])
