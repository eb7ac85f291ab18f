-- testing.lua: skill tests (`moonloop test`): the `test` module that test
-- files see, and the entry points skilltest.c calls (load, start, finish).
-- The driver that runs a skill under test is testing_driver.lua.
--
-- A test file is Lua, run in a sandbox like a skill file, that returns the
-- suite(s) made by test.skill(path or id); each suite holds cases, and a
-- case is a function of `c`, the case's handle: mocks, c:run, assertions.
-- docs/testing.md is the user's guide; this is how it works.
--
-- The work is shared by three files:
--   testing.lua          this module (load a test file, start and finish a
--                        case), the `test` module, suites and the case
--                        handle `c` with its mocks and assertions;
--   testing_driver.lua   the driver: runs the skill under test on a
--                        virtual clock and answers the ops it yields with
--                        the case's mocks (its top comment says how);
--   testing_report.lua   showing values in messages, and failing a case.
--
-- Invariants: one test file is loaded at a time (report.cur.file) and one
-- case runs at a time (report.cur.case, from M.start to M.finish); a case's
-- handle works only while its case runs (`states`); c:run is called only
-- from the case's own coroutine (s.driver, made by M.start and resumed by
-- skilltest.c), never from inside a mock.

local core = ...
local run = require("run")
local skill_api = require("api") -- its llm_path: what c:llm answers
require("flow")
local loader = require("loader")
local sandbox = require("sandbox")
local report = require("testing_report")
local driver = require("testing_driver")

local M = {}

local encode, decode, null = core.encode, core.decode, core.json.null
local create, running = coroutine.create, coroutine.running
local getinfo = debug.getinfo
local type, tostring, error, pairs, ipairs, select = type, tostring, error, pairs, ipairs, select
local setmetatable, getmetatable, pcall, xpcall = setmetatable, getmetatable, pcall, xpcall
local concat, sort = table.concat, table.sort
local cur, show, diff, failure_mt = report.cur, report.show, report.diff, report.failure_mt
local fail, failf, message_of, duration_ms = report.fail, report.failf, report.message_of, report.duration_ms
local test_line = report.test_line
local exec, set_clock, rfc3339 = driver.exec, driver.set_clock, driver.rfc3339

local DEFAULT_START = 1735689600000 -- 2025-01-01T00:00:00Z: cases start here unless c:at says otherwise

M.show = show

-- The case handle (`c`) ------------------------------------------------------

local states = setmetatable({}, { __mode = "k" }) -- handle -> case state
local api = {}
local api_mt = { __index = api, __metatable = false }

-- The state of the case whose handle is self; fails once that case ended.
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

-- c:env(values): env values for the skill, over the suite's.
function api:env(values)
  local s = state(self)
  if type(values) ~= "table" then fail("c:env(values): expected a table of env values") end
  for k, v in pairs(values) do s.env[k] = v end
end

-- c:at(time): the time the next run starts (unix seconds or RFC 3339).
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

