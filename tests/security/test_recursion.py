"""Recursion through C code that calls back into Lua cannot crash the engine.

LuaJIT bounds each coroutine's Lua stack, not the C stack: a C function
that calls Lua (string.gsub's function or table, table.sort's comparator
or __lt, string.format's __tostring, os.time's table with an __index,
skills.check loading a skill that calls skills.check) nests a C frame per
level. The smallest killer, `local function f(n) return (("x"):gsub("x",
function() return f(n+1) end)) end`, took about 9 KB of C stack a level and
crashed the engine (SIGSEGV) from a run, a file's top level, a PUT and
`moonloop check`. Each such call now checks the thread's C stack first
(lrt.h's guard): deep recursion is a Lua error naming "stack overflow".

Every case runs at a skill's top level (moonloop check, also under a 2 MB
stack; PUT; a file saved in the workspace), in a run (orchestration code
and a step body) and in the REPL; the engine survives each and reports a
Lua error, and a well-behaved skill still runs afterwards.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from lualib import (TestCase, alive, api, invoke_wait, ml_with_stack, put_skill,  # noqa: E402
                    signal_of, wait_until)

OVERFLOW = "stack overflow"

# name -> Lua that defines boom(), which recurses without end through C.
CASES = {
    "gsub_function": '''
local function f(n) return (("x"):gsub("x", function() return f(n + 1) end)) end
local function boom() return f(1) end''',
    "gsub_library_form": '''
local function f(n) return (string.gsub("x", "x", function() return f(n + 1) end)) end
local function boom() return f(1) end''',
    "gsub_table_index": '''
local t
t = setmetatable({}, { __index = function() return (("x"):gsub("x", t)) end })
local function boom() return (("x"):gsub("x", t)) end''',
    "sort_comparator": '''
local function f() table.sort({ 3, 1, 2 }, function(a, b) f() return a < b end) end
local function boom() return f() end''',
    "sort_lt_metamethod": '''
local mt = {}
mt.__lt = function(a, b) table.sort({ setmetatable({}, mt), setmetatable({}, mt) }) return false end
local function boom() table.sort({ setmetatable({}, mt), setmetatable({}, mt) }) end''',
    "format_tostring": '''
local t = setmetatable({}, { __tostring = function(self) return string.format("%s", self) end })
local function boom() return string.format("%s", t) end''',
    "format_method_tostring": '''
local t = setmetatable({}, { __tostring = function(self) return ("%s"):format(self) end })
local function boom() return ("%s"):format(t) end''',
    "os_time_index": '''
local t
t = setmetatable({}, { __index = function() return os.time(t) end })
local function boom() return os.time(t) end''',
    "tostring_metamethod": '''
local t = setmetatable({}, { __tostring = function(self) return tostring(self) .. "" end })
local function boom() return tostring(t) end''',
    "index_metamethod": '''
local t
t = setmetatable({}, { __index = function(_, k) return t[k] end })
local function boom() return t.a end''',
    "concat_metamethod": '''
local mt = {}
mt.__concat = function(a, b) return setmetatable({}, mt) .. b end
local function boom() return setmetatable({}, mt) .. "x" end''',
    "plain_recursion": '''
local function f(n) return 1 + f(n + 1) end
local function boom() return f(1) end''',
}

# Deep values through the JSON module: bounded by its own depth limits.
JSON_CASES = {
    "json_encode_deep": ('''
local function boom()
  local t = {}
  local c = t
  for i = 1, 100000 do c[1] = {} c = c[1] end
  return json.encode(t)
end''', "nested deeper"),
    "json_decode_deep": ('''
local function boom() return json.decode(("["):rep(100000)) end''', "nested deeper"),
}

ALL = dict((k, (v, OVERFLOW)) for k, v in CASES.items())
ALL.update(JSON_CASES)

GOOD = 'return { id = "good", run = function(ctx) return ctx.step.run("a", function() return 42 end) end }\n'


def top_level(defs, skill_id):
    return "%s\nboom()\nreturn { id = %r, run = function() return 1 end }\n" % (defs, skill_id)


def in_step(defs, skill_id):
    return ('%s\nreturn { id = %r, retries = 0, run = function(ctx)\n'
            '  return ctx.step.run("deep", function() return boom() end)\nend }\n' % (defs, skill_id))


def in_orchestration(defs, skill_id):
    return ('%s\nreturn { id = %r, run = function(ctx)\n'
            '  ctx.step.run("before", function() return 1 end)\n  return boom()\nend }\n' % (defs, skill_id))


def ident(name):
    return name.replace("_", "-")


class RecursionCheckTest(TestCase):
    """moonloop check of a file whose top level recurses: exit 1, never a signal."""

    def test_check_reports_a_lua_error(self):
        for name, (defs, want) in ALL.items():
            with self.subTest(case=name):
                self.w.write(name + ".lua", top_level(defs, ident(name)))
                r = self.w.ml("check", name + ".lua", timeout=60)
                self.assertIsNone(signal_of(r.returncode), "check was killed by a signal: %s" % r.stderr)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(want, r.stderr)
                self.assertIn(name + ".lua", r.stderr)

    def test_check_with_a_small_stack(self):
        # A 2 MB stack (ulimit -s 2048): the guard measures the stack the
        # thread has, so even the cases whose C frames are small (string.format,
        # os.time, which LuaJIT's own Lua stack limit stopped on 8 MB) stay errors.
        for name, (defs, want) in ALL.items():
            with self.subTest(case=name):
                self.w.write(name + ".lua", top_level(defs, ident(name)))
                r = ml_with_stack(self.w, 2 << 20, "check", name + ".lua")
                self.assertIsNone(signal_of(r.returncode), "check was killed by a signal: %s" % r.stderr)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(want, r.stderr)

    def test_the_message_names_the_function_and_the_line(self):
        self.w.write("g.lua", top_level(CASES["gsub_function"], "g"))
        r = self.w.ml("check", "g.lua", check=1)
        self.assertIn("g.lua:2: stack overflow: string.gsub calls back into Lua too deeply nested",
                      r.stderr)


class RecursionRunTest(TestCase):
    """moonloop run: the run fails with the error; the process exits 1."""

    def setUp(self):
        super().setUp()
        # As RecursionServeTest: the stack guard, not the time between
        # yields, must stop each case (in the ASan build a recursion through
        # string.format's __tostring took a second to reach the guard, and
        # the slice stopped it first, 1 run in 3).
        with open(os.path.join(self.w.path, "moonloop.conf.lua")) as f:
            conf = f.read()
        self.w.write("moonloop.conf.lua", conf.replace(
            "return {", "return {\n  limits = { run_seconds_between_yields = 20 },", 1))

    def test_in_a_step_body_and_in_orchestration(self):
        for name, (defs, want) in ALL.items():
            for where, make in (("step", in_step), ("orchestration", in_orchestration)):
                with self.subTest(case=name, where=where):
                    f = "%s_%s.lua" % (name, where)
                    self.w.write(f, make(defs, ident(name) + "-" + where))
                    r = self.w.ml("run", f, timeout=60)
                    self.assertIsNone(signal_of(r.returncode), r.stderr)
                    self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                    self.assertIn(want, r.stderr)
                    t = self.w.trace(self.run_id_of(r))
                    self.assertEqual(t["status"], "failed")
                    self.assertIn(want, t["error"]["message"])

    def test_the_error_can_be_caught(self):
        # A Lua error like any other: pcall catches it, the run goes on.
        self.w.write("c.lua", CASES["gsub_function"] + '''
return { id = "c", run = function(ctx)
  local ok, e = pcall(boom)
  return ctx.step.run("after", function() return { ok = ok, overflow = tostring(e):find("stack overflow", 1, true) ~= nil } end)
end }
''')
        r = self.w.ml("run", "c.lua", check=0)
        self.assertEqual(r.stdout.strip(), '{"ok":false,"overflow":true}')


class RecursionServeTest(TestCase):
    """One engine takes every case through PUT, the workspace and runs, and keeps serving."""

    def setUp(self):
        super().setUp()
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/good.lua", GOOD)
        # A slice long enough that the C stack guard, not the time between
        # yields, is what stops each case, even on a loaded machine (a case
        # that recursed for 1 s under load was stopped by the slice instead).
        with open(os.path.join(self.w.path, "moonloop.conf.lua")) as f:
            conf = f.read()
        self.w.write("moonloop.conf.lua", conf.replace(
            "return {", "return {\n  limits = { run_seconds_between_yields = 20 },", 1))
        self.p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")

    def assert_serving(self):
        self.assertTrue(alive(self.p), "the engine died: %s" % signal_of(self.p.poll()))
        st, b = invoke_wait(self.p.port, "good")
        self.assertEqual(st, 200, b)
        self.assertEqual(b["output"], 42)

    def test_put_of_a_recursing_top_level_is_refused(self):
        for name, (defs, want) in ALL.items():
            with self.subTest(case=name):
                st, b = put_skill(self.p.port, ident(name), top_level(defs, ident(name)))
                self.assertEqual(st, 400, b)
                self.assertIn(want, b["error"]["message"])
                self.assertTrue(alive(self.p))
        self.assert_serving()

    def test_a_recursing_file_saved_in_the_workspace_is_rejected(self):
        for name, (defs, want) in ALL.items():
            self.w.write("skills/%s.lua" % name, top_level(defs, ident(name)))
        for name, (defs, want) in ALL.items():
            with self.subTest(case=name):
                def rejected():
                    st, b = api(self.p.port, "GET", "/v1/skills/" + ident(name))
                    return st == 200 and b.get("error") and b
                b = wait_until(rejected, timeout=90, what="the watcher to reject %s" % name)
                self.assertIn(want, b["error"]["message"])
        self.assert_serving()

    def test_runs_that_recurse_fail_and_the_engine_goes_on(self):
        for name, (defs, want) in ALL.items():
            for where, make in (("step", in_step), ("orchestration", in_orchestration)):
                sid = "%s-%s" % (ident(name), where)
                st, b = put_skill(self.p.port, sid, make(defs, sid))
                self.assertEqual(st, 200, b)
        for name, (defs, want) in ALL.items():
            for where in ("step", "orchestration"):
                with self.subTest(case=name, where=where):
                    st, b = invoke_wait(self.p.port, "%s-%s" % (ident(name), where))
                    self.assertEqual(st, 200, b)
                    self.assertEqual(b["status"], "failed", b)
                    self.assertIn(want, b["error"]["message"])
                    self.assertTrue(alive(self.p))
        self.assert_serving()

    def test_skills_check_that_checks_itself_without_end(self):
        # skills.check loads the source inside the run: a source whose top
        # level checks itself nests a load per level (in C). It ends with
        # an error (the C stack guard, or the run's memory budget), never a crash.
        src = r'''
local q = 'local q = %q\nlocal r = skills.check(q:format(q))\nreturn { id = "q", run = function() return r end }'
return { id = "quine", run = function(ctx)
  return ctx.step.run("check", function() return skills.check(q:format(q)) end, { retries = 0 })
end }
'''
        st, b = put_skill(self.p.port, "quine", src)
        self.assertEqual(st, 200, b)
        st, b = invoke_wait(self.p.port, "quine")
        self.assertEqual(st, 200, b)
        self.assertIn(b["status"], ("completed", "failed"), b)
        if b["status"] == "failed":
            self.assertRegex(b["error"]["message"], "stack overflow|memory budget")
        self.assert_serving()

    def test_an_http_request_with_a_raising_metatable(self):
        # The request table reached C after the yield, outside any pcall: an
        # __index that raised there took the whole engine down.
        src = '''
return { id = "meta-req", retries = 0, run = function(ctx)
  return ctx.step.run("req", function()
    local req = setmetatable({ url = env.STANDIN .. "/x" }, { __index = function(_, k) error("no " .. k) end })
    return http.request(req).status
  end, { retries = 0 })
end }
'''
        st, b = put_skill(self.p.port, "meta-req", src)
        self.assertEqual(st, 200, b)
        st, b = invoke_wait(self.p.port, "meta-req")
        self.assertEqual(b["status"], "failed", b)
        # (whichever field the runtime reads first raises: the run fails, the engine serves on)
        self.assertRegex(b["error"]["message"], r"meta-req.lua:4: no (method|headers|json|body|timeout)")
        self.assert_serving()


class RecursionReplTest(TestCase):
    """The REPL reports the error and reads the next line."""

    # What the REPL has beyond a sandbox: the whole standard library.
    REPL_ONLY = [
        'local t = setmetatable({}, { __tostring = function(t) print(t) return "" end }) print(t)',
        "local function h() coroutine.wrap(h)() end h()",
        "local function g() local ok, e = coroutine.resume(coroutine.create(g)) if not ok then error(e, 0) end end g()",
    ]

    def test_repl_survives_every_case(self):
        lines = []
        for name, (defs, want) in ALL.items():
            lines.append(" ".join(l for l in defs.strip().splitlines()) + " boom()")
        lines += self.REPL_ONLY
        lines.append("print('still here', 6 * 7)")
        r = self.w.ml("repl", input="\n".join(lines) + "\n", timeout=240)
        self.assertIsNone(signal_of(r.returncode), r.stderr)
        out = r.stdout + r.stderr
        self.assertGreaterEqual(out.count(OVERFLOW), len(CASES) + len(self.REPL_ONLY), out[-2000:])
        self.assertIn("still here\t42", out)


if __name__ == "__main__":
    unittest.main()
