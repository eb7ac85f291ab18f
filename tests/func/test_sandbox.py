"""The skill sandbox: what skill code must not reach, from every place it runs.

Each escape attempt runs three times in one skill: at the file's top level
(while the engine loads it), in the run function outside steps
(orchestration code) and inside a step body. An attempt is a Lua function
that returns what it could reach; it is blocked when it raises an error or
returns nil/false. The skill reports every outcome, so one run checks them
all and a failure names the attempt and the place.

Cross-skill tests run two skills in one `moonloop serve`: what one skill
changes must not be seen by the other.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from mltest import RUN_ENDED, TestCase, wait_until  # noqa: E402

# Lua: ATTEMPTS is a list of {name, where, fn}; `where` is "all", "run"
# (orchestration and step body: after the globals are frozen), "orch" or
# "step". probe(where, ctx) runs the ones that apply and returns
# {name = "blocked: ..." or "REACHED: ..."}.
PROBE = r'''
local ATTEMPTS = {}
local function add(name, where, fn) ATTEMPTS[#ATTEMPTS + 1] = { name = name, where = where, fn = fn } end

-- FACTS.md: what worked against a naive environment
add("load", "all", function() return load or loadstring or loadfile or dofile end)
add("load_call", "all", function() return load("return 1") end)
add("loadstring_call", "all", function() return loadstring("return _G")() end)
add("getfenv_0", "all", function() return getfenv(0) end)
add("getfenv_f", "all", function() return getfenv(print) end)
add("getfenv_level", "all", function() return getfenv(1) end)
add("setfenv_host", "all", function() return setfenv(json.encode, {}) end)
add("string_dump", "all", function() return string.dump end)
add("string_meta_dump", "all", function() return ("").dump end)
add("string_meta_dump_call", "all", function() return ("").dump(function() end) end)
add("string_metatable", "all", function() return getmetatable("") end)
add("string_meta_write_upper", "all", function()
  getmetatable("").__index.upper = function() return "pwned" end
  return ("a"):upper() == "pwned"
end)
add("string_meta_rawset", "all", function() return rawset(getmetatable(""), "__index", {}) end)
add("string_meta_setmetatable", "all", function() return setmetatable("", {}) end)
add("string_shared_table", "all", function()
  local saved = string.upper
  string.upper = function() return "pwned" end
  local r = ("a"):upper() == "pwned"
  string.upper = saved
  return r
end)
add("require_ffi", "all", function() return require("ffi") end)
add("package_preload_ffi", "all", function() return package.preload.ffi() end)
add("registry_preload_ffi", "all", function() return debug.getregistry()._PRELOAD.ffi() end)
add("debug", "all", function() return debug end)
add("jit_off", "all", function() jit.off() return true end)
add("jit", "all", function() return jit end)
add("collectgarbage_stop", "all", function() collectgarbage("stop") return true end)
add("module_seeall", "all", function() module("evil", package.seeall) return true end)
-- the runtime's real globals and the dangerous libraries
add("G_real_globals", "all", function()
  return rawget(_G, "io") or rawget(_G, "require") or rawget(_G, "package") or rawget(_G, "debug")
end)
add("io", "all", function() return io end)
add("io_open", "all", function() return io.open("/etc/passwd") end)
add("io_popen", "all", function() return io.popen("id") end)
add("os_execute", "all", function() return os.execute("true") end)
add("os_getenv", "all", function() return os.getenv("HOME") end)
add("os_exit", "all", function() return os.exit end)
add("os_remove", "all", function() return os.remove or os.rename or os.tmpname end)
add("os_setlocale", "all", function() return os.setlocale end)
add("coroutine", "all", function() return coroutine end)
add("newproxy", "all", function() return newproxy(true) end)
add("gcinfo", "all", function() return gcinfo() end)
-- tostring / tonumber tricks: they hand out strings and numbers only
add("tostring_tricks", "all", function()
  for _, v in ipairs({ print, json.null, env, log.info, json, http, fatal, string }) do
    if type(tostring(v)) ~= "string" then return v end
  end
  local ok = pcall(tostring, setmetatable({}, { __tostring = function() return {} end }))
  if ok then return "__tostring returned a table" end
  return tonumber("0x10") ~= 16 or tonumber(print)
end)
-- engine modules
add("env_write", "all", function() env.STANDIN = "changed" return env.STANDIN == "changed" end)
add("env_new_key", "all", function() env.NEW = 1 return true end)
add("env_rawset", "all", function() rawset(env, "NEW2", 1) return rawget(env, "NEW2") end)
add("env_metatable", "all", function() return getmetatable(env) end)
add("env_setmetatable", "all", function() setmetatable(env, nil) return true end)
add("env_values_by_pairs", "all", function()
  for k, v in pairs(env) do if type(v) == "table" then return v end end
end)
add("json_null_metatable", "all", function() return getmetatable(json.null) end)
add("json_array_metatable", "all", function() return getmetatable(json.decode("[1,2]")) end)
add("json_array_metatable_array", "all", function() return getmetatable(json.array({})) end)
add("fatal_metatable", "all", function() return getmetatable(fatal("x")) end)
add("log_metatable", "all", function() return getmetatable(log) or getmetatable(log.info) end)
add("error_object_from_host", "all", function()
  local ok, e = pcall(json.decode, "{")
  return type(e) ~= "string" and (e or "no error")
end)
-- the frozen globals
add("rawset_G_after_freeze", "run", function() rawset(_G, "sneaky", 1) return rawget(_G, "sneaky") end)
add("new_global_after_freeze", "run", function() sneaky2 = 1 return rawget(_G, "sneaky2") end)
add("setmetatable_G_after_freeze", "run", function() setmetatable(_G, nil) return true end)
add("getmetatable_G", "run", function() return getmetatable(_G) end)
-- runtime internals through ctx
add("ctx_pairs_state", "run", function(ctx)
  for k, v in pairs(ctx) do if type(k) ~= "string" then return v end end
end)
add("ctx_next_state", "run", function(ctx)
  local k, v = next(ctx)
  while k ~= nil do
    if type(k) ~= "string" then return v end
    k, v = next(ctx, k)
  end
end)
add("ctx_metatable", "run", function(ctx) return getmetatable(ctx) end)
add("ctx_rawget_state", "run", function(ctx)
  local mt = getmetatable(ctx)
  return mt and rawget(ctx, mt)
end)
add("ctx_step_upvalues", "run", function(ctx) return debug.getupvalue(ctx.step.run, 1) end)
add("ctx_step_env", "run", function(ctx) return getfenv(ctx.step.run) end)
add("error_object_from_step", "orch", function(ctx)
  local ok, e = pcall(ctx.step.run, "boom", function() error("inner") end, { retries = 0 })
  if ok then return "no error" end
  if getmetatable(e) then return getmetatable(e) end
  if type(e) == "table" then
    for k, v in pairs(e) do
      if type(v) ~= "string" and type(v) ~= "boolean" and type(v) ~= "number" then return k end
    end
  end
end)
-- http: only http and https
add("http_get_file_url", "step", function() return http.get("file:///etc/passwd") end)
add("http_request_file_url", "step", function()
  local r = http.request({ url = "file:///etc/passwd" })
  return r and r.body
end)
add("http_other_schemes", "step", function()
  for _, u in ipairs({ "ftp://127.0.0.1:1/", "gopher://127.0.0.1:1/", "dict://127.0.0.1:1/",
                       "scp://127.0.0.1:1/x", "tftp://127.0.0.1:1/x", "telnet://127.0.0.1:1/",
                       "ldap://127.0.0.1:1/", "smb://127.0.0.1:1/x", "FILE:///etc/passwd" }) do
    local r = http.request({ url = u })
    if r then return u end
  end
end)
add("http_redirect_to_file", "step", function() return http.get(env.STANDIN .. "/redirect-to-file") end)

local function probe(where, ctx)
  local out = {}
  for _, a in ipairs(ATTEMPTS) do
    if a.where == "all" or a.where == where or (a.where == "run" and where ~= "top") then
      local ok, v = pcall(a.fn, ctx)
      if not ok then
        out[a.name] = "blocked: " .. tostring(v)
      elseif v == nil or v == false then
        out[a.name] = "blocked: " .. tostring(v)
      else
        out[a.name] = "REACHED: " .. tostring(v)
      end
    end
  end
  return out
end

local function globals()
  local names = {}
  for k in pairs(_G) do names[#names + 1] = tostring(k) end
  table.sort(names)
  return names
end
'''

SKILL = PROBE + r'''
local top = probe("top", nil)
local top_globals = globals()
return {
  id = "probe",
  run = function(ctx)
    local orch = probe("orch", ctx)
    local step = ctx.step.run("probe", function() return { out = probe("step", ctx), globals = globals() } end)
    return { top = top, orch = orch, step = step.out, globals_top = top_globals, globals_step = step.globals }
  end,
}
'''

# What a skill's _G may hold: the whitelist of DESIGN.md and nothing else.
ALLOWED_GLOBALS = {
    "_G", "_VERSION", "assert", "error", "ipairs", "next", "pairs", "pcall", "xpcall", "rawequal",
    "rawget", "rawset", "select", "tonumber", "tostring", "type", "unpack", "setmetatable",
    "getmetatable", "string", "table", "math", "bit", "os", "print",
    "json", "http", "log", "env", "time", "fatal", "llm", "runs", "skills",
}
FORBIDDEN_GLOBALS = {
    "io", "require", "package", "load", "loadstring", "loadfile", "dofile", "debug", "ffi", "jit",
    "coroutine", "collectgarbage", "getfenv", "setfenv", "newproxy", "gcinfo", "module",
}


class SandboxTest(TestCase):
    config = {"limits": '{ run_seconds_between_yields = 0.5, run_memory = "16MB" }'}

    def setUp(self):
        super().setUp()
        self.si.routes["/redirect-to-file"] = lambda h, b, n: (
            302, "", {"Location": "file:///etc/passwd"})

    def run_probe(self):
        self.w.write("probe.lua", SKILL)
        r = self.w.ml("run", "probe.lua", check=0, timeout=30)
        return json.loads(r.stdout), self.run_id_of(r)

    def test_every_escape_is_blocked_at_top_level_in_orchestration_and_in_a_step(self):
        out, _ = self.run_probe()
        for where in ("top", "orch", "step"):
            self.assertGreater(len(out[where]), 40, where)
            for name, res in sorted(out[where].items()):
                with self.subTest(where=where, attempt=name):
                    self.assertTrue(res.startswith("blocked"), "%s at %s: %s" % (name, where, res))

    def test_globals_are_the_whitelist_only(self):
        out, _ = self.run_probe()
        for key in ("globals_top", "globals_step"):
            names = set(out[key])
            self.assertLessEqual(names, ALLOWED_GLOBALS, key)
            self.assertFalse(names & FORBIDDEN_GLOBALS, key)
            self.assertIn("print", names)

    def test_os_is_time_date_clock_only_and_string_has_no_dump(self):
        self.w.write("s.lua", r'''
local function keys(t) local r = {} for k in pairs(t) do r[#r + 1] = k end table.sort(r) return r end
return { run = function(ctx) return { os = keys(os), has_dump = string.dump ~= nil or ("").dump ~= nil } end }
''')
        out = json.loads(self.w.ml("run", "s.lua", check=0).stdout)
        self.assertEqual(out["os"], ["clock", "date", "time"])
        self.assertFalse(out["has_dump"])

    def test_bytecode_file_is_refused(self):
        # A LuaJIT bytecode header: loading it must fail (text only), at check and at run.
        self.w.write("bc.lua", "\x1bLJ\x02\x0a\x00\x00return {}")
        r = self.w.ml("check", "bc.lua")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("not bytecode", r.stderr)
        r = self.w.ml("run", "bc.lua")
        self.assertEqual(r.returncode, 1)
        self.assertIn("not bytecode", r.stderr)

    def test_print_goes_to_the_run_log_not_stdout(self):
        self.w.write("p.lua", r'''
print("at load")
return { run = function(ctx)
  print("outside", 1, nil)
  return ctx.step.run("s", function() print("inside", true) return 7 end)
end }
''')
        r = self.w.ml("run", "p.lua", check=0)
        self.assertEqual(r.stdout.strip(), "7")  # stdout is the output, nothing else
        t = self.w.trace(self.run_id_of(r))
        logs = [l["msg"] for s in t["steps"] for l in s.get("logs", [])]
        self.assertIn("inside\ttrue", logs)
        text = json.dumps(t)
        self.assertIn("outside\\t1\\tnil", text)

    def test_check_runs_the_file_only_inside_the_sandbox(self):
        marker = os.path.join(self.w.path, "marker")
        self.w.write("evil.lua", r'''
local tries = {
  function() os.execute("touch %s") end,
  function() io.open("%s", "w"):write("x") end,
  function() require("ffi").C.system("touch %s") end,
  function() load("io.open('%s', 'w')")() end,
  function() package.loaded.os.execute("touch %s") end,
  function() getfenv(0).os.execute("touch %s") end,
}
for _, f in ipairs(tries) do pcall(f) end
return { run = function() end }
'''.replace("%s", marker))
        r = self.w.ml("check", "evil.lua")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(marker))
        # Unprotected, the first forbidden call is the error check reports.
        self.w.write("evil2.lua", 'os.execute("touch %s")\nreturn { run = function() end }\n' % marker)
        r = self.w.ml("check", "evil2.lua")
        self.assertEqual(r.returncode, 1)
        self.assertIn("execute", r.stderr)
        self.assertFalse(os.path.exists(marker))

    def test_os_getenv_says_to_read_env_and_fails_at_once(self):
        # What agents reach for first: it said only "attempt to call field
        # 'getenv' (a nil value)".
        self.w.write("g.lua", 'return { retries = 0, run = function(ctx)\n'
                     '  return ctx.step.run("home", function() return os.getenv("HOME") end)\nend }\n')
        r = self.w.ml("run", "g.lua", check=1)
        self.assertIn("attempt to call field 'getenv' (a nil value): os.getenv is not available in a "
                      "skill: read env.NAME, a variable the configuration grants", r.stderr)
        # Written out, `moonloop check` warns (the file still loads: a
        # pcall may expect the error).
        self.w.write("g2.lua", 'return { run = function(ctx)\n  return ctx.step.run("h", function() '
                     'return os.getenv("HOME") end)\nend }\n')
        r = self.w.ml("check", "g2.lua", check=0)
        self.assertIn("g2.lua:2: warning: os.getenv is not available in a skill", r.stdout + r.stderr)
        # Code may still test for what the sandbox lacks.
        self.w.write("g3.lua", 'return { run = function(ctx) return os.execute == nil and os.getenv == nil end }\n')
        self.assertEqual(self.w.ml("run", "g3.lua", check=0).stdout.strip(), "true")

    def test_a_step_without_its_id_says_so(self):
        self.w.write("n.lua", 'return { run = function(ctx) return ctx.step.run(function() return 1 end) end }\n')
        r = self.w.ml("run", "n.lua", check=1)
        self.assertIn('step.run: the first argument is the step\'s id, a name such as "fetch", got a '
                      'function: write step.run("fetch", function() ... end)', r.stderr)
        self.w.write("n2.lua", 'return { run = function(ctx) return ctx.step.sleep(5) end }\n')
        r = self.w.ml("run", "n2.lua", check=1)
        self.assertIn("step.sleep: the first argument is the step's id, a name such as \"fetch\", got a number",
                      r.stderr)

    def test_nul_bytes_are_refused_or_shown_never_lost(self):
        # JSON text here carries no NUL: an error holding one was lost
        # ("(no error recorded)"), a step id holding one was stored cut short
        # (its run failed on every replay), a skill name was looked up cut.
        cases = {
            "err": ('ctx.step.run("s", function() error("bad\\0thing") end)', "bad\\0thing"),
            "fatal": ('error(fatal("x\\0y"))', "x\\0y"),
            "id": ('ctx.step.run("fetch\\0x", function() return 1 end)',
                   "bad step id 'fetch\\0x': at most 200 characters, no '#' and no NUL byte"),
            "skill": ('ctx.step.invoke("c", { skill = "err\\0x" })',
                      "the skill given (op INVOKE) holds a NUL byte (\\0), which names nothing"),
        }
        for name, (body, want) in cases.items():
            self.w.write(name + ".lua", 'return { retries = 0, run = function(ctx)\n  %s\nend }\n' % body)
            r = self.w.ml("run", name + ".lua", check=1)
            self.assertIn(want, r.stderr, name)
            self.assertIn(want, self.w.trace(self.run_id_of(r))["error"]["message"], name)

    def test_error_values_and_tracebacks_do_not_carry_runtime_tables(self):
        self.w.write("e.lua", r'''
return { run = function(ctx)
  ctx.step.run("fails", function() error({ code = 42 }) end, { retries = 0 })
end }
''')
        r = self.w.ml("run", "e.lua")
        self.assertEqual(r.returncode, 1)
        t = self.w.trace(self.run_id_of(r))
        self.assertEqual(t["status"], "failed")
        blob = json.dumps(t)
        self.assertNotIn("moonloop/run.lua", blob)
        self.assertNotIn("moonloop/sandbox.lua", blob)


# Cross-skill: skill "tamper" changes everything it can reach, at load and
# in its run; skill "victim" then checks that it sees the stock behaviour.
TAMPER = r'''
local pcall, pairs, type, getmetatable = pcall, pairs, type, getmetatable
local function tamper(ctx)
  local function try(f) pcall(f) end
  try(function() string.upper = function() return "pwned" end end)
  try(function() string.rep = function() return "pwned" end end)
  try(function() string.format = function() return "pwned" end end)
  try(function() table.insert = function() error("pwned") end end)
  try(function() table.concat = function() return "pwned" end end)
  try(function() math.floor = function() return -1 end end)
  try(function() math.max = function() return -1 end end)
  try(function() bit.band = function() return -1 end end)
  try(function() os.time = function() return 0 end end)
  try(function() json.encode = function() return "pwned" end end)
  try(function() json.decode = function() return "pwned" end end)
  try(function() json.null = "pwned" end)
  try(function() time.now = function() return 0 end end)
  try(function() http.get = function() return "pwned" end end)
  try(function() log.info = function() error("pwned") end end)
  try(function() getmetatable("").__index.lower = function() return "pwned" end end)
  try(function() getmetatable(json.decode("[1]")).__index = function() return "pwned" end end)
  try(function() getmetatable(json.array({})).__newindex = function() error("pwned") end end)
  try(function() getmetatable(fatal("x")).__tostring = function() return "pwned" end end)
  try(function() _G.pcall = nil end)
  try(function() print = function() error("pwned") end end)
  if ctx then
    try(function() getmetatable(ctx).__index = function() return "pwned" end end)
    try(function() for k, v in pairs(ctx) do if type(k) == "table" then k.__index = function() return "pwned" end end end end)
  end
end
tamper(nil)
return { id = "tamper", run = function(ctx)
  tamper(ctx)
  ctx.step.run("t", function() tamper(ctx) return true end)
  return "tampered"
end }
'''

VICTIM = r'''
local function look(ctx)
  local bad = {}
  local function want(name, ok) if not ok then bad[#bad + 1] = name end end
  local function try(name, f) local ok, v = pcall(f) want(name, ok and v) end
  try("string.upper", function() return string.upper("a") == "A" and ("a"):upper() == "A" end)
  try("string.lower", function() return ("A"):lower() == "a" and string.lower("A") == "a" end)
  try("string.rep", function() return ("ab"):rep(2) == "abab" and string.rep("x", 3) == "xxx" end)
  try("string.format", function() return string.format("%d", 5) == "5" end)
  try("table.insert", function() local t = {} table.insert(t, 1) return t[1] == 1 end)
  try("table.concat", function() return table.concat({ "a", "b" }) == "ab" end)
  try("math", function() return math.floor(1.5) == 1 and math.max(1, 2) == 2 end)
  try("bit", function() return bit.band(3, 1) == 1 end)
  try("os.time", function() return os.time() > 1000000000 end)
  try("json", function() return json.encode({ 1 }) == "[1]" and json.decode("[1]")[1] == 1 end)
  try("json.null", function() return type(json.null) == "userdata" end)
  try("json array index", function() return json.decode("[1]")[2] == nil end)
  try("json array write", function() local a = json.array({}) a[1] = 1 return a[1] == 1 end)
  try("time", function() return time.now() > 1000000000 end)
  try("http", function() return type(http.get) == "function" and http.get ~= nil end)
  try("log", function() log.info("victim log") return true end)
  try("print", function() print("victim print") return true end)
  try("pcall", function() return pcall(function() end) end)
  try("fatal", function() return tostring(fatal("m")) == "m" end)
  if ctx then
    try("ctx.run_id", function() return type(ctx.run_id) == "string" and ctx.run_id ~= "pwned" end)
    try("ctx.attempt", function() return ctx.attempt == nil or ctx.attempt == 1 end)
  end
  return bad
end
local at_load = look(nil)
return { id = "victim", run = function(ctx)
  local orch = look(ctx)
  local step = ctx.step.run("v", function() return look(ctx) end)
  return { load = at_load, orch = orch, step = step }
end }
'''

# The shared tables that ctx hands out: ctx.step and ctx.log.
TAMPER_CTX = r'''
return { id = "tamper-ctx", run = function(ctx)
  pcall(function() ctx.step.run = function(id, fn) return "pwned" end end)
  pcall(function() ctx.step.sleep = function() return "pwned" end end)
  pcall(function() ctx.log.info = function() error("pwned") end end)
  return "tampered"
end }
'''

VICTIM_CTX = r'''
return { id = "victim-ctx", run = function(ctx)
  ctx.log.info("victim ctx log")
  return ctx.step.run("v", function() return "stock" end)
end }
'''


class CrossSkillTest(TestCase):
    config = {"limits": '{ run_seconds_between_yields = 0.5, run_memory = "16MB" }'}

    def serve(self, skills):
        ws = os.path.join(self.w.path, "ws")
        for name, src in skills.items():
            self.w.write(os.path.join("ws", name + ".lua"), src)
        self.w.start("serve", "--workspace", ws, "--listen", "127.0.0.1:0")
        wait_until(lambda: len(self.w.json("skills")) == len(skills), timeout=10,
                   what="the engine to register the skills")

    def invoke_and_wait(self, skill):
        r = self.w.ml("invoke", skill, check=0)
        run_id = r.stdout.strip().split()[-1]

        def done():
            t = self.w.trace(run_id)
            return t if t["status"] in RUN_ENDED else None
        return wait_until(done, timeout=15, what="run of " + skill)

    def test_what_one_skill_changes_another_does_not_see(self):
        self.serve({"tamper": TAMPER, "victim": VICTIM})
        t = self.invoke_and_wait("tamper")
        self.assertEqual(t["status"], "completed", t.get("error"))
        v = self.invoke_and_wait("victim")
        self.assertEqual(v["status"], "completed", v.get("error"))
        for where in ("load", "orch", "step"):
            self.assertFalse(v["output"][where], where)  # the list of what looked tampered

    def test_ctx_step_and_ctx_log_are_not_shared_between_runs(self):
        """One skill replacing ctx.step.run or ctx.log.info must not change them for others.

        KNOWN HOLE, outside the sandbox's files: lua/run.lua hands every run
        the same two tables (ctx.step is run.step, ctx.log is
        run.shared_log), so an assignment to ctx.step.run or ctx.log.info in
        one skill changes them for every run of every skill in the engine.
        The fix belongs in run.lua (a read-only view per run); then remove
        the expectedFailure mark.
        """
        self.serve({"tamper-ctx": TAMPER_CTX, "victim-ctx": VICTIM_CTX})
        t = self.invoke_and_wait("tamper-ctx")
        self.assertEqual(t["status"], "completed", t.get("error"))
        v = self.invoke_and_wait("victim-ctx")
        self.assertEqual(v["status"], "completed", v.get("error"))
        self.assertEqual(v["output"], "stock")
        self.assertEqual([s["id"] for s in v["steps"]], ["v"])
        self.assertIn("victim ctx log", json.dumps(v))


# string.find/match/gmatch/gsub in the sandbox are the engine's own (they
# check the time budget as they go): they must answer as LuaJIT's do. The
# expected values were produced by LuaJIT's built-in functions.
PATTERNS = r'''local CASES = {
  { "find", "hello world", "o w" }, { "find", "hello world", "l+" }, { "find", "a.c", ".", 1, true },
  { "find", "abc", "", 10 }, { "find", "abc", "b", -100 }, { "find", "key=val", "(%w+)=(%w+)" },
  { "find", "a\0b", "%z" }, { "find", "THE (quick) fox", "%((%a+)%)" }, { "find", "THE (quick) fox", "%f[%a]%a+", 5 },
  { "match", "  trim  ", "^%s*(.-)%s*$" }, { "match", "2024-01-02", "(%d+)-(%d+)-(%d+)" }, { "match", "abc", "()b()" },
  { "match", "f(a(b)c)d", "%b()" }, { "match", "x = 10", "^(%w+)%s*=%s*(%d+)$" }, { "match", "aaa", "a-b" },
  { "match", "hello", "(h)(e)(l)(l)(o)" }, { "match", "[tag]", "%[(.-)%]" }, { "match", "abab", "(ab)%1" },
  { "match", "abc", "[%a-]+" }, { "match", "a-b", "[a-]+" }, { "match", "x!y", "%p" }, { "match", "é", "%a" },
  { "gsub", "hello world", "o", "0" }, { "gsub", "hello world", "(%w+)", "<%1>" }, { "gsub", "abc", "", "-" },
  { "gsub", "abc", "%w", "%0%0" }, { "gsub", "hello", "l", { l = "L" } }, { "gsub", "abc", "x*", "-", 2 },
  { "gsub", "abc", "^a", "A" }, { "gsub", "a b c", "%s", "%%" }, { "gsub", "abc", "(b)", "%2" },
  { "gsub", "abc", "[", "x" }, { "gsub", "abc", "%", "x" }, { "gsub", "abc", "(", "x" }, { "gsub", "abc", "%f", "x" },
  { "gmatch", "one two  three", "%a+" }, { "gmatch", "k1=v1, k2=v2", "(%w+)=(%w+)" }, { "gmatch", "abc", "" },
  { "gmatch", "abc", "x*" }, { "gmatch", "^a^a", "^a" },
}
local function q(...) local t = { n = select("#", ...), ... } local p = {} for i = 1, t.n do p[i] = string.format("%q", tostring(t[i])) end return table.concat(p, ",") end
local function one(c)
  local f, args = c[1], { unpack(c, 2) }
  if f == "gmatch" then
    return q(pcall(function() local t = {} for a, b in string.gmatch(args[1], args[2]) do t[#t + 1] = tostring(a) .. "/" .. tostring(b) end return table.concat(t, ";") end))
  end
  return q(pcall(string[f], unpack(args, 1, table.maxn(args))))
end
return { run = function(ctx)
  local out = {}
  for i, c in ipairs(CASES) do out[i] = one(c) end
  return out
end }
'''

PATTERNS_EXPECTED = [
    "\"true\",\"5\",\"7\"",
    "\"true\",\"3\",\"4\"",
    "\"true\",\"2\",\"2\"",
    "\"true\",\"4\",\"3\"",
    "\"true\",\"2\",\"2\"",
    "\"true\",\"1\",\"7\",\"key\",\"val\"",
    "\"true\",\"2\",\"2\"",
    "\"true\",\"5\",\"11\",\"quick\"",
    "\"true\",\"6\",\"10\"",
    "\"true\",\"trim\"",
    "\"true\",\"2024\",\"01\",\"02\"",
    "\"true\",\"2\",\"3\"",
    "\"true\",\"(a(b)c)\"",
    "\"true\",\"x\",\"10\"",
    "\"true\",\"nil\"",
    "\"true\",\"h\",\"e\",\"l\",\"l\",\"o\"",
    "\"true\",\"tag\"",
    "\"true\",\"ab\"",
    "\"true\",\"abc\"",
    "\"true\",\"a-\"",
    "\"true\",\"!\"",
    "\"true\",\"nil\"",
    "\"true\",\"hell0 w0rld\",\"2\"",
    "\"true\",\"<hello> <world>\",\"2\"",
    "\"true\",\"-a-b-c-\",\"4\"",
    "\"true\",\"aabbcc\",\"3\"",
    "\"true\",\"heLLo\",\"2\"",
    "\"true\",\"-a-bc\",\"2\"",
    "\"true\",\"Abc\",\"1\"",
    "\"true\",\"a%b%c\",\"2\"",
    "\"false\",\"invalid capture index\"",
    "\"false\",\"malformed pattern (missing ']')\"",
    "\"false\",\"malformed pattern (ends with '%')\"",
    "\"true\",\"xaxbxcx\",\"4\"",
    "\"false\",\"missing '[' after '%f' in pattern\"",
    "\"true\",\"one/nil;two/nil;three/nil\"",
    "\"true\",\"k1/v1;k2/v2\"",
    "\"true\",\"/nil;/nil;/nil;/nil\"",
    "\"true\",\"/nil;/nil;/nil;/nil\"",
    "\"true\",\"^a/nil;^a/nil\""
    ]


class PatternFunctionsTest(TestCase):
    def test_pattern_functions_answer_as_luajits_builtins(self):
        self.w.write("pat.lua", PATTERNS)
        out = json.loads(self.w.ml("run", "pat.lua", check=0).stdout)
        self.assertEqual(len(out), len(PATTERNS_EXPECTED))
        for i, (got, want) in enumerate(zip(out, PATTERNS_EXPECTED)):
            with self.subTest(case=i + 1):
                self.assertEqual(got, want)


if __name__ == "__main__":
    unittest.main()
