-- sandbox.lua: fresh environments for skill code.
--
-- A skill sees a whitelist: the safe part of the standard library, in its
-- own copies of the library tables, plus the engine's modules. Nothing in it
-- leads back to the runtime's real globals, `require`, the registry, `debug`,
-- `ffi` or `jit`. Chunks are loaded text-only (no bytecode) by the C side.
--
-- Every string shares one metatable; its __index is replaced by a copy of
-- the string library without `dump`, and the metatable is protected, so
-- `("").dump` and `getmetatable("").__index.x = ...` lead nowhere.
--
-- Metatables. The runtime hands skill code tables whose metatables it
-- shares between runs and skills (ctx, error values, json arrays, env). A
-- skill that could reach one of them could change how every other run
-- behaves, so skill code only ever sees metatables that skill code set:
-- getmetatable answers false for the others, rawset refuses tables whose
-- metatable is protected (__metatable set: the frozen globals, env), and
-- pairs/next skip keys that are not plain data (strings, numbers,
-- booleans) in tables that carry a runtime metatable.
--
-- Budgets. Skill code is stopped past its time or memory budget (lrt.c);
-- a C function runs out of the hook's sight, so the ones that can run long
-- on small input are replaced: string.find/match/gmatch/gsub check the time
-- budget as they go (lrt_pattern.c), string.rep checks the memory budget
-- first, and a large table.sort compares in (hooked) Lua. tostring always
-- returns a string. pcall/xpcall cannot catch a kill, nor a divergence from
-- the journal (run.diverge).

local core = ...
local M = {}

local pairs, next, type, error, select, tostring, tonumber = pairs, next, type, error, select, tostring, tonumber
local real_pcall, real_xpcall = pcall, xpcall
local setmetatable, getmetatable, rawset, rawget = setmetatable, getmetatable, rawset, rawget
local raw_getmetatable, raw_setmetatable = debug.getmetatable, debug.setmetatable
local concat = table.concat
local run = require("run")
local api = require("api")
local user_error = run.user_error -- errors at the skill's line
local read_only, views, view_names = run.read_only, run.views, run.view_names

local function copy(t, except)
  local c = {}
  for k, v in pairs(t) do
    if not (except and except[k]) then c[k] = v end
  end
  return c
end

-- Runaway code ------------------------------------------------------------

-- A run stopped for exceeding its time or memory budget must not be able to
-- catch that error and go on: the wrappers raise it again. core.killed()
-- stays true for the rest of a run once it was killed, so a step error
-- caused by a kill cannot be caught in the orchestration code either.
local killed, kill_reason, reserve = core.killed, core.kill_reason, core.reserve

-- So does a run whose code no longer matches its journal (run.diverge):
-- it must fail, not go on past the divergence.
local current_run = require("run").current

local function check(ok, ...)
  if not ok then
    if killed() then error(kill_reason() or (...), 0) end
    local R = current_run()
    if R and R.diverged then error(R.diverged, 0) end
  end
  return ok, ...
end

local function pcall(f, ...)
  return check(real_pcall(f, ...))
end

local function xpcall(f, handler, ...)
  local function h(e)
    if killed() then return e end
    local R = current_run()
    if R and R.diverged then return e end
    return handler(e)
  end
  return check(real_xpcall(f, h, ...))
end

-- string.rep allocates its whole result in one C call, out of the hook's
-- sight: check it against the memory budget first, so a huge one fails at
-- once with an error naming the budget.
local real_rep = string.rep
local function rep(s, n, sep)
  n = tonumber(n) or n
  if type(n) == "number" and n > 1 then
    local ls = type(s) == "string" and #s or type(s) == "number" and #tostring(s) or 0
    local lsep = type(sep) == "string" and #sep or type(sep) == "number" and #tostring(sep) or 0
    local size = ls * n + lsep * (n - 1)
    if size > 65536 then reserve(size) end
  end
  return real_rep(s, n, sep)
end

