-- loader.lua: load a skill file into a fresh sandbox and validate it.

local core = ...
local sandbox = require("sandbox")
local modules = require("modules")
local skill = require("skill")
require("flow") -- installs the flow steps into run.step
local M = {}

local setfenv, pcall, type, tostring, error = setfenv, pcall, type, tostring, error

-- Run a compiled skill chunk in a fresh sandbox, then validate the table it
-- returns. Returns the definition and its normalized spec, or raises a
-- table {message=, line=, key=}.
local function load_once(chunk, file, src, default_id, env_values, extra)
  local env = sandbox.new(modules.build(env_values, extra))
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
  local spec = skill.validate(def, file, src, default_id)
  sandbox.freeze_state(def, env, "@" .. file)
  return def, spec
end

-- The same, and then, for a skill the configuration grants variables to
-- (grants: {[skill id] = {NAME = value}}, skill_env), once more with its
-- env holding the global values and its grant: the id is known only once
-- the top level has run, and a skill sees its grant from its top level on.
-- The top level is deterministic (it runs again at every restart anyway);
-- an id that comes out different the second time is refused.
function M.load(chunk, file, src, default_id, env_values, extra, grants)
  local def, spec = load_once(chunk, file, src, default_id, env_values, extra)
  local grant = grants and grants[spec.id]
  if grant == nil then return def, spec end
  local values = {}
  for k, v in pairs(env_values or {}) do values[k] = v end
  for k, v in pairs(grant) do values[k] = v end
  local ok, def2, spec2 = pcall(load_once, chunk, file, src, default_id, values, extra)
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
