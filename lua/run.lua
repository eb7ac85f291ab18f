-- run.lua: a run's body, its tasks, and step.run.
--
-- Each run is a coroutine whose body is main() below; step.parallel adds
-- child coroutines ("tasks") to a run. A step yields an op to the C core
-- (op codes from core.OP), which does the durable part and resumes the
-- task. The ops, their arguments in order and what each resumes with are
-- one table, engine/core/op.h (core.OP_ARGS here): step.run yields
-- COMMIT, RETRY, FAIL, BACKOFF, and its body's I/O HTTP (modules.lua).
-- The core checks every op against the table before it reads it.
--
-- flow.lua adds the other steps (sleep, wait_for_event, invoke,
-- send_event, parallel) and their ops.
--
-- Replay: the journal (the steps recorded so far, by seq) is given at start.
-- While the code reaches steps the journal holds, their recorded results
-- are returned without running the bodies; the first step past the end of
-- the journal runs live. A step whose id or kind differs from the journal's
-- at the same position means the code changed under the run: it fails;
-- so does a run that ends before reaching every record (unreached_records).
--
-- State: R is the run's (run_id, journal, seq, ids, now, cfg...); T is a
-- task's (in_step, attempt, step_seq while a step body runs). The main
-- task's T is R itself, so a run without parallel steps costs one table.

local core = ...
local api = require("api") -- step kinds and their options
local M = {}

local OP = core.OP
local yield, running, create = coroutine.yield, coroutine.running, coroutine.create
local real_xpcall, traceback = xpcall, debug.traceback
local type, tostring, error, setmetatable, getmetatable = type, tostring, error, setmetatable, getmetatable
local rawget = rawget
local getinfo = debug.getinfo
local floor, min = math.floor, math.min
local now_ms, encode, decode, killed = core.now, core.encode, core.decode, core.killed

local tasks = setmetatable({}, { __mode = "k" }) -- coroutine -> task state T (T.R is the run)
local EMPTY = setmetatable({}, { __newindex = function() error("internal: the empty journal is read-only") end })

M.tasks = tasks
M.EMPTY = EMPTY

-- The state of the task running now, or nil outside a run.
local function current_task()
  local co = running()
  return co and tasks[co]
end

-- The state of the run whose task is running, or nil outside a run.
local function current()
  local T = current_task()
  return T and T.R
end
M.current, M.current_task = current, current_task

-- Errors -----------------------------------------------------------------

