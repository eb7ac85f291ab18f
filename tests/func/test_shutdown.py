"""Graceful shutdown of serve: SIGTERM lets step bodies in flight reach their
checkpoint within the grace period, releases the lease, and exits 0."""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import TestCase, wait_until  # noqa: E402

SKILL = """
return { id = "slow", retries = 0, run = function(ctx)
  local a = ctx.step.run("call", function() return http.get_json(env.STANDIN .. "/slow").n end)
  ctx.step.sleep("rest", "200ms")
  local b = ctx.step.run("after", function() return http.get_json(env.STANDIN .. "/after").n end)
  return { a = a, b = b }
end }
"""


class ShutdownTest(TestCase):
    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/slow.lua", SKILL)
        self.si.routes["/slow"] = lambda h, b, n: (time.sleep(1.0), (200, {"n": n}))[1]

    def serve(self):
        p = self.w.serve("--workspace", "skills")
        return p

    def test_sigterm_lets_the_step_in_flight_finish_then_exits_0(self):
        p = self.serve()
        self.w.ml("invoke", "slow", check=0)
        wait_until(lambda: self.si.count("/slow") == 1, what="the slow call")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=15), 0)
        run = self.w.runs()[0]
        t = self.w.trace(run["id"])
        self.assertEqual(t["steps"][0]["status"], "completed")  # checkpointed before exiting
        # The lease was given up: the run can be taken at once.
        r = self.w.ml("run", "--resume", run["id"], check=0)
        self.assertEqual(json.loads(r.stdout), {"a": 1, "b": 1})
        self.assertEqual(self.si.count("/slow"), 1)  # not run again

    def test_grace_period_bounds_the_wait(self):
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN" }, shutdown_grace = "200ms" }')
        self.si.routes["/slow"] = lambda h, b, n: (time.sleep(3.0 if n == 1 else 0), (200, {"n": n}))[1]
        p = self.serve()
        self.w.ml("invoke", "slow", check=0)
        wait_until(lambda: self.si.count("/slow") == 1, what="the slow call")
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=15), 0)
        self.assertLess(time.time() - t0, 2.5)  # did not wait for the 3 s body
        run_id = self.w.runs()[0]["id"]
        r = self.w.ml("run", "--resume", run_id, check=0)
        self.assertEqual(json.loads(r.stdout)["a"], 2)  # the interrupted body ran again

    def test_a_second_signal_exits_at_once(self):
        self.si.routes["/slow"] = lambda h, b, n: (time.sleep(5.0), (200, {"n": n}))[1]
        p = self.serve()
        self.w.ml("invoke", "slow", check=0)
        wait_until(lambda: self.si.count("/slow") == 1, what="the slow call")
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=5)
        self.assertLess(time.time() - t0, 2)
        time.sleep(0.2)  # let the drain thread take serve's last words
        self.assertIn("second signal", "".join(p.stderr_lines))

    def test_idle_serve_stops_promptly(self):
        p = self.serve()
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        self.assertEqual(p.wait(timeout=10), 0)
        self.assertLess(time.time() - t0, 3)