-- table.sort without a comparator compares in C, out of the hook's sight,
-- and its quicksort has inputs that make it quadratic (32768 numbers take
-- seconds, a million take hours). Past a few thousand elements it is
-- given a comparator in Lua, with the JIT off so that the hook fires.
--
-- The library's C functions that call back into Lua (table.sort's
-- comparator and __lt, string.format's __tostring, os.time's table with
-- an __index) nest a C frame per level of recursion through them: each
-- checks the C stack first (core.cstack, lrt.h's guard), so deep recursion
-- is a "stack overflow" error, never a crash. The wrappers call the real
-- function as a tail call, so its own errors read as before.
local cstack = core.cstack
local real_sort = table.sort
local function lt(a, b) return a < b end
jit.off(lt)
local function sort(t, comp)
  cstack("table.sort")
  if comp == nil and type(t) == "table" and #t > 2000 then comp = lt end
  return real_sort(t, comp)
end
local safe_table = copy(table)
safe_table.sort = sort

local real_format = string.format
local function format(...)
  cstack("string.format")
  return real_format(...)
end

-- (os.time looked up at each call: moonloop test puts a virtual clock there.)
local function os_time(...)
  cstack("os.time")
  return os.time(...)
end

local safe_string = copy(string, { dump = true })
safe_string.rep = rep
safe_string.format = format
-- Pattern functions that check the time budget as they go (a backtracking
-- pattern can run for hours inside one C call, out of the hook's sight).
safe_string.find, safe_string.match = core.str_find, core.str_match
safe_string.gmatch, safe_string.gsub = core.str_gmatch, core.str_gsub
do
  local mt = getmetatable("")
  mt.__index = safe_string
  mt.__metatable = false
end

-- Metatables ---------------------------------------------------------------

-- The metatables set by skill code (any sandbox); weak, so they can go.
local mine = setmetatable({}, { __mode = "k" })

local function sb_setmetatable(t, mt)
  if type(mt) == "table" then mine[mt] = true end
  return setmetatable(t, mt) -- refuses a protected metatable (__metatable)
end

local function sb_getmetatable(v)
  local mt = raw_getmetatable(v)
  if mt == nil then return nil end
  if mine[mt] then return getmetatable(v) end
  return false
end

-- The tables a skill's top level left (frozen by M.freeze_state): shared
-- by all its runs, read-only once it has loaded. Weak, by table.
local frozen = setmetatable({}, { __mode = "k" })

-- Whether the raw fields of t are not skill code's to set: its metatable
-- is the runtime's and protected (the views, the frozen globals, a frozen
-- table of the top level), or it is a frozen table.
local function locked(t)
  if frozen[t] then return true end
  local mt = raw_getmetatable(t)
  return mt ~= nil and not mine[mt] and rawget(mt, "__metatable") ~= nil
end

-- How a read-only table is named in errors: its view's name ("ctx.step",
-- "json"), else what it is.
local function what_of(t)
  if frozen[t] then return "a table of the skill's top level (shared by all its runs)" end
  return view_names[t] or "this table"
end

local function sb_rawset(t, k, v)
  if type(t) == "table" and locked(t) then
    user_error(("rawset: %s is read-only (tried to set '%s')"):format(what_of(t), tostring(k)))
  end
  return rawset(t, k, v)
end

-- The table library's raw writers, refused on read-only tables as rawset
-- is: a view has no raw storage, and table.insert would give it some that
-- every run sharing the view would see. The real function is called as a
-- tail call, so its own errors read as before.
local function guard_writer(name, f)
  return function(t, ...)
    if type(t) == "table" and locked(t) then user_error(("%s: %s is read-only"):format(name, what_of(t))) end
    return f(t, ...)
  end
end
safe_table.insert = guard_writer("table.insert", table.insert)
safe_table.remove = guard_writer("table.remove", table.remove)
safe_table.sort = guard_writer("table.sort", sort)

local data_key = { string = true, number = true, boolean = true }

-- next, skipping keys that are not plain data in a table with a runtime
-- metatable (ctx keeps the run's state under a table key).
local function filtered_next(t, k)
  local v
  repeat
    k, v = next(t, k)
  until k == nil or data_key[type(k)]
  return k, v
end

-- The metatable of a frozen plain table (M.freeze_state).
local frozen_mt = {
  __newindex = function(t, k)
    user_error(("cannot set '%s': a table made by the skill's top level is shared by all its "
      .. "runs and read-only once the skill has loaded (keep what a run needs in locals "
      .. "of the run, or return it from a step)"):format(tostring(k)))
  end,
  __metatable = false,
}

local function runtime_owned(t)
  local mt = raw_getmetatable(t)
  return mt ~= nil and not mine[mt] and mt ~= frozen_mt
end

-- next over a view walks its backing (the view itself is the iteration's
-- state, so the backing never reaches skill code).
local function view_next(v, k)
  return next(views[v], k)
end

local function sb_next(t, k)
  if type(t) == "table" then
    if views[t] then return view_next(t, k) end
    if runtime_owned(t) then return filtered_next(t, k) end
  end
  return next(t, k)
end

local function sb_pairs(t)
  if type(t) ~= "table" then
    user_error(("bad argument #1 to 'pairs' (table expected, got %s)"):format(type(t)))
  end
  if views[t] then return view_next, t, nil end
  if runtime_owned(t) then return filtered_next, t, nil end
  return next, t, nil
end

-- The sandbox's os: api.os_functions (os.getenv, os.execute and the rest
-- are nil: code may test for them; run.lua's error message says what to
-- use instead of os.getenv when it is called).
local function os_lib()
  -- os.date and os.clock as they are now: a test's virtual clock replaces them.
  local have, t = { time = os_time, date = os.date, clock = os.clock }, {}
  for _, name in ipairs(api.os_functions) do t[name] = have[name] end
  return t
end

-- tostring that always gives a string: LuaJIT passes on whatever
-- __tostring returns, and code that formats a value expects text.
local function sb_tostring(v)
  local s = tostring(v)
  if type(s) ~= "string" then user_error("'__tostring' must return a string") end
  return s
end

M.safe_string = safe_string

