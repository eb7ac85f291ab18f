-- api.lua: the API skills see, as data: the one list of every skill key,
-- every step kind with its options, every module function with its
-- signature and its option keys, and the fields of ctx.
--
-- Everything that validates skill code reads these tables: the skill
-- table's validation (skill.lua), the step functions (run.lua, flow.lua)
-- and the module functions (modules.lua, llm.lua) at run time, the static
-- checks of `moonloop check` (lint.lua), and `moonloop check --api --json`,
-- which prints them (tests/func/test_agents_api.py holds docs/agents.md to
-- them). A name that is not here is not part of the API.
--
-- This file requires nothing and uses `core` only to print the tables as
-- JSON: the configuration's validation (engine/lua/config.c) loads it alone
-- into a bare state, for suggest and line_of.

local core = ...
local M = {}

local type, pairs, ipairs, tostring = type, pairs, ipairs, tostring
local concat, floor, min, max = table.concat, math.floor, math.min, math.max

-- Lists and sets -------------------------------------------------------------

-- The set of a list's values.
local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end
M.set_of = set_of

-- "a, b and c".
local function and_list(list)
  if #list <= 1 then return list[1] or "" end
  return concat(list, ", ", 1, #list - 1) .. " and " .. list[#list]
end
M.and_list = and_list

-- Edit distance, for "did you mean".
local function distance(a, b)
  local la, lb = #a, #b
  local prev, cur = {}, {}
  for j = 0, lb do prev[j] = j end
  for i = 1, la do
    cur[0] = i
    for j = 1, lb do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[lb]
end

-- The name of known (a set, or a list) nearest to key, or nil when none is
-- near enough. A known name that starts with key counts as near
-- ("wait" -> "wait_for_event", "post" -> "post_json").
local function nearest(key, known)
  if type(key) ~= "string" then return nil end
  local names = {}
  if #known > 0 then names = known else for k in pairs(known) do names[#names + 1] = k end end
  local best, bestd
  for _, k in ipairs(names) do
    local d = distance(key, k)
    if #key >= 3 and k:sub(1, #key) == key then d = min(d, 1) end
    if not bestd or d < bestd or (d == bestd and k < best) then best, bestd = k, d end
  end
  if bestd and bestd <= max(2, floor(#key / 3)) then return best end
  return nil
end
M.nearest = nearest

-- " (did you mean 'x'?)" for the key of known (a set) nearest to key, or
-- "" when none is near enough. where ("http.request", "step", "ctx")
-- looks up M.hints first.
function M.suggest(key, known, where)
  local best = where and M.hints[where .. "." .. tostring(key)] or nearest(key, known)
  return best and (" (did you mean '%s'?)"):format(best) or ""
end

-- The line where `key = ` first appears in src, or nil (a key is found as
-- text: the validation of a table that was built at run time has no AST).
function M.line_of(src, key)
  if not src or type(key) ~= "string" then return nil end
  key = key:gsub("%p", "%%%0") -- a key is text, not a pattern
  local n = 1
  for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    local s = line:gsub("%-%-.*$", "")
    if s:find("^%s*" .. key .. "%s*=") or s:find("[{,;%s]" .. key .. "%s*=") then return n end
    n = n + 1
  end
end

-- What agents reach for, from other APIs, that is not near its name here:
-- "where.key" -> the name meant ("ctx.data" -> "input").
M.hints = {
  ["ctx.data"] = "input", ["ctx.payload"] = "input", ["ctx.args"] = "input", ["ctx.params"] = "input",
  ["ctx.id"] = "run_id", ["ctx.name"] = "skill",
  ["step.call"] = "invoke", ["step.emit"] = "send_event", ["step.delay"] = "sleep", ["step.wait_until"] = "sleep_until",
  ["step.all"] = "parallel", ["step.map"] = "parallel", ["step.gather"] = "parallel", ["step.do"] = "run",
  ["http.fetch"] = "get", ["http.put"] = "request", ["http.delete"] = "request", ["http.patch"] = "request",
  ["llm.complete"] = "chat", ["llm.completion"] = "chat", ["llm.ask"] = "chat", ["llm.prompt"] = "chat",
  ["llm.generate"] = "chat",
  ["log.warning"] = "warn", ["log.debug"] = "info", ["log.err"] = "error",
  ["json.stringify"] = "encode", ["json.parse"] = "decode", ["json.dumps"] = "encode", ["json.loads"] = "decode",
  ["runs.find"] = "list", ["runs.query"] = "list", ["runs.search"] = "list", ["runs.kill"] = "cancel",
  ["runs.stop"] = "cancel", ["skills.put"] = "deploy", ["skills.write"] = "deploy", ["skills.validate"] = "check",
  ["time.time"] = "now", ["time.duration"] = "parse_duration",
  ["http.request.data"] = "json", ["http.request.payload"] = "json", ["http.request.query"] = "url",
  ["http.request.params"] = "url",
  ["http.get.query"] = "headers", ["step.wait_for_event.name"] = "event", ["step.wait_for_event.filter"] = "match",
  ["step.wait_for_event.where"] = "match",
  ["step.invoke.input"] = "data", ["step.invoke.payload"] = "data", ["step.invoke.name"] = "skill",
  ["step.invoke.id"] = "skill",
  ["step.run.attempts"] = "retries", ["step.run.max_retries"] = "retries", ["step.run.max_attempts"] = "retries",
  ["step.parallel.attempts"] = "retries", ["step.parallel.max_retries"] = "retries",
  ["step.send_event.event"] = "name", ["step.send_event.payload"] = "data", ["step.send_event.key"] = "id",
  ["llm.chat.system_prompt"] = "system", ["llm.chat.max_output_tokens"] = "max_tokens",
  ["llm.chat.response_format"] = "json",
  ["runs.list.state"] = "status", ["runs.list.skill_id"] = "skill", ["runs.list.count"] = "limit",
}

-- The skill table --------------------------------------------------------------

-- Each key: its name, what it takes, and a line of meaning.
M.skill_keys = {
  { name = "id", takes = "string [a-z0-9][a-z0-9._-]*", doc = "the skill's id; default: the file name without .lua, _ as -" },
  { name = "description", takes = "string", doc = "shown by moonloop skills" },
  { name = "triggers", takes = "list of {event=} or {cron=, tz=}", doc = "what starts runs; none: only invoke" },
  { name = "retries", takes = "0..100", doc = "retries of each step after its first attempt (default 3)" },
  { name = "backoff", takes = "duration", doc = "the first retry's delay, doubling per attempt (default 1s)" },
  { name = "timeout", takes = "duration", doc = "the whole run; past it the run fails" },
  { name = "concurrency", takes = "{limit=, key=, scope=} or a list of them",
    doc = "at most limit runs at once (per value of key; scope: shared by every skill naming it); queued, not dropped" },
  { name = "throttle", takes = "{limit=, period=, key=, burst=}",
    doc = "at most limit run starts per period (per value of key); the excess is queued, in order; burst: extra starts at once" },
  { name = "rate_limit", takes = "{limit=, period=, key=}",
    doc = "at most limit runs per period (per value of key); the excess is skipped: the run ends skipped, saying so" },
  { name = "singleton", takes = "{key=, mode=}",
    doc = "at most one run at a time (per value of key); a new one is skipped (mode \"skip\") or cancels the running one (\"cancel\")" },
  { name = "idempotency", takes = "path, or {key=, period=}",
    doc = "one run per value of key within period (default 24h); a repeat is skipped, naming the first run" },
  { name = "debounce", takes = "{period=, key=, max_wait=}",
    doc = "one run once period passed with no newer event (per value of key), with the last event's data; max_wait bounds a burst" },
  { name = "priority", takes = "function(event) -> number",
    doc = "orders the runs queued for a concurrency limit: higher first, in order of creation within a priority" },
  { name = "batch", takes = "{max=, timeout=, key=}",
    doc = "one run gets up to max events as ctx.events (per value of key), started when full or timeout after the first" },
  { name = "cancel_on", takes = "{event=, match=} or a list of them", doc = "events that cancel a run" },
  { name = "on_failure", takes = "function(ctx, err)", doc = "runs as its own durable run once a run failed" },
  { name = "run", takes = "function(ctx)", doc = "required: the run's body; its return value is the output" },
}
-- The keys of the skill table's sub-tables.
M.trigger_keys = { "event", "cron", "tz" }
M.concurrency_keys = { "limit", "key", "scope" }
M.throttle_keys = { "limit", "period", "key", "burst" }
M.rate_limit_keys = { "limit", "period", "key" }
M.singleton_keys = { "key", "mode" }
M.idempotency_keys = { "key", "period" }
M.debounce_keys = { "period", "key", "max_wait" }
M.batch_keys = { "max", "timeout", "key" }
M.cancel_on_keys = { "event", "match" }
-- Keys that versions registered before these tables existed may hold,
-- which did nothing: a recorded version that has them still loads (its
-- runs finish on it); a new file that has them is refused.
M.legacy_trigger_keys = { match = true }
M.legacy_cancel_on_keys = { timeout = true }

-- ctx --------------------------------------------------------------------------

M.ctx_fields = {
  { name = "input", doc = "the run's input (the event's data, or invoke's data)" },
  { name = "event", doc = "the triggering event {name, data, id, ts}; for other triggers data is the input" },
  { name = "run_id", doc = "the run's id" },
  { name = "skill", doc = "the skill's id" },
  { name = "version", doc = "the SHA-256 of the skill's source" },
  { name = "trigger", doc = "the trigger record {kind, ...}" },
  { name = "events", doc = "the events of the run's batch (skills with batch), oldest first; else {ctx.event}" },
  { name = "step", doc = "the step API" },
  { name = "log", doc = "the log module" },
  { name = "attempt", doc = "inside a step body: the attempt number (1, 2, ...)" },
  { name = "step_key", doc = "inside a step body: RUN_ID:STEP_ID, an idempotency key" },
}

-- Steps ----------------------------------------------------------------------------

-- Each step: its name, its arguments, the argument that is a table of
-- options (opts_arg, its keys opts; table_arg when that table is the
-- step's whole description rather than extra options; required keys),
-- the argument that holds step bodies (body_arg: a function, or a list
-- of them), what it returns.
M.steps = {
  { name = "run", args = "id, fn [, opts]", opts_arg = 3, opts = { "retries", "timeout" }, body_arg = 2,
    returns = "what fn returns (a JSON value)",
    doc = "run fn once and checkpoint its result; retried on error" },
  { name = "sleep", args = "id, duration", returns = "nil", doc = "durable sleep (\"30s\", \"5m\", \"2h\", \"7d\", or seconds)" },
  { name = "sleep_until", args = "id, time", returns = "nil", doc = "sleep until a unix time or an RFC 3339 string" },
  { name = "wait_for_event", args = "id, {event=, match=, timeout=}", opts_arg = 2, table_arg = true,
    opts = { "event", "match", "timeout" }, required = { "event" },
    returns = "the event {name, data, id, ts}, or nil on timeout",
    doc = "park the run until a matching event arrives" },
  { name = "invoke", args = "id, {skill=, data=, timeout=}", opts_arg = 2, table_arg = true,
    opts = { "skill", "data", "timeout" }, required = { "skill" },
    returns = "the child run's output",
    doc = "run another skill as a child run and wait for it (in the functions of step.parallel: children at once)" },
  { name = "send_event", args = "id, {name=, data=, id=} or a list of them", event_arg = 2,
    returns = "the list of event ids", doc = "send events, durably" },
  { name = "parallel", args = "id, {fn, fn, ...} [, opts]", opts_arg = 3, opts = { "retries", "timeout" },
    body_arg = 2, body_list = true,
    returns = "the list of the functions' results", doc = "run step bodies at once, each its own step id/1, id/2, ..." },
}
-- The keys of an event given to step.send_event.
M.event_keys = { "name", "data", "id" }

-- Modules ----------------------------------------------------------------------------

-- Each module: its functions (name, arguments, the options table as for
-- steps, what it returns) and its values. A module marked io does I/O or
-- reads the engine: its functions must be called inside step bodies
-- (except those marked pure). `fatal` is a function, not a table: its
-- entry has call = true.
M.modules = {
  { name = "json", functions = {
      { name = "encode", args = "value [, {pretty=}]", opts_arg = 2, opts = { "pretty" }, returns = "JSON text" },
      { name = "decode", args = "text", returns = "the value (null is json.null)" },
      { name = "array", args = "t", returns = "t, marked to encode as an array ([] when empty)" },
      { name = "object", args = "t", returns = "t, marked to encode as an object ({} when empty)" },
    }, values = { { name = "null", doc = "JSON null (a value that survives in tables)" } } },
  { name = "http", io = true, functions = {
      { name = "request", args = "{method=, url=, headers=, body= or json=, timeout=}", opts_arg = 1,
        table_arg = true, opts = { "method", "url", "headers", "body", "json", "timeout" }, required = { "url" },
        returns = "{status=, headers=, body=}, or nil, message on a transport failure" },
      { name = "get", args = "url [, {headers=, timeout=}]", opts_arg = 2, opts = { "headers", "timeout" },
        returns = "the body (raises on a transport failure or a non-2xx status)" },
      { name = "get_json", args = "url [, {headers=, timeout=}]", opts_arg = 2, opts = { "headers", "timeout" },
        returns = "the decoded body (raises likewise)" },
      { name = "post_json", args = "url, value [, {headers=, timeout=}]", opts_arg = 3,
        opts = { "headers", "timeout" }, returns = "the decoded answer (raises likewise)" },
    } },
  { name = "llm", io = true, functions = {
      { name = "chat", args = "{prompt= or messages=, system=, model=, json=, temperature=, max_tokens=, timeout=}",
        opts_arg = 1, table_arg = true,
        opts = { "prompt", "messages", "system", "model", "json", "temperature", "max_tokens", "timeout" },
        returns = "{text=, json=, usage=, model=}" },
    } },
  { name = "runs", io = true, functions = {
      { name = "list", args = "{skill=, status=, trigger=, parent=, since=, until=, limit=}", opts_arg = 1,
        table_arg = true, opts = { "skill", "status", "trigger", "parent", "since", "until", "limit" },
        returns = "run records, newest first" },
      { name = "get", args = "run_id", returns = "the run record with its steps, or nil, message" },
      { name = "cancel", args = "run_id [, reason]",
        returns = "{run_id=, status=}, or nil, message when there is no such run or it already ended" },
      { name = "stats", args = "{skill=, since=, until=, interval=}", opts_arg = 1, table_arg = true,
        opts = { "skill", "since", "until", "interval" },
        returns = "the health figures of a skill (or every skill) over a window, as GET /v1/skills/{id}/stats; nil, message for an unknown skill" },
    } },
  { name = "skills", io = true, functions = {
      { name = "list", args = "", returns = "the registered skills" },
      { name = "get", args = "id", returns = "the skill record with its live source, or nil, message" },
      { name = "check", args = "source [, name]", pure = true,
        returns = "{ok=true, id=, warnings=} or {ok=false, error=, line=}" },
      { name = "deploy", args = "id, source", returns = "{file=, version=}" },
    } },
  { name = "log", functions = {
      { name = "info", args = "...", returns = "nil" },
      { name = "warn", args = "...", returns = "nil" },
      { name = "error", args = "...", returns = "nil" },
    } },
  { name = "time", functions = {
      { name = "now", args = "", returns = "unix seconds (with ms); outside a step: the time recorded at the last step" },
      { name = "parse", args = "rfc3339", returns = "unix seconds" },
      { name = "parse_duration", args = "s", returns = "seconds" },
    } },
  { name = "env", functions = {}, doc = "read-only: the variables the configuration grants, as strings" },
  { name = "fatal", call = true, args = "message", returns = "an error value: error(fatal(msg)) fails the step without retries",
    functions = {} },
}

-- Lookups: M.step[name], M.module[name], M.func[module][name].
M.step, M.module, M.func = {}, {}, {}
for _, s in ipairs(M.steps) do M.step[s.name] = s end
for _, m in ipairs(M.modules) do
  M.module[m.name] = m
  local f = {}
  for _, fn in ipairs(m.functions) do f[fn.name] = fn end
  for _, v in ipairs(m.values or {}) do f[v.name] = v end
  M.func[m.name] = f
end
for _, s in ipairs(M.steps) do s.opts_set = s.opts and set_of(s.opts) end
for _, m in ipairs(M.modules) do
  for _, fn in ipairs(m.functions) do fn.opts_set = fn.opts and set_of(fn.opts) end
end
M.skill_key_set = {}
for _, k in ipairs(M.skill_keys) do M.skill_key_set[k.name] = true end
M.ctx_field_set = {}
for _, k in ipairs(M.ctx_fields) do M.ctx_field_set[k.name] = true end
M.event_key_set = set_of(M.event_keys)

-- Every hint names something that exists (checked once, when loaded).
for k, v in pairs(M.hints) do
  local where, key = k:match("^(.+)%.([^.]+)$")
  local known
  if where == "ctx" then known = M.ctx_field_set[v]
  elseif where == "step" then known = M.step[v]
  elseif M.func[where] then known = M.func[where][v]
  else
    local mod, fn = where:match("^([^.]+)%.([^.]+)$")
    local e = mod == "step" and M.step[fn] or (M.func[mod] and M.func[mod][fn])
    known = e and (e.opts_set and e.opts_set[v] or (fn == "send_event" and M.event_key_set[v]))
  end
  if not known or key == v then error("api.lua: the hint " .. k .. " -> " .. v .. " names nothing") end
end

-- The names of a list of entries.
local function names(list)
  local out = {}
  for i, e in ipairs(list) do out[i] = e.name end
  return out
end
M.names = names

-- Messages ----------------------------------------------------------------------------

-- How a key shows in a message: a string quoted, anything else as itself.
local function shown(k)
  if type(k) == "string" then return "'" .. k:sub(1, 40) .. "'" end
  return tostring(k)
end

-- The message for an unknown key k of the options table of `what` (a step
-- or module function entry, named name: "step.run", "http.request"), or
-- nil when every key is known. Positional entries of a table that takes
-- keys only are unknown keys too ({ "x" }).
function M.unknown_key(name, entry, k)
  if entry.opts_set[k] then return nil end
  if name == "step.invoke" and k == 1 then
    -- A list of children: the one way to start several at once.
    return "step.invoke: takes one child {skill=, data=, timeout=}, not a list; for several at once, "
      .. "call it in the functions of step.parallel: fns[i] = function() return ctx.step.invoke(\"child\", "
      .. "{ skill = ..., data = ... }) end, then ctx.step.parallel(\"fan\", fns)"
  end
  local word = entry.table_arg and "key" or "option"
  return ("%s: unknown %s %s%s; the %ss are %s"):format(name, word, shown(k),
    type(k) == "string" and M.suggest(k, entry.opts_set, name) or "", word, and_list(entry.opts))
end

-- The message for the first unknown key of t, or nil when it has none.
-- Names come before other keys and in sorted order, so the message does
-- not depend on the table's internal order.
function M.check_keys(name, entry, t)
  local bad, other
  for k in pairs(t) do
    if not entry.opts_set[k] then
      if type(k) ~= "string" then other = other or k
      elseif not bad or k < bad then bad = k end
    end
  end
  if bad or other ~= nil then return M.unknown_key(name, entry, bad or other) end
  return nil
end

-- The message for an event of step.send_event with an unknown key, or nil.
function M.check_event_keys(name, i, ev)
  for k in pairs(ev) do
    if not M.event_key_set[k] then
      return ("%s: event %d: unknown key %s%s; an event has name, data and id"):format(name, i, shown(k),
        type(k) == "string" and M.suggest(k, M.event_key_set, name) or "")
    end
  end
  return nil
end

-- The message for `module.key` when the module has no such function or
-- value ("http.post is not a function of the http module: did you mean
-- http.post_json? (its functions are ...)"). module "step" is ctx.step.
-- Matching events -------------------------------------------------------------

-- The fields of an event (store.c's store__event_json): every path into
-- an event starts at one of them.
M.event_fields = { "data", "name", "id", "ts" }
local EVENT_FIELDS = set_of(M.event_fields)

-- A path into an event ("data.order_id"; "event.data.x" reads as
-- "data.x"): the path without "event.", or nil when it is not a path,
-- and then, for a path that starts at no field of an event, why. Such a
-- path ("service") is nil in every event, so it compares equal in all of
-- them: a wait or cancel_on would take any event, a key would hold every
-- run under one value. lenient (a version registered before, a step
-- replayed) takes it as before.
function M.event_path(p, lenient)
  if type(p) ~= "string" or not p:match("^[%a_][%w_]*[%w_.]*$") or p:find("..", 1, true) or p:sub(-1) == "." then
    return nil
  end
  local q = p:gsub("^event%.", "")
  if not lenient and not EVENT_FIELDS[q:match("^[^.]+")] then
    return nil, ("%q names no field of an event (a path starts at %s): did you mean \"data.%s\"?")
      :format(p, table.concat(M.event_fields, ", "), q)
  end
  return q
end

-- The `match` of step.wait_for_event and cancel_on (what: where it is,
-- for messages; null: json.null, the one value that is not a Lua scalar
-- allowed) as a list of pairs: {path} compares the value at path in the
-- incoming event with the run's own event's (ctx.event); {path, value}
-- with that value. Accepted: a path ("data.order_id"), a list of paths,
-- a table of path = value (a string, number, boolean or json.null), or
-- a list and pairs at once. Returns the pairs, or nil and a message that
-- names the fix.
function M.match_pairs(what, m, null, lenient)
  if type(m) == "string" then
    local p, why = M.event_path(m, lenient)
    if why then return nil, ("%s: 'match' %s"):format(what, why) end
    if not p then
      return nil, ("%s: 'match' must be a path such as \"data.request_id\" (or a table of path = value), got %q"):format(what, m)
    end
    return { { p } }
  end
  if type(m) ~= "table" then
    return nil, ("%s: 'match' must be a path such as \"data.request_id\", or a table of path = value such as "
      .. "{ [\"data.service\"] = \"api\" }, got a %s"):format(what, type(m))
  end
  local out, keys, n = {}, {}, #m
  for k in pairs(m) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    if type(a) == type(b) and (type(a) == "number" or type(a) == "string") then return a < b end
    return type(a) < type(b)
  end)
  for _, k in ipairs(keys) do
    local v = m[k]
    if type(k) == "number" and k >= 1 and k <= n and k == floor(k) then
      local p, why = M.event_path(v, lenient)
      if why then return nil, ("%s: match[%d] %s"):format(what, k, why) end
      if not p then
        return nil, ("%s: match[%d] must be a path such as \"data.service\" (compared with the run's own event), "
          .. "got %s; for a given value write match = { [\"data.service\"] = value }"):format(what, k,
          type(v) == "string" and ("%q"):format(v) or ("a " .. type(v)))
      end
      out[#out + 1] = { p }
    elseif type(k) ~= "string" then
      return nil, ("%s: 'match' keys must be paths such as \"data.service\", got a %s key (%s): "
        .. "write match = { [\"data.service\"] = value }"):format(what, type(k), tostring(k))
    else
      local p, why = M.event_path(k, lenient)
      if why then return nil, ("%s: match key %s"):format(what, why) end
      if not p then
        return nil, ("%s: match key %q is not a path such as \"data.service\""):format(what, k)
      end
      local tv = type(v)
      if tv == "table" or (tv ~= "string" and tv ~= "number" and tv ~= "boolean" and v ~= null) then
        return nil, ("%s: match[%q] is a %s: match compares single values (a string, number or boolean); "
          .. "name each field by its own path, such as match = { [\"%s.id\"] = ... }"):format(what, k, tv, k)
      end
      out[#out + 1] = { p, v }
    end
  end
  if #out == 0 then
    return nil, ("%s: 'match' is empty: it would match every event; leave it out, or name a path"):format(what)
  end
  return out
end

function M.unknown(module, key)
  key = tostring(key)
  local hint = M.hints[module .. "." .. key]
  if module == "step" then
    local near = hint or nearest(key, names(M.steps))
    return ("ctx.step.%s is not a step%s (the steps are %s)"):format(key,
      near and (": did you mean ctx.step." .. near .. "?") or "", and_list(names(M.steps)))
  end
  if module == "ctx" then
    local near = hint or nearest(key, names(M.ctx_fields))
    return ("ctx.%s is not a field of ctx%s (the fields are %s)"):format(key,
      near and (": did you mean ctx." .. near .. "?") or "", and_list(names(M.ctx_fields)))
  end
  if module == "os" then
    -- The sandbox's os (sandbox.lua) has only the clock: no processes, files or environment.
    if key == "getenv" then
      return "os.getenv is not available in a skill: read env.NAME, a variable the configuration grants "
        .. "(env = { \"NAME\" } in moonloop.conf.lua)"
    end
    return ("os.%s is not available in a skill (os has only %s)"):format(key, and_list(M.os_functions))
  end
  if module == "env" then
    return ("env.%s(...): env holds strings, not functions: it is the variables the configuration grants "
      .. "(env = { \"NAME\" } in moonloop.conf.lua), read as env.NAME"):format(key)
  end
  local m = M.module[module]
  if not m then return ("%s.%s: there is no module '%s'"):format(module, key, module) end
  local all = names(m.functions)
  for _, v in ipairs(m.values or {}) do all[#all + 1] = v.name end
  local near = hint or nearest(key, all)
  return ("%s.%s is not a function of the %s module%s (its functions are %s)"):format(module, key, module,
    near and (": did you mean " .. module .. "." .. near .. "?") or "", and_list(names(m.functions)))
end

-- The path the llm module posts to under llm.base_url (llm.lua), which a
-- test's c:llm answers (testing.lua).
M.llm_path = "/chat/completions"

-- The functions of the sandbox's os (sandbox.lua): the clock only.
M.os_functions = { "clock", "date", "time" }

-- What agents write when they take env for a module of functions
-- (env.get("X")): such a name, when it is not granted, is answered with
-- M.unknown's "env holds strings" rather than "add 'get' to env".
local ENV_GUESSES = set_of({ "get", "getenv", "has", "lookup", "read", "fetch", "keys", "list", "all", "value" })

-- The message for env.NAME when the configuration does not grant NAME to
-- the skill (skill: its id, or nil when not known yet), the same at run
-- time and in `moonloop check`. how "test": the skill runs in `moonloop
-- test`, where the test's env is what is granted.
function M.env_not_granted(name, skill, how)
  name = tostring(name)
  if ENV_GUESSES[name] then return M.unknown("env", name) end
  if how == "test" then
    return ("env.%s is not granted to this skill in this test: give it with test.skill(path, { env = { %s = \"...\" } }) "
      .. "or c:env{ %s = \"...\" } (the engine grants it with env or skill_env in moonloop.conf.lua)"):format(name,
      name, name)
  end
  return ("env.%s is not granted to this skill: add \"%s\" to env = {...} in moonloop.conf.lua (every skill), "
    .. "or to skill_env = { [\"%s\"] = { \"%s\" } } (this skill only)"):format(name, name, skill or "SKILL-ID", name)
end

-- Export -------------------------------------------------------------------------------

-- The tables as plain data (`moonloop check --api --json`): lists only,
-- no lookup sets; arr marks a list that may be empty as a JSON array.
function M.export(arr)
  arr = arr or function(t) return t end
  -- A function's call as written: http.request{...} for one that takes a
  -- single table, else name(args).
  -- io: the function must be called inside a step body.
  local function entry(e, prefix, io)
    local a = e.args or ""
    local call = prefix .. e.name .. ((a:sub(1, 1) == "{" and a:sub(-1) == "}") and a or "(" .. a .. ")")
    return { name = e.name, call = call, options = arr(e.opts or {}), required = arr(e.required or {}),
      returns = e.returns, doc = e.doc, io = io }
  end
  local out = { skill_keys = {}, trigger_keys = M.trigger_keys, concurrency_keys = M.concurrency_keys,
    throttle_keys = M.throttle_keys, rate_limit_keys = M.rate_limit_keys, singleton_keys = M.singleton_keys,
    idempotency_keys = M.idempotency_keys, debounce_keys = M.debounce_keys, batch_keys = M.batch_keys, cancel_on_keys = M.cancel_on_keys, event_keys = M.event_keys, ctx_fields = {}, steps = {}, modules = {} }
  for i, k in ipairs(M.skill_keys) do out.skill_keys[i] = { name = k.name, takes = k.takes, doc = k.doc } end
  for i, k in ipairs(M.ctx_fields) do out.ctx_fields[i] = { name = k.name, doc = k.doc } end
  for i, s in ipairs(M.steps) do
    local e = entry(s, "step.")
    e.call = "step." .. s.name .. "(" .. s.args .. ")"
    out.steps[i] = e
  end
  for i, m in ipairs(M.modules) do
    local fns = {}
    for j, fn in ipairs(m.functions) do fns[j] = entry(fn, m.name .. ".", (m.io and not fn.pure) or false) end
    local vals = {}
    for j, v in ipairs(m.values or {}) do vals[j] = { name = v.name, doc = v.doc } end
    out.modules[i] = { name = m.name, functions = arr(fns), values = arr(vals), io = m.io or false, doc = m.doc,
      call = m.call and (m.name .. "(" .. m.args .. ")") or nil, returns = m.call and m.returns or nil }
  end
  return out
end

-- The tables as one JSON document.
function M.export_json()
  return core.encode(M.export(core.json.array), 0)
end

-- The tables as text, one line per name, for a person to read.
function M.export_text()
  local t = M.export()
  local lines = {}
  local function add(s) lines[#lines + 1] = s end
  add("skill keys: " .. concat(names(t.skill_keys), ", "))
  add("  triggers: {" .. concat(t.trigger_keys, "=, ") .. "=}; concurrency: {" .. concat(t.concurrency_keys, "=, ")
    .. "=}; throttle: {" .. concat(t.throttle_keys, "=, ") .. "=}; rate_limit: {"
    .. concat(t.rate_limit_keys, "=, ") .. "=}; singleton: {" .. concat(t.singleton_keys, "=, ")
    .. "=}; idempotency: {" .. concat(t.idempotency_keys, "=, ") .. "=}; debounce: {"
    .. concat(t.debounce_keys, "=, ") .. "=}; batch: {" .. concat(t.batch_keys, "=, ") .. "=}; cancel_on: {" .. concat(t.cancel_on_keys, "=, ") .. "=}")
  add("ctx fields: " .. concat(names(t.ctx_fields), ", "))
  add("steps:")
  for _, s in ipairs(t.steps) do add("  ctx." .. s.call .. " -> " .. s.returns) end
  add("  (send_event's events: {" .. concat(t.event_keys, "=, ") .. "=})")
  add("modules:")
  for _, m in ipairs(t.modules) do
    if m.call then add("  " .. m.call .. " -> " .. m.returns) end
    if m.doc then add("  " .. m.name .. ": " .. m.doc) end
    for _, f in ipairs(m.functions) do add("  " .. f.call .. " -> " .. f.returns) end
    for _, v in ipairs(m.values) do add("  " .. m.name .. "." .. v.name .. ": " .. v.doc) end
  end
  return concat(lines, "\n")
end

return M
