-- skill.lua: strict validation of a skill definition table.
--
-- Errors name the file, the line (found in the source) and the key, and
-- suggest the nearest known key for a misspelt one ("retires" ->
-- "retries"). validate() returns a normalized spec or raises a table
-- {message=, line=, key=} whose message already carries "file:line: ".

local core = ...
local M = {}

local api = require("api") -- the one list of skill keys
local NULL = type(core) == "table" and core.json and core.json.null or nil
local suggest, line_of = api.suggest, api.line_of
local set_of = api.set_of

local KEYS = api.skill_key_set
local TRIGGER_KEYS = set_of(api.trigger_keys)
local CONCURRENCY_KEYS = set_of(api.concurrency_keys)
local CANCEL_KEYS = set_of(api.cancel_on_keys)
M.suggest = suggest

-- A value as an error shows it: a string is quoted and called one, so "3"
-- is never mistaken for 3; a table or function by its type.
local function show(v)
  if type(v) == "string" then
    return ('the string "%s"'):format(#v > 40 and v:sub(1, 40) .. "..." or v)
  elseif type(v) == "number" or type(v) == "boolean" or v == nil then
    return tostring(v)
  end
  return "a " .. type(v)
end

-- The line of the final `return`, where the table starts.
local function line_of_return(src)
  if not src then return nil end
  local n, found = 1, nil
  for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    if line:find("^%s*return[%s{]") or line:find("^%s*return$") then found = n end
    n = n + 1
  end
  return found
end

-- recorded: the source is a version registered before (its runs resume on
-- it), so keys that newer validation refuses but that never did anything
-- (api.legacy_*) are let through rather than failing those runs.
function M.validate(def, file, src, default_id, recorded)
  local function fail(key, fmt, ...)
    local line = line_of(src, key) or line_of_return(src)
    local where = line and (file .. ":" .. line) or file
    error({ message = where .. ": " .. fmt:format(...), line = line, key = key }, 0)
  end

  -- A key (concurrency, throttle, singleton, ...): a path into the run's
  -- event (api.event_path), or nil when optional; else fail at field.
  local function key_path(field, where, v, example, optional)
    if v == nil and optional then return end
    local ok, why = api.event_path(v, recorded)
    if why then fail(field, "'%s' %s", where, why) end
    if not ok then fail(field, "'%s' must be a path such as \"%s\", got %s", where, example, show(v)) end
  end

  if type(def) ~= "table" then
    fail(nil, "the file must return a table (the skill definition), got %s", type(def))
  end
  for k in pairs(def) do
    if type(k) ~= "string" then fail(nil, "the skill table has a non-string key %s", tostring(k)) end
    if not KEYS[k] then fail(k, "unknown key '%s' in the skill table%s", k, suggest(k, KEYS)) end
  end
  local function duration(key, v)
    if type(v) == "number" then
      if v < 0 or v ~= v then fail(key, "'%s' must be a positive duration, got %s", key, show(v)) end
      return math.floor(v * 1000 + 0.5)
    end
    if type(v) ~= "string" then
      fail(key, "'%s' must be a duration such as \"30s\" or \"1h\", got %s", key, type(v))
    end
    local ms, err = core.duration(v)
    if not ms then fail(key, "'%s': %s", key, err) end
    return ms
  end

  local spec = {}
  local id = def.id
  if id == nil then id = default_id end
  if type(id) ~= "string" then fail("id", "'id' must be a string, got %s", type(id)) end
  if not id:match("^[a-z0-9][a-z0-9._-]*$") or #id > 128 then
    fail("id", "bad skill id '%s': use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", id)
  end
  spec.id = id

  if def.description ~= nil and type(def.description) ~= "string" then
    fail("description", "'description' must be a string, got %s", type(def.description))
  end
  spec.description = def.description

  if type(def.run) ~= "function" then
    fail(def.run == nil and nil or "run", "the skill table needs a 'run' function, got %s", type(def.run))
  end
  if def.on_failure ~= nil and type(def.on_failure) ~= "function" then
    fail("on_failure", "'on_failure' must be a function, got %s", type(def.on_failure))
  end
  spec.has_on_failure = def.on_failure ~= nil
  if def.priority ~= nil and type(def.priority) ~= "function" then
    fail("priority", "'priority' must be a function(event) returning a number (higher runs first), got %s",
         show(def.priority))
  end
  spec.has_priority = def.priority ~= nil

  if def.retries ~= nil then
    local r = def.retries
    if type(r) ~= "number" or r < 0 or r ~= math.floor(r) or r > 100 then
      fail("retries", "'retries' must be a whole number from 0 to 100, got %s", show(r))
    end
  end
  spec.retries = def.retries
  if def.backoff ~= nil then spec.backoff_ms = duration("backoff", def.backoff) end
  if def.timeout ~= nil then spec.timeout_ms = duration("timeout", def.timeout) end

  local triggers = {}
  if def.triggers ~= nil then
    if type(def.triggers) ~= "table" then
      fail("triggers", "'triggers' must be a list of tables, got %s", type(def.triggers))
    end
    for i, t in ipairs(def.triggers) do
      if type(t) ~= "table" then fail("triggers", "trigger %d must be a table, got %s", i, type(t)) end
      for k in pairs(t) do
        if not TRIGGER_KEYS[k] and not (recorded and api.legacy_trigger_keys[k]) then
          fail(type(k) == "string" and k or "triggers", "unknown key '%s' in trigger %d%s", tostring(k), i,
               type(k) == "string" and suggest(k, TRIGGER_KEYS) or "")
        end
      end
      if (t.event == nil) == (t.cron == nil) then
        fail("triggers", "trigger %d needs exactly one of 'event' or 'cron'", i)
      end
      if t.event ~= nil then
        if type(t.event) ~= "string" or t.event == "" then
          fail("event", "trigger %d: 'event' must be a non-empty string", i)
        end
        if t.tz ~= nil then fail("tz", "trigger %d: 'tz' only goes with 'cron'", i) end
        triggers[#triggers + 1] = { event = t.event, match = t.match }
      else
        if type(t.cron) ~= "string" then fail("cron", "trigger %d: 'cron' must be a string", i) end
        if t.tz ~= nil and type(t.tz) ~= "string" then fail("tz", "trigger %d: 'tz' must be a string", i) end
        -- (An empty zone read as UTC: leave tz out for UTC.)
        if t.tz == "" then fail("tz", "trigger %d: 'tz' is empty: name a zone such as \"Europe/Paris\", or leave tz out for UTC", i) end
        local ok, err = core.cron_check(t.cron, t.tz)
        if not ok then fail("cron", "trigger %d: %s", i, err) end
        triggers[#triggers + 1] = { cron = t.cron, tz = t.tz }
      end
    end
    for k in pairs(def.triggers) do
      if type(k) ~= "number" or k < 1 or k > #def.triggers or k ~= math.floor(k) then
        fail("triggers", "'triggers' must be a list (found key %s)", tostring(k))
      end
    end
  end
  spec.triggers = triggers

  if def.concurrency ~= nil then
    -- One limit {limit=, key=, scope=}, or a list of them: a run starts
    -- only when every one of them has room.
    local c = def.concurrency
    if type(c) ~= "table" then
      fail("concurrency", "'concurrency' must be a table {limit=, key=, scope=} or a list of them, got %s", show(c))
    end
    local list = c[1] ~= nil and c or { c }
    if c[1] ~= nil then
      for k in pairs(c) do
        if type(k) ~= "number" or k < 1 or k > #c or k ~= math.floor(k) then
          fail(type(k) == "string" and k or "concurrency",
               "'concurrency' is a list of limits, so it cannot also have the key '%s': write "
               .. "{ {limit = 1, key = ...}, {limit = 5} }", tostring(k))
        end
      end
    end
    local limits, seen = {}, {}
    for i, l in ipairs(list) do
      local where = #list > 1 and ("concurrency " .. i) or "concurrency"
      if type(l) ~= "table" then fail("concurrency", "%s must be a table {limit=, key=, scope=}, got %s", where, show(l)) end
      for k in pairs(l) do
        if not CONCURRENCY_KEYS[k] then
          fail(type(k) == "string" and k or "concurrency", "unknown key '%s' in '%s'%s", tostring(k), where,
               type(k) == "string" and suggest(k, CONCURRENCY_KEYS) or "")
        end
      end
      if type(l.limit) ~= "number" or l.limit < 1 or l.limit ~= math.floor(l.limit) or l.limit > 1e9 then
        fail("limit", "'%s.limit' must be a whole number of at least 1, got %s", where, show(l.limit))
      end
      key_path("key", where .. ".key", l.key, "event.data.service", true)
      if l.scope ~= nil and (type(l.scope) ~= "string" or not l.scope:match("^[a-z0-9][a-z0-9._-]*$")
          or #l.scope > 100) then
        fail("scope", "'%s.scope' must be a name such as \"openai\" ([a-z0-9][a-z0-9._-]*), shared by every "
             .. "skill that names it, got %s", where, show(l.scope))
      end
      local id = (l.scope or "") .. "|" .. (l.key or "")
      if seen[id] then
        fail("concurrency", "%s repeats %s %s: keep one limit per %s (the smaller)", where,
             l.scope and ("scope '" .. l.scope .. "'") or "the skill's own limit",
             l.key and ("on key '" .. l.key .. "'") or "without a key", l.scope and "scope and key" or "key")
      end
      seen[id] = true
      limits[#limits + 1] = { limit = l.limit, key = l.key, scope = l.scope }
    end
    spec.concurrency = limits
  end

  -- throttle and rate_limit: at most `limit` starts per `period` (per
  -- value of `key`); throttle queues the excess (burst: extra starts at
  -- once), rate_limit skips it.
  local function per_period(name, keys, with_burst)
    local t = def[name]
    if t == nil then return nil end
    local shape = with_burst and "{limit=, period=, key=, burst=}" or "{limit=, period=, key=}"
    if type(t) ~= "table" then fail(name, "'%s' must be a table %s, got %s", name, shape, show(t)) end
    for k in pairs(t) do
      if not keys[k] then
        fail(type(k) == "string" and k or name, "unknown key '%s' in '%s'%s", tostring(k), name,
             type(k) == "string" and suggest(k, keys) or "")
      end
    end
    if type(t.limit) ~= "number" or t.limit < 1 or t.limit ~= math.floor(t.limit) or t.limit > 1e9 then
      fail("limit", "'%s.limit' must be a whole number of at least 1 (starts per period), got %s", name, show(t.limit))
    end
    if t.period == nil then fail(name, "'%s' needs a 'period' such as \"1m\" (%s)", name, shape) end
    local period = duration(name .. ".period", t.period)
    if period < 1 then fail("period", "'%s.period' must be longer than 0", name) end
    key_path("key", name .. ".key", t.key, "event.data.team", true)
    local burst = 0
    if with_burst and t.burst ~= nil then
      if type(t.burst) ~= "number" or t.burst < 0 or t.burst ~= math.floor(t.burst) or t.burst > 1e6 then
        fail("burst", "'%s.burst' must be a whole number of at least 0 (extra starts at once), got %s", name, show(t.burst))
      end
      burst = t.burst
    end
    return { limit = t.limit, period = period, key = t.key, burst = burst }
  end
  local throttle = per_period("throttle", set_of(api.throttle_keys), true)
  local rate = per_period("rate_limit", set_of(api.rate_limit_keys), false)

  -- singleton: at most one run per value of key; a new one is skipped
  -- (mode "skip") or cancels the live one and takes its place ("cancel").
  local singleton
  if def.singleton ~= nil then
    local t, keys = def.singleton, set_of(api.singleton_keys)
    if type(t) ~= "table" then fail("singleton", "'singleton' must be a table {key=, mode=}, got %s", show(t)) end
    for k in pairs(t) do
      if not keys[k] then
        fail(type(k) == "string" and k or "singleton", "unknown key '%s' in 'singleton'%s", tostring(k),
             type(k) == "string" and suggest(k, keys) or "")
      end
    end
    key_path("key", "singleton.key", t.key, "event.data.service", true)
    if t.mode ~= nil and t.mode ~= "skip" and t.mode ~= "cancel" then
      fail("mode", "'singleton.mode' must be \"skip\" (a new run is skipped while one runs) or \"cancel\" "
           .. "(a new run cancels the one running), got %s", show(t.mode))
    end
    singleton = { key = t.key, mode = t.mode or "skip" }
  end
  -- idempotency: one run per value of key within period (default 24h).
  local idem
  if def.idempotency ~= nil then
    local t, keys = def.idempotency, set_of(api.idempotency_keys)
    if type(t) == "string" then t = { key = t } end
    if type(t) ~= "table" then
      fail("idempotency", "'idempotency' must be a path such as \"event.data.order_id\" or a table {key=, period=}, got %s",
           show(t))
    end
    for k in pairs(t) do
      if not keys[k] then
        fail(type(k) == "string" and k or "idempotency", "unknown key '%s' in 'idempotency'%s", tostring(k),
             type(k) == "string" and suggest(k, keys) or "")
      end
    end
    if t.key == nil then
      fail("idempotency", "'idempotency' needs a key: a path such as \"event.data.order_id\", got nil")
    end
    key_path("idempotency", "idempotency.key", t.key, "event.data.order_id")
    local period = t.period ~= nil and duration("idempotency.period", t.period) or 24 * 3600 * 1000
    if period < 1 then fail("period", "'idempotency.period' must be longer than 0") end
    idem = { key = t.key, period = period }
  end

  -- debounce: a run starts once period passed with no newer event for its
  -- key, with the latest event's data; a burst waits at most max_wait.
  local debounce
  if def.debounce ~= nil then
    local t, keys = def.debounce, set_of(api.debounce_keys)
    if type(t) ~= "table" then fail("debounce", "'debounce' must be a table {period=, key=, max_wait=}, got %s", show(t)) end
    for k in pairs(t) do
      if not keys[k] then
        fail(type(k) == "string" and k or "debounce", "unknown key '%s' in 'debounce'%s", tostring(k),
             type(k) == "string" and suggest(k, keys) or "")
      end
    end
    if t.period == nil then fail("debounce", "'debounce' needs a 'period' such as \"5s\": how long no newer event must come") end
    local period = duration("debounce.period", t.period)
    if period < 1 then fail("period", "'debounce.period' must be longer than 0") end
    key_path("key", "debounce.key", t.key, "event.data.incident", true)
    local max_wait = t.max_wait ~= nil and duration("debounce.max_wait", t.max_wait) or nil
    if max_wait and max_wait < period then
      fail("max_wait", "'debounce.max_wait' must be at least the period (%s ms), got %s ms", period, max_wait)
    end
    debounce = { period = period, key = t.key, max_wait = max_wait }
  end

  -- batch: one run gets up to max events (ctx.events), started when the
  -- batch is full or timeout passed since its first event, per key.
  local batch
  if def.batch ~= nil then
    local t, keys = def.batch, set_of(api.batch_keys)
    if type(t) ~= "table" then fail("batch", "'batch' must be a table {max=, timeout=, key=}, got %s", show(t)) end
    for k in pairs(t) do
      if not keys[k] then
        fail(type(k) == "string" and k or "batch", "unknown key '%s' in 'batch'%s", tostring(k),
             type(k) == "string" and suggest(k, keys) or "")
      end
    end
    if type(t.max) ~= "number" or t.max < 1 or t.max ~= math.floor(t.max) or t.max > 10000 then
      fail("max", "'batch.max' must be a whole number from 1 to 10000 (events per run), got %s", show(t.max))
    end
    if t.timeout == nil then fail("batch", "'batch' needs a 'timeout' such as \"5s\": how long a batch waits to fill") end
    local timeout = duration("batch.timeout", t.timeout)
    key_path("key", "batch.key", t.key, "event.data.tenant", true)
    batch = { max = t.max, timeout = timeout, key = t.key }
  end

  -- A debounce drops every run of a burst but the last, and a batch's run
  -- carries the events batched into it: a debounced batch would lose
  -- them (or hand one run more than max). A batch's timeout already
  -- gathers a burst.
  if batch and debounce then
    fail("debounce", "'batch' and 'debounce' cannot be combined: a debounce skips every run of a burst but "
         .. "the last, and with it the events batched into that run; a batch already gathers a burst "
         .. "(its run starts when it is full or 'timeout' after its first event): drop 'debounce'")
  end

  -- What the core asks of the store before a run starts (flowctl.c), in
  -- the order they apply (store_queue.c's admit): admission (idempotency,
  -- batch, debounce, rate limit, singleton, throttle), then the
  -- concurrency slots.
  local flow = {}
  if idem then flow[#flow + 1] = { kind = "idempotency", key = idem.key, period = idem.period } end
  if batch then flow[#flow + 1] = { kind = "batch", limit = batch.max, period = batch.timeout, key = batch.key } end
  if debounce then
    flow[#flow + 1] = { kind = "debounce", period = debounce.period, key = debounce.key, max_wait = debounce.max_wait }
  end
  if rate then
    flow[#flow + 1] = { kind = "rate", limit = rate.limit, period = rate.period, key = rate.key }
  end
  if singleton then
    flow[#flow + 1] = { kind = "singleton", key = singleton.key, mode = singleton.mode }
    -- One run at a time per key: a run that cancelled the live one waits
    -- for its end.
    flow[#flow + 1] = { kind = "concurrency", limit = 1, key = singleton.key, tag = "singleton" }
  end
  if throttle then
    flow[#flow + 1] = { kind = "throttle", limit = throttle.limit, period = throttle.period, key = throttle.key,
                        burst = throttle.burst }
  end
  for _, l in ipairs(spec.concurrency or {}) do
    flow[#flow + 1] = { kind = "concurrency", limit = l.limit, key = l.key, scope = l.scope }
  end
  if #flow > 0 then spec.flow = flow end
  if spec.has_priority and not spec.concurrency and not singleton then
    fail("priority", "'priority' orders the runs waiting for a concurrency limit, and this skill has none: "
         .. "add concurrency = {limit = N}")
  end

  if def.cancel_on ~= nil then
    -- A list of {event=, match=}, or one of them (as concurrency takes).
    local c0 = def.cancel_on
    if type(c0) ~= "table" then
      fail("cancel_on", "'cancel_on' must be a table {event=, match=} or a list of them, got %s", show(c0))
    end
    local single = c0[1] == nil and next(c0) ~= nil
    local items = single and { c0 } or c0
    if not single then
      -- The first stray key in sorted order, so the message does not
      -- depend on the table's internal order.
      local bad
      for k in pairs(c0) do
        if type(k) ~= "number" or k < 1 or k > #c0 or k ~= math.floor(k) then
          if bad == nil or (type(k) == "string" and (type(bad) ~= "string" or k < bad)) then bad = k end
        end
      end
      if bad ~= nil then
        fail(type(bad) == "string" and bad or "cancel_on",
             "'cancel_on' is a list of {event=, match=}, so it cannot also have the key '%s': write "
             .. "{ {event = \"x\", match = ...}, ... }", tostring(bad))
      end
    end
    local list = {}
    for i, c in ipairs(items) do
      local where = single and "cancel_on" or ("cancel_on " .. i)
      if type(c) ~= "table" then fail("cancel_on", "%s must be a table {event=, match=}, got %s", where, show(c)) end
      local bad -- the first unknown key in sorted order (names first)
      for k in pairs(c) do
        if not CANCEL_KEYS[k] and not (recorded and api.legacy_cancel_on_keys[k]) then
          if bad == nil or (type(k) == "string" and (type(bad) ~= "string" or k < bad)) then bad = k end
        end
      end
      if bad ~= nil then
        fail(type(bad) == "string" and bad or "cancel_on", "unknown key '%s' in %s%s; the keys are %s", tostring(bad),
             where, type(bad) == "string" and suggest(bad, CANCEL_KEYS) or "", table.concat(api.cancel_on_keys, " and "))
      end
      if type(c.event) ~= "string" or c.event == "" then
        fail("cancel_on", "%s needs an 'event' name", where)
      end
      -- The match as pairs ({path} or {path, value}: api.match_pairs), for
      -- run.c's cancel_match and testing_driver.lua.
      local match
      if c.match ~= nil then
        local err
        match, err = api.match_pairs(where, c.match, NULL, recorded)
        if not match then fail("match", "%s", err) end
      end
      list[#list + 1] = { event = c.event, match = match }
    end
    spec.cancel_on = list
  end
  return spec
end

-- (api.lua has them; kept here for the modules that ask skill.lua.)
M.suggest, M.line_of = suggest, line_of

return M