-- c:now(): the virtual time in unix seconds (the running run's clock).
function api:now()
  local s = state(self)
  return (cur.case == s and s.running and driver.now() or s.clock) / 1000
end

-- Fail unless id is a step id (a non-empty string).
local function check_id(what, id)
  if type(id) ~= "string" or id == "" then failf("%s: the step id must be a non-empty string", what) end
end

-- c:mock(step_id, value or function(attempt, step_id)): the step's body
-- returns the value (or calls the function) instead.
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

-- c:mock_error(step_id, message [, {fatal=true}]): the step's body fails.
function api:mock_error(id, message, opts)
  local s = state(self)
  check_id("c:mock_error", id)
  if opts ~= nil and type(opts) ~= "table" then fail("c:mock_error(step_id, message [, {fatal=true}])") end
  s.mocks[id] = { kind = "error", message = tostring(message or "mocked failure"), fatal = opts and opts.fatal }
end

-- c:http("[METHOD ]part-of-url", response): answer matching requests with
-- response (a table, or a function(request, n) that returns one).
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
  s.http[#s.http + 1] = { method = "POST", url = skill_api.llm_path, n = 0, resp = function(req, n)
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

-- c:event(name, data [, {after=, id=}]): an event that arrives `after` the
-- run's start, for waits and cancel_on. name and data may each be a
-- function of the run ({id, input, event}), called when the run first
-- looks for events (the driver's event_parts): an event named after the
-- run's id ("approve." .. run.id), which the test cannot know ahead.
function api:event(name, data, opts)
  local s = state(self)
  if type(name) ~= "function" and (type(name) ~= "string" or name == "") then
    fail("c:event(name, data [, {after=, id=}]): name must be an event name, or a function(run) returning one")
  end
  if opts ~= nil and type(opts) ~= "table" then fail("c:event(name, data, opts): opts must be a table {after=, id=}") end
  if data ~= nil and type(data) ~= "function" and not encode(data, 0) then fail("c:event: data is not a JSON value") end
  s.events[#s.events + 1] = { name = name, data = data, id = opts and opts.id or core.test_ulid(s.clock),
                              after = duration_ms(opts and opts.after, "c:event: after"), taken = {},
                              resolved = {} }
end

-- c:child(skill_id, output [, {after=}]): step.invoke of that skill ends
-- with output (or what a function(input, n) returns).
function api:child(skill, output, opts)
  local s = state(self)
  if type(skill) ~= "string" or skill == "" then fail("c:child(skill_id, output [, {after=}]): skill_id must be a string") end
  if opts ~= nil and type(opts) ~= "table" then fail("c:child(skill_id, output, opts): opts must be a table {after=}") end
  local m = { n = 0, after = duration_ms(opts and opts.after, "c:child: after") }
  if type(output) == "function" then m.fn = output else m.value = output end
  s.children[skill] = m
end

-- c:child_error(skill_id, message [, {after=}]): the child run fails.
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
  -- The test's env is what the configuration grants: a name it does not
  -- give raises when the skill reads it (false: granted, not set).
  local ok, def, spec = pcall(loader.load, suite.chunk, suite.file, suite.src,
    core.test_default_id(suite.file), env, nil, nil, nil, "test")
  if not ok then failf("cannot load %s: %s", suite.file, message_of(def)) end
  return def, spec
end

-- c:run(input [, {event=, at=}]): run the skill to its end (and its
-- on_failure run if it failed); returns the output and the error message.
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
  -- Every run is replayed from its journal too, as after a crash.
  local diverged = driver.replay(st, def)
  if diverged then
    s.running = false
    fail(diverged)
  end
  if st.status == "failed" and spec.has_on_failure then
    local trig = encode({ kind = "on_failure", run_id = st.run_id, error = st.error or null }, 0)
    s.failure_run = exec(s, s.suite, def, spec, { entry = "on_failure", trigger = trig, input = input_json,
                                                   event = how.event })
    diverged = driver.replay(s.failure_run, def)
    if diverged then
      s.running = false
      fail("the on_failure run: " .. diverged)
    end
  end
  s.clock = driver.now()
  s.running = false
  return st.output, st.error and st.error.message
end

-- Assertions ---------------------------------------------------------------

-- c:eq(actual, expected [, label]): fail where the values differ.
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

-- c:ok(v [, label]): fail unless v is true; returns v.
function api:ok(v, label)
  state(self)
  if v then return v end
  fail(label and tostring(label) or ("expected a true value, got " .. show(v)))
end

-- c:fail(msg): fail the case.
function api:fail(msg)
  state(self)
  fail(tostring(msg or "failed"))
end

-- c:err(text or pattern [, which]): fail unless the run failed with an
-- error containing it; returns the message.
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

-- c:status([which]): the run's status.
function api:status(which)
  local s = state(self)
  s.checked_error = true
  return view(s, which).status
end

-- The ids of a run's steps, in order.
local function step_ids(st)
  local ids = {}
  for i, seq in ipairs(st.seqs) do ids[i] = st.steps[seq].id end
  return ids
end

-- c:steps([ids [, which]]): the run's step ids; fail if they differ from ids.
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

-- The value of JSON text, or nil for nil, null or bad JSON.
local function decode_or_nil(js)
  if js == nil then return nil end
  local ok, v = pcall(decode, js)
  if not ok or v == null then return nil end
  return v
end

-- c:step(id [, which]): what the run recorded of step id; fail if none.
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

-- c:logs([which]): the run's log lines {level, msg, step}.
function api:logs(which)
  local s = state(self)
  local st = view(s, which)
  local out = {}
  for i, l in ipairs(st.logs) do
    out[i] = { level = l.level, msg = l.msg, step = l.seq > 0 and st.steps[l.seq] and st.steps[l.seq].id or nil }
  end
  return out
end

-- c:sent, c:requests, c:invoked ([which]): the events the run sent, the
-- HTTP requests it made, the child runs it asked for.
function api:sent(which) return view(state(self), which).sent end
function api:requests(which) return view(state(self), which).requests end
function api:invoked(which) return view(state(self), which).invoked end

-- c:output([which]): the run's output.
function api:output(which)
  return view(state(self), which).output
end

-- c:trace([which]): the run as `moonloop trace --json` shows it.
function api:trace(which)
  local st = view(state(self), which)
  local rec, err = core.test_trace(st.run_id)
  if not rec then failf("reading the run's trace: %s", tostring(err)) end
  return rec
end

-- c:on_failure(): the on_failure run {run_id, status, output, error}, or nil.
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

-- t:case(name, fn) (or t:test): add a case of the suite.
function suite_methods:case(name, fn)
  if not suites[self] then error("t:case: call it on a suite made by test.skill (t:case, with a colon)", 2) end
  if type(name) ~= "string" or name == "" then error("t:case(name, fn): name must be a non-empty string", 2) end
  if type(fn) ~= "function" then error(("t:case(%s, fn): fn must be a function(c)"):format(show(name)), 2) end
  local line = getinfo(fn, "S").linedefined
  local cases = cur.file.cases
  cases[#cases + 1] = { suite = self, name = name, fn = fn, line = line }
  return self
end
suite_methods.test = suite_methods.case

-- t:before_each(fn): run fn(c) before each case of the suite.
function suite_methods:before_each(fn)
  if not suites[self] then error("t:before_each: call it on a suite made by test.skill", 2) end
  if type(fn) ~= "function" then error("t:before_each(fn): fn must be a function(c)", 2) end
  self.before[#self.before + 1] = fn
  return self
end

-- The `test` module of one test file.
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
    local path = target:sub(1, 1) == "/" and target or (cur.file.dir .. target)
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
    local list = cur.file.suites
    list[#list + 1] = suite
    return suite
  end
  return test
end

-- The modules a test file sees: test, json, fatal, log (to stderr), time.
local function test_mods()
  local json = {}
  for k, v in pairs(core.json) do json[k] = v end
  local function out(level)
    return function(...)
      local parts = {}
      for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
      io.stderr:write(("%s: [%s] %s\n"):format(cur.file.path, level, concat(parts, " ")))
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

-- The line number of path that an error message starts with, or nil.
local function line_in(msg, path)
  local p = ("^" .. path:gsub("%p", "%%%0") .. ":(%d+):")
  return tonumber(tostring(msg):match(p))
end

-- The message handler of a test file's top level: the error, with the
-- test file's line.
local function load_handler(e)
  if type(e) == "table" then return e end
  return { message = tostring(e), line = test_line(2) }
end

-- Load a test file (its top level runs here, under the caller's budget).
-- Returns the number of cases, or a result table {file, line, message}
-- when the file cannot be loaded.
function M.load(path, src)
  local F = { path = path, dir = path:match("^(.*/)") or "", source = "@" .. path, cases = {}, suites = {},
              recorded = {} }
  cur.file, cur.case = F, nil
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

-- The message handler of a case: a failure as it is, else the error's
-- message and line (a kill: what stopped the test code).
local function case_handler(e)
  if getmetatable(e) == failure_mt then return e end
  local kill = core.kill_reason()
  if kill then
    return { message = "the test code was stopped: " .. kill:gsub("^stopped: the run ", "it "), line = test_line(2) }
  end
  local msg = message_of(e)
  local path = cur.file.path
  local line = line_in(msg, path) or test_line(2)
  msg = msg:gsub("^" .. path:gsub("%p", "%%%0") .. ":%d+: ", "")
  return { message = msg, line = line }
end

-- Make the driver coroutine of case i; skilltest.c resumes it to the end.
function M.start(i)
  local case = cur.file.cases[i]
  local handle = setmetatable({}, api_mt)
  local s = {
    case = case, suite = case.suite, handle = handle, env = {}, mocks = {}, http = {}, llm = {},
    events = {}, children = {}, unmocked = {}, clock = DEFAULT_START,
  }
  states[handle] = s
  cur.case = s
  s.driver = create(function()
    local ok, e = xpcall(function()
      for _, fn in ipairs(case.suite.before) do fn(handle) end
      case.fn(handle)
    end, case_handler)
    if not ok and not s.failure then s.failure = e end -- the first failure (report.fail keeps it)
  end)
  return s.driver
end

-- Why a failed case failed, with what else the reader will want to know.
local function notes(s)
  local out = {}
  local st = s.last
  if st and st.status ~= "completed" and not s.checked_error and not st.stopped_by_test then
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
-- The driver coroutine of a replay of a recorded run (moonloop replay):
-- it yields after each slice, as a case's does, and returns ok, message.
function M.replay(def, info, journal, status, output_json, error_message)
  return coroutine.create(function()
    return driver.replay_recorded(def, info, journal, status, output_json, error_message)
  end)
end

function M.finish(escaped)
  local s = cur.case
  core.test_clock(nil)
  cur.case = nil
  local r = { file = cur.file.path, name = s.case.name, line = s.case.line, ok = true,
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