-- The runtime functions that call skill code as a whole (a run's body, a
-- step's body): the search below stops at them.
local boundaries = setmetatable({}, { __mode = "k" })

-- "file:line: " of the skill code that called into the runtime: the
-- nearest Lua frame on the stack that is not the runtime's own (its files
-- are moonloop/*.lua; C frames are skipped too, as in pcall(http.get, u)).
-- "" when there is none below the step or run body that runs the code:
-- its caller's frame is gone (a tail call, `return http.get(u)`), and the
-- code further out only started the step. Counting levels instead breaks
-- on tail calls and on calls that come through the runtime's wrappers.
local function skill_position()
  for level = 2, 200 do
    local info = getinfo(level, "Slf")
    if not info or boundaries[info.func] then break end
    if info.what ~= "C" and (info.currentline or 0) > 0 and info.source:sub(1, 10) ~= "=moonloop/" then
      return ("%s:%d: "):format(info.short_src, info.currentline)
    end
  end
  return ""
end
M.skill_position = skill_position

-- Raise msg for the skill author: at the skill's line, never the runtime's.
local function user_error(msg)
  error(skill_position() .. msg, 0)
end
M.user_error = user_error

-- Error values (fatal(), a failed step's error) are tables, so that they
-- can carry fields (step, fatal, child...). They read like the message
-- they hold: tostring(e) is e.message, and `..` with a string, a number or
-- another error value joins their texts ("failed: " .. e).
local function error_text(e) return tostring(e.message) end

-- One operand of `..` on an error value: an error value's message, a
-- string or number as itself; any other value fails as plain Lua would.
local function concat_part(v)
  local t = type(v)
  if t == "string" or t == "number" then return v end
  local mt = t == "table" and getmetatable(v)
  if mt and rawget(mt, "__concat") == M.error_concat then return error_text(v) end
  user_error(("attempt to concatenate a %s value"):format(t))
end

-- The __concat of error values, whichever side the error value is on.
function M.error_concat(a, b)
  return concat_part(a) .. concat_part(b)
end

-- A metatable for error values: tostring and `..` give the message.
function M.error_mt()
  return { __tostring = error_text, __concat = M.error_concat }
end

local fatal_mt = M.error_mt()
M.fatal_mt = fatal_mt

-- Raise msg at the skill's line as fatal() does, failing the step without
-- retries: for mistakes retrying cannot fix (a permission the
-- configuration does not give).
local function user_fatal(msg)
  error(setmetatable({ message = skill_position() .. msg, fatal = true }, fatal_mt), 0)
end
M.user_fatal = user_fatal

-- fatal(msg): an error value that fails its step at once, without retries.
function M.fatal(msg)
  return setmetatable({ message = tostring(msg), fatal = true }, fatal_mt)
end

local step_error_mt = M.error_mt()
M.step_error_mt = step_error_mt

-- A call of os.getenv, which agents reach for first and the sandbox does
-- not have: the message says what to use (api.unknown).
local function absent_hint(m)
  if m:find("attempt to call field 'getenv' (a nil value)", 1, true) then
    return m .. ": " .. api.unknown("os", "getenv")
  end
  return m
end

-- A "nil value" error of a run that read a variable the configuration
-- grants but the engine's environment does not set (env.X read as nil,
-- modules.lua's make_env) says so: otherwise it reads as a typo. The
-- variable the message names, if it names one read so, else all of them.
local function unset_env_hint(m)
  local R = current()
  local names = R and R.unset_env
  if not names or not m:find("a nil value", 1, true) or m:find("granted to this skill but not set", 1, true) then
    return m
  end
  local list = {}
  local named = m:match("'([%w_]+)' %(a nil value%)")
  if named and names[named] then
    list[1] = named
  else
    for k in pairs(names) do
      if type(k) == "string" then list[#list + 1] = k end
    end
    table.sort(list)
  end
  if #list == 0 then return m end
  local vars = "env." .. table.concat(list, ", env.")
  if R.test then
    return ("%s (%s %s granted to this skill but not set: false in the test's env)"):format(m, vars,
      #list == 1 and "is" or "are")
  end
  return ("%s (%s %s granted to this skill but not set where the engine runs: set %s in the engine's "
    .. "environment and restart it, or test it with `if env.%s then`)"):format(m, vars,
    #list == 1 and "is" or "are", table.concat(list, ", "), list[1])
end

-- A message as JSON can hold it: a NUL byte (which JSON text here does
-- not carry, so the whole error was lost) shown as \0.
local function visible(m)
  if type(m) == "string" and m:find("\0", 1, true) then return (m:gsub("%z", "\\0")) end
  return m
end

-- The text of an error value that is no error value of ours: a table
-- without __tostring by value (its JSON text when it is JSON: error({code
-- = 1}) reads {"code":1}), never by its address, which differs between a
-- run and its replay; nil as "nil".
local function shown(e)
  local mt = type(e) == "table" and getmetatable(e)
  if type(e) == "table" and not (type(mt) == "table" and rawget(mt, "__tostring")) then
    local ok, js = pcall(encode, e, 4096)
    if ok and js then return js end
    return "a table that is not JSON (error() with a string shows its message)"
  end
  local m = tostring(e)
  if type(m) ~= "string" then m = "an error value that is not a string" end
  return m
end

-- Turn any error value into {message=, traceback=, fatal=, step=}.
local function normalize(e, tb)
  local mt = type(e) == "table" and getmetatable(e)
  if mt == fatal_mt or mt == step_error_mt then
    return { message = visible(e.message), fatal = e.fatal, step = e.step, traceback = tb or e.traceback }
  end
  if type(e) == "table" and type(e.message) == "string" then
    return { message = visible(e.message), traceback = tb }
  end
  local m = shown(e)
  return { message = visible(absent_hint(unset_env_hint(m))), traceback = tb }
end

-- Keep the skill's frames in a traceback and drop the runtime's.
local function clean_traceback(tb)
  local out = {}
  for line in tb:gmatch("[^\n]+") do
    if not line:find("moonloop/", 1, true) and not line:find("%[C%]: in function '[%w_]*xpcall'")
      and not line:find("%[C%]: in function 'pcall'") and line ~= "stack traceback:" then
      out[#out + 1] = line
    end
  end
  return "stack traceback:\n" .. table.concat(out, "\n")
end

-- The handler of the runtime's xpcalls: the error with the skill's
-- traceback, in a table marked as the handler's (wrapped_mt), so that
-- unwrap finds any value in it, nil too.
local wrapped_mt = {}
local function handler(e)
  if type(e) == "table" and rawget(e, "traceback") then return e end
  return setmetatable({ value = e, traceback = clean_traceback(traceback("", 2)) }, wrapped_mt)
end

-- The error an xpcall with handler caught, whatever its value.
local function caught(h)
  if getmetatable(h) == wrapped_mt then return h.value end
  return h
end

-- {message=, traceback=, ...} of what an xpcall with handler caught.
local function unwrap(h)
  return normalize(caught(h), type(h) == "table" and h.traceback or nil)
end
M.handler, M.unwrap, M.normalize = handler, unwrap, normalize

-- Whether the running code could yield an op to the engine: not from a
-- callback of a C function (string.gsub, table.sort), which Lua cannot
-- yield across. coroutine.isyieldable where this LuaJIT has it; else a
-- walk down to the step or run body for a C frame other than pcall and
-- xpcall (LuaJIT yields across those).
local real_pcall = pcall
local isyieldable = coroutine.isyieldable or function()
  for level = 2, 200 do
    local info = getinfo(level, "Sf")
    if not info or boundaries[info.func] then return true end
    if info.what == "C" and info.func ~= real_pcall and info.func ~= real_xpcall then return false end
  end
  return true
end

-- Refuse, before anything runs, a step or a request (name: "step.run",
-- "http.get") called where it could not yield: otherwise the body would run
-- and its end fail in the runtime's own code. where: the code to call it
-- from instead. Fatal: a retry would make the same call.
local function need_yieldable(name, where)
  if not isyieldable() then
    user_fatal(("%s cannot be called from inside a callback of a C function (string.gsub, table.sort, ...): "
      .. "call it from %s"):format(name, where))
  end
end
M.need_yieldable = need_yieldable

-- Steps ------------------------------------------------------------------

-- The run and task of a step call (name: "step.run"; id: the step id),
-- checked first of all: outside a run is an error, and so is a step inside
-- a step's body. That one is fatal: retrying the body would only make the
-- same mistake again, so the step fails at once, as with fatal().
local function need_run(name, id)
  local T = current_task()
  if not T then user_error(name .. " can only be called inside a run") end
  if T.in_step then
    error(setmetatable({
      message = ("%ssteps cannot be nested: %s('%s') was called inside the body of step '%s'")
        :format(skill_position(), name, tostring(id), T.in_step),
      fatal = true,
    }, fatal_mt), 0)
  end
  need_yieldable(name, "the run function's own code")
  -- The id left out: the body (or the seconds, the options) came first.
  if type(id) ~= "string" then
    user_error(("%s: the first argument is the step's id, a name such as \"fetch\", got %s%s")
      :format(name, id == nil and "nil" or ("a " .. type(id)), type(id) == "function"
        and (": write " .. name .. "(\"fetch\", function() ... end)") or ""))
  end
  return T.R, T
end
M.need_run = need_run

-- The code reached something the journal does not hold: the run fails with
-- msg, and no pcall in the skill can catch it (the sandbox's pcall raises
-- R.diverged again): going on would mix two histories.
local function diverge(R, msg)
  local e = setmetatable({ message = skill_position() .. msg, fatal = true }, fatal_mt)
  R.diverged = e
  error(e, 0)
end
M.diverge = diverge

local function mismatch(R, seq, rec, sid, kind)
  diverge(R, ("the code no longer matches this run's journal: step %d is '%s' (%s) in the journal, but the code reached '%s' (%s)")
    :format(seq, rec.id, rec.kind, sid, kind))
end

-- The journal's record at seq, checked against the step the code reached.
-- A record reached is counted (R.replayed: the steps a replay took as
-- recorded) and where the code reached it kept (R.replayed_at), for
-- unreached_records when the run ends.
local function record_at(R, seq, sid, kind)
  local rec = R.journal[seq]
  if rec then
    if rec.id ~= sid or rec.kind ~= kind then mismatch(R, seq, rec, sid, kind) end
    R.replayed, R.replayed_at = seq, skill_position()
  else
    R.replaying = false
    R.journal = EMPTY -- past its end: the journal is not needed any more
  end
  return rec
end
M.record_at = record_at

-- Number the next step and check it against the journal. Returns the
-- numbered id, its seq, and the journal's record for it (during replay).
local function next_step(R, T, id, kind)
  -- (need_run refused an id that is no string.)
  if id == "" then user_error('step id must be a non-empty string, got ""') end
  if #id > 200 or id:find("#", 1, true) or id:find("\0", 1, true) then
    user_error(("bad step id '%s': at most 200 characters, no '#' and no NUL byte")
      :format((id:sub(1, 40):gsub("%z", "\\0"))))
  end
  local n = (R.ids[id] or 0) + 1
  R.ids[id] = n
  local sid = n == 1 and id or (id .. "#" .. n)
  local seq = R.seq + 1
  R.seq = seq
  local rec = record_at(R, seq, sid, kind)
  -- The REPL's step_through (run_pause.lua): pause before a live step.
  if not rec and R.pause then rec = R.pause(R, seq, sid, kind) end
  return sid, seq, rec
end
M.next_step = next_step

local function backoff_ms(R, opts, n)
  local base = (opts and opts.backoff_ms) or R.cfg.backoff_ms
  local d = min(base * 2 ^ (n - 1), R.cfg.backoff_max_ms)
  -- "Equal jitter": half fixed, half random, so retries of many runs spread out.
  return floor(d / 2 + core.random() * d / 2)
end
M.backoff_ms = backoff_ms

local function raise_step_error(sid, e)
  error(setmetatable({
    message = ("step '%s' failed: %s"):format(sid, e.message), step = sid,
    cause = e.message, traceback = e.traceback, fatal = e.fatal,
  }, step_error_mt), 0)
end
M.raise_step_error = raise_step_error

-- A duration (seconds, or a string such as "5m") in milliseconds. A bad
-- one raises "<what>: ...", at the skill's line, or with no position when
-- level is 0 (the test harness's own messages).
local function to_ms(v, what, level)
  if type(v) == "number" then return v * 1000 end
  local msg
  if type(v) == "string" then
    local ms, err = core.duration(v)
    if ms then return ms end
    msg = what .. ": " .. err
  else
    msg = what .. ": expected a duration such as 30 or \"5m\", got " .. type(v)
  end
  if level == 0 then error(msg, 0) end
  user_error(msg)
end
M.to_ms = to_ms

-- A step body's result as the JSON text a step records, or nil and why
-- not ("result is not a JSON value: ..."), the output limit (bytes,
-- limits.step_output) named when it was passed. Shared with the REPL's
-- ctx (repl.lua), so that a result refused in a run is refused there too.
function M.encode_result(res, limit)
  local out, err = encode(res, limit)
  if out then return out end
  return nil, ("result is not a JSON value: %s%s"):format(err,
    err:find("over the limit of", 1, true) and " (limits.step_output)" or "")
end

-- Run a step body at (seq, sid) with retries, given its journal record.
-- Shared by step.run and the bodies of step.parallel.
local function run_body(R, T, seq, sid, rec, fn, opts)
  local n, cut = 0, 0 -- attempts so far, and how many of them were interrupted
  if rec then
    if rec.status == "completed" then
      R.now = rec.ended_at or R.now
      return decode(rec.output)
    elseif rec.status == "failed" then
      raise_step_error(sid, { message = rec.error or "failed", fatal = true })
    end
    -- In flight when the process died: go on from its recorded attempts,
    -- waiting out a backoff that had not finished. An attempt cut in its
    -- body is recorded as interrupted, and the body runs again as the next
    -- attempt; interrupted attempts do not count against the retries.
    n = rec.attempts or 0
    cut = rec.interrupted or 0
    if rec.retry_at then
      yield(OP.BACKOFF, seq, rec.retry_at)
    elseif n > 0 then
      core.step_interrupted(seq, sid, n, rec.attempt_started_at or rec.started_at)
      cut = cut + 1
    end
  end
  local retries = (opts and opts.retries) or R.cfg.retries
  local timeout = opts and opts.timeout
  if timeout ~= nil then timeout = to_ms(timeout, "step.run: opts.timeout") end
  local started = rec and rec.started_at or now_ms()
  while true do
    n = n + 1
    T.in_step, T.attempt, T.step_seq = sid, n, seq
    local t0 = now_ms()
    core.step_begin(seq, sid, n, timeout or 0, started)
    local ok, res = real_xpcall(fn, handler)
    core.step_end()
    T.in_step = nil
    local e
    if ok then
      local out, err = M.encode_result(res, R.cfg.output_limit)
      if out then
        local ended = now_ms()
        yield(OP.COMMIT, seq, sid, "run", out, n, started, ended)
        R.now = ended
        return decode(out)
      end
      e = { message = err, fatal = true }
    elseif killed() then
      e = normalize(caught(res), type(res) == "table" and res.traceback or nil)
      e.message = core.kill_reason and core.kill_reason() or e.message
      e.fatal = true
    else
      e = unwrap(res)
    end
    if e.fatal or n - cut > retries then
      local ended = now_ms()
      -- The message as recorded is the one a replay raises: the same words.
      if n - cut > retries and not e.fatal and retries > 0 then
        e.message = ("%s (after %d attempts)"):format(e.message, n - cut)
      end
      yield(OP.FAIL, seq, sid, "run", n, e.message, e.traceback, t0, ended, started)
      R.now = ended
      raise_step_error(sid, e)
    end
    yield(OP.RETRY, seq, sid, n, e.message, e.traceback, t0, backoff_ms(R, opts, n), started)
  end
end
M.run_body = run_body
boundaries[run_body] = true

-- Check the opts of step.run or step.parallel ({retries=, timeout=})
-- before the step is numbered, so a bad one never reaches run_body. The
-- option keys are api.lua's.
local function check_step_opts(what, opts)
  if opts == nil then return end
  if type(opts) ~= "table" then user_error(what .. ": opts must be a table {retries=, timeout=}") end
  local bad = api.check_keys(what, api.step[what:match("[%w_]+$")], opts)
  if bad then user_fatal(bad) end
  local r = opts.retries
  if r ~= nil and (type(r) ~= "number" or r ~= floor(r) or r < 0 or r > 100) then
    user_error(what .. ": opts.retries must be a whole number from 0 to 100, got " .. (type(r) == "number" and tostring(r) or type(r)))
  end
  if opts.timeout ~= nil then to_ms(opts.timeout, what .. ": opts.timeout") end
end
M.check_step_opts = check_step_opts

local function step_run(id, fn, opts)
  local R, T = need_run("step.run", id)
  if type(fn) ~= "function" then
    user_error(("step.run('%s', fn): fn must be a function, got %s"):format(tostring(id), type(fn)))
  end
  check_step_opts("step.run", opts)
  local sid, seq, rec = next_step(R, T, id, "run")
  return run_body(R, T, seq, sid, rec, fn, opts)
end

M.step = { run = step_run }

-- Install further step functions (flow.lua).
function M.add_step(name, fn) M.step[name] = fn end

-- The run body -----------------------------------------------------------

-- A run's trigger, input and event are decoded when first read: a parked
-- run that never looks at them keeps only their JSON text.
function M.trigger(R)
  local t = R.trigger
  if type(t) == "string" then
    t = decode(t)
    R.trigger = t
  end
  return t
end

function M.input(R)
  local v = R.input
  if type(v) == "string" then
    v = decode(v)
    if v == core.json.null then v = nil end
    R.input = v or false
  end
  return v or nil
end

-- The ctx.event of a run: the triggering event, or for other triggers a
-- stand-in whose data is the run's input, so `event.data.x` works alike.
function M.event(R)
  if R.event then return R.event end
  local trigger = M.trigger(R)
  local ev = trigger.event
  if type(ev) ~= "table" then
    ev = { name = "moonloop." .. tostring(trigger.kind or "invoke"), data = M.input(R), id = R.run_id,
           ts = R.started_at / 1000 }
  end
  R.event = ev
  return ev
end

-- The ctx.events of a run: its batch's events (a skill with `batch`: the
-- store holds them, closed before the run started, so a replay reads the
-- same), else a list of its one event.
function M.events(R)
  if R.events then return R.events end
  local js = core.batch_events and core.batch_events(R.run_id)
  local list = js and decode(js)
  if type(list) ~= "table" or #list == 0 then list = { M.event(R) } end
  R.events = list
  return list
end

-- ctx is one small table per run; its fields are read through from the
-- run's state, so a parked run costs little memory. The state itself is
-- kept outside ctx (skill code cannot reach it), and ctx.step and ctx.log
-- are read-only views: no skill can replace them for the others.
local ctx_mt = { __metatable = false }
local ctx_runs = setmetatable({}, { __mode = "k" }) -- ctx -> R

-- Read-only views. A view is an empty table whose protected metatable
-- reads through to a backing table: skill code reads the backing's fields
-- through it, and nothing it does writes them: `view.k = v` raises
-- (__newindex), and since the view has no raw storage, the raw writers
-- (rawset, table.insert/remove/sort) are refused by the sandbox for any
-- table with a protected runtime metatable; setmetatable refuses it too.
-- pairs and next walk the backing (the sandbox's, through `views`), and
-- never hand the backing itself to skill code. writable, when given, is
-- asked on each write: the module tables a skill sees may be added to by
-- its own top level while it loads (function string.trim ... end), and
-- are read-only from then on.
local views = setmetatable({}, { __mode = "k" }) -- view -> backing
local view_names = setmetatable({}, { __mode = "k" }) -- view -> its name, for errors
M.views, M.view_names = views, view_names

local function read_only(t, what, writable)
  local v = setmetatable({}, {
    __index = t,
    __newindex = function(_, k, val)
      if writable and writable() then
        t[k] = val
        return
      end
      user_error(("%s is read-only (tried to set '%s')"):format(what, tostring(k)))
    end,
    __metatable = false,
  })
  views[v] = t
  view_names[v] = what
  return v
end
M.read_only = read_only
local step_view, log_view
local function in_step_of()
  local T = current_task()
  return T and T.in_step and T
end
local ctx_fields = {
  run_id = function(R) return R.run_id end,
  skill = function(R) return R.cfg.skill end,
  version = function(R) return R.cfg.version end,
  event = function(R) return M.event(R) end,
  input = function(R) return M.input(R) end,
  trigger = function(R) return M.trigger(R) end,
  events = function(R) return M.events(R) end,
  step = function()
    if not step_view then
      -- The steps as the view's backing (pairs and next walk it; every
      -- step is installed before the first run asks); ctx.step.wait is
      -- an error that names the steps, not a nil to call.
      local steps = {}
      for k, f in pairs(M.step) do steps[k] = f end
      step_view = read_only(setmetatable(steps, { __index = function(_, k)
        user_fatal(api.unknown("step", k))
      end }), "ctx.step")
    end
    return step_view
  end,
  log = function()
    log_view = log_view or read_only(M.shared_log, "ctx.log")
    return log_view
  end,
  attempt = function()
    local T = in_step_of()
    return T and T.attempt or nil
  end,
  step_key = function(R)
    local T = in_step_of()
    return T and (R.run_id .. ":" .. T.in_step) or nil
  end,
}
-- A field ctx does not have is an error that names the fields (ctx.data
-- is ctx.input), not a nil that fails further on.
ctx_mt.__index = function(ctx, k)
  local f = ctx_fields[k]
  if f then return f(ctx_runs[ctx]) end
  user_fatal(api.unknown("ctx", k))
end

-- A run that ended (returned, or failed in its own code) while its journal
-- still holds records it never reached has left the journal: its code took
-- a shorter path than the run did (it read the clock outside a step, or a
-- variable a step's body set, which a replay does not run). Like any divergence, the run fails with why (and a
-- replay reports it) instead of ending as if all was well. Returns the
-- message, or nil when the journal was used up. fn: the run function,
-- whose line is named when no step was reached; how: "returned", "failed".
local function unreached_records(R, fn, how)
  local rec = R.journal[R.seq + 1]
  if not rec or killed() then return nil end
  -- The line: the last step reached, else where the run function starts.
  local where, after = R.replayed_at or "", " without reaching any step of it"
  if R.replayed then
    local last = R.journal[R.replayed]
    after = (" after step %d '%s' (the last step it reached, at this line)"):format(R.replayed, tostring(last and last.id))
  else
    local info = getinfo(fn, "S")
    where = info and info.what == "Lua" and ("%s:%d: "):format(info.short_src, info.linedefined) or ""
  end
  local e = setmetatable({
    message = ("%sthe code no longer matches this run's journal: the run %s%s, but the journal goes on to step %d "
      .. "'%s' (%s). A step's body does not run again on replay: a variable it set keeps its old value, so "
      .. "return what the code after it needs from the body (local v = ctx.step.run(...))")
      :format(where, how, after, R.seq + 1, tostring(rec.id), tostring(rec.kind)),
    fatal = true,
  }, fatal_mt)
  R.diverged = e
  return e.message
end

local function main(R, def, err_arg)
  -- A run of a skill with flow control is made before it is granted its
  -- slots (started_at 0) and first resumed once it has them: its clock
  -- starts now, or its first sleep or wait timeout would count from 1970
  -- and be over at once. (A run that ever started has its started_at.)
  if not R.now or R.now == 0 then R.now = now_ms() end
  local ctx = setmetatable({}, ctx_mt)
  ctx_runs[ctx] = R
  local fn = R.entry == "on_failure" and def.on_failure or def.run
  local ok, res = real_xpcall(fn, handler, ctx, err_arg)
  local left = R.journal ~= EMPTY and not R.diverged and unreached_records(R, fn, ok and "returned" or "failed")
  if left then return false, encode({ message = left }, 0) end
  if not ok then
    local e = unwrap(res)
    -- A budget stopped the run: say which (an allocation refused by the
    -- allocator raises only Lua's "not enough memory").
    if killed() and not e.step then e.message = core.kill_reason() or e.message end
    return false, encode({ message = e.message, step = e.step, traceback = e.traceback }, 0)
  end
  local out, err = encode(res, R.cfg.output_limit)
  if not out then
    return false, encode({ message = "the run's result is not a JSON value: " .. err }, 0)
  end
  return true, out
end
boundaries[main] = true

-- Create the coroutine of a run. info holds run_id, entry, started_at, cfg
-- (a table shared by the runs of one skill version: skill, version,
-- retries, backoff_ms, backoff_max_ms, output_limit), and, as JSON text,
-- trigger and input. journal is the replay journal (or nil).
function M.new(info, def, journal)
  local R = info
  R.R = R
  R.trigger = info.trigger or "{}"
  R.journal = journal or EMPTY
  R.replaying = journal ~= nil and #journal > 0
  R.seq, R.ids, R.now = 0, {}, info.started_at
  local err_arg = R.entry == "on_failure" and M.trigger(R).error or nil
  -- on_failure's err ({message=, step=, traceback=}) reads as its message,
  -- like the error values a step raises.
  if type(err_arg) == "table" then setmetatable(err_arg, step_error_mt) end
  local co = create(function() return main(R, def, err_arg) end)
  tasks[co] = R
  return co
end

return M
