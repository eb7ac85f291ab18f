-- flow.lua: the steps that park a run or fan out: sleep, sleep_until,
-- wait_for_event, invoke, send_event, parallel. Their ops (SLEEP, WAIT,
-- INVOKE, SEND, PARALLEL; a parallel step ends with COMMIT or FAIL) and
-- their arguments are rows of the op table, engine/core/op.h.
-- An invoke in a step.parallel branch's body yields INVOKE with the
-- branch's seq, its key "branch/ID" as id, and the parallel's start.
--
-- Times are counted from the step's start as recorded (R.now), so a replay
-- after a restart waits for what is left, not for the whole duration again.

local core = ...
local run = require("run")
local api = require("api") -- the steps' option keys
local M = {}

local OP = core.OP
local yield, create = coroutine.yield, coroutine.create
local real_xpcall = xpcall
local type, tostring, error, ipairs, pairs, select, next = type, tostring, error, ipairs, pairs, select, next
local encode, decode = core.encode, core.decode
local need_run, next_step, record_at, to_ms = run.need_run, run.next_step, run.record_at, run.to_ms
local user_error, user_fatal = run.user_error, run.user_fatal
local null = core.json.null

local function done_rec(R, rec)
  if rec and rec.status == "completed" then
    R.now = rec.ended_at or R.now
    return true
  end
end

local function sleep_until(R, T, id, wake_at)
  local sid, seq, rec = next_step(R, T, id, "sleep")
  if done_rec(R, rec) then return nil end
  local started = R.now
  if rec then
    wake_at = rec.wake_at or wake_at
    started = rec.started_at or started
  end
  local ended = yield(OP.SLEEP, seq, sid, wake_at, started)
  R.now = ended or wake_at
  return nil
end

run.add_step("sleep", function(id, duration)
  local R, T = need_run("step.sleep", id)
  return sleep_until(R, T, id, R.now + to_ms(duration, "step.sleep"))
end)

run.add_step("sleep_until", function(id, t)
  local R, T = need_run("step.sleep_until", id)
  local at
  if type(t) == "number" then
    at = t * 1000
  elseif type(t) == "string" then
    local ms, err = core.parse_time(t)
    if not ms then user_error("step.sleep_until: " .. err) end
    at = ms
  else
    user_error("step.sleep_until: expected a unix time or an RFC 3339 string, got " .. type(t))
  end
  return sleep_until(R, T, id, at)
end)

-- The value at a dotted path ("data.request_id") in a table, or nil.
local function at_path(v, path)
  for part in path:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = v[part]
  end
  return v
end

-- The value at a dotted path in v as JSON text ("null" when there is none):
-- how a wait's match is compared (testing_driver.lua compares the same way).
local function json_at(v, path)
  v = at_path(v, path)
  return encode(v == nil and null or v, 0)
end
M.json_at = json_at

-- The match of a wait as its store row holds it: a JSON object of path ->
-- value, from api.match_pairs's pairs ({path}: the value at path in ev,
-- the run's own event; {path, value}: that value). testing_driver.lua
-- builds cancel_on's the same way.
local function match_json(ev, list)
  local o = {}
  for _, p in ipairs(list) do
    local v
    if #p == 1 then v = at_path(ev, p[1]) else v = p[2] end
    o[p[1]] = v == nil and null or v
  end
  return encode(o, 0)
end
M.match_json = match_json

-- Whether an event (a table {name, id, data, ts}) matches a match as
-- match_json gives it, decoded: every path's value equal as JSON.
function M.matches(event, match)
  for path, v in pairs(match) do
    if json_at(event, path) ~= encode(v, 0) then return false end
  end
  return true
end

