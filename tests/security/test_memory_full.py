"""A Lua state too full for the engine's own calls fails a run, never the engine.

The engine's C code calls the Lua API outside a slice: it makes a run's
coroutine and pushes its input, pushes an HTTP response, a child run's
result, step.parallel's results onto a parked coroutine, takes registry
references. limits.total_memory stops a slice that would pass it, and the
engine's own calls had one run budget of reserve past it; past that, an
allocation there was an unprotected Lua error and LuaJIT's panic ended the
process ("unprotected Lua error: not enough memory", SIGABRT): runs that
hold memory while they sleep, then an invoke with a large input, took the
engine down. Now every such call goes through lrt_protect: the run it was
for fails, naming limits.total_memory, and the engine goes on.
"""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from lualib import BIN, TestCase, alive, api, invoke_wait, wait_until  # noqa: E402

LIMIT = "limits.total_memory"
GOOD = 'return { id = "good", run = function(ctx) return ctx.step.run("a", function() return 42 end) end }\n'
SLEEPER = '''
return { id = "sleeper", run = function(ctx)
  local keep = ctx.run_id:rep(2^20 / 26)
  ctx.step.sleep("nap", 60)
  return #keep
end }'''
ECHO = 'return { id = "echo", run = function(ctx) return #ctx.event.data end }\n'
# Where data.at says, its log line makes the next n blocks the engine
# allocates in the Lua state outside a slice be refused (the test build's
# lua_full): whatever the engine does next (a child's start and input,
# step.parallel's references, an HTTP response, a child's result, the
# results' list, the sleep's time) meets a full state.
HOSTILE = '''
return { id = "hostile", run = function(ctx)
  local d = ctx.event.data
  local function arm(at) if d.at == at then log.info("fault: lua_full=" .. d.n) end end
  arm("start")
  local r = ctx.step.parallel("p", {
    function() arm("invoke"); return ctx.step.invoke("c", { skill = "echo", data = string.rep("x", 2000) }) end,
    function() arm("http"); return http.request({ url = env.STANDIN .. "/big" }).status end,
  })
  arm("sleep")
  ctx.step.sleep("s", 0.01)
  arm("last")
  local v = ctx.step.invoke("c2", { skill = "echo", data = "abc" })
  return { r, v }
end }'''


def faults_compiled():
    out = subprocess.run([BIN, "version", "--json"], capture_output=True, text=True).stdout
    return json.loads(out).get("faults") is True


class FullStateTest(TestCase):
    config = {"limits": '{ run_memory = "4MB", total_memory = "16MB", event = "8MB" }'}

    def start(self, env=None):
        os.makedirs(os.path.join(self.w.path, "skills"), exist_ok=True)
        for name, src in (("good", GOOD), ("sleeper", SLEEPER), ("echo", ECHO), ("hostile", HOSTILE)):
            self.w.write("skills/%s.lua" % name, src)
        self.p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0", env=env)

    def assert_serving(self, tries=1):
        """The engine is up and a run of another skill completes (a few
        tries: a fault armed by count may still refuse a start or two)."""
        for _ in range(tries):
            self.assertTrue(alive(self.p), "the engine died: %s" % "".join(self.p.stderr_lines)[-2000:])
            st, b = invoke_wait(self.p.port, "good")
            if b and b.get("status") == "completed":
                self.assertEqual(b.get("output"), 42, b)
                return
        self.fail("no run of another skill completed: %s" % b)

    def test_a_large_input_into_a_full_state_fails_its_run_not_the_engine(self):
        self.start()
        # Runs holding 1 MB each while they sleep fill the state to its cap
        # (those that would pass it fail, as before)...
        for _ in range(20):
            st, b = api(self.p.port, "POST", "/v1/skills/sleeper/invoke", {"data": None})
            self.assertEqual(st, 202, b)
        wait_until(lambda: all(r["status"] in ("sleeping", "failed") for r in self.w.runs(skill="sleeper"))
                   and len(self.w.runs(skill="sleeper")) == 20, timeout=60, what="the sleepers to settle")
        # ...then a 6 MB input is pushed onto a new run's coroutine outside
        # any slice: past the cap and its reserve.
        st, b = api(self.p.port, "POST", "/v1/skills/echo/invoke", {"data": "x" * (6 << 20), "wait": 60},
                    timeout=90)
        self.assertEqual(b["status"], "failed", b)
        self.assertIn(LIMIT, b["error"]["message"])
        self.assertTrue(alive(self.p), "the engine died: %s" % "".join(self.p.stderr_lines)[-2000:])
        self.assert_serving()

    @unittest.skipUnless(faults_compiled(), "the binary has no fault points (built without MOONLOOP_FAULTS)")
    def test_each_engine_call_into_a_full_state_fails_only_its_run(self):
        self.si.routes["/big"] = lambda h, body, n: (200, "b" * 100000)
        self.start(env={"MOONLOOP_FAULT": ""})
        failed = 0
        for at, n in [(at, n) for at in ("start", "invoke", "http", "sleep", "last") for n in (1, 2, 3, 5, 9, 20)]:
            st, b = invoke_wait(self.p.port, "hostile", {"at": at, "n": n})
            self.assertTrue(alive(self.p), "%s n=%d: the engine died: %s" % (at, n, "".join(self.p.stderr_lines)[-2000:]))
            self.assertEqual(st, 200, b)
            self.assertIn(b["status"], ("completed", "failed"), b)
            if b["status"] == "failed":
                failed += 1
                self.assertIn(LIMIT, b["error"]["message"], "%s n=%d: %s" % (at, n, b))
            self.assert_serving(tries=n + 2)
        self.assertGreater(failed, 0, "no run met the full state: the fault point did not fire")


if __name__ == "__main__":
    unittest.main()
