"""Memory: no run holds more than its budget across steps, a skill's shared
state cannot grow across runs, and the engine's total stays bounded.

limits.run_memory was a budget per slice (between two yields): a run kept
500 MB across 10 steps against 64 MB, and a top-level local kept memory
across runs (RSS 180 -> 573 MB) until the kernel killed the engine. Now
every Lua allocation is charged to the run whose coroutine made it (lrt.h's
accounts), so the budget counts what a run holds across its steps; the
tables a skill's top level made are read-only once it loaded; what runs
leave behind in state the skill's runs share is counted, and a skill that
left more than a run's budget there starts no more runs; and the whole
Lua state is capped (limits.total_memory): past it the run that allocates
fails, the engine does not.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from lualib import TestCase, alive, api, invoke_wait, put_skill, wait_until  # noqa: E402

BUDGET = "limits.run_memory"
GOOD = 'return { id = "good", run = function(ctx) return ctx.step.run("a", function() return 42 end) end }\n'


def lua_mb(port):
    """The engine's Lua memory, from /metrics (the process's RSS would
    count the sanitizers' own memory in the ASan build)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith("moonloop_lua_memory_bytes "):
            return float(line.split()[1]) / (1 << 20)
    raise AssertionError("no moonloop_lua_memory_bytes in /metrics")


class MemoryTest(TestCase):
    config = {"limits": '{ run_memory = "16MB", total_memory = "160MB" }'}

    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/good.lua", GOOD)
        self.p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")

    def put(self, sid, src):
        st, b = put_skill(self.p.port, sid, src)
        self.assertEqual(st, 200, b)

    def assert_serving(self):
        self.assertTrue(alive(self.p), "the engine died")
        st, b = invoke_wait(self.p.port, "good")
        self.assertEqual((st, b.get("output")), (200, 42), b)

    def test_memory_held_across_steps_is_refused(self):
        # 6 MB more per step, each slice well within 16 MB: the run holds
        # 18 MB at its third step.
        self.put("keeper", '''
return { id = "keeper", run = function(ctx)
  local keep = {}
  for i = 1, 10 do
    ctx.step.run("s", function() return i end)
    keep[i] = ctx.run_id:rep(6 * 2^20 / 26) .. i
  end
  return #keep
end }''')
        st, b = invoke_wait(self.p.port, "keeper")
        self.assertEqual(b["status"], "failed", b)
        self.assertIn(BUDGET, b["error"]["message"])
        self.assertIn("across its steps", b["error"]["message"])
        t = self.w.trace(b["run_id"])
        self.assertLess(len(t["steps"]), 4, "the run went on past its budget")
        self.assert_serving()

    def test_an_http_body_a_run_keeps_counts_against_it(self):
        # (Each body differs: equal strings are one string in Lua.)
        self.si.routes["/big"] = lambda h, body, n: (200, "%08d" % n + "b" * (5 << 20))
        # 5 MB per step, kept in a variable of the run: the body is the
        # run's (charged to it when it arrives).
        self.put("fetcher", '''
return { id = "fetcher", run = function(ctx)
  local keep = {}
  for i = 1, 6 do
    ctx.step.run("s", function()
      keep[i] = http.request({ url = env.STANDIN .. "/big" }).body
      return #keep[i]
    end)
  end
  return #keep
end }''')
        st, b = invoke_wait(self.p.port, "fetcher")
        self.assertEqual(b["status"], "failed", b)
        self.assertIn(BUDGET, b["error"]["message"])
        self.assert_serving()

    def test_a_top_level_table_that_runs_append_to(self):
        for how in ("t[#t + 1] = v", "table.insert(t, v)", "rawset(t, #t + 1, v)", "t.last = v",
                    "t.nested.more = v"):
            with self.subTest(how=how):
                sid = "appender-%d" % len(how)
                self.put(sid, '''
local t = { nested = {} }
return { id = "%s", run = function(ctx)
  local v = ctx.run_id:rep(2^20 / 26)
  %s
  return #t
end }''' % (sid, how))
                st, b = invoke_wait(self.p.port, sid)
                self.assertEqual(b["status"], "failed", b)
                self.assertRegex(b["error"]["message"], r":5: .*(read-only|shared by all its runs)")
        self.assert_serving()

    def test_state_kept_across_runs_stops_the_skill(self):
        # A table with a metatable of its own is not frozen against t[k] = v;
        # each run leaves 6 MB there. Once the skill's runs left more than a
        # run's budget, its next runs are refused, and memory stays bounded.
        self.put("hoarder", '''
local cache = setmetatable({}, {})
return { id = "hoarder", run = function(ctx)
  cache[#cache + 1] = ctx.run_id:rep(6 * 2^20 / 26)
  return #cache
end }''')
        done, refused = 0, []
        for _ in range(12):
            st, b = invoke_wait(self.p.port, "hoarder")
            if b["status"] == "completed":
                self.assertFalse(refused, "a run completed after one was refused")
                done += 1
            else:
                refused.append(b["error"]["message"])
        # Counted once two collection cycles passed since a run ended (what
        # is left then is kept, not garbage): 3 runs fill the budget, and
        # the cycles may take a run or three more.
        self.assertLessEqual(done, 6)
        self.assertTrue(refused)
        self.assertIn("cannot keep state across runs", refused[0])
        self.assertIn(BUDGET, refused[0])
        mb = lua_mb(self.p.port)
        self.assertLess(mb, 40, "the engine's Lua memory grew to %.0f MB" % mb)
        self.assert_serving()

    def test_an_upvalue_that_grows_across_runs(self):
        self.put("grower", '''
local acc = ""
return { id = "grower", run = function(ctx)
  acc = acc .. ctx.run_id:rep(2 * 2^20 / 26)
  return #acc
end }''')
        statuses = [invoke_wait(self.p.port, "grower")[1]["status"] for _ in range(14)]
        self.assertIn("failed", statuses)
        self.assertLess(lua_mb(self.p.port), 40)
        self.assert_serving()

    def test_the_total_is_capped_and_the_engine_stays_up(self):
        # Runs that each hold 12 MB (within their budget) while they sleep:
        # the state's cap (160 MB) stops the run that would pass it.
        self.put("sleeper", '''
return { id = "sleeper", run = function(ctx)
  local keep = ctx.run_id:rep(12 * 2^20 / 26)
  ctx.step.sleep("nap", 60)
  return #keep
end }''')
        ids = []
        for _ in range(16):
            st, b = api(self.p.port, "POST", "/v1/skills/sleeper/invoke", {"data": None})
            self.assertEqual(st, 202, b)
            ids.append(b["run_id"])

        def settled():
            runs = self.w.runs(skill="sleeper")
            return len(runs) == 16 and all(r["status"] in ("sleeping", "failed") for r in runs) and runs
        runs = wait_until(settled, timeout=60, what="every run to sleep or fail")
        failed = [r for r in runs if r["status"] == "failed"]
        self.assertTrue(failed, "no run met the cap")
        self.assertTrue(any(r["status"] == "sleeping" for r in runs))
        self.assertIn("limits.total_memory", self.w.trace(failed[0]["id"])["error"]["message"])
        self.assertLessEqual(lua_mb(self.p.port), 160)
        self.assert_serving()


if __name__ == "__main__":
    unittest.main()
