"""A run that crashes the engine is quarantined, and can be cancelled offline.

A run whose code crashes the engine (here a real SIGSEGV from the test-only
fault point crash_on_log, engine/fault.h) is resumed by the next engine,
crashes it again, and so on: a crash loop. The crashing process records
which run's code it was executing (DB-crashes, by its crash-signal handler);
the next engine counts it against the run (runs.crashes), and the run's next
checkpoint clears it. A run taken over with 3 crashes is failed instead of
resumed, with an error saying so, and the engine stays up. A kill never
counts: runs resume however often the engine is killed.

`moonloop cancel RUN_ID` works with no engine running: it first reaps the
leases of dead local processes, so the crashing run is cancelled at once and
no engine resumes it again; and a cancellation asked of an engine that could
not act on it is applied before the run's code runs again.
"""
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from lualib import TestCase, alive, invoke_wait, kill9, signal_of, wait_until  # noqa: E402

FAULT = {"MOONLOOP_FAULT": "crash_on_log=BOOM"}

CRASHER = '''
return { id = "crasher", run = function(ctx)
  ctx.step.run("one", function() return 1 end)
  ctx.step.run("two", function()
    http.get(env.STANDIN .. "/two")
    log.info("BOOM")
    return 2
  end)
  return "done"
end }
'''

# Crashes in step "two" on its first two calls and in step "three" on its
# first two: four crashes, never three without a checkpoint in between.
FLAKY = '''
return { id = "flaky", run = function(ctx)
  ctx.step.run("two", function()
    if http.get_json(env.STANDIN .. "/two").n <= 2 then log.info("BOOM") end
    return 2
  end)
  ctx.step.run("three", function()
    if http.get_json(env.STANDIN .. "/three").n <= 2 then log.info("BOOM") end
    return 3
  end)
  return "done"
end }
'''

GOOD = 'return { id = "good", run = function(ctx) return ctx.step.run("a", function() return 42 end) end }\n'

SLOW = '''
return { id = "slow", run = function(ctx)
  ctx.step.run("wait", function() return http.get(env.STANDIN .. "/slow") end)
  return "done"
end }
'''


