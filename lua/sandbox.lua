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

local core = ...
local M = {}

local pairs, type, error, select, tostring = pairs, type, error, select, tostring
local real_pcall, real_xpcall = pcall, xpcall
local setmetatable, getmetatable, rawset = setmetatable, getmetatable, rawset
local concat = table.concat

local function copy(t, except)
  local c = {}
  for k, v in pairs(t) do
    if not (except and except[k]) then c[k] = v end
  end
  return c
end

local safe_string = copy(string, { dump = true })
do
  local mt = getmetatable("")
  mt.__index = safe_string
  mt.__metatable = false
end

-- A run stopped for exceeding its time or memory budget must not be able to
-- catch that error and go on: the wrappers raise it again.
local killed = core.killed

local function check(ok, ...)
  if not ok and killed() then error((...), 0) end
  return ok, ...
end

local function pcall(f, ...)
  return check(real_pcall(f, ...))
end

local function xpcall(f, handler, ...)
  local function h(e)
    if killed() then return e end
    return handler(e)
  end
  return check(real_xpcall(f, h, ...))
end

M.safe_string = safe_string

-- Build a fresh environment. `mods` holds the engine modules to expose
-- (json, http, log, env, time, fatal, ...); `log` is used for print.
function M.new(mods)
  local log = mods.log
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
    pcall = pcall, xpcall = xpcall, rawequal = rawequal, rawget = rawget, rawset = rawset,
    select = select, tonumber = tonumber, tostring = tostring, type = type,
    unpack = unpack, setmetatable = setmetatable, getmetatable = getmetatable,
    _VERSION = _VERSION,
    string = copy(safe_string), table = copy(table), math = copy(math), bit = copy(bit),
    os = { time = os.time, date = os.date, clock = os.clock },
  }
  for k, v in pairs(mods) do env[k] = v end
  env.print = function(...)
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    log.info(concat(parts, "\t"))
  end
  env._G = env
  return env
end

-- After a skill file's top level has run, its globals are fixed: assigning
-- a new global or reading an undefined one is an error (it is nearly always
-- a typo, and globals that change between runs would break replay).
function M.freeze(env, chunkname)
  setmetatable(env, {
    __newindex = function(_, k)
      error(("cannot set global '%s' in skill code after it loaded: use a local"):format(tostring(k)), 2)
    end,
    __index = function(_, k)
      error(("undefined global '%s'"):format(tostring(k)), 2)
    end,
    __metatable = false,
  })
end

return M