run.add_step("wait_for_event", function(id, opts)
  local R, T = need_run("step.wait_for_event", id)
  -- An unknown key first: { name = "x" } is a misnamed 'event'.
  local bad = type(opts) == "table" and api.check_keys("step.wait_for_event", api.step.wait_for_event, opts)
  if bad then user_fatal(bad) end
  if type(opts) ~= "table" or type(opts.event) ~= "string" or opts.event == "" then
    user_error("step.wait_for_event(id, {event=, timeout=, match=}): 'event' must be an event name")
  end
  local match
  if opts.match ~= nil then
    local err
    -- A replay takes what an older engine took when the wait was made.
    match, err = api.match_pairs("step.wait_for_event", opts.match, null, R.replaying)
    if not match then user_fatal(err) end
  end
  local timeout = opts.timeout ~= nil and to_ms(opts.timeout, "step.wait_for_event: timeout") or nil
  local sid, seq, rec = next_step(R, T, id, "wait")
  if done_rec(R, rec) then
    local v = decode(rec.output)
    return v ~= null and v or nil
  end
  local started = rec and rec.started_at or R.now
  local timeout_at = rec and rec.wake_at or (timeout and started + timeout or 0)
  if match then match = match_json(run.event(R), match) end
  local ev, ended = yield(OP.WAIT, seq, sid, opts.event, match, timeout_at, started)
  R.now = ended or R.now
  return ev and decode(ev) or nil
end)

-- The outcome of an invoke (decoded; nil: it timed out) as the step
-- returns it: the child's output, or an error. In a step.parallel branch
-- the error is the branch body's (its step records it); elsewhere it is
-- the invoke step's own.
local function invoke_result(sid, outcome, branch)
  if outcome and outcome.status == "completed" then
    local v = outcome.output
    return v ~= null and v or nil
  end
  local msg
  if not outcome then
    msg = ("child run did not end within its timeout")
  else
    local e = type(outcome.error) == "table" and outcome.error.message or tostring(outcome.status)
    msg = ("child run %s %s: %s"):format(tostring(outcome.run_id), tostring(outcome.status), e)
  end
  if branch then
    -- Fatal: the body's retry would find the same child, ended as it is.
    error(setmetatable({ message = msg, child = outcome and outcome.run_id, fatal = true }, run.fatal_mt), 0)
  end
  error(setmetatable({ message = ("step '%s' failed: %s"):format(sid, msg), step = sid,
    child = outcome and outcome.run_id, fatal = true }, run.step_error_mt), 0)
end

-- Check step.invoke's options; returns the child's input as JSON and the
-- timeout in ms (or nil).
local function invoke_opts(opts)
  local bad = type(opts) == "table" and api.check_keys("step.invoke", api.step.invoke, opts)
  if bad then user_fatal(bad) end
  if type(opts) ~= "table" or type(opts.skill) ~= "string" or opts.skill == "" then
    user_error("step.invoke(id, {skill=, data=, timeout=}): 'skill' must be a skill id")
  end
  local data, err = encode(opts.data == nil and null or opts.data, 0)
  if not data then user_error("step.invoke: data is not a JSON value: " .. err) end
  return data, opts.timeout ~= nil and to_ms(opts.timeout, "step.invoke: timeout") or nil
end

-- step.invoke in the body of a step.parallel branch (T: the branch's
-- task): the child is started and awaited inside the body, which has no
-- steps of its own; the branch's step (id/N) is the durable record. The
-- invoke's key is "id/N/ID" (numbered within the attempt: "id/N/ID#2"),
-- from which the core derives the child's id with the parallel's start
-- time, so a retry of the body or its replay after a crash finds the same
-- child (started once, awaited again). While it waits, the branch's
-- record holds {run_id, step} and the timeout (wake_at), for a replay.
local function branch_invoke(T, id, opts)
  if type(id) ~= "string" or id == "" or #id > 200 or id:find("#", 1, true) then
    user_error("step.invoke: the step id must be a non-empty string of at most 200 characters, without '#'")
  end
  run.need_yieldable("step.invoke", "the branch's function's own code")
  local data, timeout = invoke_opts(opts)
  if T.inv_attempt ~= T.attempt then T.inv_attempt, T.inv_ids = T.attempt, {} end
  local n = (T.inv_ids[id] or 0) + 1
  T.inv_ids[id] = n
  local key = T.in_step .. "/" .. (n == 1 and id or (id .. "#" .. n))
  local rec, child, timeout_at = T.rec, nil, nil
  local was = rec and rec.status == "running" and rec.output and decode(rec.output)
  if type(was) == "table" and was.step == key and type(was.run_id) == "string" then
    -- Replayed while this invoke waited: the same child, the same timeout.
    child, timeout_at = was.run_id, rec.wake_at or 0
  end
  if not timeout_at then timeout_at = timeout and core.now() + timeout or 0 end
  local out, _, failure = yield(OP.INVOKE, T.step_seq, key, opts.skill, data, timeout_at, T.par_started, child)
  if failure then error(setmetatable({ message = failure, fatal = true }, run.fatal_mt), 0) end
  return invoke_result(key, out and decode(out), true)
