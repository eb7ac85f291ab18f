-- repl.lua: the Lua half of `moonloop repl` (engine/cli/repl.c drives it).
--
-- Each chunk typed at the prompt runs in a coroutine of its own (M.eval)
-- that the engine resumes. What needs the engine yields an op to
-- engine/cli/repl.c and gets the answer back when it is ready, while the loop
-- goes on running runs and transfers:
--
--   SKILL  target                -> skill info table, or nil, message
--   RUN    version data pause    -> status, output, error, run_id (JSON texts)
--   RESUME run_id pause          -> the same
--   WAIT   run_id                -> the same, for a run another engine executes
--   HTTP   request               -> as for runs (modules.lua), so top-level
--                                   http calls work at the prompt
--
-- Reads and writes that never wait (send, invoke, runs, trace) are plain C
-- functions of core. C also calls M.check (is a chunk complete?),
-- M.complete (tab completion) and M.value_json (step_through's values).
--
-- The REPL's globals (M.env) are the whole standard library of LuaJIT (it
-- is the developer's own process, not a sandbox), the modules a skill sees
-- (json, http, log, env, time, fatal, ...) and the functions below. Chunks
-- are compiled with the JIT off, so that Ctrl-C (the count hook) can stop a
-- loop typed at the prompt.

local core = ...
local modules = require("modules")
local M = {}

local ROP = core.repl_ops
local yield = coroutine.yield
local null = core.json.null
local encode, decode = core.encode, core.decode
-- Everything the REPL prints goes through term: controls in a run's output
-- or a skill's error are shown escaped (\x1b, \u202e), never obeyed.
local term = core.repl_term
local type, tostring, pairs, next, select, error, rawget = type, tostring, pairs, next, select, error, rawget
local raw_getmetatable = debug.getmetatable
local concat, sort = table.concat, table.sort
local floor, huge = math.floor, math.huge

local run_mod = require("run")
local api = require("api")
local user_error = run_mod.user_error -- errors at the caller's line, never the runtime's

local env -- the REPL's globals, made by M.init
local limits = { step_output = 1048576 } -- the configuration's (M.init)

-- The options of the REPL's functions that take some ({wait=}, {step=}):
-- checked as the engine checks a step's, an unknown key named.
local function opts_entry(list) return { opts = list, opts_set = api.set_of(list) } end
local INVOKE_OPTS, RESUME_OPTS = opts_entry({ "wait" }), opts_entry({ "step" })
local RUNS_FILTER = opts_entry({ "limit", "since", "skill", "status", "trigger" })
local function check_opts(name, entry, opts, shape)
  if opts == nil then return end
  if type(opts) ~= "table" then user_error(("%s: opts must be a table such as %s"):format(name, shape)) end
  local bad = api.check_keys(name, entry, opts)
  if bad then user_error(bad) end
end

-- Pretty printing -----------------------------------------------------------

local MAX_DEPTH, MAX_ITEMS, WIDTH = 6, 200, 78

local KEYWORDS = {}
for w in ("and break do else elseif end false for function goto if in local nil not or repeat return then true until while"):gmatch("%a+") do
  KEYWORDS[w] = true
end

local ESC = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\" }
local function quote(s)
  return '"' .. string.gsub(s, '[%c"\\]', function(c) return ESC[c] or ("\\%03d"):format(c:byte()) end) .. '"'
end

local function number(v)
  if v ~= v then return "nan" end
  if v == huge then return "inf" elseif v == -huge then return "-inf" end
  if v == floor(v) and v > -2 ^ 53 and v < 2 ^ 53 then return ("%d"):format(v) end
  for p = 14, 17 do
    local s = ("%." .. p .. "g"):format(v)
    if tonumber(s) == v then return s end
  end
  return tostring(v)
end

local function scalar(v)
  local t = type(v)
  if t == "string" then return quote(v) end
  if t == "number" then return number(v) end
  if v == null then return "null" end
  return tostring(v)
end

local function key_text(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k] then return k end
  return "[" .. scalar(k) .. "]"
end

local TYPE_ORDER = { number = 1, string = 2, boolean = 3 }
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then
    local oa, ob = TYPE_ORDER[ta] or 4, TYPE_ORDER[tb] or 4
    if oa ~= ob then return oa < ob end
    return ta < tb
  end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

-- The length of t's array part (1..n all present) and its other keys, sorted.
local function keys_of(t)
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  local keys = {}
  for k in next, t do
    if not (type(k) == "number" and k >= 1 and k <= n and k == floor(k)) then keys[#keys + 1] = k end
  end
  sort(keys, key_less)
  return n, keys
end

-- v as text: tables on one line when they fit, else one item per line.
-- path holds the tables being printed (a table met again on it is a cycle).
local function render(v, depth, path, indent)
  if type(v) ~= "table" then return scalar(v) end
  if path[v] then return "<cycle>" end
  local mt = raw_getmetatable(v)
  if type(mt) == "table" and rawget(mt, "__tostring") then return tostring(v) end
  if next(v) == nil then return "{}" end
  if depth > MAX_DEPTH then return "{...}" end
  local n, keys = keys_of(v)
  path[v] = true
  local inner = indent .. "  "
  local items = {}
  for i = 1, n do
    if #items >= MAX_ITEMS then break end
    items[#items + 1] = render(rawget(v, i), depth + 1, path, inner)
  end
  for _, k in ipairs(keys) do
    if #items >= MAX_ITEMS then break end
    items[#items + 1] = key_text(k) .. " = " .. render(rawget(v, k), depth + 1, path, inner)
  end
  path[v] = nil
  local more = n + #keys - #items
  if more > 0 then items[#items + 1] = ("... (%d more)"):format(more) end
  local one = "{ " .. concat(items, ", ") .. " }"
  if #one + #indent <= WIDTH and not one:find("\n", 1, true) then return one end
  return "{\n" .. inner .. concat(items, ",\n" .. inner) .. ",\n" .. indent .. "}"
end

-- The text the REPL prints for a value.
function M.pretty(v) return render(v, 1, {}, "") end

local function show(v)
  local mt = raw_getmetatable(v)
  if type(mt) == "table" and rawget(mt, "__repl_show") then return mt.__repl_show(v) end
  io.stdout:write(term(M.pretty(v)), "\n")
end

-- Errors ---------------------------------------------------------------------

-- The frames of the REPL's code and of skill files; the runtime's and C's dropped.
local function short_traceback(tb)
  local out = {}
  for line in tostring(tb or ""):gmatch("[^\n]+") do
    local l = line:gsub("^%s+", "")
    if l ~= "stack traceback:" and not l:find("moonloop/", 1, true) and not l:find("^%[C%]")
      and not l:find("^%[builtin") and not l:find("^%(tail call%)") and not l:find("^%.%.%.") then
      out[#out + 1] = "  " .. l
      if #out >= 6 then break end
    end
  end
  return out
end

-- A failed run's error: tostring and `..` give its message, as for step errors.
local run_error_mt = require("run").error_mt()

local function handler(e)
  if type(e) == "table" and raw_getmetatable(e) == run_error_mt then
    return { value = e, traceback = e.traceback }
  end
  return { value = e, traceback = debug.traceback("", 2) }
end

local function message_of(v)
  if type(v) == "table" and type(v.message) == "string" then return v.message end
  if type(v) == "string" then return v end
  local mt = raw_getmetatable(v)
  if type(mt) == "table" and rawget(mt, "__tostring") then return tostring(v) end
  return "(error value) " .. M.pretty(v)
end

local function print_error(e)
  -- The handler itself failed (no stack left after a stack overflow):
  -- xpcall then gives the error as it was raised.
  if type(e) ~= "table" or (e.value == nil and e.traceback == nil) then e = { value = e } end
  io.stderr:write(term(message_of(e.value)), "\n")
  local tb = short_traceback(e.traceback)
  -- A traceback that only names the chunk typed at the prompt says nothing new.
  if #tb == 1 and tb[1]:find("in main chunk$") then tb = {} end
  if #tb > 0 then io.stderr:write("stack traceback:\n", term(concat(tb, "\n")), "\n") end
end

-- Compiling and evaluating -----------------------------------------------------

-- "=expr" is "return expr", as in the standalone interpreter.
local function source_of(src)
  local rest = src:match("^%s*=(.*)$")
  if rest then return "return " .. rest end
  return src
end

-- Compile a chunk: as an expression list first (its values are printed),
-- else as statements. Returns the function and whether it is an
-- expression, or nil and the statements' error. An expression list is
-- compiled as the arguments of a call, not as `return explist`: a call
-- there would be a tail call, and `error("x")` would lose its "stdin:1:".
local function compile(src)
  src = source_of(src)
  local expr = true
  local fn = loadstring("return " .. src, "=stdin")
  if fn then
    fn = loadstring("return (function(...) return select('#', ...), ... end)(" .. src .. "\n)", "=stdin")
  end
  if not fn then
    local err
    expr = false
    fn, err = loadstring(src, "=stdin")
    if not fn then return nil, err end
  end
  setfenv(fn, env)
  jit.off(fn, true) -- every function of the chunk runs in the interpreter, where the hook sees it
  return fn, expr
end

-- "complete" (or a syntax error: eval reports it) or "incomplete": the
-- chunk ends too early, and the prompt should read another line.
function M.check(src)
  if loadstring("return " .. source_of(src), "=stdin") then return "complete" end
  local fn, err = loadstring(source_of(src), "=stdin")
  if fn then return "complete" end
  if err:sub(-7) == "'<eof>'" then return "incomplete" end
  return "complete"
end

local function pack(...) return { n = select("#", ...), ... } end

-- Evaluate one chunk and print its values (stdout) or its error (stderr).
-- Runs in the REPL's coroutine. Returns true, or false after an error.
function M.eval(src)
  if M.reset_scratch then M.reset_scratch() end
  local fn, expr = compile(src)
  if not fn then
    io.stderr:write(term(tostring(expr)), "\n")
    return false
  end
  local res = pack(xpcall(fn, handler))
  if not res[1] then
    print_error(res[2])
    return false
  end
  -- An expression's values (after their count), or what statements return.
  local first, last = 2, res.n
  if expr then first, last = 3, 2 + res[2] end
  for i = first, last do show(res[i]) end
  return true
end

-- The JSON text of a Lua expression evaluated in the REPL's globals (a value
-- typed to skip a step), or nil and a message.
function M.value_json(src)
  local fn, err = loadstring("return " .. src, "=value")
  if not fn then return nil, err end
  setfenv(fn, env)
  local ok, v = pcall(fn)
  if not ok then return nil, message_of(v) end
  local js, e = encode(v == nil and null or v, 0)
  if not js then return nil, "not a JSON value: " .. e end
  return js
end

-- Completion -------------------------------------------------------------------

local function index(v, k)
  local tv = type(v)
  if tv == "string" then return string[k] end
  if tv ~= "table" then return nil end
  local ok, r = pcall(function() return v[k] end)
  if ok then return r end
  return nil
end

-- The identifier keys of t and of the tables its metatables' __index lead to.
local function names_of(t, into, methods_only)
  local seen = 0
  while type(t) == "table" and seen < 8 do
    for k, val in next, t do
      if type(k) == "string" and k:match("^[%a_][%w_]*$") and (not methods_only or type(val) == "function") then
        into[k] = true
      end
    end
    local mt = raw_getmetatable(t)
    t = type(mt) == "table" and rawget(mt, "__index") or nil
    seen = seen + 1
  end
end

-- Candidates completing `word` ("js", "json.en", "s:up"), as whole words.
function M.complete(word)
  local names, prefix, part = {}, "", nil
  local base, sep, tail = word:match("^(.-)([%.:])([%w_]*)$")
  if base then
    if not base:match("^[%a_][%w_]*$") and not base:match("^[%a_][%w_.]*[%w_]$") then return {} end
    local v = env
    for name in base:gmatch("[^.]+") do
      v = index(v, name)
      if v == nil then return {} end
    end
    if type(v) == "string" then
      if sep == ":" then names_of(string, names, true) end
    else
      names_of(v, names, sep == ":")
    end
    prefix, part = base .. sep, tail
  else
    part = word:match("^[%a_][%w_]*$") or (word == "" and "" or nil)
    if not part then return {} end
    names_of(env, names)
    for w in pairs(KEYWORDS) do names[w] = true end
  end
  local out = {}
  for k in pairs(names) do
    if k:sub(1, #part) == part then out[#out + 1] = prefix .. k end
  end
  sort(out)
  return out
end

-- The REPL's functions ---------------------------------------------------------

-- Yield an op to engine/cli/repl.c: only the REPL's own coroutine can.
local function engine_op(name, ...)
  if not core.can_yield() then
    user_error(name .. " can only be called at the REPL's top level, not inside a coroutine")
  end
  return yield(...)
end

local skill_mt = {
  __tostring = function(s)
    return ("<skill %s %s%s>"):format(s.id, s.version:sub(1, 12), s.file and (" " .. s.file) or "")
  end,
}

-- The skill a REPL function is given (a handle, a path, an id), or nil
-- and a message.
local function need_skill(target, fname)
  if type(target) == "table" and raw_getmetatable(target) == skill_mt then return target end
  if type(target) ~= "string" or target == "" then
    return nil, ("%s: expected a skill: a file path, a registered skill id, or the value of skill(...); got %s")
      :format(fname, type(target))
  end
  local info, err = engine_op(fname, ROP.SKILL, target)
  if not info then return nil, err end
  return setmetatable(info, skill_mt)
end

local function data_json(data, fname)
  if data == nil then return "null" end
  local js, err = encode(data, 0)
  if not js then user_error(("%s: data is not a JSON value: %s"):format(fname, err)) end
  return js
end

-- What run() and its kin return: the output and the run id, or raise the
-- run's error. A run stopped in step_through (q) returns nil and its id.
local function finish(fname, status, output, err, run_id)
  if status == nil then user_error(("%s: %s"):format(fname, tostring(output))) end -- the op failed
  if status == "completed" then
    local v = decode(output or "null")
    if v == null then v = nil end
    return v, run_id
  end
  if status == "abandoned" then return nil, run_id end
  local ok, e = pcall(decode, err or "null")
  if not ok or type(e) ~= "table" then e = {} end
  error(setmetatable({
    message = ("run %s %s: %s"):format(run_id, status, tostring(e.message or "no error recorded")),
    traceback = e.traceback, run_id = run_id,
  }, run_error_mt), 0)
end

local function check_run_id(id, fname)
  if type(id) ~= "string" or not id:match("^[0-9A-Z]+$") then
    user_error(("%s: expected a run id (such as \"01J...\"), got %s"):format(fname,
      type(id) == "string" and ("'" .. id:sub(1, 40) .. "'") or type(id)))
  end
end

local runs_mt = {
  __repl_show = function(list) core.repl_show("runs", encode(core.json.array(list), 0)) end,
}
local trace_mt = {
  __repl_show = function(rec) core.repl_show("trace", encode(rec, 0)) end,
}

local HELP = [[
moonloop repl: Lua with the engine inside. Beside Lua's libraries and the
modules skills see (json, http, log, env, time, fatal, ...):

  skill(path or id)              load a skill file (checked) or a registered skill
  run(skill, data)               run it here to its end, printing each step;
                                 returns its output and its run id
  step_through(skill, data)      the same, pausing before each step:
                                   Enter runs it, s VALUE skips it with VALUE
                                   (a Lua expression), q stops (resumable)
  resume(run_id [, {step=true}]) finish an unfinished run here
  send(name, data [, id])        send an event; returns its id
  invoke(id, data [, {wait=true}])  queue a run of a registered skill (as the CLI)
  runs{skill=, status=, since=, limit=}   recent runs, newest first
  trace(run_id)                  one run as a tree
  ctx                            a stand-in for a run's ctx, to try step code
                                 here: its steps run at once, nothing is journaled

Tab completes names, Ctrl-C stops what runs, Ctrl-D leaves.]]

local function make_functions()
  local f = {}

  function f.skill(target)
    local s, err = need_skill(target, "skill")
    if not s then user_error(err) end
    return s
  end

  function f.run(target, data)
    local s, err = need_skill(target, "run")
    if not s then user_error(err) end
    local out, id = finish("run", engine_op("run", ROP.RUN, s.version, data_json(data, "run"), false))
    return out, id
  end

  function f.step_through(target, data)
    local s, err = need_skill(target, "step_through")
    if not s then user_error(err) end
    local js = data_json(data, "step_through")
    local out, id = finish("step_through", engine_op("step_through", ROP.RUN, s.version, js, true))
    return out, id
  end

  function f.resume(run_id, opts)
    check_run_id(run_id, "resume")
    check_opts("resume", RESUME_OPTS, opts, "{step = true}")
    local step = type(opts) == "table" and opts.step and true or false
    local out, id = finish("resume", engine_op("resume", ROP.RESUME, run_id, step))
    return out, id
  end

  function f.send(name, data, id)
    if type(name) ~= "string" or name == "" then user_error("send(name, data [, id]): name must be an event name") end
    if id ~= nil and type(id) ~= "string" then user_error("send: id (the idempotency key) must be a string") end
    local ev, err = core.repl_send(name, data_json(data, "send"), id)
    if not ev then user_error("send: " .. err) end
    return ev
  end

  function f.invoke(id, data, opts)
    if type(id) ~= "string" or id == "" then user_error("invoke(id, data [, {wait=true}]): id must be a registered skill id") end
    check_opts("invoke", INVOKE_OPTS, opts, "{wait = true}")
    local js = data_json(data, "invoke")
    local alive = core.repl_engine_alive()
    if opts and opts.wait and not alive then
      -- As `moonloop invoke --wait`: no engine holds the database, so run it here.
      local out, rid = f.run(id, data)
      return out, rid
    end
    local run_id, err = core.repl_enqueue(id, js)
    if not run_id then user_error("invoke: " .. err) end
    if opts and opts.wait then
      local out, rid = finish("invoke", engine_op("invoke", ROP.WAIT, run_id))
      return out, rid
    end
    if not alive then
      io.stderr:write(("queued; no engine is running: resume(\"%s\") runs it here\n"):format(run_id))
    end
    return run_id
  end

  function f.runs(filter)
    if filter == nil then filter = {} end
    if type(filter) == "string" then filter = { skill = filter } end
    if type(filter) ~= "table" then user_error("runs{skill=, status=, since=, limit=}: expected a table") end
    check_opts("runs", RUNS_FILTER, filter, "{skill = \"hello\"}")
    local js, err = core.repl_runs(filter.skill, filter.status, filter.since and tostring(filter.since),
      tonumber(filter.limit) or 20, filter.trigger)
    if not js then user_error("runs: " .. err) end
    return setmetatable(decode(js), runs_mt)
  end

  function f.trace(run_id)
    check_run_id(run_id, "trace")
    local js, err = core.repl_trace(run_id)
    if not js then user_error("trace: " .. err) end
    return setmetatable(decode(js), trace_mt)
  end

  function f.help() io.stdout:write(HELP, "\n") end

  f.ctx = M.scratch_ctx(f)
  return f
end

-- The REPL's `ctx`: a stand-in for a run's ctx, to try the body of a
-- skill at the prompt. Its steps run at once and nothing is journaled:
-- step.run calls its function, step.sleep waits on the engine's loop,
-- step.invoke is run(), step.send_event is send(), step.parallel calls its
-- functions in turn; step.wait_for_event needs a real run. The rules a
-- run holds its steps to hold here too, so that code tried here does not
-- fail in a run: a step inside a step's body is refused, and a body's
-- result must be a JSON value within limits.step_output, returned as a
-- run gets it back (a copy through JSON), and the options of step.run and
-- step.parallel are checked by run.lua's own check_step_opts. opts.timeout
-- ends the body's requests when it passes, as in a run (engine/cli/repl.c,
-- op_http). Not retried: an error is shown at once.
function M.scratch_ctx(f)
  local step = {}
  local in_step -- the id of the step whose body runs
  local function check_id(name, id)
    if type(id) ~= "string" or id == "" then user_error(("ctx.step.%s: the step id must be a non-empty string"):format(name)) end
    if in_step then
      user_error(("steps cannot be nested: ctx.step.%s('%s') was called inside the body of step '%s'")
        :format(name, id, in_step))
    end
  end
  -- A chunk stopped in a step body (Ctrl-C) never came back to clear it.
  M.reset_scratch = function()
    in_step = nil
    core.repl_step_timeout()
  end
  -- Run a step body as a run would: not nested, its result through JSON
  -- within the output limit, its requests ended at its timeout.
  local function body(id, fn, opts)
    local timeout = opts and opts.timeout
    if timeout ~= nil then timeout = run_mod.to_ms(timeout, "opts.timeout") end
    in_step = id
    core.repl_step_timeout(id, timeout)
    local ok, v = pcall(fn)
    core.repl_step_timeout()
    in_step = nil
    if not ok then error(v, 0) end
    local out, err = run_mod.encode_result(v, limits.step_output)
    if not out then user_error(("step '%s' failed: %s"):format(id, err)) end
    return decode(out)
  end
  local function sleep_ms(name, ms)
    engine_op("ctx.step." .. name, ROP.SLEEP, ms)
  end
  function step.run(id, fn, opts)
    check_id("run", id)
    if type(fn) ~= "function" then user_error("ctx.step.run(id, fn): fn must be a function") end
    run_mod.check_step_opts("step.run", opts)
    return body(id, fn, opts)
  end
  function step.sleep(id, duration)
    check_id("sleep", id)
    local ms = type(duration) == "number" and duration * 1000 or core.duration(tostring(duration))
    if not ms then user_error("ctx.step.sleep: expected a duration such as 30 or \"5m\"") end
    sleep_ms("sleep", ms)
  end
  function step.sleep_until(id, t)
    check_id("sleep_until", id)
    local at = type(t) == "number" and t * 1000 or core.parse_time(tostring(t))
    if not at then user_error("ctx.step.sleep_until: expected a unix time or an RFC 3339 string") end
    sleep_ms("sleep_until", math.max(0, at - core.now()))
  end
  function step.wait_for_event(id)
    user_error("ctx.step.wait_for_event needs a real run: try the skill with run() or step_through()")
  end
  function step.invoke(id, opts)
    check_id("invoke", id)
    if type(opts) ~= "table" then user_error("ctx.step.invoke(id, {skill=, data=})") end
    local out = f.run(opts.skill, opts.data)
    return out
  end
  function step.send_event(id, events)
    check_id("send_event", id)
    if type(events) ~= "table" then user_error("ctx.step.send_event(id, event or list): expected a table") end
    local list = events.name ~= nil and { events } or events
    local ids = {}
    for i, ev in ipairs(list) do ids[i] = f.send(ev.name, ev.data, ev.id) end
    return ids
  end
  function step.parallel(id, fns, opts)
    check_id("parallel", id)
    if type(fns) ~= "table" or #fns == 0 then
      user_error("ctx.step.parallel(id, {fn, fn, ...}): expected a non-empty list of functions")
    end
    for i, fn in ipairs(fns) do
      if type(fn) ~= "function" then user_error(("ctx.step.parallel: item %d is not a function"):format(i)) end
    end
    run_mod.check_step_opts("step.parallel", opts)
    local out = {}
    for i, fn in ipairs(fns) do out[i] = body(id .. "/" .. i, fn, opts) end
    return out
  end
  return {
    step = step, log = modules.make_log(), run_id = "repl", skill = "repl", version = "repl",
    input = nil, event = { name = "moonloop.repl", id = "repl" }, attempt = 1, step_key = "repl:step",
  }
end

-- pcall, xpcall and coroutine.resume that cannot swallow Ctrl-C: the
-- "interrupted" error (a kill, lrt.h) is raised again, as the sandbox's
-- pcall does for skill code.
local function unswallowable()
  local real_pcall, real_xpcall, real_resume = pcall, xpcall, coroutine.resume
  local killed, kill_reason = core.killed, core.kill_reason
  local function check(ok, ...)
    if not ok and killed() then error(kill_reason() or (...), 0) end
    return ok, ...
  end
  local co = {}
  for k, v in pairs(coroutine) do co[k] = v end
  co.resume = function(c, ...) return check(real_resume(c, ...)) end
  return {
    pcall = function(f, ...) return check(real_pcall(f, ...)) end,
    xpcall = function(f, h, ...)
      return check(real_xpcall(f, function(e)
        if killed() then return e end
        return h(e)
      end, ...))
    end,
    coroutine = co,
  }
end

-- The standard library with the C stack guard (lrt.h) on every function
-- that calls back into Lua from C: the sandbox's guarded string, table and
-- os functions, and print, coroutine.resume and coroutine.wrap (a
-- coroutine resumed from a coroutine nests C frames too, and LuaJIT bounds
-- each coroutine's Lua stack, not their number).
local function guarded(base)
  local g = require("sandbox").guarded
  local cstack = core.cstack
  local out = {}
  for lib, fns in pairs(g) do
    local t = {}
    for k, v in pairs(_G[lib]) do t[k] = v end
    for k, v in pairs(fns) do t[k] = v end
    out[lib] = t
  end
  local real_print = print
  out.print = function(...)
    cstack("print")
    return real_print(...)
  end
  local co = base.coroutine
  local resume, create = co.resume, co.create
  co.resume = function(c, ...)
    cstack("coroutine.resume")
    return resume(c, ...)
  end
  co.wrap = function(f)
    local c = create(f)
    local function pass(ok, ...)
      if not ok then error((...), 0) end
      return ...
    end
    return function(...)
      cstack("coroutine.wrap")
      return pass(resume(c, ...))
    end
  end
  return out
end

-- Build the REPL's globals. env_values: the configuration's env.* values;
-- lims: the configuration's limits a run's steps are held to ({step_output=}).
function M.init(env_values, lims)
  if type(lims) == "table" and tonumber(lims.step_output) then limits.step_output = tonumber(lims.step_output) end
  env = {}
  for k, v in pairs(_G) do env[k] = v end
  local base = unswallowable()
  for k, v in pairs(base) do env[k] = v end
  for k, v in pairs(guarded(base)) do env[k] = v end
  for k, v in pairs(modules.build(env_values)) do env[k] = v end
  for k, v in pairs(make_functions()) do env[k] = v end
  -- print as Lua's, its text escaped as everything else the REPL prints.
  env.print = function(...)
    local parts = {}
    for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
    io.stdout:write(term(concat(parts, "\t")), "\n")
  end
  env._G = env
  M.env = env
end

return M
