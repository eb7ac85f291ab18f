"""Runaway skill code: the time and memory budgets between two yields.

Every case must end with the run failed and an error in its trace that
names the budget (limits.run_seconds_between_yields or limits.run_memory),
and the engine must keep serving: in `serve`, a well-behaved run started at
the same time completes, and so does a new run after the kills.

Budgets are small here (0.25 s, 4 MB) to keep the tests fast.

Known limits (time inside one C call is invisible to the count hook):
- the sandbox's own string.find/match/gmatch/gsub check the time budget,
  string.rep the memory budget, and a table.sort of more than 2000 elements
  compares in hooked Lua; other C functions are only bounded by the memory
  budget (their input must fit in it) and run in linear or n log n time;
- json.encode/json.decode (engine/lua/json.c) build a cJSON tree with malloc,
  outside the Lua allocator and the hook: the tree is bounded by the run's
  budget (test_json_trees_count_against_the_run_budget) and the walk by
  the slice's time (test_json_encode_of_shared_subtables_is_bounded);
- the memory budget is per run: what a run keeps across its steps counts
  (tests/security/test_memory.py holds it), and a slice may briefly hold
  four budgets inside one C call before it is refused memory ("not enough
  memory").
"""
import json
import os
import resource
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import BIN, TestCase, wait_until  # noqa: E402