end

run.add_step("invoke", function(id, opts)
  local T0 = run.current_task()
  if T0 and T0.in_step and T0.branch then return branch_invoke(T0, id, opts) end
  if T0 and T0.in_step then
    error(setmetatable({ message = ("%ssteps cannot be nested: step.invoke('%s') was called inside the body of step '%s'; "
      .. "call it in the run function, or in a function of step.parallel (one child run per function, all at once)")
      :format(run.skill_position(), tostring(id), T0.in_step), fatal = true }, run.fatal_mt), 0)
  end
  local R, T = need_run("step.invoke", id)
  local data, timeout = invoke_opts(opts)
  local sid, seq, rec = next_step(R, T, id, "invoke")
  local outcome
  -- Done: completed, or failed with the child's outcome kept (a child that
  -- failed or did not end in time). A failure to start the child has none.
  if done_rec(R, rec) or (rec and rec.status == "failed" and rec.output ~= nil) then
    R.now = rec.ended_at or R.now
    outcome = decode(rec.output)
    if outcome == null then outcome = nil end -- timed out
  elseif rec and rec.status == "failed" then
    -- The child could not be started: raise that again, start nothing.
    R.now = rec.ended_at or R.now
    run.raise_step_error(sid, { message = rec.error or "failed", fatal = true })
  else
    local started = rec and rec.started_at or R.now
    local timeout_at = rec and rec.wake_at or (timeout and started + timeout or 0)
    local child = rec and rec.output and decode(rec.output)
    child = type(child) == "table" and child.run_id or nil
    local out, ended, failure = yield(OP.INVOKE, seq, sid, opts.skill, data, timeout_at, started, child)
    R.now = ended or R.now
    if failure then run.raise_step_error(sid, { message = failure, fatal = true }) end
    outcome = out and decode(out)
  end
  return invoke_result(sid, outcome, false)
end)

run.add_step("send_event", function(id, events)
  local R, T = need_run("step.send_event", id)
  if type(events) ~= "table" then user_error("step.send_event(id, event or list): expected a table") end
  -- One event, or a list of them: a table with keys but no [1] is one
  -- event (so { event = "x" } is an event with a misnamed key, not an
  -- empty list).
  local list = (events[1] == nil and next(events) ~= nil) and { events } or events
  for i, ev in ipairs(list) do
    local bad = type(ev) == "table" and api.check_event_keys("step.send_event", i, ev)
    if bad then user_fatal(bad) end
    if type(ev) ~= "table" or type(ev.name) ~= "string" or ev.name == "" then
      user_error(("step.send_event: event %d needs a 'name'"):format(i))
    end
  end
  if #list == 0 then user_error("step.send_event: no events to send") end
  local sid, seq, rec = next_step(R, T, id, "send")
  if done_rec(R, rec) then return decode(rec.output) end
  if rec and rec.status == "failed" then
    R.now = rec.ended_at or R.now
    run.raise_step_error(sid, { message = rec.error or "failed", fatal = true })
  end
  local js, err = encode(core.json.array(list), R.cfg.output_limit)
  if not js then user_error("step.send_event: " .. err) end
  -- A refused event (over limits.event) fails the step: nil, the end time, why.
  local ids, ended, failure = yield(OP.SEND, seq, sid, js, rec and rec.started_at or core.now())
  R.now = ended or R.now
  if failure then run.raise_step_error(sid, { message = failure, fatal = true }) end
  return decode(ids)
end)

-- A child of step.parallel: one step body at its own seq, with retries.
local function child_body(R, T, seq, sid, rec, fn, opts)
  local ok, res = real_xpcall(run.run_body, run.handler, R, T, seq, sid, rec, fn, opts)
  if ok then return true, encode(res == nil and null or res, 0) end
  local e = run.unwrap(res)
  return false, encode({ message = e.message, step = e.step or sid }, 0)
