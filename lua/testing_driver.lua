-- testing_driver.lua: the driver of skill tests (`moonloop test`): it runs
-- the skill under test for a case (testing.lua's c:run) on a virtual clock
-- and answers what the run yields.
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
--   INVOKE                the case's child mock for that skill (c:child);
--                         from a step.parallel branch's body, without a
--                         step record of its own (the branch's is it)
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
--
-- Invariants: only the earliest task of the queue is resumed, and the
-- clock is set to its time first; a run ends (st.done) when its main
-- coroutine returns or fails, when it times out or is cancelled, when it
-- waits with nothing left to wake it, or after MAX_RESUMES resumes, so an
-- endless loop in skill code cannot hang `moonloop test`.

local core = ...
local run = require("run")
local api = require("api")
local flow = require("flow")
local report = require("testing_report")

local M = {}

local OP = core.OP
local encode, decode, null = core.encode, core.decode, core.json.null
local resume, yield = coroutine.resume, coroutine.yield
local co_status = coroutine.status
local type, tostring, error, pairs, ipairs, select = type, tostring, error, pairs, ipairs, select
local getmetatable, pcall = getmetatable, pcall
local floor, max = math.floor, math.max
local sort, remove = table.sort, table.remove
local cur, failure_mt = report.cur, report.failure_mt
local failf, message_of, duration_ms = report.failf, report.message_of, report.duration_ms

local TC = core.test_config
local MAX_RESUMES = 20000           -- resumes of one run before it counts as endless

-- The virtual clock ---------------------------------------------------------

local clock = 0

-- Set the virtual clock (here and for core.now).
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

-- ms since the epoch as RFC 3339 text in UTC, with milliseconds.
local function rfc3339(ms)
  local s = floor(ms / 1000)
  return os.date("!%Y-%m-%dT%H:%M:%S", s) .. (".%03dZ"):format(ms - s * 1000)
end

-- The values ... as a list with its length in n (nils kept).
local function pack(...) return { n = select("#", ...), ... } end

-- Skill code under test ------------------------------------------------------

-- The run state of the running skill coroutine (set in run.new's info).
local function current_st()
  local R = run.current()
  return R and R.test
end

-- The id the next step named id gets in run R: id, then "id#2", ...
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
      -- A mock of the parallel step itself gives each function's result:
      -- a list (one per function), a function(attempt, child_id) called
      -- for each, or c:mock_error failing each. Mocks of a child
      -- ("fan/2") come first.
      local whole = st.C.mocks[sid] or st.C.mocks[id]
      if whole then
        whole.used = true
        if whole.kind == "value" and type(whole.value) ~= "table" then
          failf("c:mock(%s): step '%s' is a parallel step: mock it with the list of its functions' results, "
            .. "or mock each function as %s, %s, ...; got %s", encode(id, 0), sid, encode(sid .. "/1", 0),
            encode(sid .. "/2", 0), report.show(whole.value))
        end
      end
      for i = 1, #fns do
        local m = mock_body(st, sid .. "/" .. i, id .. "/" .. i)
        if not m and whole then
          local part = whole
          if whole.kind == "value" then part = { kind = "value", value = whole.value[i] } end
          m = function()
            local T = run.current_task()
            if part.kind == "value" then return part.value end
            if part.kind == "error" then error(part.fatal and run.fatal(part.message) or part.message, 0) end
            return part.fn(T.attempt, T.in_step)
          end
        end
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

-- The run context's core functions, for a process without a scheduler:
-- logs are kept in the run's state; a step's timeout and LLM usage in its
-- task.
core.log = function(level, msg, seq)
  local st = current_st()
  if st then
    st.logs[#st.logs + 1] = { seq = seq or 0, ts = clock, level = level, msg = msg }
  else
    io.stderr:write(("[%s] %s\n"):format(tostring(level), tostring(msg)))
  end
end
-- A step attempt begins: its timeout counts from now on the virtual clock.
core.step_begin = function(seq, sid, n, timeout_ms, started)
  local T = run.current_task()
  if not T then return end
  T.test_timeout = (timeout_ms and timeout_ms > 0) and timeout_ms or nil
  T.test_deadline = T.test_timeout and (core.now() + timeout_ms) or nil
  if (n or 1) <= 1 then T.test_usage = nil end
end
-- A step attempt ended: no timeout any more.
core.step_end = function()
  local T = run.current_task()
  if T then T.test_deadline = nil end
end
-- Tests are hermetic: the modules that read or change the engine itself
-- (runs.*, skills.list/get/deploy) answer with an error that says to mock
-- the step; skills.check, which is pure, works.
for _, name in ipairs({ "runs_list", "runs_get", "runs_cancel", "skills_list", "skills_get", "skills_deploy" }) do
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
-- LLM usage of the running step (llm.chat), summed over its attempts.
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

-- Queue task co to be resumed at virtual time `at` with args (or with
-- what fn returns then, for an answer that must be made at that time).
local function push(st, co, at, args, fn)
  st.qn = st.qn + 1
  st.queue[#st.queue + 1] = { co = co, at = at, args = args, fn = fn, n = st.qn }
end

-- Take the earliest task from the queue (ties: the first queued), or nil.
local function pop(st)
  local best, bi
  for i, e in ipairs(st.queue) do
    if not best or e.at < best.at or (e.at == best.at and e.n < best.n) then best, bi = e, i end
  end
  if bi then remove(st.queue, bi) end
  return best
end

local NONE = { n = 0 } -- resume with no values

-- The record of step seq in the run, made when missing.
local function step_rec(st, seq, id, kind)
  local s = st.steps[seq]
  if not s then
    s = { seq = seq, id = id, kind = kind, attempts = 0, failures = {} }
    st.steps[seq] = s
  end
  return s
end

-- The case's mock of step sid (a numbered id: "approval#2" is mocked by
-- "approval#2", else by "approval") when the step is not a step.run (whose
-- mocks replace its body, above), marked used; or nil.
local function step_mock(st, sid)
  local m = st.C.mocks[sid] or st.C.mocks[(sid:gsub("#%d+$", ""))]
  if m then m.used = true end
  return m
end

-- Call f, a function of the test, from the driver: a failure (an
-- assertion in it) goes on as the case's failure; any other error fails
-- the case naming what called it.
local function call_test_fn(what, f, ...)
  local r = pack(pcall(f, ...))
  if not r[1] then
    if getmetatable(r[2]) == failure_mt then error(r[2], 0) end
    failf("%s raised: %s", what, message_of(r[2]))
  end
  return unpack(r, 2, r.n)
end

-- The name and data of a supplied event for run st: c:event's name and
-- data may be functions of the run ({id, input, event}), called once per
-- run (an event named after the run's id: "approve." .. run.id).
local function event_parts(st, ev)
  if type(ev.name) ~= "function" and type(ev.data) ~= "function" then return ev.name, ev.data end
  local r = ev.resolved[st.run_id]
  if r then return r.name, r.data end
  local input = st.input and decode(st.input)
  local run = { id = st.run_id, input = input ~= null and input or nil, event = st.event }
  local name, data = ev.name, ev.data
  if type(name) == "function" then
    name = call_test_fn("c:event: the function giving the event's name", name, run)
    if type(name) ~= "string" or name == "" then
      failf("c:event: the function giving the event's name returned %s, not an event name", report.show(name))
    end
  end
  if type(data) == "function" then
    data = call_test_fn("c:event: the function giving the event's data", data, run)
    if data ~= nil and not encode(data, 0) then failf("c:event: the function giving the event's data returned a value that is not JSON") end
  end
  ev.resolved[st.run_id] = { name = name, data = data }
  return name, data
end

-- A supplied event as a wait step of run st sees it: {name, id, data, ts}.
local function event_object(st, ev)
  local name, data = event_parts(st, ev)
  return { name = name, id = ev.id, data = data == nil and null or data, ts = rfc3339(ev.ts) }
end

-- A wait step mocked with c:mock (m): it ends at once with the mocked
-- event (name, id and ts filled in when the mock leaves them out), or with
-- nil at its timeout (at once when it has none), as if it timed out.
local function mock_wait(st, co, s, m, id, name, timeout_at)
  if m.kind == "error" then
    failf("c:mock_error(%s): step '%s' waits for an event, which does not fail: mock it with the event it gets, "
      .. "c:mock(%s, { data = {...} }), or with nil for its timeout", encode(id, 0), id, encode(id, 0))
  end
  local v = m.value
  if m.kind == "fn" then v = call_test_fn(("the mock of step '%s'"):format(id), m.fn, 1, id) end
  if v ~= nil and v ~= null and type(v) ~= "table" then
    failf("c:mock(%s): step '%s' waits for an event: mock it with the event, a table such as { data = {...} }, "
      .. "or with nil for its timeout; got %s", encode(id, 0), id, report.show(v))
  end
  if v == nil or v == null then
    push(st, co, timeout_at > 0 and max(clock, timeout_at) or clock, nil, function()
      s.status, s.output, s.ended_at, s.wake_at = "completed", "null", clock, nil
      return nil, clock
    end)
    return
  end
  local ev = {}
  for k, x in pairs(v) do ev[k] = x end
  ev.name = ev.name == nil and name or ev.name
  ev.id = ev.id == nil and core.test_ulid(clock) or ev.id
  ev.ts = ev.ts == nil and rfc3339(clock) or ev.ts
  ev.data = ev.data == nil and null or ev.data
  local js = encode(ev, 0)
  if not js then failf("c:mock(%s): the event is not a JSON value", encode(id, 0)) end
  push(st, co, clock, nil, function()
    s.status, s.output, s.ended_at, s.wake_at = "completed", js, clock, nil
    return js, clock
  end)
end

-- The first supplied event for a wait of this run: name, time, match
-- (a decoded match object of path -> value, or nil).
local function find_event(st, name, match, upto)
  local best
  for _, ev in ipairs(st.C.events) do
    if not ev.taken[st.run_id] and ev.ts >= st.started and (upto == 0 or ev.ts <= upto)
      and (not best or ev.ts < best.ts) and event_parts(st, ev) == name
      and (not match or flow.matches(event_object(st, ev), match)) then
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
        if c.event == event_parts(st, ev) then
          local ok = true
          if c.match then
            -- Its pairs (skill.lua) against this run's event, as the engine does.
            ok = flow.matches(event_object(st, ev), decode(flow.match_json(st.event, c.match)))
          end
          if ok then best = ev break end
        end
      end
    end
  end
  return best
end

-- The case's http mock for a request: the last one added that matches.
local function find_http(C, method, url)
  for i = #C.http, 1, -1 do
    local m = C.http[i]
    if (not m.method or m.method == method) and url:find(m.url, 1, true) then return m end
  end
end

-- The reasons the HTTP client gives a failed transfer (engine/core/httpc.h,
-- struct httpc_resp): what a mock's `reason` may say.
local HTTP_REASONS = { "timeout", "connect", "dns", "tls", "too_big", "scheme", "redirects", "invalid",
                       "network", "nomem", "internal", "self" }
local is_http_reason = {}
for _, r in ipairs(HTTP_REASONS) do is_http_reason[r] = true end
-- A mocked failure that names no reason: the client's own for a failure it
-- does not classify (a reset connection, one closed without a response).
local DEFAULT_HTTP_REASON = "network"
local HTTP_DEFAULT_TIMEOUT_MS = 30000 -- httpc.h's HTTPC_DEFAULT_TIMEOUT_MS

-- A mock's response as the HTTP op answers: {status, body, headers} and
-- its delay (ms), or nil, the delay, a message and the failure's reason.
local function http_response(resp)
  if type(resp) ~= "table" then
    return nil, 0, ("an http mock must answer a table {status=, body= or json=, headers=}, got %s"):format(type(resp))
  end
  local delay = duration_ms(resp.delay, "http mock: delay")
  if resp.reason ~= nil then
    if resp.error == nil then
      failf("http mock: reason = %s goes with error = \"...\" (a failed transfer), which this response does not give",
        encode(tostring(resp.reason), 0))
    elseif not is_http_reason[resp.reason] then
      failf("http mock: reason = %s is not one the HTTP client gives: %s", encode(tostring(resp.reason), 0),
        table.concat(HTTP_REASONS, ", "))
    end
  end
  if resp.error ~= nil then return nil, delay, tostring(resp.error), resp.reason or DEFAULT_HTTP_REASON end
  local headers = {}
  if type(resp.headers) == "table" then
    for k, v in pairs(resp.headers) do headers[tostring(k):lower()] = tostring(v) end
  end
  local body = resp.body
  if resp.json ~= nil then
    local err
    body, err = encode(resp.json, 0)
    if not body then return nil, 0, "http mock: json is not a JSON value: " .. err end
    headers["content-type"] = headers["content-type"] or "application/json"
  end
  if body ~= nil and type(body) ~= "string" then body = encode(body, 0) or tostring(body) end
  local status = resp.status or 200
  if type(status) ~= "number" then return nil, 0, "http mock: status must be a number" end
  return { status = status, body = body or "", headers = headers }, delay
end

-- The request as the HTTP client names it in its messages (httpc.c's
-- describe_request): the method as given, the URL without user:password@,
-- cut after 300 characters.
local function describe_request(method, url)
  local a = url:find("://", 1, true)
  if a then
    a = a + 3
    local e = (url:find("[/?#]", a) or #url + 1) - 1
    local at = url:sub(a, e):match("^.*()@")
    if at then url = url:sub(1, a - 1) .. url:sub(a + at) end
  end
  if #url > 300 then url = url:sub(1, 300) .. "..." end
  return method .. " " .. url
end

-- A failure's message as the HTTP client makes it (httpc.c's describe_error).
local function transfer_error(cause, what)
  return (cause:sub(1, 200) .. " (" .. what .. ")"):sub(1, 511)
end

-- The request's timeout in ms as the engine reads it
-- (run__http_request_from_lua, httpc_start): seconds (a number, or a
-- string of one) or a duration string; 0, nil or an unreadable string is
-- the client's default. A negative one: nil, the client's message.
local function request_timeout_ms(t, what)
  local ms = 0
  local n = tonumber(t)
  if n then
    ms = n * 1000
    ms = ms >= 0 and floor(ms) or -floor(-ms)
  elseif type(t) == "string" then
    ms = core.duration(t) or 0
  end
  if ms < 0 then return nil, ("negative timeout %d ms (%s)"):format(ms, what) end
  return ms ~= 0 and ms or HTTP_DEFAULT_TIMEOUT_MS
end

-- What a body's request or wait gets when its step's time is up (the
-- engine's run__step_timed_out): nil, the message, the reason.
local function step_timed_out(T)
  return pack(nil, ("step '%s' timed out after %s"):format(tostring(T.in_step),
    core.test_fmt_duration(T.test_timeout)), "step_timeout")
end

-- The HTTP op: record the request and queue the mock's answer (after its
-- delay), or the request's timeout when the delay outlasts it, or the
-- step's timeout when that comes first, or an error when nothing mocks it.
local function handle_http(st, co, T, req)
  local C = st.C
  local raw_method = (req.method ~= nil and tostring(req.method) ~= "") and tostring(req.method) or "GET"
  local method = raw_method:upper()
  local url = tostring(req.url)
  local what = describe_request(raw_method, url)
  local timeout_ms, terr = request_timeout_ms(req.timeout, what)
  if not timeout_ms then -- refused by the client before anything is sent
    push(st, co, clock, pack(nil, terr))
    return
  end
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
    if method == "POST" and url:sub(-#api.llm_path) == api.llm_path then
      -- llm.chat's request: c:llm gives the model's answer.
      msg = ("POST %s (the LLM) is not mocked in this test: give the model's answer with c:llm(answer), "
        .. "or mock the step '%s' with c:mock"):format(url, tostring(rec.step))
    end
    C.unmocked[#C.unmocked + 1] = method .. " " .. url
    push(st, co, clock, pack(nil, msg))
    return
  end
  m.n = m.n + 1
  local resp, delay, err, reason = m.resp, 0, nil, nil
  if type(resp) == "function" then
    local ok, v = pcall(resp, rec, m.n)
    if getmetatable(v) == failure_mt then error(v, 0) end
    if not ok then -- a function that raises: a failed transfer
      resp, err, reason = nil, message_of(v), DEFAULT_HTTP_REASON
    else
      resp = v
    end
  end
  if resp ~= nil then resp, delay, err, reason = http_response(resp) end
  if not resp and not err then err = "http mock gave no response" end
  local at, out = clock + (delay or 0), nil
  if at > clock + timeout_ms then
    -- The request's own timeout ends the transfer first, as libcurl's does.
    at = clock + timeout_ms
    out = pack(nil, transfer_error(("timeout after %d ms"):format(timeout_ms), what), "timeout")
  elseif resp then
    out = pack(resp)
  else
    out = pack(nil, err, reason)
  end
  local dl = T and T.test_deadline
  if dl and at > dl then
    push(st, co, dl, step_timed_out(T))
    return
  end
  push(st, co, at, out)
end

-- The INVOKE op: answer with the case's child mock for the skill (after its
-- `after`, or nil at the step's timeout), or fail the step if none.
local function handle_invoke(st, co, seq, id, skill, data, timeout_at, started)
  -- An invoke in a step.parallel branch's body (id "fan/2/ID") has no
  -- step record of its own: the branch's step is the record.
  local T = run.tasks[co]
  local branch = T and T.branch and T.in_step
  if branch and T.test_deadline and clock >= T.test_deadline then
    -- Its time is up: no child is started in this attempt (as in the engine).
    push(st, co, clock, pack(nil, clock, ("step '%s' timed out before its child run started"):format(branch)))
    return
  end
  local s = branch and {} or step_rec(st, seq, id, "invoke")
  s.status, s.started_at, s.attempts = "waiting", started, 1
  local input = decode(data)
  if input == null then input = nil end
  st.invoked[#st.invoked + 1] = { skill = skill, data = input, step = id }
  local m = st.C.children[skill]
  -- c:mock of the step itself: its value is the child's output (a
  -- function: called with 1, the step id), c:mock_error a failed child.
  -- In a branch, c:mock("fan/2/ID"), or c:mock("ID") for every branch's.
  local sm = step_mock(st, id) or (branch and step_mock(st, id:match("[^/]*$")))
  if sm then
    if sm.kind == "value" then m = { n = 0, value = sm.value }
    elseif sm.kind == "error" then m = { n = 0, error = sm.message }
    else m = { n = 0, fn = function() return sm.fn(1, id) end } end
  end
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
  -- A branch's step timeout (step.parallel's opts.timeout) ends its wait
  -- too, as in the engine.
  local dl = branch and T.test_deadline
  if dl and at > dl and (timeout_at == 0 or dl < timeout_at) then
    push(st, co, dl, nil, function()
      return nil, clock, ("step '%s' timed out after %s while waiting for its child run %s"):format(branch,
        core.test_fmt_duration(T.test_timeout), decode(outcome).run_id)
    end)
    return
  end
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

-- The driver's side of each op of the op table (engine/core/op.h), by
-- name: record it, and queue the task with the op's answer (see the table
-- above). a holds the op's arguments by name (core.op_args); T is the
-- yielding task's state.
local handlers = {}

function handlers.COMMIT(st, co, T, a)
  local s = step_rec(st, a.seq, a.id, a.kind)
  s.status, s.output, s.attempts, s.started_at, s.ended_at = "completed", a.output, a.attempts, a.started, a.ended
  s.retry_at = nil
  s.usage = T and T.test_usage
  push(st, co, clock, NONE)
end

function handlers.RETRY(st, co, T, a)
  local s = step_rec(st, a.seq, a.id, "run")
  s.status, s.attempts, s.started_at, s.retry_at = "running", a.n, a.started, clock + a.delay
  s.failures[#s.failures + 1] = { n = a.n, error = a.message, traceback = a.traceback,
                                 started_at = a.attempt_started, ended_at = clock, retry_at = clock + a.delay }
  push(st, co, clock + a.delay, NONE)
end

function handlers.FAIL(st, co, T, a)
  local s = step_rec(st, a.seq, a.id, a.kind)
  s.status, s.error, s.attempts, s.started_at, s.ended_at, s.retry_at = "failed", a.message, a.n, a.started, a.ended, nil
  s.failures[#s.failures + 1] = { n = a.n, error = a.message, traceback = a.traceback,
                                 started_at = a.attempt_started, ended_at = a.ended }
  s.usage = T and T.test_usage
  push(st, co, clock, NONE)
end

function handlers.BACKOFF(st, co, T, a)
  push(st, co, max(clock, a.retry_at), NONE)
end

-- A wait inside a body (llm.chat's before a retry): cut short by the
-- step's timeout, as the engine does (run_op_delay).
function handlers.DELAY(st, co, T, a)
  local at, dl = clock + max(0, a.ms), T and T.test_deadline
  if dl and at > dl then push(st, co, max(clock, dl), step_timed_out(T)) return end
  push(st, co, at, NONE)
end

function handlers.HTTP(st, co, T, a)
  handle_http(st, co, T, a.request)
end

function handlers.SLEEP(st, co, T, a)
  if step_mock(st, a.id) then
    failf("c:mock(%s): step '%s' is a sleep: sleeps pass at once on the virtual clock, so there is nothing "
      .. "to mock (remove the mock; c:step(%s).duration is how long it slept)", encode(a.id, 0), a.id, encode(a.id, 0))
  end
  local s = step_rec(st, a.seq, a.id, "sleep")
  s.status, s.started_at, s.wake_at, s.attempts = "sleeping", a.started, a.wake_at, 1
  push(st, co, max(clock, a.wake_at), nil, function()
    s.status, s.ended_at, s.wake_at = "completed", clock, nil
    return clock
  end)
end

function handlers.WAIT(st, co, T, a)
  local id, name, timeout_at = a.id, a.event, a.timeout_at
  local s = step_rec(st, a.seq, id, "wait")
  s.status, s.started_at, s.attempts = "waiting", a.started, 1
  s.wake_at = timeout_at > 0 and timeout_at or nil
  local m = step_mock(st, id)
  if m then return mock_wait(st, co, s, m, id, name, timeout_at) end
  local ev = find_event(st, name, a.match and decode(a.match), timeout_at)
  if ev then
    ev.taken[st.run_id] = true
    push(st, co, max(clock, ev.ts), nil, function()
      local js = encode(event_object(st, ev), 0)
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
end

function handlers.INVOKE(st, co, T, a)
  handle_invoke(st, co, a.seq, a.id, a.skill, a.data, a.timeout_at, a.started)
end

function handlers.SEND(st, co, T, a)
  if step_mock(st, a.id) then
    failf("c:mock(%s): step '%s' sends events: in a test they are recorded, not sent, so there is nothing "
      .. "to mock (remove the mock; c:sent() lists them, and a wait of the run can take them)", encode(a.id, 0), a.id)
  end
  local s = step_rec(st, a.seq, a.id, "send")
  local list, ids = decode(a.events), {}
  for i, ev in ipairs(list) do
    local eid = core.test_ulid(clock)
    ids[i] = eid
    local data = ev.data
    if data == null then data = nil end
    st.sent[#st.sent + 1] = { name = ev.name, data = data, id = eid, key = ev.id, step = a.id }
    st.C.events[#st.C.events + 1] = { name = ev.name, data = data, id = eid, ts = clock, taken = {} }
  end
  local js = encode(core.json.array(ids), 0)
  s.status, s.output, s.attempts, s.started_at, s.ended_at = "completed", js, 1, a.started, clock
  push(st, co, clock, pack(js, clock))
end

function handlers.PARALLEL(st, co, T, a)
  local s = step_rec(st, a.seq, a.id, "parallel")
  s.status, s.started_at, s.attempts = "running", a.started, 1
  local group = { parent = co, left = #a.tasks, results = {} }
  for i, kid in ipairs(a.tasks) do
    st.kids[kid] = { group = group, i = i }
    push(st, kid, clock, NONE)
  end
end

-- runs.cancel answers before it yields in a test (core.runs_cancel, above),
-- and nothing pauses a run under test (step_through is the REPL's).
function handlers.CANCEL()
  error("internal: runs.cancel yielded its op in a skill test", 0)
end
function handlers.PAUSE()
  error("internal: a run under test yielded a pause (the REPL's step_through)", 0)
end

-- The op table and the driver agree, or `moonloop test` does not start:
-- an op the driver does not know would be misread, and a handler for an
-- op the table lacks is one the core does not have.
for name in pairs(OP) do
  if not handlers[name] then error(("testing_driver: op %s of the op table (engine/core/op.h) has no handler in the test driver"):format(name), 0) end
end
for name in pairs(handlers) do
  if not OP[name] then error(("testing_driver: the test driver handles op %s, which the op table (engine/core/op.h) does not have"):format(name), 0) end
end

-- Interpret the op task co yielded (r: resume's results, r[2] the op),
-- read with the core's own decoder: a malformed op fails the run, as in
-- the engine (the caller ends it). Returns the op's name and arguments,
-- or nil and the decoder's message.
local function handle_op(st, co, r)
  local ok, name, a = pcall(core.op_args, unpack(r, 2, r.n))
  if not ok then return nil, message_of(name) end
  handlers[name](st, co, run.tasks[co], a)
  return name, a
end

-- The step (seq, id) the op in r (resume's results) names, if it names one.
local function op_step(r)
  local ok, _, a = pcall(core.op_args, unpack(r, 2, r.n))
  if ok then return a.seq, a.id end
end

-- Journal what a run did into the throwaway store (as the engine would
-- have, ending with its final state).
local function journal_run(st)
  local J = core.test_journal
  local skill = st.suite
  local recorded = cur.file.recorded
  if not recorded[skill.version] then
    recorded[skill.version] = true
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
  local terminal = core.VOCAB.ended[st.status]
  J("run_set", { run_id = st.run_id, status = st.status, output = st.output_json, error = st.error_json,
                 ended_at = terminal and st.ended or 0 })
end

-- End the run with its status, output and error (JSON text); natural: it
-- ended by its own code (not by its timeout, a cancel, a budget, a stall).
local function finish(st, status, output_json, error_json, natural)
  st.natural = natural
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

-- End the run with status and an error message.
local function fail_run(st, status, message)
  finish(st, status, nil, encode({ message = message }, 0))
end

-- A child of step.parallel ended: once all have, resume the parent.
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
  if C.pending then
    -- An assertion failed inside the run (in a mock): the case ends here.
    -- The run is kept as far as it went, failed, so that the report's run
    -- id shows it (moonloop trace RUN_ID --db PATH).
    fail_run(st, "failed", "stopped by the test: " .. tostring(C.pending.message or C.pending))
    st.stopped_by_test = true
    journal_run(st)
    core.test_commit()
    error(C.pending, 0)
  end
  if kill then
    -- Skill code ran past its budget: as in the engine, that is final for
    -- the run. Record the step it failed (if any), then end the run.
    local msg = kill
    if r[1] and co_status(co) ~= "dead" and r[2] == OP.FAIL then
      local _, a = handle_op(st, co, r)
      if a then msg = ("step '%s' failed: %s"):format(tostring(a.id), tostring(a.message)) end
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
      if r[2] then finish(st, "completed", r[3] or "null", nil, true) else finish(st, "failed", nil, r[3], true) end
    else
      child_done(st, co, r[2], r[3])
    end
    return
  end
  local name, err = handle_op(st, co, r)
  if not name then fail_run(st, "failed", err) end
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
  st.cfg = cfg
  -- The case's run from its start (an on_failure run is the case's
  -- failure_run): a failure raised inside it (an assertion in a mock)
  -- still names its run id in the report.
  if how.entry ~= "on_failure" then C.last = st end
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

-- Replay checks ---------------------------------------------------------------

-- "FILE:LINE: " of the skill code where the suspended coroutine co is, or "".
local function co_position(co)
  for level = 0, 200 do
    local info = debug.getinfo(co, level, "Sl")
    if not info then break end
    if info.what ~= "C" and (info.currentline or 0) > 0 and info.source:sub(1, 10) ~= "=moonloop/" then
      return ("%s:%d: "):format(info.short_src, info.currentline)
    end
  end
  return ""
end

-- The step records of a run as an engine reads them back for a replay.
local function journal_of(st)
  local journal = {}
  for _, seq in ipairs(st.seqs) do
    local s = st.steps[seq]
    if s.status ~= "completed" and s.status ~= "failed" then return nil end
    journal[seq] = { seq = seq, id = s.id, kind = s.kind, status = s.status, output = s.output,
                     error = s.error, attempts = s.attempts, started_at = s.started_at,
                     ended_at = s.ended_at }
  end
  return journal
end

local REPLAY = "replaying the run from its journal (as an engine does after a crash)"
local HINT = "Code outside step bodies runs again on replay and must take the same path:"
  .. " put what varies (the time, random numbers, outside calls) inside a step"

-- Replay run st, which ended by its own code, from the journal it left, as
-- an engine does after a crash or when it takes the run over: every step
-- returns (or raises) what it recorded and nothing runs, so the run must
-- end as it did. Code outside steps that takes another path on replay
-- (it read the clock or a random number) is caught here, not in
-- production: the message names the line. Returns nil, or why it failed.
local function replay(st, def)
  if not st.natural then return nil end
  local journal = journal_of(st)
  if not journal then return nil end
  local st2 = {
    C = st.C, suite = st.suite, spec = st.spec, run_id = st.run_id, entry = st.entry,
    trigger = st.trigger, input = st.input, event = st.event, started = st.started, steps = {},
    logs = {}, requests = {}, sent = {}, invoked = {}, kids = {}, queue = {}, qn = 0, resumes = 0,
    status = "running",
  }
  local info = { run_id = st.run_id, entry = st.entry, started_at = st.started, cfg = st.cfg,
                 trigger = st.trigger, input = st.input, test = st2 }
  local co = run.new(info, def, journal)
  -- A replay comes later (an hour, here): code that reads the clock
  -- outside a step sees another time, as it would in production.
  local saved = clock
  set_clock(max(clock, st.ended or clock) + 3600 * 1000)
  yield() -- a tick: the replay has its own budget
  local r = pack(resume(co))
  set_clock(saved)
  local kill = core.kill_reason()
  if kill then return ("%s: it was stopped: %s"):format(REPLAY, kill) end
  if not r[1] then return ("%s: %s"):format(REPLAY, message_of(r[2])) end
  if co_status(co) ~= "dead" then
    local T = run.tasks[co]
    local _, op_id = op_step(r)
    local sid = T and T.in_step or op_id or "?"
    return ("%s%s reached step '%s' and would run it: the run had not taken that step there. %s")
      :format(co_position(co), REPLAY, sid, HINT)
  end
  if info.diverged then
    return ("%s: %s. %s"):format(REPLAY, tostring(info.diverged.message), HINT)
  end
  local ok, payload = r[2], r[3]
  local function what(status, json)
    local v = json and decode(json)
    if status == "failed" then
      return "failed: " .. tostring(type(v) == "table" and v.message or v)
    end
    return "completed with " .. tostring(json)
  end
  local got = what(ok and "completed" or "failed", payload)
  local want = what(st.status, st.status == "completed" and st.output_json or st.error_json)
  if got ~= want then
    return ("%s: the run %s, the replay %s. %s"):format(REPLAY, want, got, HINT)
  end
  return nil
end

M.exec, M.set_clock, M.rfc3339, M.replay = exec, set_clock, rfc3339, replay

-- Replay a recorded run (moonloop replay): info as run.new takes it, the
-- journal as store_get_steps reads it, and what the run record says
-- (status, output JSON, error message). Nothing runs: the first op the
-- replay yields is where it would go on live. Returns ok, and a sentence.
function M.replay_recorded(def, info, journal, status, output_json, error_message)
  local st = {
    C = { mocks = {}, events = {}, http = {}, children = {}, unmocked = {} }, run_id = info.run_id,
    steps = {}, logs = {}, requests = {}, sent = {}, invoked = {}, kids = {}, queue = {}, qn = 0,
    resumes = 0, status = "running",
  }
  info.test = st
  local co = run.new(info, def, journal)
  core.test_clock(nil)
  set_clock(core.now()) -- the replay happens now
  yield()
  local r = pack(resume(co))
  local kill = core.kill_reason()
  if kill then return false, "the replay was stopped: " .. kill end
  if not r[1] then return false, "the replay failed: " .. message_of(r[2]) end
  if info.diverged then return false, tostring(info.diverged.message) end
  -- The steps the replay took as recorded (run.lua's record_at counts them).
  local n = info.replayed or 0
  local steps = ("%d step%s replayed"):format(n, n == 1 and "" or "s")
  if co_status(co) ~= "dead" then
    local T = run.tasks[co]
    local op_seq, op_id = op_step(r)
    local seq = T and T.in_step and T.step_seq or op_seq
    local sid = T and T.in_step or op_id or "?"
    local rec = seq and journal[seq]
    if status == "completed" or (rec and (rec.status == "completed" or rec.status == "failed")) then
      return false, ("%sthe replay reached step '%s' and would run it: the run had not taken that step there (%s)")
        :format(co_position(co), sid, steps)
    end
    return true, ("%s; it goes on live at step '%s'"):format(steps, sid)
  end
  local ok, payload = r[2], r[3]
  if status == "completed" or status == "failed" then
    local got, want
    if ok then got = "completed with " .. tostring(payload) else
      local v = decode(payload)
      got = "failed: " .. tostring(type(v) == "table" and v.message or v)
    end
    if status == "completed" then want = "completed with " .. tostring(output_json)
    else want = "failed: " .. tostring(error_message) end
    if got ~= want then
      -- A run that failed by its timeout, a cancel or a budget ended
      -- outside its code: its replay has nothing to compare.
      if status == "failed" and ok == false then
        return true, ("%s; the run failed (%s), the replay ends %s"):format(steps, tostring(error_message), got)
      end
      return false, ("the run %s, the replay %s (%s)"):format(want, got, steps)
    end
    return true, ("%s; it ends %s as recorded"):format(steps, status)
  end
  return true, ("%s; it would end %s"):format(steps, ok and "completed" or "failed")
end

-- The virtual clock now (ms since the epoch).
function M.now() return clock end

return M