def cpu_of(fn):
    """fn's answer and the CPU seconds (user + system) its child processes
    used: the bound on how soon a budget stops a run, which a loaded
    machine does not stretch as it does wall time (the budget itself is
    the engine thread's CPU time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = fn()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

SLICE = 0.25
MEMORY_BUDGET = "4MB"
LIMITS = '{ run_seconds_between_yields = %s, run_memory = "%s" }' % (SLICE, MEMORY_BUDGET)
# For memory cases: enough time that a slow build (ASan) still meets the
# memory budget first.
MEMORY_SLICE = 3


def set_limits(w, slice_s, memory=MEMORY_BUDGET):
    w.write("moonloop.conf.lua", 'return {\n  env = {"STANDIN"},\n  limits = '
            '{ run_seconds_between_yields = %s, run_memory = "%s" },\n}\n' % (slice_s, memory))
TIME = "limits.run_seconds_between_yields"
MEMORY = "limits.run_memory"


def in_step(body):
    return 'return { run = function(ctx)\n  return ctx.step.run("s", function()\n%s\n  end)\nend }\n' % body


def in_orch(body):
    return "return { run = function(ctx)\n%s\nend }\n" % body


# name -> (skill source, the budget its error must name)
CASES = {
    "loop_in_step": (in_step("while true do end"), TIME),
    "loop_in_orchestration": (in_orch("while true do end"), TIME),
    "loop_after_a_step": (in_orch('ctx.step.run("ok", function() return 1 end)\nwhile true do end'), TIME),
    "pcall_loop_in_step": (in_step("while true do pcall(function() while true do end end) end"), TIME),
    "pcall_loop_in_orchestration": (in_orch("while true do pcall(function() while true do end end) end"), TIME),
    "xpcall_with_looping_handler": (in_step(
        "while true do xpcall(function() while true do end end, function(e) while true do end end) end"), TIME),
    "xpcall_handler_loops_on_plain_error": (in_step(
        'while true do xpcall(function() error("x") end, function(e) while true do end end) end'), TIME),
    "pcall_around_a_killed_step": (in_orch(
        'while true do pcall(ctx.step.run, "spin", function() while true do end end) end'), TIME),
    "loop_in_table_sort_comparator": (in_step(
        "local t = {} for i = 1, 100 do t[i] = i end\n"
        "table.sort(t, function(a, b) while true do end end)"), TIME),
    "loop_in_gsub_callback": (in_step('return (string.gsub("abc", "%w", function(c) while true do end end))'), TIME),
    "loop_in_error_tostring": (in_step(
        "error(setmetatable({}, { __tostring = function() while true do end end }))"), TIME),
    "loop_in_metamethod": (in_step(
        "local t = setmetatable({}, { __index = function(t, k) while true do end end })\nreturn t.x"), TIME),
    "recursion_without_end": (in_step("local function f(n) return f(n + 1) end\nreturn f(1)"), TIME),
    # skills.check loads a source inside the caller's slice: the kill of
    # that source's top level came back as its result, and the caller's
    # loop then ran on unchecked (the hook ignored a slice already killed).
    "loop_after_a_check_killed_in_step": (in_step('skills.check("while true do end")\nwhile true do end'), TIME),
    "loop_after_a_check_killed_in_orchestration": (in_orch(
        'skills.check("while true do end")\nskills.check("while true do end")\nwhile true do end'), TIME),
    "loop_after_a_check_killed_for_memory": (in_step(
        'skills.check("local t = {} while true do t[#t + 1] = {} end")\nwhile true do end'), MEMORY),
    "memory_hog_in_step": (in_step(
        'local t = {}\nwhile true do t[#t + 1] = ("x"):rep(1000) .. #t end'), MEMORY),
    "memory_hog_in_orchestration": (in_orch(
        'local t = {}\nwhile true do t[#t + 1] = ("x"):rep(1000) .. #t end'), MEMORY),
    "memory_hog_under_pcall": (in_step(
        'local t = {}\nwhile true do pcall(function() while true do t[#t + 1] = {} end end) end'), MEMORY),
    "huge_string_rep": (in_step('return #("x"):rep(2^31)'), MEMORY),
    "huge_string_rep_library": (in_step('return #string.rep("ab", 1e9, ",")'), MEMORY),
    "string_doubling": (in_step('local s = "x"\nwhile true do s = s .. s end'), MEMORY),
    "memory_in_orchestration_before_a_step": (in_orch(
        'local t = {}\nfor i = 1, 40 do t[i] = ("x"):rep(2^20) .. i end\n'
        'ctx.step.run("after", function() return 1 end)\nreturn #t'), MEMORY),
}


# A worst case for LuaJIT's table.sort (n a power of two, at least 16):
# checked against McIlroy's "killer adversary" run on Lua 5.1's auxsort;
# about n*n/4 comparisons.
KILLER = r'''
local function killer(n)
  if n == 16 then return { 0, 8, 2, 12, 4, 10, 6, 1, 3, 5, 7, 9, 11, 13, 14, 15 } end
  local h = n / 2
  local sub = killer(h)
  local out = {}
  for i = 0, h - 2 do out[i + 1] = (i % 2 == 0) and i or h + sub[(i - 1) / 2 + 1] end
  local v = 1
  for i = h - 1, n - 3 do out[i + 1] = v v = v + 2 end
  out[n - 1], out[n] = n - 2, n - 1
  return out
end
'''


class RunawayRunTest(TestCase):
    """Each case through `moonloop run`: the run fails, its trace names the budget."""
    config = {"limits": LIMITS}

    def check_case(self, name):
        src, budget = CASES[name]
        if budget == MEMORY:
            set_limits(self.w, MEMORY_SLICE)
        self.w.write(name + ".lua", src)
        r, took = cpu_of(lambda: self.w.ml("run", name + ".lua", timeout=30))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertLess(took, 5, "the run took %.1f s of CPU to be stopped" % took)
        self.assertIn(budget, r.stderr)
        t = self.w.trace(self.run_id_of(r))
        self.assertEqual(t["status"], "failed")
        self.assertIn(budget, t["error"]["message"])
        self.assertIn("stopped", t["error"]["message"])
        for s in t["steps"]:
            if s["status"] == "failed":
                self.assertIn(budget, json.dumps(s))  # the step's own error names it too
        return t


def _make(name):
    def test(self):
        self.check_case(name)
    test.__name__ = "test_" + name
    test.__doc__ = "%s: the run is stopped by %s" % (name, CASES[name][1])
    return test


for _name in CASES:
    setattr(RunawayRunTest, "test_" + _name, _make(_name))


class BudgetDetailsTest(TestCase):
    config = {"limits": LIMITS}

    def test_loop_at_the_top_level_of_a_file_fails_its_load_naming_the_budget(self):
        self.w.write("top.lua", "while true do end\nreturn { run = function() end }\n")
        for cmd in (["check", "top.lua"], ["run", "top.lua"]):
            r, cpu = cpu_of(lambda: self.w.ml(*cmd, timeout=30))
            self.assertEqual(r.returncode, 1, cmd)
            self.assertLess(cpu, 5)
            self.assertIn(TIME, r.stderr)
            self.assertIn("top.lua", r.stderr)

    def test_memory_hog_at_the_top_level_fails_its_load_naming_the_budget(self):
        set_limits(self.w, MEMORY_SLICE)
        self.w.write("top.lua", 'local t = {}\nwhile true do t[#t + 1] = ("x"):rep(100) .. #t end\n')
        r = self.w.ml("check", "top.lua", timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn(MEMORY, r.stderr)

    def test_code_that_yields_in_time_is_not_stopped(self):
        # Busy for a twentieth of the budget (CPU time: a loaded machine
        # stretches it in wall time, so a slice needs that margin), thirty
        # times over: more than the budget in all, never between two yields.
        self.w.write("ok.lua", in_orch('''
  local n = 0
  for i = 1, 30 do
    n = n + ctx.step.run("busy", function()
      local t0 = os.clock()
      while os.clock() - t0 < %s do end
      return 1
    end)
  end
  return n''' % (SLICE / 20)))
        r = self.w.ml("run", "ok.lua", check=0)
        self.assertEqual(r.stdout.strip(), "30")

    def test_garbage_is_not_counted_against_the_memory_budget(self):
        # 50 MB allocated in one slice, but never more than a few MB alive.
        set_limits(self.w, MEMORY_SLICE)
        self.w.write("g.lua", in_step('''
    local n = 0
    for i = 1, 50 do local s = ("x"):rep(2^20) .. i n = n + #s end
    return n'''))
        r = self.w.ml("run", "g.lua", check=0)
        self.assertEqual(int(r.stdout), sum(2 ** 20 + len(str(i)) for i in range(1, 51)))

    def test_memory_held_across_yields_in_budget_is_fine(self):
        # 0.75 MB more per slice, 3 MB in all: within the run's budget.
        set_limits(self.w, MEMORY_SLICE)
        self.w.write("m.lua", in_orch('''
  local keep = {}
  for i = 1, 4 do
    ctx.step.run("s", function() return i end)
    keep[i] = ("x"):rep(0.75 * 2^20)
  end
  return #keep'''))
        r = self.w.ml("run", "m.lua", check=0)
        self.assertEqual(r.stdout.strip(), "4")

    def test_memory_held_across_yields_counts_against_the_run(self):
        # 3 MB more per slice: each slice is within the budget, but the run
        # holds 12 MB by the end, three budgets.
        set_limits(self.w, MEMORY_SLICE)
        self.w.write("m.lua", in_orch('''
  local keep = {}
  for i = 1, 4 do
    ctx.step.run("s", function() return i end)
    keep[i] = ("x"):rep(3 * 2^20)
  end
  return #keep'''))
        r = self.w.ml("run", "m.lua", timeout=30)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn(MEMORY, r.stderr)
        self.assertIn("across its steps", r.stderr)

    def test_a_file_that_loops_after_a_check_killed_fails_its_load(self):
        self.w.write("top.lua", 'skills.check("while true do end")\nwhile true do end\n'
                     'return { run = function() return 1 end }\n')
        r, cpu = cpu_of(lambda: self.w.ml("run", "top.lua", timeout=30))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertLess(cpu, 5)
        self.assertIn(TIME, r.stdout + r.stderr)

    def test_log_lines_past_the_run_budget_are_dropped_and_counted(self):
        # Lines wait in memory for their commit and stay in the database: a
        # run that logged without end filled both (925 MB in 7 s).
        self.w.write("moonloop.conf.lua", 'return { limits = { run_logs = "64KB" } }\n')
        self.w.write("l.lua", in_orch('''
  local s = ("x"):rep(1000)
  for i = 1, 100 do log.info(s) end
  ctx.step.run("s", function() for i = 1, 100 do log.info(s) end return 1 end)
  return "done"'''))
        r = self.w.ml("run", "l.lua", timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        t = self.w.trace(self.run_id_of(r))
        logs = t.get("logs", []) + [ln for s in t["steps"] for ln in s.get("logs", [])]
        kept = [ln for ln in logs if ln["msg"] == "x" * 1000]
        self.assertEqual(len(kept), 65)  # 65 lines of 1,000 bytes fit 64 KB
        notes = [ln["msg"] for ln in logs if ln["level"] == "warn"]
        self.assertEqual(notes, ["this run logged 64.0 KB, its budget (limits.run_logs): its further log lines "
                                 "are dropped", "135 log lines were dropped past this run's budget "
                                 "(limits.run_logs)"])

    def test_a_killed_step_is_not_retried(self):
        self.w.write("r.lua", 'return { retries = 3, run = function(ctx)\n'
                     '  ctx.step.run("s", function() while true do end end)\nend }\n')
        r = self.w.ml("run", "r.lua", timeout=30)
        self.assertEqual(r.returncode, 1)
        t = self.w.trace(self.run_id_of(r))
        self.assertEqual(len(t["steps"][0]["attempts"]), 1)

    def test_a_kill_cannot_be_caught_in_a_later_slice(self):
        # The kill fails the step; pcall in the orchestration code must not
        # let the run go on (the kill is final for the run).
        self.w.write("c.lua", in_orch('''
  local ok, e = pcall(ctx.step.run, "spin", function() while true do end end)
  return ctx.step.run("after", function() return "went on" end)'''))
        r = self.w.ml("run", "c.lua", timeout=30)
        self.assertEqual(r.returncode, 1, r.stdout)
        t = self.w.trace(self.run_id_of(r))
        self.assertEqual([s["id"] for s in t["steps"]], ["spin"])

    def test_pathological_pattern_is_stopped_by_the_time_budget(self):
        # One string.find call with a backtracking pattern runs for hours in
        # C; the sandbox's pattern functions check the time budget as they go.
        self.w.write("p.lua", in_step('return string.find(("a"):rep(300000), ("a*"):rep(3) .. "b")'))
        r, cpu = cpu_of(lambda: self.w.ml("run", "p.lua", timeout=60))
        self.assertEqual(r.returncode, 1)
        self.assertLess(cpu, 5)
        self.assertIn(TIME, r.stderr)

    def test_quadratic_table_sort_is_stopped_by_the_time_budget(self):
        # LuaJIT's quicksort (Lua 5.1's) has inputs that make it quadratic;
        # this closed form of McIlroy's adversary for its median-of-three
        # makes one table.sort call of 32768 numbers take seconds in C.
        self.w.write("ks.lua", KILLER + in_step(
            'local t = killer(32768)\ntable.sort(t)\nreturn t[1]'))
        r, cpu = cpu_of(lambda: self.w.ml("run", "ks.lua", timeout=60))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertLess(cpu, 5)
        self.assertIn(TIME, r.stderr)

    def test_table_sort_still_sorts(self):
        set_limits(self.w, MEMORY_SLICE)
        self.w.write("s.lua", KILLER + in_step('''
    local ok = true
    for _, n in ipairs({ 10, 3000, 9000 }) do
      local t, u = {}, {}
      for i = 1, n do t[i] = (i * 7919) % n u[i] = tostring(t[i]) end
      table.sort(t) table.sort(u)
      for i = 2, n do ok = ok and t[i - 1] <= t[i] and u[i - 1] <= u[i] end
      table.sort(t, function(a, b) return a > b end)
      ok = ok and t[1] == n - 1
    end
    local k = killer(2048)
    table.sort(k)
    for i = 1, #k do ok = ok and k[i] == i - 1 end
    return ok'''))
        r = self.w.ml("run", "s.lua", check=0)
        self.assertEqual(r.stdout.strip(), "true")

    def test_plain_find_of_a_long_needle_is_fast(self):
        # A naive search is O(n*m): 5e10 steps here, all inside one C call.
        self.w.write("f.lua", in_step(
            'local h = ("a"):rep(1000000)\n'
            'return { string.find(h, ("a"):rep(50000) .. "b", 1, true) == nil,'
            ' (h .. "b"):find(("a"):rep(50000) .. "b", 1, true) }'))
        r, cpu = cpu_of(lambda: self.w.ml("run", "f.lua", check=0, timeout=60))
        self.assertLess(cpu, 5)
        self.assertEqual(json.loads(r.stdout), [True, 950001, 1000001])

    def test_check_of_a_key_that_is_a_pathological_pattern_ends(self):
        # The validator looks for an unknown key's line with a pattern built
        # from the key; a key made of ".-" items used to hang `check`.
        self.w.write("k.lua", 'return {\n  [(".-"):rep(12) .. "y"] = 1,\n'
                     '  run = function() end, -- ' + "a" * 300 + '\n}\n')
        r, cpu = cpu_of(lambda: self.w.ml("check", "k.lua", timeout=60))
        self.assertEqual(r.returncode, 1)
        self.assertLess(cpu, 5)

    def test_json_encode_of_shared_subtables_is_bounded(self):
        """json.encode walks shared subtables again at each reference: t =
        {t, t} 25 times is 50M nodes, minutes and gigabytes if nothing
        bounds it (json.c used to build the whole tree with malloc, out of
        the hook's sight). json.c counts what it writes and stops at the
        limit or the slice's deadline, so the run fails within seconds (the
        bound only catches the unbounded walk, not a slow machine)."""
        self.w.write("dag.lua", in_step(
            "local t = { 1 }\nfor i = 1, 25 do t = { t, t } end\nreturn #json.encode(t)"))
        t0 = time.time()
        # A file database whatever the suite's backend: the bound is the
        # encoder's, and a server's connections would count in it too.
        r = self.w.ml("run", "dag.lua", "--db", os.path.join(self.w.path, "dag.db"), timeout=120)
        self.assertLess(time.time() - t0, 20)
        self.assertEqual(r.returncode, 1)

    def ml_peak(self, *args):
        """Run moonloop to its end: its result, and the most memory it held
        (KB, the kernel's count for that one process)."""
        out, err = (open(os.path.join(self.w.path, n), "w+") for n in ("peak.out", "peak.err"))
        with out, err:
            p = subprocess.Popen([BIN] + list(args), cwd=self.w.path, env=self.w.env, stdout=out, stderr=err)
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            return p.returncode, out.read(), err.read(), ru.ru_maxrss

    def test_json_trees_count_against_the_run_budget(self):
        """cJSON's tree lives outside the Lua heap: json.decode of an 8 MB
        array of small numbers built a 320 MB tree (a review's 24 MB text
        peaked at 1.1 GB), and json.encode of one table referenced 100,000
        times grew by gigabytes until the slice's time ran out. Each tree
        may now take the run's budget: past it the call raises an error
        that names limits.run_memory (a pcall catches it: nothing was kept),
        and the engine's memory stays near what a trivial run takes."""
        set_limits(self.w, MEMORY_SLICE, "32MB")
        self.w.write("small.lua", in_step("return 1"))
        self.w.write("big.lua", in_orch('''
  local a, b = ctx.step.run("decode", function()
    local text = "[" .. ("1,"):rep(4e6) .. "1]"
    local ok, err = pcall(json.decode, text)
    return { ok, tostring(err) }
  end), ctx.step.run("encode", function()
    local t = {}
    for i = 1, 1000 do t[i] = i end
    local big = {}
    for i = 1, 100000 do big[i] = t end
    local ok, err = pcall(json.encode, big)
    return { ok, tostring(err) }
  end)
  return { decode = a, encode = b, small = #json.decode("[" .. ("1,"):rep(1000) .. "1]") }'''))
        db = os.path.join(self.w.path, "peak.db")
        rc, _, err, base = self.ml_peak("run", "small.lua", "--db", db)
        self.assertEqual(rc, 0, err)
        rc, out, err, peak = self.ml_peak("run", "big.lua", "--db", db)
        self.assertEqual(rc, 0, err)
        res = json.loads(out)
        for what in ("decode", "encode"):
            self.assertEqual(res[what][0], False, res)
            self.assertIn("json.%s: " % what, res[what][1])
            self.assertIn("the run's memory budget of 32.0 MB", res[what][1])
            self.assertIn(MEMORY, res[what][1])
        self.assertIn("at $[", res["encode"][1])  # where it stopped
        self.assertEqual(res["small"], 1001)
        # The text (8 MB) and the tree (at most 32 MB) on top of a trivial
        # run; without the bound, 320 MB and more.
        self.assertLess(peak - base, 150 * 1024, (base, peak))

    def test_pathological_pattern_with_a_small_input_ends(self):
        # The point is that small inputs end, not that they fit a slice of
        # 250 ms on a loaded machine: a budget of 3 s here.
        set_limits(self.w, 3)
        self.w.write("p.lua", in_step(
            'local s = ("a"):rep(20)\n'
            'return { found = string.find(s, ("a*"):rep(5) .. "b") ~= nil,\n'
            '         m = s:match("^(a-)a-a-$"), g = (s:gsub("a-", "")) }'))
        r, cpu = cpu_of(lambda: self.w.ml("run", "p.lua", check=0, timeout=30))
        self.assertLess(cpu, 5)
        self.assertEqual(json.loads(r.stdout), {"found": False, "m": "", "g": "a" * 20})


# Runs that behave: several quick steps and a 200 ms HTTP call.
GOOD = r'''
return { id = "good", run = function(ctx)
  local n = 0
  for i = 1, 5 do n = n + ctx.step.run("quick", function() return i end) end
  local slow = ctx.step.run("slow", function() return http.get_json(env.STANDIN .. "/slow") end)
  return { n = n, slow = slow.ok }
end }
'''


class ServeKeepsServingTest(TestCase):
    config = {"limits": LIMITS}

    def setUp(self):
        super().setUp()

        def slow(h, body, n):
            time.sleep(0.2)
            return 200, {"ok": True}
        self.si.routes["/slow"] = slow

    def test_runaway_runs_fail_while_other_runs_complete(self):
        ws = os.path.join(self.w.path, "ws")
        self.w.write("ws/good.lua", GOOD)
        names = sorted(CASES)
        for name in names:
            self.w.write("ws/%s.lua" % name, CASES[name][0].replace(
                "return { run", 'return { id = "%s", run' % name.replace("_", "-"), 1))
        # a file whose top level never ends is rejected; the others load
        self.w.write("ws/zz-top-loop.lua", "while true do end\n")
        p = self.w.start("serve", "--workspace", ws, "--listen", "127.0.0.1:0")
        wait_until(lambda: len(self.w.json("skills")) >= len(names) + 1, timeout=20,
                   what="the engine to load the skills")
        ids = {}
        ids["good-before"] = self.w.ml("invoke", "good", check=0).stdout.split()[-1]
        for name in names:
            ids[name] = self.w.ml("invoke", name.replace("_", "-"), check=0).stdout.split()[-1]
        ids["good-during"] = self.w.ml("invoke", "good", check=0).stdout.split()[-1]

        def all_done():
            runs = {r["id"]: r for r in self.w.runs()}
            if all(runs.get(i, {}).get("status") in ("completed", "failed") for i in ids.values()):
                return runs
        wait_until(all_done, timeout=60, interval=0.1, what="every run to end")
        self.assertIsNone(p.poll(), "the engine died")
        for key in ("good-before", "good-during"):
            t = self.w.trace(ids[key])
            self.assertEqual(t["status"], "completed", (key, t.get("error")))
            self.assertEqual(t["output"], {"n": 15, "slow": True})
        for name in names:
            with self.subTest(case=name):
                t = self.w.trace(ids[name])
                self.assertEqual(t["status"], "failed")
                msg = t["error"]["message"]
                if CASES[name][1] == MEMORY and TIME in msg:
                    continue  # a slow build (ASan) ran out of time first: still stopped
                self.assertIn(CASES[name][1], msg)
        # after the kills: a new run completes
        after = self.w.ml("invoke", "good", "--wait", check=0, timeout=30)
        self.assertEqual(json.loads(after.stdout), {"n": 15, "slow": True})
        self.assertIsNone(p.poll(), "the engine died")
        skills = {s["id"]: s for s in self.w.json("skills")}
        # (sidecar) A rejected file is kept as its skill's load error, with no live version.
        self.assertIsNone(skills["zz-top-loop"]["version"])
        self.assertIn("without yielding", skills["zz-top-loop"]["error"]["message"])


if __name__ == "__main__":
    unittest.main()
