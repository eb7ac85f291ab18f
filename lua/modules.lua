-- modules.lua: the modules a skill sees (json, http, log, env, time, fatal).
--
-- Each sandbox gets its own copies of these tables, so a skill that
-- replaces `http.get` changes only its own. Functions that need the engine
-- (I/O, the journal) reach it through `core`, the C half.

local core = ...
local run = require("run")
local M = {}

local OP = core.OP
local yield = coroutine.yield
local type, tostring, select, error, pairs = type, tostring, select, error, pairs
local concat = table.concat
local current_task = run.current_task

local function message(...)
  local n = select("#", ...)
  local parts = {}
  for i = 1, n do parts[i] = tostring((select(i, ...))) end
  return concat(parts, " ")
end

-- log lines go to the current run's trace, attached to the step whose body
-- is running (or to the run). While a run replays, code outside steps runs
-- again: its lines were already recorded, so they are not written twice.
local function logger(level)
  return function(...)
    local T = current_task()
    if T and T.R.replaying and not T.in_step then return end
    core.log(level, message(...), T and T.in_step and T.step_seq or 0)
  end
end

local function make_log()
  return { info = logger("info"), warn = logger("warn"), error = logger("error") }
end

-- I/O must happen inside a step body, where its result is checkpointed;
-- outside one it would run again on every replay.
local function io_allowed(name)
  local T = current_task()
  if T and not T.in_step then
    error(name .. " must be called inside a step body (ctx.step.run) so that its result is checkpointed", 3)
  end
  if not T and not core.can_yield() then
    error(name .. " can only be called inside a run", 3)
  end
end

local function http_request(req)
  if type(req) ~= "table" then error("http.request expects a table {method=, url=, headers=, body=, timeout=}", 2) end
  if type(req.url) ~= "string" then error("http.request: 'url' must be a string", 2) end
  io_allowed("http.request")
  return yield(OP.HTTP, req)
end

local function excerpt(body)
  body = tostring(body or "")
  if #body > 200 then body = body:sub(1, 200) .. "..." end
  return body
end

-- Perform a request and raise on a transport failure or a non-2xx status.
local function checked(name, req)
  io_allowed(name)
  local resp, err = yield(OP.HTTP, req)
  if not resp then error(("%s: %s"):format(name, err), 3) end
  if resp.status < 200 or resp.status > 299 then
    error(("%s: %s %s returned %d: %s"):format(name, req.method or "GET", req.url, resp.status,
      excerpt(resp.body)), 3)
  end
  return resp
end

local function decode_body(name, resp, req)
  local ok, v = pcall(core.decode, resp.body)
  if not ok then
    error(("%s: %s %s did not answer JSON (%s): %s"):format(name, req.method or "GET", req.url,
      tostring(v):gsub("^json.decode: ", ""), excerpt(resp.body)), 3)
  end
  return v
end

local function make_http()
  local http = {}
  http.request = http_request
  function http.get(url, opts)
    if type(url) ~= "string" then error("http.get: url must be a string", 2) end
    local req = { url = url, headers = opts and opts.headers, timeout = opts and opts.timeout }
    return checked("http.get", req).body
  end
  function http.get_json(url, opts)
    if type(url) ~= "string" then error("http.get_json: url must be a string", 2) end
    local req = { url = url, headers = { Accept = "application/json" }, timeout = opts and opts.timeout }
    if opts and opts.headers then for k, v in pairs(opts.headers) do req.headers[k] = v end end
    return decode_body("http.get_json", checked("http.get_json", req), req)
  end
  function http.post_json(url, value, opts)
    if type(url) ~= "string" then error("http.post_json: url must be a string", 2) end
    local body = core.encode(value == nil and core.json.null or value, 0)
    local req = { method = "POST", url = url, body = body, timeout = opts and opts.timeout,
      headers = { ["Content-Type"] = "application/json", Accept = "application/json" } }
    if opts and opts.headers then for k, v in pairs(opts.headers) do req.headers[k] = v end end
    local resp = checked("http.post_json", req)
    if resp.body == "" then return nil end
    local ok, v = pcall(core.decode, resp.body)
    if ok then return v end
    return resp.body
  end
  return http
end

local function make_time()
  local t = {}
  -- Outside a step body the time is the one recorded at the last step, so
  -- a replay sees the same value; inside a body it is the real clock.
  function t.now()
    local T = current_task()
    if T and not T.in_step then return T.R.now / 1000 end
    return core.now() / 1000
  end
  function t.parse_duration(s)
    if type(s) == "number" then return s end
    local ms, err = core.duration(s)
    if not ms then error("time.parse_duration: " .. err, 2) end
    return ms / 1000
  end
  return t
end

local function make_env(values)
  return setmetatable({}, {
    __index = values,
    __newindex = function(_, k) error(("env is read-only (tried to set '%s')"):format(tostring(k)), 2) end,
    __metatable = false,
  })
end

-- The module table for one sandbox. `extra` adds modules (llm, runs, skills).
function M.build(env_values, extra)
  local json = {}
  for k, v in pairs(core.json) do json[k] = v end
  local mods = {
    json = json, http = make_http(), log = make_log(), time = make_time(),
    env = make_env(env_values or {}), fatal = run.fatal,
  }
  if extra then for k, v in pairs(extra) do mods[k] = v end end
  return mods
end

M.make_log = make_log
run.shared_log = make_log()
return M
