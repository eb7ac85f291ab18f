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
function M.load(chunk, file, src, default_id, env_values, extra)
  local env = sandbox.new(modules.build(env_values, extra))
  setfenv(chunk, env)
  local ok, def = pcall(chunk)
  if not ok then
    if type(def) == "table" and def.message then def = def.message end
    local msg = tostring(def)
    if type(msg) ~= "string" then msg = "the file raised an error that is not a string" end
    error({ message = msg, line = tonumber(msg:match("^[^:\n]+:(%d+):")) }, 0)
  end
  sandbox.freeze(env)
  local spec = skill.validate(def, file, src, default_id)
  sandbox.freeze_state(def, env, "@" .. file)
  return def, spec
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