class QuarantineTest(TestCase):
    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))
        for name, src in (("crasher", CRASHER), ("flaky", FLAKY), ("good", GOOD), ("slow", SLOW)):
            self.w.write("skills/%s.lua" % name, src)

    def start_serve(self, env=None):
        """serve, with the crash fault armed; it may crash before it listens."""
        e = dict(FAULT)
        e.update(env or {})
        return self.w.start("serve", "--workspace", "skills", "--listen", "127.0.0.1:0", env=e)

    def wait_crash(self, p, timeout=30):
        """Wait for serve to die; it must die of SIGSEGV (the fault), not exit."""
        try:
            p.wait(timeout=timeout)
        except Exception:
            raise AssertionError("serve did not crash within %ds" % timeout)
        self.assertEqual(signal_of(p.returncode), "SIGSEGV", p.stderr.read())

    def listening(self, p, timeout=30):
        """Wait until serve listens; returns its port (fails if it died)."""
        end = time.time() + timeout
        seen = []
        while time.time() < end:
            line = p.stderr.readline()
            if not line:
                raise AssertionError("serve exited (%s): %s" % (signal_of(p.wait()), "".join(seen)))
            seen.append(line)
            if "listening on http://" in line:
                p.seen = seen
                return int(line.rsplit(":", 1)[1])
        raise AssertionError("serve did not listen: %s" % "".join(seen))

    def run_of(self, skill):
        runs = self.w.runs(skill=skill)
        self.assertEqual(len(runs), 1, runs)
        return runs[0]

    def test_a_crash_looping_run_is_quarantined_at_the_third_crash(self):
        p = self.start_serve()
        self.listening(p)
        rid = self.w.ml("invoke", "crasher", check=0).stdout.strip()
        self.wait_crash(p)  # crash 1: the engine that ran it
        for n in (2, 3):
            p = self.start_serve()
            self.wait_crash(p)  # crashes 2 and 3: each engine that resumed it
        p = self.start_serve()
        port = self.listening(p)
        # The fourth engine fails the run instead of resuming it, and serves.
        wait_until(lambda: self.w.runs(skill="crasher")[0]["status"] == "failed", timeout=30,
                   what="the run to be quarantined")
        t = self.w.trace(rid)
        self.assertIn("quarantined", t["error"]["message"])
        self.assertIn("crashed 3 times while this run's code was executing", t["error"]["message"])
        self.assertEqual([(s["id"], s["status"]) for s in t["steps"]][0], ("one", "completed"))
        self.assertEqual(self.si.count("/two"), 3, "step two ran once per crash, never again")
        st, b = invoke_wait(port, "good")
        self.assertEqual((st, b["output"]), (200, 42), b)
        time.sleep(0.5)
        self.assertTrue(alive(p))
        self.assertEqual(self.si.count("/two"), 3)

    def test_a_checkpoint_clears_the_count(self):
        p = self.start_serve()
        self.listening(p)
        rid = self.w.ml("invoke", "flaky", check=0).stdout.strip()
        for _ in range(4):  # two crashes in step two, two in step three
            self.wait_crash(p)
            p = self.start_serve()
        self.listening(p)
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30,
                   what="the run to complete")
        self.assertEqual(self.w.trace(rid)["output"], "done")
        self.assertEqual((self.si.count("/two"), self.si.count("/three")), (3, 3))

    def test_kills_never_count_as_crashes(self):
        # The run's step waits on HTTP each time the engine is killed: five
        # kills, no crash; the run is resumed every time and completes.
        gate = []

        def slow(handler, body, n):
            while not gate:
                time.sleep(0.05)
            return 200, "late %d" % n
        self.si.routes["/slow"] = slow
        p = self.start_serve()
        self.listening(p)
        rid = self.w.ml("invoke", "slow", check=0).stdout.strip()
        for n in range(1, 6):
            wait_until(lambda: self.si.count("/slow") == n, what="step try %d" % n)
            kill9(p)
            p = self.start_serve()
            self.listening(p)
        gate.append(1)
        wait_until(lambda: self.w.trace(rid)["status"] == "completed", timeout=30,
                   what="the run to complete")
        self.assertEqual(self.w.trace(rid)["output"], "done")
        self.assertFalse(os.path.exists(self.w.db + "-crashes") and
                         open(self.w.db + "-crashes").read(), "no crash was recorded")
        p.terminate()
        p.wait(timeout=20)

    def test_moonloop_cancel_with_no_engine_ends_the_loop(self):
        p = self.start_serve()
        self.listening(p)
        rid = self.w.ml("invoke", "crasher", check=0).stdout.strip()
        self.wait_crash(p)
        p = self.start_serve()
        self.wait_crash(p)
        # No engine runs now; the dead engine's lease has not expired.
        r = self.w.ml("cancel", rid, check=0)
        self.assertIn("cancelled " + rid, r.stdout)
        self.assertEqual(self.run_of("crasher")["status"], "cancelled")
        p = self.start_serve()
        port = self.listening(p)
        st, b = invoke_wait(port, "good")
        self.assertEqual((st, b["output"]), (200, 42), b)
        self.assertTrue(alive(p))
        self.assertEqual(self.si.count("/two"), 2, "no engine ran the cancelled run again")
        self.assertEqual(self.w.trace(rid)["status"], "cancelled")

    def test_a_cancellation_its_engine_could_not_apply_comes_first(self):
        # An engine holds the run in a step body, then freezes (SIGSTOP): a
        # cancel only flags the run for it. The engine is killed; the next
        # one ends the run cancelled before running any of its code again.
        gate = []

        def slow(handler, body, n):
            while not gate:
                time.sleep(0.05)
            return 200, "late"
        self.si.routes["/slow"] = slow
        # A long lease: the frozen engine's must not expire meanwhile (the
        # cancel would then end the run at once, as for a dead engine).
        self.w.write("moonloop.conf.lua", 'return { env = { "STANDIN" }, lease = "120s" }\n')
        p = self.start_serve()
        self.listening(p)
        rid = self.w.ml("invoke", "slow", check=0).stdout.strip()
        wait_until(lambda: self.si.count("/slow") == 1, what="the step to start")
        # Its "running" row is durable: the engine is idle, waiting on HTTP.
        wait_until(lambda: self.w.trace(rid)["steps"], what="the step's row")
        try:
            for _ in range(50):
                # Frozen inside a commit, the engine would hold the database's
                # write lock: let it go on a moment and freeze it again.
                os.killpg(p.pid, signal.SIGSTOP)
                r = self.w.ml("cancel", rid)
                if "database is locked" not in r.stderr:
                    break
                os.killpg(p.pid, signal.SIGCONT)
                time.sleep(0.2)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("cancelling", r.stdout)
        finally:
            kill9(p)
        gate.append(1)
        p = self.start_serve()
        self.listening(p)
        wait_until(lambda: self.w.trace(rid)["status"] == "cancelled", timeout=30,
                   what="the run to be cancelled")
        time.sleep(0.5)
        self.assertEqual(self.si.count("/slow"), 1, "the step ran again after the cancel")
        self.assertIn("cancelled", self.w.trace(rid)["error"]["message"])


if __name__ == "__main__":
    unittest.main()
