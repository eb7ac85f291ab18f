-- loader.lua: load a skill file into a fresh sandbox and validate it.
--
-- Validation is the skill table's (skill.lua) and, for a new version, the
-- static checks of its source (lint.lua): the first static error fails the
-- load; the warnings go with the spec (spec.warnings) for `moonloop check`
-- and skills.check to show. A recorded version (one registered before,
-- whose runs resume on it) is not checked statically: a check added since
-- must not fail the runs that were accepted.

local core = ...
local sandbox = require("sandbox")
local modules = require("modules")
local skill = require("skill")
local run = require("run")
local api = require("api")
require("flow") -- installs the flow steps into run.step
local M = {}

local setfenv, pcall, type, tostring, error = setfenv, pcall, type, tostring, error

-- The API's tables and what the runtime has must agree: a step or a
-- module function added on one side only is a mistake of ours, said at
-- once rather than found by an agent.
do
  local mods = modules.build({})
  for _, s in ipairs(api.steps) do
    if type(run.step[s.name]) ~= "function" then error("internal: api.lua lists step." .. s.name .. ", the runtime has none") end
  end
  for name in pairs(run.step) do
    if not api.step[name] then error("internal: step." .. name .. " is missing from api.lua") end
  end
  for _, m in ipairs(api.modules) do
    local t = mods[m.name]
    if t == nil then error("internal: api.lua lists the module " .. m.name .. ", the runtime has none") end
    for _, f in ipairs(m.functions) do
      if type(t[f.name]) ~= "function" then error("internal: api.lua lists " .. m.name .. "." .. f.name .. ", the runtime has none") end
    end
    if type(t) == "table" and m.name ~= "env" then
      for k in pairs(t) do
        if not api.func[m.name][k] then error("internal: " .. m.name .. "." .. k .. " is missing from api.lua") end
      end
    end
  end
end

-- The static checks of the last source checked: a test file runs its
-- skill many times (each c:run loads it afresh), from the same source.
local last_src, last_errors, last_warnings, last_env_reads

local function lint(src)
  if src ~= last_src then
    last_errors, last_warnings, last_env_reads = require("lint").check(src)
    last_src = src
  end
  return last_errors, last_warnings, last_env_reads
end

-- The first static error of a skill's source: lint's, or a literal
-- env.NAME that the configuration does not grant to the skill (granted:
-- the set of names it grants, or nil when the configuration is not known:
-- then nothing is said), whichever comes first; nil when there is none.
local function first_error(errors, env_reads, granted, id)
  local e = errors[1]
  if granted then
    for _, r in ipairs(env_reads) do
      if not granted[r.name] then
        if not e or r.line < e.line then e = { line = r.line, message = api.env_not_granted(r.name, id) } end
        break
      end
    end
  end
  return e
end

-- The names granted to skill id: the global env's and its skill_env's.
local function granted_to(id, env_values, grants)
  local set = {}
  for k in pairs(env_values or {}) do set[k] = true end
  for k in pairs(grants and grants[id] or {}) do set[k] = true end
  return set
end

