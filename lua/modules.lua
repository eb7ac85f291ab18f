-- modules.lua: the modules a skill sees (json, http, log, env, time, fatal).
--
-- Each sandbox gets its own copies of these tables, so a skill that
-- replaces `http.get` changes only its own. Functions that need the engine
-- (I/O, the journal) reach it through `core`, the C half.

local core = ...
local run = require("run")
local api = require("api") -- every function's option keys
local suggest = api.suggest -- " (did you mean 'x'?)"
local M = {}

local OP = core.OP
local yield = coroutine.yield
local type, tostring, select, error, pairs, ipairs, next = type, tostring, select, error, pairs, ipairs, next
local concat = table.concat
-- Text from outside the run (a response, the store's records): its JSON
-- tree counts against the run's memory budget (core.decode's bound).
local function decode(s) return core.decode(s, true) end
local current_task, user_error, user_fatal = run.current_task, run.user_error, run.user_fatal

-- Raise at the skill's line when opts (the options table of module
-- function mod.name) has a key the function does not take: a misspelt or
-- guessed key would otherwise be ignored ({ json = body } sent no body).
local function check_keys(mod, name, opts)
  local bad = api.check_keys(mod .. "." .. name, api.func[mod][name], opts)
  if bad then user_fatal(bad) end -- fatal: a retry would make the same mistake
end
M.check_keys = check_keys

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
    user_error(name .. " must be called inside a step body (ctx.step.run) so that its result is checkpointed")
  end
  if T then run.need_yieldable(name, "the step body's own code") end
  if not T and not core.can_yield() then
    user_error(name .. " can only be called inside a run")
  end
end

-- The request as a fresh table of its fields, headers copied: the C side
-- reads what a run yields after the yield, outside any protected call, so
-- it must never meet a skill's metamethods there (an __index that raises
-- would take the engine down). Reading the fields here runs them inside
-- the run, where an error is the run's.
local function plain_request(req)
  local r = { method = req.method, url = req.url, body = req.body, timeout = req.timeout }
  local h = req.headers
  if type(h) == "table" then
    local copy = {}
    for k, v in next, h do copy[k] = v end
    r.headers = copy
  end
  return r
end

-- http.request{method=, url=, headers=, body= or json=, timeout=}. json =
-- value sends value as JSON (encoded as by json.encode, with Content-Type:
-- application/json unless headers say otherwise); body is text as is.
local function http_request(req)
  if type(req) ~= "table" then
    user_error("http.request expects a table {method=, url=, headers=, body= or json=, timeout=}")
  end
  check_keys("http", "request", req)
  if type(req.url) ~= "string" then user_error("http.request: 'url' must be a string") end
  if req.headers ~= nil and type(req.headers) ~= "table" then
    user_error("http.request: 'headers' must be a table of header names and values")
  end
  if req.json ~= nil then
    if req.body ~= nil then user_error("http.request: give 'body' (text) or 'json' (a value), not both") end
    local body, err = core.encode(req.json, 0)
    if not body then user_error("http.request: json is not a JSON value: " .. err) end
    local headers, typed = {}, false
    for k, v in pairs(req.headers or {}) do
      headers[k] = v
      if type(k) == "string" and k:lower() == "content-type" then typed = true end
    end
    if not typed then headers["Content-Type"] = "application/json" end
    req = { method = req.method or "POST", url = req.url, headers = headers, body = body, timeout = req.timeout }
  elseif req.body ~= nil and type(req.body) ~= "string" then
    user_error(("http.request: 'body' must be a string, got a %s (to send a value as JSON, use json = value)")
      :format(type(req.body)))
  end
  io_allowed("http.request")
  return yield(OP.HTTP, plain_request(req))
end
M.http_request = http_request

local function excerpt(body)
  body = tostring(body or "")
  if #body > 200 then body = body:sub(1, 200) .. "..." end
  return body
end

-- Perform a request and raise on a transport failure or a non-2xx status.
local function checked(name, req)
  io_allowed(name)
  local resp, err = yield(OP.HTTP, plain_request(req))
  if not resp then user_error(("%s: %s"):format(name, err)) end
  if resp.status < 200 or resp.status > 299 then
    user_error(("%s: %s %s returned %d: %s"):format(name, req.method or "GET", req.url, resp.status,
      excerpt(resp.body)))
  end
  return resp
end

