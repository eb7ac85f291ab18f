-- testing_report.lua: how skill tests (`moonloop test`) show values and
-- fail a case; shared by testing.lua (the `test` module and the case
-- handle) and testing_driver.lua (the driver that runs the skill).
--
-- show(v) writes a value for a message (strings as JSON, tables as Lua
-- constructors with sorted keys, at most 6 levels and 600 characters);
-- diff(a, b) finds the first path where two values differ. fail(msg) ends
-- the case with a failure value (failure_mt) that carries the line of the
-- test file nearest to the top of the call stack.
--
-- Invariants:
--   - M.cur.file is the test file being loaded or run (set by
--     testing.load); M.cur.case is the state of the case being run, from
--     testing.start to testing.finish, else nil;
--   - a failure raised inside a step body (an assertion in a mock) is also
--     kept in cur.case.pending, so the driver raises it again after the
--     resume: the step's own error handling cannot swallow it.

local core = ...
local run = require("run")

local M = {}

local encode, null = core.encode, core.json.null
local running = coroutine.running
local getinfo = debug.getinfo
local type, tostring, error, pairs, ipairs, pcall = type, tostring, error, pairs, ipairs, pcall
local setmetatable = setmetatable
local floor = math.floor
local concat, sort = table.concat, table.sort
local to_ms = run.to_ms

-- The test file and the case being run (see the invariants above).
local cur = { file = nil, case = nil }
M.cur = cur

-- Showing values in messages ---------------------------------------------

-- Whether k can be written as a bare field name (k = v, t.k).
local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil end

-- The keys of t in a stable order: by type, then by value.
local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return keys
end

-- v as text for a message.
local function show(v, depth)
  depth = depth or 0
  local tv = type(v)
  if v == null then return "null" end
  if tv == "string" then return (encode(v, 0) or ("%q"):format(v)) end
  if tv == "number" then
    if v == floor(v) and v > -1e15 and v < 1e15 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  end
  if tv ~= "table" then return tostring(v) end
  if depth > 6 then return "{...}" end
  local n, count = #v, 0
  for _ in pairs(v) do count = count + 1 end
  local parts = {}
  if count == n then
    for i = 1, n do parts[i] = show(v[i], depth + 1) end
  else
    for _, k in ipairs(sorted_keys(v)) do
      local key = is_ident(k) and k or ("[" .. show(k, depth + 1) .. "]")
      parts[#parts + 1] = key .. " = " .. show(v[k], depth + 1)
    end
  end
  local s = "{" .. concat(parts, ", ") .. "}"
  if #s > 600 then s = s:sub(1, 600) .. "..." end
  return s
end
M.show = show

-- One step of a path to a value: ".name" or "[key]".
local function key_path(k)
  if is_ident(k) then return "." .. k end
  return "[" .. show(k) .. "]"
end

-- The first place where a and b differ: path, value in a, value in b.
local function diff(a, b, path)
  if a == b then return nil end
  if type(a) ~= "table" or type(b) ~= "table" then return path, a, b end
  local seen = {}
  for _, t in ipairs({ a, b }) do
    for _, k in ipairs(sorted_keys(t)) do
      if not seen[k] then
        seen[k] = true
        local p, x, y = diff(a[k], b[k], path .. key_path(k))
        if p then return p, x, y end
      end
    end
  end
  return nil
end
M.diff = diff

-- Failures ------------------------------------------------------------------

local failure_mt = { __tostring = function(f) return f.message end }
M.failure_mt = failure_mt

-- The line of the test file in the call stack nearest to the top.
local function test_line(from)
  local F = cur.file
  if not F then return nil end
  for level = from or 2, 60 do
    local info = getinfo(level, "Sl")
    if not info then break end
    if info.source == F.source and (info.currentline or 0) > 0 then return info.currentline end
  end
end
M.test_line = test_line

-- Fail the case now, pointing at the test file's line that called. The
-- first failure is kept on the case at once: a pcall in the test code
-- that catches it does not make the case pass.
local function fail(msg)
  local C = cur.case
  local f = setmetatable({ message = msg, line = test_line(3) }, failure_mt)
  if C and not C.failure then C.failure = f end
  -- Raised inside a step body (an assertion in a mock), the error would
  -- only fail that step: keep it, and the driver raises it after the resume.
  if C and running() ~= C.driver then C.pending = C.pending or f end
  error(f, 0)
end
M.fail = fail

-- fail with a message made by string.format.
function M.failf(fmt, ...) return fail(fmt:format(...)) end

-- The message of an error value (a table's message, or the table shown).
function M.message_of(e)
  if type(e) == "table" then
    if type(e.message) == "string" then return e.message end
    return show(e)
  end
  return tostring(e)
end

-- A duration given to a mock or to the case handle (seconds, or a string
-- such as "5m") in milliseconds; nil is 0. A bad one fails the case, with
-- run.to_ms's message: "<what>: ...".
function M.duration_ms(v, what)
  if v == nil then return 0 end
  local ok, ms = pcall(to_ms, v, what, 0)
  if not ok then fail(ms) end
  return ms
end

return M