-- Run a compiled skill chunk in a fresh sandbox, then validate the table it
-- returns. Returns the definition and its normalized spec, or raises a
-- table {message=, line=, key=}. recorded: see the top. grant: make_env's
-- (modules.lua). granted: the names the configuration grants to each id,
-- as granted_to finds them, or nil when it is not known.
local function load_once(chunk, file, src, default_id, env_values, extra, recorded, grant, grants, how)
  grant.skill = default_id
  local env = sandbox.new(modules.build(env_values, extra, grant))
  setfenv(chunk, env)
  local ok, def = pcall(chunk)
  if not ok then
    if type(def) == "table" and def.message then def = def.message end
    local msg = tostring(def)
    if type(msg) ~= "string" then msg = "the file raised an error that is not a string" end
    -- An error with no position (LuaJIT's own "stack overflow") still names the file.
    if msg:sub(1, #file + 1) ~= file .. ":" then msg = file .. ": " .. msg end
    error({ message = msg, line = tonumber(msg:match("^[^:\n]+:(%d+):")) }, 0)
  end
  sandbox.freeze(env)
  local spec = skill.validate(def, file, src, default_id, recorded)
  grant.skill = spec.id
  -- (A file over 128 KB is not checked statically: parsing it could take
  -- longer than the time budget of the load.)
  if not recorded and type(src) == "string" and #src <= 131072 then
    local errors, warnings, env_reads = lint(src)
    local granted = how == "engine" and granted_to(spec.id, env_values, grants) or nil
    local e = first_error(errors, env_reads, granted, spec.id)
    if e then error({ message = ("%s:%d: %s"):format(file, e.line, e.message), line = e.line }, 0) end
    if #warnings > 0 then spec.warnings = warnings end
  end
  sandbox.freeze_state(def, env, "@" .. file)
  return def, spec
end

-- The same, and then, for a skill the configuration grants variables to
-- (grants: {[skill id] = {NAME = value}}, skill_env), once more with its
-- env holding the global values and its grant: the id is known only once
-- the top level has run, and a skill sees its grant from its top level on.
-- The top level is deterministic (it runs again at every restart anyway);
-- an id that comes out different the second time is refused.
--
-- env_values and grants hold false for a variable that is granted but not
-- set (for a check, every grant is so: a check never reads a grant's
-- values). In the first pass, the names of every grant read as nil and
-- are noted: a skill that turns out to have no grant yet read such a name
-- is loaded once more, where that read raises. how:
-- "engine" when the configuration is known (moonloop check, a load, a
-- deploy): a literal env.NAME it does not grant is a static error too;
-- "check" when it is not (skills.check from a skill); "test" in `moonloop
-- test`, where the test's env is the grant (nothing is said statically:
-- a test may mock the step that reads it).
function M.load(chunk, file, src, default_id, env_values, extra, grants, recorded, how)
  how = how or "engine"
  local maybe
  for _, g in pairs(grants or {}) do
    for k in pairs(g) do
      maybe = maybe or {}
      maybe[k] = true
    end
  end
  local first = { maybe = maybe, pending = {}, how = how }
  local def, spec = load_once(chunk, file, src, default_id, env_values, extra, recorded, first, grants, how)
  local grant = grants and grants[spec.id]
  if grant == nil then
    -- This is the skill's env from now on: its runs read it exactly.
    first.maybe = nil
    if #first.pending == 0 then return def, spec end
    -- Its top level read a name of another skill's grant: once more, where
    -- that read raises as it will in its runs (the skill may catch it).
    return load_once(chunk, file, src, default_id, env_values, extra, recorded, { how = how }, grants, how)
  end
  local values = {}
  for k, v in pairs(env_values or {}) do values[k] = v end
  for k, v in pairs(grant) do values[k] = v end
  local ok, def2, spec2 = pcall(load_once, chunk, file, src, default_id, values, extra, recorded,
    { how = how }, grants, how)
  if not ok then
    -- Its message could hold a granted secret (error(env.TOKEN)), and load
    -- errors are shown to whoever lists skills: it is not passed on.
    error({ message = ("%s: the skill loads without its granted variables (skill_env) but fails with "
      .. "them; the error is not shown, as it could hold one of them"):format(file) }, 0)
  end
  if spec2.id ~= spec.id then
    error({ message = ("%s: the skill's id came out as '%s', then as '%s' once its granted variables "
      .. "(skill_env) were set: a skill's id cannot depend on env"):format(file, spec.id, spec2.id) }, 0)
  end
  return def2, spec2
end

-- The same, returning true, def, spec or false, message, line: the C side
-- needs the line apart from the message.
function M.try_load(...)
  local ok, def, spec = pcall(M.load, ...)
  if ok then return true, def, spec end
  if type(def) == "table" then return false, tostring(def.message), def.line end
  return false, tostring(def), nil
end

return M