-- Raise when decoding an answer failed for want of memory (v: the error):
-- that is no reason to take the answer for text.
local function check_budget(name, resp, req, v)
  if not tostring(v):find("limits.run_memory", 1, true) then return end
  user_error(("%s: %s %s: decoding its answer (%d bytes): %s"):format(name, req.method or "GET", req.url,
    #resp.body, (tostring(v):gsub("^json.decode: ", ""))))
end

local function decode_body(name, resp, req)
  local ok, v = pcall(decode, resp.body)
  if not ok then
    check_budget(name, resp, req, v)
    user_error(("%s: %s %s did not answer JSON (%s): %s"):format(name, req.method or "GET", req.url,
      tostring(v):gsub("^json.decode: ", ""), excerpt(resp.body)))
  end
  return v
end

-- The options of http.get, get_json and post_json: nil or {headers=, timeout=}.
local function check_opts(name, opts)
  if opts == nil then return nil end
  if type(opts) ~= "table" then user_error(name .. ": opts must be a table {headers=, timeout=}") end
  check_keys("http", name:match("[%w_]+$"), opts)
  if opts.headers ~= nil and type(opts.headers) ~= "table" then
    user_error(name .. ": opts.headers must be a table of header names and values")
  end
  return opts
end

local function make_http()
  local http = {}
  http.request = http_request
  function http.get(url, opts)
    if type(url) ~= "string" then user_error("http.get: url must be a string") end
    opts = check_opts("http.get", opts)
    local req = { url = url, headers = opts and opts.headers, timeout = opts and opts.timeout }
    return checked("http.get", req).body
  end
  function http.get_json(url, opts)
    if type(url) ~= "string" then user_error("http.get_json: url must be a string") end
    opts = check_opts("http.get_json", opts)
    local req = { url = url, headers = { Accept = "application/json" }, timeout = opts and opts.timeout }
    if opts and opts.headers then for k, v in pairs(opts.headers) do req.headers[k] = v end end
    return decode_body("http.get_json", checked("http.get_json", req), req)
  end
  function http.post_json(url, value, opts)
    if type(url) ~= "string" then user_error("http.post_json: url must be a string") end
    opts = check_opts("http.post_json", opts)
    local body, err = core.encode(value == nil and core.json.null or value, 0)
    if not body then user_error("http.post_json: value is not a JSON value: " .. err) end
    local req = { method = "POST", url = url, body = body, timeout = opts and opts.timeout,
      headers = { ["Content-Type"] = "application/json", Accept = "application/json" } }
    if opts and opts.headers then for k, v in pairs(opts.headers) do req.headers[k] = v end end
    local resp = checked("http.post_json", req)
    if resp.body == "" then return nil end
    local ok, v = pcall(decode, resp.body)
    if ok then return v end
    check_budget("http.post_json", resp, req, v)
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
  -- An RFC 3339 time ("2026-11-29T16:51:24.123Z") as unix seconds.
  function t.parse(s)
    if type(s) ~= "string" then user_error("time.parse expects an RFC 3339 string") end
    local ms, err = core.parse_time(s)
    if not ms then user_error("time.parse: " .. err) end
    return ms / 1000
  end
  function t.parse_duration(s)
    if type(s) == "number" then return s end
    if type(s) ~= "string" then
      user_error("time.parse_duration expects a number of seconds or a string such as \"5m\"")
    end
    local ms, err = core.duration(s)
    if not ms then user_error("time.parse_duration: " .. err) end
    return ms / 1000
  end
  return t
end

local function make_llm()
  local llm = require("llm")
  -- llm.chat does its I/O through http.request, under the same rules; it
  -- checks them first itself, so that a refusal names llm.chat.
  llm.request = http_request
  local chat = llm.chat
  -- Its retries of failed calls are said in the run's trace.
  llm.warn = logger("warn")
  return { chat = function(req)
    if type(req) == "table" then check_keys("llm", "chat", req) end
    io_allowed("llm.chat")
    return chat(req)
  end }
end

-- runs: run history, for review loops. Reads happen inside step bodies
-- (where their answer is checkpointed), like any I/O.
local function since_ms(v, what)
  if v == nil then return nil end
  if type(v) == "number" then return v * 1000 end
  if type(v) == "string" then
    local d = core.duration(v)
    if d then return core.now() - d end
    local t, err = core.parse_time(v)
    if t then return t end
    user_error(what .. ": expected a duration such as \"7d\", a unix time or an RFC 3339 time, got '" .. v .. "'")
  end
  user_error(what .. ": expected a duration, a unix time or an RFC 3339 time")
end

-- runs.list's filter is strict: a misspelt key or value would otherwise
-- quietly match every run, or none.
-- The words are the engine's (base/vocab.h, as core.VOCAB).
local STATUSES, TRIGGER_KINDS = core.VOCAB.run_statuses, core.VOCAB.trigger_kinds

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end
local STATUS_SET, TRIGGER_SET = set_of(STATUSES), set_of(TRIGGER_KINDS)

-- How a value shows in a message: a string quoted, a number as itself,
-- else its type.
local function shown(v)
  if type(v) == "string" then return "'" .. v:sub(1, 40) .. "'" end
  if type(v) == "number" then return tostring(v) end
  return type(v)
end

-- Check runs.list's filter: known keys, strings where strings are due,
-- a status and a trigger kind that exist.
local function check_list_filter(f)
  check_keys("runs", "list", f)
  for _, k in ipairs({ "skill", "parent", "status", "trigger" }) do
    if f[k] ~= nil and type(f[k]) ~= "string" then
      user_error(("runs.list: %s must be a string, got %s"):format(k, type(f[k])))
    end
  end
  for _, c in ipairs({ { "status", STATUS_SET, STATUSES }, { "trigger", TRIGGER_SET, TRIGGER_KINDS } }) do
    local k, set, list = c[1], c[2], c[3]
    local v = f[k]
    if v ~= nil and not set[v] then
      user_error(("runs.list: %s must be one of %s; got %s%s"):format(k, concat(list, ", "), shown(v),
        suggest(v, set)))
    end
  end
end

local function make_runs()
  local runs = {}
  function runs.list(f)
    f = f or {}
    if type(f) ~= "table" then
      user_error("runs.list expects a table {skill=, status=, trigger=, parent=, since=, until=, limit=}")
    end
    check_list_filter(f)
    io_allowed("runs.list")
    local limit = f.limit or 100
    if type(limit) ~= "number" or limit < 1 or limit > 10000 then
      user_error("runs.list: limit must be a number from 1 to 10000")
    end
    local js, err = core.runs_list{ skill = f.skill, status = f.status, trigger = f.trigger,
      parent = f.parent, since = since_ms(f.since, "runs.list: since"),
      ["until"] = since_ms(f["until"], "runs.list: until"), limit = limit }
    if not js then user_error("runs.list: " .. err) end
    return decode(js)
  end
  function runs.get(id)
    if type(id) ~= "string" then user_error("runs.get expects a run id") end
    io_allowed("runs.get")
    local js, err = core.runs_get(id)
    if not js then return nil, err end
    return decode(js)
  end
  -- Cancel a run (and its children) as `moonloop cancel` does, durably;
  -- only for skills the configuration lists in `cancellers`.
  function runs.cancel(id, reason)
    if type(id) ~= "string" then user_error("runs.cancel(run_id [, reason]) expects a run id") end
    if reason ~= nil and type(reason) ~= "string" then user_error("runs.cancel: reason must be a string") end
    io_allowed("runs.cancel")
    -- First the checks that need no journal: the permission (fatal: a
    -- retry cannot fix it), an id that names no run (an answer).
    local ok, err, how = core.runs_cancel(id)
    if not ok then
      if how == "answer" then return nil, err end
      (how == "fatal" and user_fatal or user_error)(err)
    end
    local res, msg = yield(OP.CANCEL, id, reason)
    if not res then return nil, msg end
    return decode(res)
  end
  -- runs.stats{skill=, since=, until=, interval=}: the health figures of
  -- one skill (or of every skill without skill=) over a window, as
  -- GET /v1/skills/{id}/stats (GET /v1/stats) answers them. A skill that
  -- is neither registered nor ever ran gives nil, message.
  function runs.stats(f)
    f = f or {}
    if type(f) ~= "table" then
      user_error("runs.stats expects a table {skill=, since=, until=, interval=}")
    end
    check_keys("runs", "stats", f)
    if f.skill ~= nil and type(f.skill) ~= "string" then
      user_error(("runs.stats: skill must be a string, got %s"):format(type(f.skill)))
    end
    io_allowed("runs.stats")
    local interval = f.interval
    if type(interval) == "number" then
      interval = interval * 1000
    elseif type(interval) == "string" then
      local ms, err = core.duration(interval)
      if not ms then user_error("runs.stats: interval: " .. err) end
      interval = ms
    elseif interval ~= nil then
      user_error("runs.stats: interval must be a duration such as \"1h\" or a number of seconds")
    end
    if interval ~= nil and interval <= 0 then user_error("runs.stats: interval must be positive") end
    local js, err, code = core.runs_stats{ skill = f.skill,
      since = since_ms(f.since == nil and "7d" or f.since, "runs.stats: since"),
      ["until"] = since_ms(f["until"], "runs.stats: until"), interval = interval }
    if not js then
      if code == "not_found" then return nil, err end
      user_error("runs.stats: " .. err)
    end
    return decode(js)
  end
  return runs
end

-- skills: the registry. check is pure (it loads the source in a fresh
-- sandbox); list and get read the store; deploy writes a skill file into
-- the workspace, where the sidecar picks it up.
local function make_skills()
  local skills = {}
  function skills.list()
    io_allowed("skills.list")
    local js, err = core.skills_list()
    if not js then user_error("skills.list: " .. err) end
    return decode(js)
  end
  function skills.get(id)
    if type(id) ~= "string" then user_error("skills.get expects a skill id") end
    io_allowed("skills.get")
    local js, err = core.skills_get(id)
    if not js then return nil, err end
    return decode(js)
  end
  function skills.check(source, name)
    if type(source) ~= "string" then user_error("skills.check expects Lua source (a string)") end
    if name ~= nil and type(name) ~= "string" and type(name) ~= "number" then
      user_error("skills.check: name must be a file name (a string)")
    end
    local ok, id_or_err, line = core.skills_check(source, name)
    -- On success, line is the static checks' warnings (JSON), if any.
    if ok then return { ok = true, id = id_or_err, warnings = line and decode(line) or nil } end
    return { ok = false, error = id_or_err, line = line }
  end
  function skills.deploy(id, source)
    if type(id) ~= "string" or type(source) ~= "string" then
      user_error("skills.deploy(id, source) expects a skill id and Lua source")
    end
    io_allowed("skills.deploy")
    local res, err, fatal = core.skills_deploy(id, source)
    -- A skill the configuration does not let deploy fails at once: retrying will not change that.
    if not res then (fatal and user_fatal or user_error)(err) end
    return res
  end
  return skills
end

-- env: the variables the configuration grants to the skill, as a
-- read-only view. values: {NAME = value}, false for a variable that is
-- granted but not set in the engine's environment. grant (optional):
--   skill    the skill's id, for messages (the loader sets it once known)
--   how      "test" in `moonloop test` (messages say how a test grants)
--   maybe    names that may be granted once the skill's id is known (the
--            loader's first pass: any skill_env grant): read as nil and
--            noted in the list `pending`, for the loader to decide
-- Reading a name that is not granted raises (fatal: a retry cannot grant
-- it), naming the configuration key to add; a granted name that is not set
-- reads as nil (so `env.X or default` and `if env.X then` work), and the
-- run notes it, so that a "nil value" error it then raises says why
-- (run.lua's normalize). pairs(env) walks the variables that are set.
local function make_env(values, grant)
  grant = grant or {}
  local set = {}
  for k, v in pairs(values) do
    if v ~= false then set[k] = v end
  end
  setmetatable(set, { __index = function(_, k)
    if values[k] == false then
      local R = run.current()
      if R then
        R.unset_env = R.unset_env or {}
        R.unset_env[k] = true
      end
      return nil
    end
    if grant.maybe and grant.maybe[k] then
      grant.pending[#grant.pending + 1] = k
      return nil
    end
    local R = run.current()
    user_fatal(api.env_not_granted(k, R and R.cfg and R.cfg.skill or grant.skill, grant.how))
  end })
  return run.read_only(set, "env")
end

-- A module's table: reading a name it does not have raises, naming the
-- nearest function ("http.post is not a function of the http module: did
-- you mean http.post_json?"), at the skill's line, rather than giving a nil
-- that fails further on. Fatal: a retry would make the same mistake.
local function strict(t, name)
  return setmetatable(t, { __index = function(_, k) user_fatal(api.unknown(name, k)) end })
end

-- The module table for one sandbox. `extra` adds modules (llm, runs,
-- skills); grant is make_env's.
function M.build(env_values, extra, grant)
  local json = {}
  for k, v in pairs(core.json) do json[k] = v end
  local encode = core.json.encode
  json.encode = function(v, opts)
    if type(opts) == "table" then check_keys("json", "encode", opts) end
    return encode(v, opts)
  end
  local mods = {
    json = json, http = make_http(), log = make_log(), time = make_time(),
    env = make_env(env_values or {}, grant), fatal = run.fatal, llm = make_llm(),
    runs = make_runs(), skills = make_skills(),
  }
  for name, t in pairs(mods) do
    if type(t) == "table" and name ~= "env" then strict(t, name) end
  end
  if extra then for k, v in pairs(extra) do mods[k] = v end end
  return mods
end

M.make_log = make_log
run.shared_log = strict(make_log(), "log") -- ctx.log
return M