-- The library functions that call back into Lua from C, with the C stack
-- guard, for the REPL's globals (the whole standard library, not a
-- sandbox): deep recursion through them must not crash the REPL either.
M.guarded = {
  string = { find = core.str_find, match = core.str_match, gmatch = core.str_gmatch,
             gsub = core.str_gsub, format = format },
  table = { sort = sort },
  os = { time = os_time },
}

-- Whether an environment's top level is still running (its modules may be
-- added to until then); weak, by environment.
local loading = setmetatable({}, { __mode = "k" })

-- Build a fresh environment. `mods` holds the engine modules to expose
-- (json, http, log, env, time, fatal, ...); `log` is used for print.
-- Every library and module table is a read-only view of this sandbox's
-- own copy (the runs of a skill share its sandbox): the skill's top level
-- may add to them while it loads, nothing can change them after.
function M.new(mods)
  local log = mods.log
  local env
  local function writable() return loading[env] == true end
  local function view(t, name) return read_only(t, name, writable) end
  env = {
    assert = assert, error = error, ipairs = ipairs, next = sb_next, pairs = sb_pairs,
    pcall = pcall, xpcall = xpcall, rawequal = rawequal, rawget = rawget, rawset = sb_rawset,
    select = select, tonumber = tonumber, tostring = sb_tostring, type = type,
    unpack = unpack, setmetatable = sb_setmetatable, getmetatable = sb_getmetatable,
    _VERSION = _VERSION,
    string = view(copy(safe_string), "string"), table = view(copy(safe_table), "table"),
    math = view(copy(math, { randomseed = true }), "math"), bit = view(copy(bit), "bit"),
    os = view(os_lib(), "os"),
  }
  loading[env] = true
  if type(mods.json) == "table" then
    -- json.array and json.object set a table's metatable from C, past any
    -- protection: they would take a view's (or a frozen table's) away.
    mods.json.array = guard_writer("json.array", mods.json.array)
    mods.json.object = guard_writer("json.object", mods.json.object)
  end
  for k, v in pairs(mods) do
    -- env (the configuration's values) is a view already.
    if type(v) == "table" and not views[v] then v = view(v, k) end
    env[k] = v
  end
  env.print = function(...)
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do parts[i] = sb_tostring((select(i, ...))) end
    log.info(concat(parts, "\t"))
  end
  env._G = env
  return env
end

-- After a skill file's top level has run, its globals are fixed: the
-- environment becomes a view of what its top level left there (so no run
-- can replace a global the others use: `json = nil` is an error, like a
-- new global), reading an undefined global is an error (nearly always a
-- typo), and its module tables are read-only from now on. Globals that
-- changed between runs would break replay too.
function M.freeze(env, chunkname)
  loading[env] = nil
  local globals = {}
  for k, v in next, env do globals[k] = v end
  for k in next, globals do rawset(env, k, nil) end
  setmetatable(globals, {
    __index = function(_, k)
      user_error(("undefined global '%s'"):format(tostring(k)))
    end,
  })
  -- Raw: the top level may have set a metatable of its own on _G.
  raw_setmetatable(env, {
    __index = globals,
    __newindex = function(_, k)
      user_error(("cannot set global '%s' in skill code after it loaded: use a local"):format(tostring(k)))
    end,
    __metatable = false,
  })
  views[env] = globals
  view_names[env] = "_G"
end

-- Freeze what a skill's top level left for its runs: every table reachable
-- from its definition, its globals and the upvalues of its functions (its
-- own functions only; the runtime's are not walked). Runs share these, so
-- none may change them: a plain table gets a protected metatable whose
-- __newindex raises (a new key, t[#t + 1] = v, is an error at the line
-- that tried), and every one of them is refused to rawset and
-- table.insert/remove/sort. What a run writes in its locals, its step
-- results and its return value is its own. Limits: an existing key can
-- still be assigned (Lua cannot intercept it), an upvalue can still be
-- reassigned, and a table with a metatable of its own keeps it (only its
-- raw writers are refused): the memory accounting (lrt.h's groups) stops
-- a skill whose runs keep growing such state.
function M.freeze_state(def, env, source)
  local seen = {}
  local function walk(v)
    local tv = type(v)
    if tv == "table" then
      if seen[v] or views[v] then return end
      seen[v] = true
      local mt = raw_getmetatable(v)
      -- A protected object of the runtime (a view): read-only already.
      if mt ~= nil and not mine[mt] and rawget(mt, "__metatable") ~= nil then return end
      for k, x in next, v do
        walk(k)
        walk(x)
      end
      if mt and mine[mt] then walk(mt) end
      frozen[v] = true
      if mt == nil then setmetatable(v, frozen_mt) end
    elseif tv == "function" then
      if seen[v] then return end
      seen[v] = true
      local info = debug.getinfo(v, "S")
      if info.source ~= source then return end -- a C function, or the runtime's
      local i = 1
      while true do
        local name, x = debug.getupvalue(v, i)
        if name == nil then break end
        walk(x)
        i = i + 1
      end
    end
  end
  walk(def)
  local globals = views[env]
  if globals then
    for _, v in next, globals do walk(v) end
  end
end

return M
