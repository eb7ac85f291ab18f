"""Shared read-only views are really read-only.

ctx.step and ctx.log are shared by every run; the modules and library tables
a skill sees (json, http, llm, runs, skills, log, env, time, string, table,
math, bit, os) and its globals are shared by all runs of the skill. They
were read-only only to `view.k = v`: `table.insert(ctx.step, x)` and
`rawset(json, ...)` succeeded, `json.array(ctx.step)` replaced the view's
metatable (from C, past its protection), and what one run wrote every
other run saw. Each is now a view with no raw storage of its own, and every
writer is refused: assignment, rawset, table.insert/remove/sort,
setmetatable, json.array and json.object.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from lualib import TestCase  # noqa: E402

VIEWS = ["ctx.step", "ctx.log", "json", "http", "llm", "runs", "skills", "log", "env", "time",
         "string", "table", "math", "bit", "os", "_G"]

WRITES = {
    "assign_new": "v.zz_new = 1",
    "assign_existing": "v[next(v) or 'x'] = 1",
    "rawset": 'rawset(v, "zz_raw", 1)',
    "table_insert": 'table.insert(v, "zz")',
    "table_insert_at": 'table.insert(v, 1, "zz")',
    "table_remove": "table.remove(v)",
    "table_sort": "table.sort(v)",
    "setmetatable": "setmetatable(v, {})",
    "json_array": "json.array(v)",
    "json_object": "json.object(v)",
}

PROBE = '''
local VIEWS = { %s }
local function view(ctx, name)
  if name == "ctx.step" then return ctx.step elseif name == "ctx.log" then return ctx.log end
  return _G[name]
end
return { id = "probe", run = function(ctx)
  local out = {}
  for _, name in ipairs(VIEWS) do
    out[name] = {}
%s
    -- What is left on the view: no raw key, no new key seen by pairs.
    local v = view(ctx, name)
    local raw = next(v) ~= nil and rawget(v, (next(v))) ~= nil
    local keys = {}
    for k in pairs(v) do if tostring(k):find("^zz") or k == 1 then keys[#keys + 1] = tostring(k) end end
    out[name].left = (raw or #keys > 0 or #v > 0) and table.concat(keys, ",") or false
  end
  -- The views still work.
  out.works = ctx.step.run("still", function()
    return json.encode({ a = string.upper("x"), n = math.floor(2.5), t = type(table.concat) })
  end)
  return out
end }
'''


def probe_source():
    tries = []
    for wname, code in WRITES.items():
        tries.append('    out[name].%s = select(2, pcall(function() local v = view(ctx, name) %s end)) or "WROTE"'
                     % (wname, code))
    return PROBE % (", ".join('"%s"' % v for v in VIEWS), "\n".join(tries))


class ViewsTest(TestCase):
    def test_every_writer_is_refused_on_every_shared_view(self):
        self.w.write("probe.lua", probe_source())
        for attempt in (1, 2):  # a second run sees the views as the first left them
            r = self.w.ml("run", "probe.lua", check=0)
            out = json.loads(r.stdout)
            self.assertEqual(json.loads(out["works"]), {"a": "X", "n": 2, "t": "function"})
            for name in VIEWS:
                for wname in WRITES:
                    with self.subTest(view=name, write=wname, run=attempt):
                        msg = out[name][wname]
                        self.assertNotEqual(msg, "WROTE", "%s: %s succeeded" % (name, wname))
                with self.subTest(view=name, run=attempt):
                    self.assertIs(out[name]["left"], False, "%s has raw content after the writes" % name)

    def test_in_serve_one_run_cannot_change_what_the_next_sees(self):
        os.makedirs(os.path.join(self.w.path, "skills"))
        self.w.write("skills/tamper.lua", '''
return { id = "tamper", run = function(ctx)
  local before = { step = type(ctx.step.run), encode = json.encode({ 1 }), upper = string.upper("a"),
                   n = 0 }
  for k in pairs(ctx.step) do before.n = before.n + 1 end
  for _, f in ipairs({
    function() ctx.step.run = nil end, function() rawset(ctx.step, "run", print) end,
    function() table.insert(ctx.step, print) end, function() json.encode = nil end,
    function() rawset(string, "upper", string.lower) end, function() string = nil end,
    function() _G.json = nil end, function() table.insert(_G, 1) end,
  }) do pcall(f) end
  return before
end }
''')
        p = self.w.serve("--workspace", "skills", "--listen", "127.0.0.1:0")
        outs = [self.w.ml("invoke", "tamper", "--wait", check=0).stdout for _ in range(3)]
        self.assertEqual(len(set(outs)), 1, outs)
        self.assertEqual(json.loads(outs[0]), {"step": "function", "encode": "[1]", "upper": "A",
                                               "n": 7})
        self.assertIsNone(p.poll())

    def test_pairs_walks_a_view_without_handing_out_what_is_behind_it(self):
        self.w.write("p.lua", '''
return { id = "p", run = function(ctx)
  local names = {}
  for k, v in pairs(json) do names[#names + 1] = k end
  table.sort(names)
  local f, state = pairs(json)
  return { names = names, state_is_the_view = state == json, next_works = next(ctx.step) ~= nil }
end }
''')
        out = json.loads(self.w.ml("run", "p.lua", check=0).stdout)
        self.assertIn("encode", out["names"])
        self.assertIn("decode", out["names"])
        self.assertTrue(out["state_is_the_view"])
        self.assertTrue(out["next_works"])

    def test_a_top_level_may_add_to_its_own_copies_while_it_loads(self):
        self.w.write("t.lua", '''
function string.trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end
table.last = function(t) return t[#t] end
return { id = "t", run = function(ctx)
  local ok = pcall(function() string.trim2 = string.trim end)
  return { trimmed = string.trim("  x  "), last = table.last({ 1, 2 }), added_later = ok }
end }
''')
        out = json.loads(self.w.ml("run", "t.lua", check=0).stdout)
        self.assertEqual(out, {"trimmed": "x", "last": 2, "added_later": False})

    def test_globals_cannot_be_replaced_by_a_run(self):
        self.w.write("g.lua", '''
local N = 1
return { id = "g", run = function(ctx)
  local out = {}
  for i, f in ipairs({ function() json = nil end, function() print = nil end,
                       function() rawset(_G, "x", 1) end, function() _G.undefined_yet = 1 end }) do
    local ok, e = pcall(f)
    out[i] = ok and "WROTE" or e
  end
  return out
end }
''')
        out = json.loads(self.w.ml("run", "g.lua", check=0).stdout)
        for msg in out:
            self.assertNotEqual(msg, "WROTE")
        self.assertIn("cannot set global 'json'", out[0])
        self.assertIn("read-only", out[2])


if __name__ == "__main__":
    unittest.main()
