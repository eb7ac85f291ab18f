-- testing.lua: skill tests (`moonloop test`): the `test` module that test
-- files see, and the driver that runs a skill under test.
--
-- A test file is Lua, run in a sandbox like a skill file, that returns the
-- suite(s) made by test.skill(path or id); each suite holds cases, and a
-- case is a function of `c`, the case's handle: mocks, c:run, assertions.
-- docs/testing.md is the user's guide; this is how it works.
--
-- The run under test is the production one: the skill file is loaded by
-- loader.load (the real sandbox and validation) and its run coroutine is
-- made by run.new, so step.run, retries, JSON rules, replay checks and
-- every flow step are the engine's own code. Only the other side of the
-- yields is different: where the engine's scheduler (run.c, run_flow.c)
-- does the durable part of an op, this driver interprets it:
--
--   COMMIT, RETRY, FAIL   recorded in the case's step records; a retry
--                         waits its backoff on the virtual clock
--   BACKOFF, DELAY        wait on the virtual clock
--   HTTP                  answered by the case's http/llm mocks, or
--                         refused: "GET http://... is not mocked"
--   SLEEP                 the virtual clock jumps to the wake time
--   WAIT                  the first supplied event that matches (c:event),
--                         delivered at its time, or nil at the timeout
--   INVOKE                the case's child mock for that skill (c:child)
--   SEND                  recorded (c:sent) and added to the case's events
--   PARALLEL              the children run as tasks of this driver
--
-- Tasks (the run's main coroutine and step.parallel's children) wait in a
-- queue ordered by virtual time, then by arrival; the driver takes the
-- earliest, sets the clock to its time and resumes it. So sleeps, backoffs
-- and timeouts pass at once and in order, and time.now() (core.now,
-- replaced by skilltest.c) reads the virtual clock. The run's own timeout
-- (the skill's `timeout`) and its cancel_on events apply on that clock.
--
-- Mocks by step id replace the body before step.run runs it: run.step.run
-- and run.step.parallel are wrapped (in this process only) to swap in the
-- mock's body, then tail-call the real function, so the mocked result goes
-- through the same encode/decode and retry code as a real one.
--
-- Budgets: the driver is a coroutine resumed by skilltest.c with
-- lrt_resume; it yields back after each resume of skill code (tick), so
-- every slice of skill code has the engine's time and memory budget.
--
-- When a run ends, everything it did is journaled into the throwaway
-- store (skilltest.c's test_journal/test_commit), so `moonloop trace RUN
-- --db THAT.db` shows it as it would show a production run.

local core = ...
local run = require("run")
require("flow")
local loader = require("loader")
local sandbox = require("sandbox")

local M = {}

local OP = core.OP
local encode, decode, null = core.encode, core.decode, core.json.null
local create, resume, yield = coroutine.create, coroutine.resume, coroutine.yield
local running, co_status = coroutine.running, coroutine.status
local getinfo, traceback = debug.getinfo, debug.traceback
local type, tostring, error, pairs, ipairs, select = type, tostring, error, pairs, ipairs, select
local setmetatable, getmetatable, pcall, xpcall = setmetatable, getmetatable, pcall, xpcall
local floor, max = math.floor, math.max
local concat, sort, remove = table.concat, table.sort, table.remove

local TC = core.test_config
local DEFAULT_START = 1735689600000 -- 2025-01-01T00:00:00Z: cases start here unless c:at says otherwise
local MAX_RESUMES = 20000           -- resumes of one run before it counts as endless

local F -- the test file being run
local C -- the case being run

-- The virtual clock ---------------------------------------------------------

local clock = 0
local function set_clock(ms)
  clock = ms
  core.test_clock(ms)
end

-- os.time() and os.date() without a time read the virtual clock too (the
-- sandbox copies them from here when it builds an environment).
do
  local real_time, real_date = os.time, os.date
  os.time = function(t)
    if t == nil then return floor(core.now() / 1000) end
    return real_time(t)
  end
  os.date = function(fmt, t)
    if t == nil then t = floor(core.now() / 1000) end
    return real_date(fmt, t)
  end
end

local function rfc3339(ms)
  local s = floor(ms / 1000)
  return os.date("!%Y-%m-%dT%H:%M:%S", s) .. (".%03dZ"):format(ms - s * 1000)
end

local function pack(...) return { n = select("#", ...), ... } end

-- Showing values in messages ---------------------------------------------

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil end

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

-- Failures ------------------------------------------------------------------

local failure_mt = { __tostring = function(f) return f.message end }

-- The line of the test file in the call stack nearest to the top.
local function test_line(from)
  if not F then return nil end
  for level = from or 2, 60 do
    local info = getinfo(level, "Sl")
    if not info then break end
    if info.source == F.source and (info.currentline or 0) > 0 then return info.currentline end
  end
end

-- Fail the case now, pointing at the test file's line that called.
local function fail(msg)
  local f = setmetatable({ message = msg, line = test_line(3) }, failure_mt)
  -- Raised inside a step body (an assertion in a mock), the error would
  -- only fail that step: keep it, and the driver raises it after the resume.
  if C and running() ~= C.driver then C.pending = C.pending or f end
  error(f, 0)
end

local function failf(fmt, ...) return fail(fmt:format(...)) end

local function message_of(e)
  if type(e) == "table" then
    if type(e.message) == "string" then return e.message end
    return show(e)
  end
  return tostring(e)
end

-- Skill code under test ------------------------------------------------------

-- The run state of the running skill coroutine (set in run.new's info).
local function current_st()
  local R = run.current()
  return R and R.test
end

local function numbered(R, id)
  local n = (R.ids[id] or 0) + 1
  return n == 1 and id or (id .. "#" .. n)
end

-- The mock body for the step sid (its numbered id) or id, or nil.
local function mock_body(st, sid, id)
  local m = st.C.mocks[sid] or st.C.mocks[id]
  if not m then return nil end
  m.used = true
  if m.kind == "value" then
    return function() return m.value end
  elseif m.kind == "error" then
    return function() error(m.fatal and run.fatal(m.message) or m.message, 0) end
  end
  return function()
    local T = run.current_task()
    return m.fn(T.attempt, T.in_step)
  end
end

-- step.run and step.parallel with mocks: swap the body, then tail-call the
-- engine's function (a tail call, so its errors still name the skill's line).
do
  local real_run, real_parallel = run.step.run, run.step.parallel
  run.step.run = function(id, fn, opts)
    local st = current_st()
    if st and type(id) == "string" and type(fn) == "function" then
      fn = mock_body(st, numbered(run.current(), id), id) or fn
    end
    return real_run(id, fn, opts)
  end
  run.step.parallel = function(id, fns, opts)
    local st = current_st()
    if st and type(id) == "string" and type(fns) == "table" then
      local sid, copy = numbered(run.current(), id), nil
      for i = 1, #fns do
        local m = mock_body(st, sid .. "/" .. i, id .. "/" .. i)
        if m then
          copy = copy or { unpack(fns) }
          copy[i] = m
        end
      end
      fns = copy or fns
    end
    return real_parallel(id, fns, opts)
  end
end

-- The run context's core functions, for a process without a scheduler.
core.log = function(level, msg, seq)
  local st = current_st()
  if st then
    st.logs[#st.logs + 1] = { seq = seq or 0, ts = clock, level = level, msg = msg }
  else
    io.stderr:write(("[%s] %s\n"):format(tostring(level), tostring(msg)))
  end
end
core.step_begin = function(seq, sid, n, timeout_ms, started)
  local T = run.current_task()
  if not T then return end
  T.test_timeout = (timeout_ms and timeout_ms > 0) and timeout_ms or nil
  T.test_deadline = T.test_timeout and (core.now() + timeout_ms) or nil
  if (n or 1) <= 1 then T.test_usage = nil end
end
core.step_end = function()
  local T = run.current_task()
  if T then T.test_deadline = nil end
end
-- Tests are hermetic: the modules that read or change the engine itself
-- (runs.*, skills.list/get/deploy) answer with an error that says to mock
-- the step; skills.check, which is pure, works.
for _, name in ipairs({ "runs_list", "runs_get", "skills_list", "skills_get", "skills_deploy" }) do
  local what = name:gsub("_", ".", 1)
  core[name] = function()
    local T = run.current_task()
    local sid = T and T.in_step
    return nil, ("%s is not available in skill tests: mock the step%s with c:mock"):format(what,
      sid and (" '" .. sid .. "'") or "")
  end
end

-- Backoffs have no jitter in tests, so virtual times are exact: retry n of
-- a step waits backoff * 2^(n-1) (capped), every time.
core.random = function() return 1 end
core.step_usage = function(p, c, t)
  local T = run.current_task()
  if not T then return end
  local u = T.test_usage or { prompt_tokens = 0, completion_tokens = 0, total_tokens = 0, calls = 0 }
  u.prompt_tokens = u.prompt_tokens + (tonumber(p) or 0)
  u.completion_tokens = u.completion_tokens + (tonumber(c) or 0)
  u.total_tokens = u.total_tokens + (tonumber(t) or 0)
  u.calls = u.calls + 1
  T.test_usage = u
end

-- The driver ----------------------------------------------------------------

local function push(st, co, at, args, fn)
  st.qn = st.qn + 1
  st.queue[#st.queue + 1] = { co = co, at = at, args = args, fn = fn, n = st.qn }
end

local function pop(st)
  local best, bi
  for i, e in ipairs(st.queue) do
    if not best or e.at < best.at or (e.at == best.at and e.n < best.n) then best, bi = e, i end
  end
  if bi then remove(st.queue, bi) end
  return best
end

local NONE = { n = 0 }

local function step_rec(st, seq, id, kind)
  local s = st.steps[seq]
  if not s then
    s = { seq = seq, id = id, kind = kind, attempts = 0, failures = {} }
    st.steps[seq] = s
  end
  return s
end

local function at_path(v, path)
  for part in path:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = v[part]
  end
  return v
end

local function json_at(v, path)
  local x = at_path(v, path)
  return encode(x == nil and null or x, 0)
end

local function event_object(ev)
  return { name = ev.name, id = ev.id, data = ev.data == nil and null or ev.data, ts = rfc3339(ev.ts) }
end

-- The first supplied event for a wait of this run: name, time, match.
local function find_event(st, name, path, value, upto)
  local best
  for _, ev in ipairs(st.C.events) do
    if ev.name == name and not ev.taken[st.run_id] and ev.ts >= st.started
      and (upto == 0 or ev.ts <= upto)
      and (not path or json_at(event_object(ev), path) == value)
      and (not best or ev.ts < best.ts) then
      best = ev
    end
  end
  return best
end

-- The earliest event of the skill's cancel_on that arrives by `upto`.
local function find_cancel(st, upto)
  local list = st.spec.cancel_on
  if not list then return nil end
  local best
  for _, ev in ipairs(st.C.events) do
    if ev.ts >= st.started and ev.ts <= upto and (not best or ev.ts < best.ts) then
      for _, c in ipairs(list) do
        if c.event == ev.name then
          local ok = true
          if c.match then
            local path = c.match:gsub("^event%.", "")
            ok = json_at(event_object(ev), path) == json_at(st.event, path)
          end
          if ok then best = ev break end
        end
      end
    end
  end
  return best
end

local function find_http(C, method, url)
  for i = #C.http, 1, -1 do
    local m = C.http[i]
    if (not m.method or m.method == method) and url:find(m.url, 1, true) then return m end
  end
end

local function duration_ms(v, what)
  if v == nil then return 0 end
  if type(v) == "number" then return v * 1000 end
  if type(v) == "string" then
    local ms, err = core.duration(v)
    if ms then return ms end
    failf("%s: %s", what, err)
  end
  failf("%s: expected a duration such as 30 or \"5m\", got %s", what, type(v))
end

-- A mock's response as the HTTP op answers: {status, body, headers}, or nil, message.
local function http_response(resp)
  if type(resp) ~= "table" then
    return nil, nil, ("an http mock must answer a table {status=, body= or json=, headers=}, got %s"):format(type(resp))
  end
  if resp.error ~= nil then return nil, nil, tostring(resp.error) end
  local headers = {}
  if type(resp.headers) == "table" then
    for k, v in pairs(resp.headers) do headers[tostring(k):lower()] = tostring(v) end
  end
  local body = resp.body
  if resp.json ~= nil then
    local err
    body, err = encode(resp.json, 0)
    if not body then return nil, nil, "http mock: json is not a JSON value: " .. err end
    headers["content-type"] = headers["content-type"] or "application/json"
  end
  if body ~= nil and type(body) ~= "string" then body = encode(body, 0) or tostring(body) end
  local status = resp.status or 200
  if type(status) ~= "number" then return nil, nil, "http mock: status must be a number" end
  return { status = status, body = body or "", headers = headers }, duration_ms(resp.delay, "http mock: delay")
end

local function handle_http(st, co, T, req)
  local C = st.C
  local method = tostring(req.method or "GET"):upper()
  local url = tostring(req.url)
  local rec = { method = method, url = url, headers = req.headers or {}, body = req.body,
                step = T and T.in_step }
  if type(req.body) == "string" then
    local ok, v = pcall(decode, req.body)
    if ok then rec.json = v end
  end
  st.requests[#st.requests + 1] = rec
  local m = find_http(C, method, url)
  if not m then
    local msg = ("%s %s is not mocked in this test: mock the step '%s' with c:mock, or the request with c:http(%s, response)")
      :format(method, url, tostring(rec.step), encode(method .. " " .. url, 0))
    C.unmocked[#C.unmocked + 1] = method .. " " .. url
    push(st, co, clock, pack(nil, msg))
    return
  end
  m.n = m.n + 1
  local resp, delay, err = m.resp, 0, nil
  if type(resp) == "function" then
    local ok, v = pcall(resp, rec, m.n)
    if getmetatable(v) == failure_mt then error(v, 0) end
    if not ok then
      resp, err = nil, message_of(v)
    else
      resp = v
    end
  end
  if resp ~= nil then resp, delay, err = http_response(resp) end
  if not resp and not err then err = "http mock gave no response" end
  local at = clock + (delay or 0)
  local dl = T and T.test_deadline
  if dl and at > dl then
    push(st, co, dl, pack(nil, ("step '%s' timed out after %s"):format(tostring(T.in_step),
      core.test_fmt_duration(T.test_timeout))))
    return
  end
  if resp then push(st, co, at, pack(resp)) else push(st, co, at, pack(nil, err)) end
end

local function handle_invoke(st, co, seq, id, skill, data, timeout_at, started)
  local s = step_rec(st, seq, id, "invoke")
  s.status, s.started_at, s.attempts = "waiting", started, 1
  local input = decode(data)
  if input == null then input = nil end
  st.invoked[#st.invoked + 1] = { skill = skill, data = input, step = id }
  local m = st.C.children[skill]
  if not m then
    local msg = ("child skill '%s' is not mocked in this test: add c:child(%s, output)"):format(skill, encode(skill, 0))
    s.status, s.error, s.ended_at = "failed", msg, clock
    push(st, co, clock, pack(nil, clock, msg))
    return
  end
  m.n = m.n + 1
  local status, output, err = "completed", m.value, nil
  if m.error then
    status, err = "failed", { message = m.error }
  elseif m.fn then
    local ok, v = pcall(m.fn, input, m.n)
    if getmetatable(v) == failure_mt then error(v, 0) end
    if ok then output = v else status, err = "failed", { message = message_of(v) } end
  end
  local outcome = encode({ run_id = core.test_ulid(clock), status = status,
    output = output == nil and null or output, error = err or null }, 0)
  if not outcome then failf("c:child(%s): the output is not a JSON value", encode(skill, 0)) end
  local at = clock + (m.after or 0)
  if timeout_at > 0 and at > timeout_at then
    push(st, co, timeout_at, nil, function()
      s.status, s.output, s.ended_at = "completed", "null", clock
      return nil, clock
    end)
    return
  end
  push(st, co, at, nil, function()
    s.status, s.output, s.ended_at = "completed", outcome, clock
    return outcome, clock
  end)
end

local function handle_op(st, co, r)
  local op = r[2]
  local T = run.tasks[co]
  if op == OP.COMMIT then
    local s = step_rec(st, r[3], r[4], r[5])
    s.status, s.output, s.attempts, s.started_at, s.ended_at = "completed", r[6], r[7], r[8], r[9]
    s.retry_at = nil
    s.usage = T and T.test_usage
    push(st, co, clock, NONE)
  elseif op == OP.RETRY then
    local seq, id, n, msg, tb, t0, delay, started = r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]
    local s = step_rec(st, seq, id, "run")
    s.status, s.attempts, s.started_at, s.retry_at = "running", n, started, clock + delay
    s.failures[#s.failures + 1] = { n = n, error = msg, traceback = tb, started_at = t0, ended_at = clock,
                                   retry_at = clock + delay }
    push(st, co, clock + delay, NONE)
  elseif op == OP.FAIL then
    local seq, id, kind, n, msg, tb, t0, ended, started = r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11]
    local s = step_rec(st, seq, id, kind)
    s.status, s.error, s.attempts, s.started_at, s.ended_at, s.retry_at = "failed", msg, n, started, ended, nil
    s.failures[#s.failures + 1] = { n = n, error = msg, traceback = tb, started_at = t0, ended_at = ended }
    s.usage = T and T.test_usage
    push(st, co, clock, NONE)
  elseif op == OP.BACKOFF then
    push(st, co, max(clock, r[4] or clock), NONE)
  elseif op == OP.DELAY then
    push(st, co, clock + max(0, r[3] or 0), NONE)
  elseif op == OP.HTTP then
    handle_http(st, co, T, r[3])
  elseif op == OP.SLEEP then
    local s = step_rec(st, r[3], r[4], "sleep")
    s.status, s.started_at, s.wake_at, s.attempts = "sleeping", r[6], r[5], 1
    push(st, co, max(clock, r[5]), nil, function()
      s.status, s.ended_at, s.wake_at = "completed", clock, nil
      return clock
    end)
  elseif op == OP.WAIT then
    local seq, id, name, path, value, timeout_at, started = r[3], r[4], r[5], r[6], r[7], r[8], r[9]
    local s = step_rec(st, seq, id, "wait")
    s.status, s.started_at, s.attempts = "waiting", started, 1
    s.wake_at = timeout_at > 0 and timeout_at or nil
    local ev = find_event(st, name, path, value, timeout_at)
    if ev then
      ev.taken[st.run_id] = true
      push(st, co, max(clock, ev.ts), nil, function()
        local js = encode(event_object(ev), 0)
        s.status, s.output, s.ended_at, s.wake_at = "completed", js, clock, nil
        return js, clock
      end)
    elseif timeout_at > 0 then
      push(st, co, max(clock, timeout_at), nil, function()
        s.status, s.output, s.ended_at, s.wake_at = "completed", "null", clock, nil
        return nil, clock
      end)
    else
      st.stuck = ("the run waits for event '%s' (step '%s') with no timeout, and the test supplied none that matches: add c:event(%s, data)")
        :format(name, id, encode(name, 0))
    end
  elseif op == OP.INVOKE then
    handle_invoke(st, co, r[3], r[4], r[5], r[6], r[7], r[8])
  elseif op == OP.SEND then
    local s = step_rec(st, r[3], r[4], "send")
    local list, ids = decode(r[5]), {}
    for i, ev in ipairs(list) do
      local eid = core.test_ulid(clock)
      ids[i] = eid
      local data = ev.data
      if data == null then data = nil end
      st.sent[#st.sent + 1] = { name = ev.name, data = data, id = eid, key = ev.id, step = r[4] }
      st.C.events[#st.C.events + 1] = { name = ev.name, data = data, id = eid, ts = clock, taken = {} }
    end
    local js = encode(core.json.array(ids), 0)
    s.status, s.output, s.attempts, s.started_at, s.ended_at = "completed", js, 1, r[6], clock
    push(st, co, clock, pack(js, clock))
  elseif op == OP.PARALLEL then
    local seq, id, started = r[3], r[4], r[5]
    local s = step_rec(st, seq, id, "parallel")
    s.status, s.started_at, s.attempts = "running", started, 1
    local group = { parent = co, left = r.n - 5, results = {} }
    for i = 1, group.left do
      local kid = r[5 + i]
      st.kids[kid] = { group = group, i = i }
      push(st, kid, clock, NONE)
    end
  else
    error(("internal: the skill yielded an op this driver does not know (%s)"):format(tostring(op)), 0)
  end
end

-- Journal what a run did into the throwaway store (as the engine would
-- have, ending with its final state).
local function journal_run(st)
  local J = core.test_journal
  local skill = st.suite
  if not F.recorded[skill.version] then
    F.recorded[skill.version] = true
    J("version", { version = skill.version, skill = st.spec.id, source = skill.src, file = skill.file,
                   loaded_at = st.started })
    J("skill", { id = st.spec.id, version = skill.version, file = skill.file,
                 description = st.spec.description,
                 triggers = encode(core.json.array(st.spec.triggers or {}), 0), updated_at = st.started })
  end
  J("run_new", { id = st.run_id, skill = st.spec.id, version = skill.version, status = "running",
                 entry = st.entry, trigger = st.trigger, input = st.input,
                 created_at = st.started, started_at = st.started })
  for _, seq in ipairs(st.seqs) do
    local s = st.steps[seq]
    for _, a in ipairs(s.failures) do
      J("attempt", { run_id = st.run_id, seq = seq, n = a.n, status = "failed", error = a.error,
                     traceback = a.traceback, started_at = a.started_at, ended_at = a.ended_at,
                     retry_at = a.retry_at })
    end
    J("step", { run_id = st.run_id, seq = seq, id = s.id, kind = s.kind, status = s.status,
                output = s.output, error = s.error, usage = s.usage and encode(s.usage, 0),
                attempts = s.attempts, started_at = s.started_at, ended_at = s.ended_at,
                wake_at = s.wake_at, retry_at = s.retry_at })
  end
  for _, l in ipairs(st.logs) do
    J("log", { run_id = st.run_id, seq = l.seq, ts = l.ts, level = l.level, msg = l.msg })
  end
  local terminal = st.status == "completed" or st.status == "failed" or st.status == "cancelled"
  J("run_set", { run_id = st.run_id, status = st.status, output = st.output_json, error = st.error_json,
                 ended_at = terminal and st.ended or 0 })
end

local function finish(st, status, output_json, error_json)
  st.done, st.status, st.ended = true, status, clock
  st.output_json, st.error_json = output_json, error_json
  if output_json then
    local v = decode(output_json)
    if v ~= null then st.output = v end
  end
  if error_json then
    local e = decode(error_json)
    st.error = type(e) == "table" and e or { message = tostring(e) }
  end
  local seqs = {}
  for seq in pairs(st.steps) do seqs[#seqs + 1] = seq end
  sort(seqs)
  st.seqs = seqs
  st.queue = {}
end

local function fail_run(st, status, message)
  finish(st, status, nil, encode({ message = message }, 0))
end

local function child_done(st, kid, ok, value)
  local k = st.kids[kid]
  if not k then return end
  st.kids[kid] = nil
  local g = k.group
  g.results[k.i] = { ok = ok and true or false, value = value or "null" }
  g.left = g.left - 1
  if g.left == 0 then push(st, g.parent, clock, pack(g.results)) end
end

-- Resume one task with args and deal with what it yields or returns.
local function step_once(st, co, args)
  local C = st.C
  yield() -- a tick: skilltest.c starts a fresh budget for the next slice
  st.resumes = st.resumes + 1
  local r = pack(resume(co, unpack(args, 1, args.n or #args)))
  local kill = core.kill_reason()
  if C.pending then error(C.pending, 0) end
  if kill then
    -- Skill code ran past its budget: as in the engine, that is final for
    -- the run. Record the step it failed (if any), then end the run.
    local msg = kill
    if r[1] and co_status(co) ~= "dead" and r[2] == OP.FAIL then
      handle_op(st, co, r)
      msg = ("step '%s' failed: %s"):format(tostring(r[4]), tostring(r[7]))
    elseif r[1] and co_status(co) == "dead" and not r[2] then
      local ok, e = pcall(decode, r[3])
      msg = ok and type(e) == "table" and e.message or msg
    end
    fail_run(st, "failed", msg)
    return
  end
  if not r[1] then
    local msg = message_of(r[2])
    if co == st.main then fail_run(st, "failed", msg) else child_done(st, co, false, encode({ message = msg }, 0)) end
    return
  end
  if co_status(co) == "dead" then
    if co == st.main then
      if r[2] then finish(st, "completed", r[3] or "null", nil) else finish(st, "failed", nil, r[3]) end
    else
      child_done(st, co, r[2], r[3])
    end
    return
  end
  handle_op(st, co, r)
end

-- Run one run of the suite's skill to its end (or until it parks for good).
local function exec(C, suite, def, spec, how)
  local started = clock
  local run_id = core.test_ulid(started)
  local st = {
    C = C, suite = suite, spec = spec, run_id = run_id, entry = how.entry, trigger = how.trigger,
    input = how.input, event = how.event, started = started, steps = {}, logs = {}, requests = {},
    sent = {}, invoked = {}, kids = {}, queue = {}, qn = 0, resumes = 0, status = "running",
  }
  local cfg = {
    skill = spec.id, version = suite.version, retries = spec.retries or TC.retries,
    backoff_ms = spec.backoff_ms or TC.backoff_ms, backoff_max_ms = TC.backoff_max_ms,
    output_limit = TC.output_limit,
  }
  local info = { run_id = run_id, entry = how.entry, started_at = started, cfg = cfg,
                 trigger = how.trigger, input = how.input, test = st }
  st.main = run.new(info, def, nil)
  push(st, st.main, started, NONE)
  local deadline = spec.timeout_ms and started + spec.timeout_ms
  while not st.done do
    local e = pop(st)
    if not e then
      fail_run(st, "waiting", st.stuck or "internal: the run has nothing left to do but did not end")
      break
    end
    if e.at > clock then
      local cancel = find_cancel(st, e.at)
      if deadline and e.at > deadline and not (cancel and cancel.ts <= deadline) then
        set_clock(deadline)
        fail_run(st, "failed", ("the run timed out after %s (its timeout)"):format(core.test_fmt_duration(spec.timeout_ms)))
        break
      end
      if cancel then
        set_clock(max(clock, cancel.ts))
        fail_run(st, "cancelled", ("cancelled by event %s (%s)"):format(cancel.name, cancel.id))
        break
      end
      set_clock(e.at)
    end
    if st.resumes >= MAX_RESUMES then
      fail_run(st, "failed", ("the run did not end after %d resumes (an endless loop?)"):format(MAX_RESUMES))
      break
    end
    local args = e.args
    if e.fn then args = pack(e.fn()) end
    step_once(st, e.co, args)
  end
  journal_run(st)
  local ok, err = core.test_commit()
  if not ok then error("recording the run in the test database: " .. tostring(err), 0) end
  return st
end

-- The case handle (`c`) ------------------------------------------------------

local states = setmetatable({}, { __mode = "k" }) -- handle -> case state
local api = {}
local api_mt = { __index = api, __metatable = false }

local function state(self)
  local s = states[self]
  if not s then fail("this test case has ended (a `c` kept from another case?)") end
  return s
end

-- The run a step/steps/logs assertion is about: the last run, or its on_failure run.
local function view(s, which)
  if which == nil or which == "run" then
    if not s.last then fail("no run yet: call c:run(input) first") end
    return s.last
  elseif which == "on_failure" then
    if not s.failure_run then fail("no on_failure run: the last run did not fail, or its skill has no on_failure") end
    return s.failure_run
  end
  failf("expected nil, \"run\" or \"on_failure\" to choose the run, got %s", show(which))
end

function api:env(values)
  local s = state(self)
  if type(values) ~= "table" then fail("c:env(values): expected a table of env values") end
  for k, v in pairs(values) do s.env[k] = v end
end

function api:at(t)
  local s = state(self)
  if type(t) == "number" then
    s.clock = t * 1000
  elseif type(t) == "string" then
    local ms, err = core.parse_time(t)
    if not ms then failf("c:at: %s", err) end
    s.clock = ms
  else
    fail("c:at(time): expected a unix time or an RFC 3339 string")
  end
end

function api:now()
  local s = state(self)
  return (C == s and s.running and clock or s.clock) / 1000
end

local function check_id(what, id)
  if type(id) ~= "string" or id == "" then failf("%s: the step id must be a non-empty string", what) end
end

function api:mock(id, ...)
  local s = state(self)
  check_id("c:mock", id)
  if select("#", ...) == 0 then fail("c:mock(step_id, value or function(attempt)): give what the step returns") end
  local v = ...
  if type(v) == "function" then
    s.mocks[id] = { kind = "fn", fn = v }
  else
    s.mocks[id] = { kind = "value", value = v }
  end
end

function api:mock_error(id, message, opts)
  local s = state(self)
  check_id("c:mock_error", id)
  if opts ~= nil and type(opts) ~= "table" then fail("c:mock_error(step_id, message [, {fatal=true}])") end
  s.mocks[id] = { kind = "error", message = tostring(message or "mocked failure"), fatal = opts and opts.fatal }
end

function api:http(match, response)
  local s = state(self)
  if type(match) ~= "string" or match == "" then
    fail("c:http(match, response): match is \"[METHOD ]part-of-url\", such as \"GET /metrics\"")
  end
  if type(response) ~= "table" and type(response) ~= "function" then
    fail("c:http(match, response): response is a table {status=, json= or body=, headers=, delay=} or a function(request, n)")
  end
  local method, url = match:match("^(%u+)%s+(.+)$")
  s.http[#s.http + 1] = { method = method, url = url or match, resp = response, n = 0 }
end

-- c:llm(answer): the LLM endpoint answers with these, in order (the last
-- one repeats): a string is the model's text, a table is sent as JSON
-- text, a function(request, n) returns either.
function api:llm(answer)
  local s = state(self)
  local t = type(answer)
  if t ~= "string" and t ~= "table" and t ~= "function" then
    fail("c:llm(answer): a string (the model's text), a table (sent as JSON text) or a function(request, n)")
  end
  s.llm[#s.llm + 1] = answer
  if s.llm_mocked then return end
  s.llm_mocked = true
  s.http[#s.http + 1] = { method = "POST", url = "/chat/completions", n = 0, resp = function(req, n)
    local a = s.llm[n] or s.llm[#s.llm]
    local body = type(req.json) == "table" and req.json or {}
    if type(a) == "function" then a = a(body, n) end
    if type(a) == "table" then a = encode(a, 0) end
    return { status = 200, json = {
      id = "chatcmpl-test-" .. n, model = body.model, object = "chat.completion",
      choices = { { index = 0, message = { role = "assistant", content = tostring(a) }, finish_reason = "stop" } },
      usage = { prompt_tokens = 10, completion_tokens = 5, total_tokens = 15 },
    } }
  end }
end

function api:event(name, data, opts)
  local s = state(self)
  if type(name) ~= "string" or name == "" then fail("c:event(name, data [, {after=, id=}]): name must be a string") end
  if opts ~= nil and type(opts) ~= "table" then fail("c:event(name, data, opts): opts must be a table {after=, id=}") end
  if data ~= nil and not encode(data, 0) then fail("c:event: data is not a JSON value") end
  s.events[#s.events + 1] = { name = name, data = data, id = opts and opts.id or core.test_ulid(s.clock),
                              after = duration_ms(opts and opts.after, "c:event: after"), taken = {} }
end

function api:child(skill, output, opts)
  local s = state(self)
  if type(skill) ~= "string" or skill == "" then fail("c:child(skill_id, output [, {after=}]): skill_id must be a string") end
  if opts ~= nil and type(opts) ~= "table" then fail("c:child(skill_id, output, opts): opts must be a table {after=}") end
  local m = { n = 0, after = duration_ms(opts and opts.after, "c:child: after") }
  if type(output) == "function" then m.fn = output else m.value = output end
  s.children[skill] = m
end

function api:child_error(skill, message, opts)
  local s = state(self)
  if type(skill) ~= "string" or skill == "" then fail("c:child_error(skill_id, message): skill_id must be a string") end
  self:child(skill, nil, opts)
  s.children[skill].error = tostring(message or "mocked failure")
end

-- Load the suite's skill in a fresh sandbox, as the engine loads a version.
local function load_skill(s)
  local suite = s.suite
  local env = {}
  for k, v in pairs(suite.env) do env[k] = v end
  for k, v in pairs(s.env) do env[k] = v end
  local ok, def, spec = pcall(loader.load, suite.chunk, suite.file, suite.src,
    core.test_default_id(suite.file), env)
  if not ok then failf("cannot load %s: %s", suite.file, message_of(def)) end
  return def, spec
end

function api:run(input, opts)
  local s = state(self)
  if running() ~= s.driver then fail("c:run can only be called from the case's function (not inside a mock)") end
  if opts ~= nil and type(opts) ~= "table" then fail("c:run(input [, {event=, at=}]): opts must be a table") end
  if opts and opts.at ~= nil then self:at(opts.at) end
  local input_json, err = encode(input == nil and null or input, 0)
  if not input_json then failf("c:run: the input is not a JSON value: %s", err) end
  local def, spec = load_skill(s)
  -- Events supplied ahead arrive `after` their delay, counted from this run's start.
  for _, ev in ipairs(s.events) do
    if not ev.ts then ev.ts = s.clock + ev.after end
  end
  local how = { entry = "run", input = input_json }
  if opts and opts.event ~= nil then
    if type(opts.event) ~= "string" or opts.event == "" then fail("c:run: opts.event must be an event name") end
    local ev = { name = opts.event, id = core.test_ulid(s.clock), data = input == nil and null or input,
                 ts = rfc3339(s.clock) }
    how.trigger = encode({ kind = "event", event = ev }, 0)
    how.event = ev
  else
    how.trigger = encode({ kind = "invoke", by = "test" }, 0)
    how.event = { data = input == nil and null or input }
  end
  s.running = true
  set_clock(s.clock)
  local st = exec(s, s.suite, def, spec, how)
  s.last, s.failure_run, s.checked_error = st, nil, false
  if st.status == "failed" and spec.has_on_failure then
    local trig = encode({ kind = "on_failure", run_id = st.run_id, error = st.error or null }, 0)
    s.failure_run = exec(s, s.suite, def, spec, { entry = "on_failure", trigger = trig, input = input_json,
                                                   event = how.event })
  end
  s.clock = clock
  s.running = false
  return st.output, st.error and st.error.message
end

-- Assertions ---------------------------------------------------------------

function api:eq(actual, expected, label)
  state(self)
  local path, a, b = diff(actual, expected, "")
  if path == nil then return end
  local head = label and (tostring(label) .. ": ") or ""
  local where = path == "" and "values differ" or ("values differ at " .. path:gsub("^%.", ""))
  local msg = ("%s%s: expected %s, got %s"):format(head, where, show(b), show(a))
  if path ~= "" then
    msg = msg .. ("\nexpected: %s\nactual:   %s"):format(show(expected), show(actual))
  end
  fail(msg)
end

function api:ok(v, label)
  state(self)
  if v then return v end
  fail(label and tostring(label) or ("expected a true value, got " .. show(v)))
end

function api:fail(msg)
  state(self)
  fail(tostring(msg or "failed"))
end

function api:err(pattern, which)
  local s = state(self)
  local st = view(s, which)
  s.checked_error = true
  if type(pattern) ~= "string" then fail("c:err(pattern): pattern must be a string") end
  if st.status == "completed" then
    failf("expected the run to fail with %s, but it completed with output %s", show(pattern), show(st.output))
  end
  local msg = st.error and st.error.message or ""
  local found = msg:find(pattern, 1, true)
  if not found then
    local ok, r = pcall(string.find, msg, pattern)
    found = ok and r
  end
  if not found then
    failf("the run %s with a different error\nexpected: %s\nactual:   %s", st.status, show(pattern), show(msg))
  end
  return msg
end

function api:status(which)
  local s = state(self)
  s.checked_error = true
  return view(s, which).status
end

local function step_ids(st)
  local ids = {}
  for i, seq in ipairs(st.seqs) do ids[i] = st.steps[seq].id end
  return ids
end

function api:steps(expected, which)
  local s = state(self)
  local st = view(s, which)
  local ids = step_ids(st)
  if expected == nil then return ids end
  if type(expected) ~= "table" then fail("c:steps{ids...}: expected a list of step ids") end
  if diff(ids, expected, "") == nil then return ids end
  local exp = {}
  for i, v in ipairs(expected) do exp[i] = tostring(v) end
  failf("steps differ\nexpected: %s\nactual:   %s", concat(exp, ", "), concat(ids, ", "))
end

local function decode_or_nil(js)
  if js == nil then return nil end
  local ok, v = pcall(decode, js)
  if not ok or v == null then return nil end
  return v
end

function api:step(id, which)
  local s = state(self)
  local st = view(s, which)
  check_id("c:step", id)
  for _, seq in ipairs(st.seqs) do
    local r = st.steps[seq]
    if r.id == id then
      local failures, logs = {}, {}
      for i, a in ipairs(r.failures) do failures[i] = { n = a.n, error = a.error } end
      for _, l in ipairs(st.logs) do
        if l.seq == seq then logs[#logs + 1] = l.msg end
      end
      local start, stop = r.started_at, r.ended_at
      return {
        id = r.id, kind = r.kind, status = r.status, output = decode_or_nil(r.output), error = r.error,
        attempts = r.attempts, failures = failures, logs = logs,
        started_at = start and start / 1000, ended_at = stop and stop / 1000,
        duration = start and stop and (stop - start) / 1000,
        usage = r.usage,
      }
    end
  end
  failf("no step '%s' in the run; its steps: %s", id, #st.seqs > 0 and concat(step_ids(st), ", ") or "(none)")
end

function api:logs(which)
  local s = state(self)
  local st = view(s, which)
  local out = {}
  for i, l in ipairs(st.logs) do
    out[i] = { level = l.level, msg = l.msg, step = l.seq > 0 and st.steps[l.seq] and st.steps[l.seq].id or nil }
  end
  return out
end

function api:sent(which) return view(state(self), which).sent end
function api:requests(which) return view(state(self), which).requests end
function api:invoked(which) return view(state(self), which).invoked end

function api:output(which)
  return view(state(self), which).output
end

function api:trace(which)
  local st = view(state(self), which)
  local rec, err = core.test_trace(st.run_id)
  if not rec then failf("reading the run's trace: %s", tostring(err)) end
  return rec
end

function api:on_failure()
  local s = state(self)
  local st = s.failure_run
  if not st then return nil end
  return { run_id = st.run_id, status = st.status, output = st.output, error = st.error and st.error.message }
end

-- Test files ---------------------------------------------------------------

local suite_methods = {}
local suite_mt = { __index = suite_methods, __metatable = false }
local suites = setmetatable({}, { __mode = "k" })

function suite_methods:case(name, fn)
  if not suites[self] then error("t:case: call it on a suite made by test.skill (t:case, with a colon)", 2) end
  if type(name) ~= "string" or name == "" then error("t:case(name, fn): name must be a non-empty string", 2) end
  if type(fn) ~= "function" then error(("t:case(%s, fn): fn must be a function(c)"):format(show(name)), 2) end
  local line = getinfo(fn, "S").linedefined
  F.cases[#F.cases + 1] = { suite = self, name = name, fn = fn, line = line }
  return self
end
suite_methods.test = suite_methods.case

function suite_methods:before_each(fn)
  if not suites[self] then error("t:before_each: call it on a suite made by test.skill", 2) end
  if type(fn) ~= "function" then error("t:before_each(fn): fn must be a function(c)", 2) end
  self.before[#self.before + 1] = fn
  return self
end

local function new_test_module()
  local test = {}
  -- test.skill(path or id [, {env = {...}}]): the skill under test. A
  -- path is relative to the test file; a bare id that is not a file names
  -- a skill registered in the configured database.
  function test.skill(target, opts)
    if type(target) ~= "string" or target == "" then
      error("test.skill(path or id [, opts]): expected a file path or a skill id", 2)
    end
    if opts ~= nil and type(opts) ~= "table" then error("test.skill(path, opts): opts must be a table {env=}", 2) end
    if opts and opts.env ~= nil and type(opts.env) ~= "table" then error("test.skill: opts.env must be a table", 2) end
    local path = target:sub(1, 1) == "/" and target or (F.dir .. target)
    local src, file, err
    if core.test_is_file(path) then
      src, err = core.test_read(path)
      file = path
    elseif target:find("%.lua$") or target:find("/", 1, true) then
      err = ("no skill file '%s' (looked for %s, relative to the test file)"):format(target, path)
    else
      src, file = core.test_registered(target)
      if not src then err = file end
    end
    if not src then error(err, 2) end
    local chunk, cerr = core.test_compile(src, file)
    if not chunk then error("cannot load the skill: " .. cerr, 2) end
    local env = {}
    if opts and opts.env then for k, v in pairs(opts.env) do env[k] = v end end
    local suite = setmetatable({ file = file, src = src, chunk = chunk, version = core.test_sha256(src),
                                 env = env, before = {} }, suite_mt)
    suites[suite] = true
    F.suites[#F.suites + 1] = suite
    return suite
  end
  return test
end

local function test_mods()
  local json = {}
  for k, v in pairs(core.json) do json[k] = v end
  local function out(level)
    return function(...)
      local parts = {}
      for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
      io.stderr:write(("%s: [%s] %s\n"):format(F.path, level, concat(parts, " ")))
    end
  end
  return {
    test = new_test_module(), json = json, fatal = run.fatal,
    log = { info = out("info"), warn = out("warn"), error = out("error") },
    time = {
      now = function() return core.now() / 1000 end,
      parse_duration = function(v)
        if type(v) == "number" then return v end
        local ms, err = core.duration(tostring(v))
        if not ms then error("time.parse_duration: " .. err, 2) end
        return ms / 1000
      end,
    },
  }
end

local function line_in(msg, path)
  local p = ("^" .. path:gsub("%p", "%%%0") .. ":(%d+):")
  return tonumber(tostring(msg):match(p))
end

local function load_handler(e)
  if type(e) == "table" then return e end
  return { message = tostring(e), line = test_line(2) }
end

-- Load a test file (its top level runs here, under the caller's budget).
-- Returns the number of cases, or a result table {file, line, message}
-- when the file cannot be loaded.
function M.load(path, src)
  F = { path = path, dir = path:match("^(.*/)") or "", source = "@" .. path, cases = {}, suites = {},
        recorded = {} }
  C = nil
  core.test_clock(nil)
  local chunk, err = core.test_compile(src, path)
  if not chunk then return { file = path, line = line_in(err, path), message = err } end
  local env = sandbox.new(test_mods())
  setfenv(chunk, env)
  local ok, res = xpcall(chunk, load_handler)
  if not ok then
    local msg = message_of(res)
    return { file = path, line = line_in(msg, path) or res.line, message = msg }
  end
  sandbox.freeze(env, path)
  local function bad_return()
    return { file = path, message = ("%s: a test file returns the suite from test.skill(...) (or a list of suites), got %s")
      :format(path, type(res)) }
  end
  if res ~= nil and not suites[res] then
    if type(res) ~= "table" then return bad_return() end
    for _, v in ipairs(res) do
      if not suites[v] then return bad_return() end
    end
  end
  if #F.cases == 0 then
    return { file = path, message = ("%s: no test cases: add t:case(name, function(c) ... end)"):format(path) }
  end
  return #F.cases
end

local function case_handler(e)
  if getmetatable(e) == failure_mt then return e end
  local kill = core.kill_reason()
  if kill then
    return { message = "the test code was stopped: " .. kill:gsub("^stopped: the run ", "it "), line = test_line(2) }
  end
  local msg = message_of(e)
  local line = line_in(msg, F.path) or test_line(2)
  msg = msg:gsub("^" .. F.path:gsub("%p", "%%%0") .. ":%d+: ", "")
  return { message = msg, line = line }
end

-- Make the driver coroutine of case i; skilltest.c resumes it to the end.
function M.start(i)
  local case = F.cases[i]
  local handle = setmetatable({}, api_mt)
  local s = {
    case = case, suite = case.suite, handle = handle, env = {}, mocks = {}, http = {}, llm = {},
    events = {}, children = {}, unmocked = {}, clock = DEFAULT_START,
  }
  states[handle] = s
  C = s
  s.driver = create(function()
    local ok, e = xpcall(function()
      for _, fn in ipairs(case.suite.before) do fn(handle) end
      case.fn(handle)
    end, case_handler)
    if not ok then s.failure = e end
  end)
  return s.driver
end

-- Why a failed case failed, with what else the reader will want to know.
local function notes(s)
  local out = {}
  local st = s.last
  if st and st.status ~= "completed" and not s.checked_error then
    out[#out + 1] = ("note: the run %s: %s"):format(st.status, st.error and st.error.message or "?")
  end
  local unused = {}
  for id, m in pairs(s.mocks) do
    if not m.used then unused[#unused + 1] = id end
  end
  if #unused > 0 then
    sort(unused)
    out[#out + 1] = "note: mocks never used: " .. concat(unused, ", ")
  end
  return #out > 0 and ("\n" .. concat(out, "\n")) or ""
end

-- The result of the case just run: {file, line, name, ok, message, run_id}.
-- escaped: an error that ended the driver outside the case's own handler.
function M.finish(escaped)
  local s = C
  core.test_clock(nil)
  C = nil
  local r = { file = F.path, name = s.case.name, line = s.case.line, ok = true,
              run_id = s.last and s.last.run_id }
  local f = s.failure
  if escaped and not f then f = { message = "the test was stopped: " .. tostring(escaped) } end
  if f then
    r.ok = false
    r.line = f.line or s.case.line
    r.message = message_of(f) .. notes(s)
  end
  states[s.handle] = nil
  return r
end

return M
