"""Crash tests: real engine processes killed with SIGKILL at several points.

Guarantees 1, 2 and 4 of DESIGN: after a crash a completed step's body never
runs again, the step in flight at the kill runs at most twice, and every
unfinished run resumes from its last completed step.
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, kill9, wait_until  # noqa: E402

TWENTY = """
return {
  id = "twenty",
  retries = 2,
  backoff = "50ms",
  run = function(ctx)
    local total = 0
    for i = 1, 20 do
      local r = ctx.step.run("call", function()
        return http.post_json(env.STANDIN .. "/call/" .. ctx.step_key:gsub("#", "~"), { i = i })
      end)
      total = total + r.n
    end
    return { total = total, steps = 20 }
  end,
}
"""


class CrashTest(TestCase):
    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))
        # Each call takes a little while, so kills land while steps are in flight.
        def slow(handler, body, n):
            time.sleep(0.06)
            return 200, {"n": n}
        self.slow = slow

    def route_all_calls(self, fn):
        self.si.route_prefix("/call/", fn)

    def calls_per_step(self):
        out = {}
        for path, n in self.si.all_calls().items():
            if path.startswith("/call/"):
                out[path[len("/call/"):]] = n
        return out

    def assert_exactly_once_except_in_flight(self, kills):
        per = self.calls_per_step()
        runs = self.w.runs(skill="twenty")
        self.assertTrue(runs)
        for r in runs:
            self.assertEqual(r["status"], "completed", r)
            self.assertEqual(r["output"]["steps"], 20)
            steps = self.w.trace(r["id"])["steps"]
            self.assertEqual(len(steps), 20)
            extra = 0
            for s in steps:
                key = r["id"] + ":" + s["id"].replace("#", "~")
                n = per.get(key, 0)
                self.assertGreaterEqual(n, 1, key)
                # A kill costs a step in flight one more run: a step can be
                # in flight at several kills (its rerun cut by the next one).
                self.assertLessEqual(n, 1 + kills, "%s ran %d times" % (key, n))
                extra += n - 1
                # The recorded result is the one the (last) body returned.
                self.assertEqual(s["output"]["n"], n)
            # At most one step was in flight at each kill.
            self.assertLessEqual(extra, kills)

    def test_serve_killed_repeatedly_loses_nothing_and_repeats_nothing(self):
        self.route_all_calls(self.slow)
        self.w.write("skills/twenty.lua", TWENTY)
        p = self.w.serve("--workspace", "skills")
        for i in range(6):
            self.w.ml("invoke", "twenty", "--data", json.dumps({"i": i}), check=0)
        rnd = random.Random(7)
        kills, mid_run_kills = 0, 0
        for _ in range(5):
            start = sum(self.calls_per_step().values())
            if start >= 6 * 20:
                break  # everything ran already: more kills prove nothing
            wait_until(lambda: sum(self.calls_per_step().values()) > start, what="progress")
            time.sleep(rnd.uniform(0.05, 0.3))
            progress = sum(self.calls_per_step().values())
            kill9(p)
            kills += 1
            if progress < 6 * 20:
                mid_run_kills += 1
            p = self.w.serve("--workspace", "skills")
        # The kills must have landed while runs were unfinished to prove anything.
        self.assertGreaterEqual(mid_run_kills, 3)
        wait_until(lambda: all(r["status"] == "completed" for r in self.w.runs(skill="twenty"))
                   and len(self.w.runs(skill="twenty")) == 6, timeout=60, what="all runs to complete")
        self.assert_exactly_once_except_in_flight(kills)

    def test_moonloop_run_killed_then_resumed(self):
        self.route_all_calls(self.slow)
        self.w.write("twenty.lua", TWENTY)
        p = self.w.start("run", "twenty.lua")
        wait_until(lambda: sum(self.calls_per_step().values()) >= 7, what="some steps")
        kill9(p)
        run_id = self.w.runs()[0]["id"]
        before = self.w.trace(run_id)
        done_before = [s for s in before["steps"] if s["status"] == "completed"]
        self.assertGreater(len(done_before), 0)
        self.assertNotEqual(before["status"], "completed")
        r = self.w.ml("run", "--resume", run_id, check=0)
        self.assertEqual(json.loads(r.stdout)["steps"], 20)
        self.assert_exactly_once_except_in_flight(1)

    def test_serve_takes_over_a_killed_moonloop_run(self):
        self.route_all_calls(self.slow)
        self.w.write("skills/twenty.lua", TWENTY)
        p = self.w.start("run", "skills/twenty.lua")
        wait_until(lambda: sum(self.calls_per_step().values()) >= 5, what="some steps")
        kill9(p)
        self.w.serve("--workspace", "skills")
        wait_until(lambda: self.w.runs()[0]["status"] == "completed", timeout=30, what="takeover")
        self.assert_exactly_once_except_in_flight(1)

    def test_kill_during_a_commit_group(self):
        self.route_all_calls(self.slow)
        self.w.write("twenty.lua", TWENTY)
        # Each commit holds its transaction open for 150 ms before COMMIT.
        self.w.env["MOONLOOP_FAULT"] = "commit=150"
        p = self.w.start("run", "twenty.lua")
        wait_until(lambda: sum(self.calls_per_step().values()) >= 4, what="some steps")
        time.sleep(0.07)  # well inside a commit
        kill9(p)
        del self.w.env["MOONLOOP_FAULT"]
        run_id = self.w.runs()[0]["id"]
        r = self.w.ml("run", "--resume", run_id, check=0)
        self.assertEqual(json.loads(r.stdout)["steps"], 20)
        self.assert_exactly_once_except_in_flight(1)

    def test_kill_during_a_retry_backoff(self):
        self.w.write("flaky.lua", """
return { id = "flaky", retries = 3, backoff = "1500ms", run = function(ctx)
  return ctx.step.run("flaky", function()
    return http.get_json(env.STANDIN .. "/flaky")
  end)
end }""")
        # Fails twice, then answers.
        self.si.routes["/flaky"] = lambda h, b, n: (503, {"n": n}) if n <= 2 else (200, {"n": n})
        p = self.w.start("run", "flaky.lua")
        wait_until(lambda: self.si.count("/flaky") >= 1, what="the first attempt")
        time.sleep(0.3)  # inside the first backoff (0.75 to 1.5 s)
        kill9(p)
        self.assertEqual(self.si.count("/flaky"), 1)
        run_id = self.w.runs()[0]["id"]
        t = self.w.trace(run_id)
        self.assertEqual(t["steps"][0]["status"], "running")
        self.assertEqual(t["steps"][0]["attempts"][0]["status"], "failed")
        retry_at = t["steps"][0]["attempts"][0]["retry_at"]
        r = self.w.ml("run", "--resume", run_id, check=0)
        self.assertEqual(json.loads(r.stdout), {"n": 3})
        self.assertEqual(self.si.count("/flaky"), 3)
        t = self.w.trace(run_id)
        atts = t["steps"][0]["attempts"]
        self.assertEqual([a["status"] for a in atts], ["failed", "failed", "completed"])
        # The resumed process waited out the recorded backoff, not a new one.
        self.assertGreaterEqual(atts[1]["started_at"], retry_at)