end

run.add_step("parallel", function(id, fns, opts)
  local R, T = need_run("step.parallel", id)
  if type(fns) ~= "table" or #fns == 0 then
    user_error("step.parallel(id, {fn, fn, ...}): expected a non-empty list of functions")
  end
  for i, fn in ipairs(fns) do
    if type(fn) ~= "function" then user_error(("step.parallel: item %d is not a function"):format(i)) end
  end
  run.check_step_opts("step.parallel", opts)
  local sid, seq, rec = next_step(R, T, id, "parallel")
  local n = #fns
  if rec and (rec.status == "completed" or rec.status == "failed") then
    -- Ended: its branches' records follow its own. Step past them (checked
    -- against the code's branches) before anything else, so the steps after
    -- the parallel meet their own records.
    local first_failed
    for i = 1, n do
      local crec = record_at(R, seq + i, sid .. "/" .. i, "run")
      if not crec then run.diverge(R, ("the code no longer matches this run's journal: step %d should be '%s' (run), a branch of the ended parallel '%s', but the journal ends before it"):format(seq + i, sid .. "/" .. i, sid)) end
      if crec.status == "failed" and not first_failed then first_failed = i end
    end
    R.seq = seq + n
    R.now = rec.ended_at or R.now
    if rec.status == "completed" then return decode(rec.output) end
    error(setmetatable({ message = ("step '%s' failed: %s"):format(sid, rec.error or "failed"),
      step = first_failed and (sid .. "/" .. first_failed) or sid, fatal = true }, run.step_error_mt), 0)
  end
  -- The children's seqs follow the parent's; take their records before
  -- anything can end the replay.
  local recs = {}
  for i = 1, n do recs[i] = R.journal[seq + i] end
  R.seq = seq + n
  local started = rec and rec.started_at or core.now()
  local cos = {}
  for i = 1, n do
    local csid = sid .. "/" .. i
    local crec = recs[i]
    if crec and (crec.id ~= csid or crec.kind ~= "run") then
      record_at(R, seq + i, csid, "run") -- raises the mismatch
    end
    if crec then R.replayed = seq + i end
    -- A branch may call step.invoke in its body (branch_invoke): it needs
    -- its record and the parallel's start (its children's ids derive from it).
    local CT = { R = R, branch = true, rec = crec, par_started = started }
    local co = create(function() return child_body(R, CT, seq + i, csid, crec, fns[i], opts) end)
    run.tasks[co] = CT
    cos[i] = co
  end
  -- The parallel step had not ended: whatever follows it is live.
  R.replaying = false
  R.journal = run.EMPTY
  local results = yield(OP.PARALLEL, seq, sid, started, unpack(cos))
  local values, failed = {}, nil
  for i = 1, n do
    local r = results[i]
    local v = decode(r.value)
    if r.ok then
      values[i] = v
    elseif not failed then
      failed = { i = i, message = type(v) == "table" and v.message or tostring(v) }
    end
  end
  local ended = core.now()
  if failed then
    yield(OP.FAIL, seq, sid, "parallel", 1, failed.message, nil, started, ended, started)
    R.now = ended
    error(setmetatable({ message = ("step '%s' failed: %s"):format(sid, failed.message), step = sid .. "/" .. failed.i,
      fatal = true }, run.step_error_mt), 0)
  end
  local out, err = encode(core.json.array(values), R.cfg.output_limit)
  if not out then
    -- Too large together (each branch's value was within the limit), or
    -- past the run's memory: the step fails saying which limit, as a
    -- step.run's result does.
    local msg = ("the results of its branches are not a JSON value: %s%s"):format(err,
      err:find("over the limit of", 1, true) and " (limits.step_output)" or "")
    yield(OP.FAIL, seq, sid, "parallel", 1, msg, nil, started, ended, started)
    R.now = ended
    error(setmetatable({ message = ("step '%s' failed: %s"):format(sid, msg), step = sid, fatal = true },
      run.step_error_mt), 0)
  end
  yield(OP.COMMIT, seq, sid, "parallel", out, 1, started, ended)
  R.now = ended
  return decode(out)
end)

return M
