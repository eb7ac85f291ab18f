-- lint.lua: static checks of a skill file, against the API's tables
-- (api.lua), made wherever a new version is validated (moonloop check,
-- skills.check, PUT, the workspace watcher, moonloop test: all through
-- loader.lua), so that a mistake is named with its line before the code
-- ever runs.
--
-- The source is parsed with luacheck's parser (Debian's lua-check, built
-- into the binary as luacheck.parser, .lexer and .utils) into an AST of
-- tagged nodes (Call, Index, Id, Function, Table, Pair, Local, ...), which
-- one walk checks with the locals in scope. Only what is certain is
-- flagged: literal option tables, calls on the module names when no local
-- shadows them, steps as X.step.Y on a run's ctx or a local alias of
-- ctx.step. A file the parser cannot read is not checked (LuaJIT compiled
-- it already, so it is valid Lua).
--
-- Errors (the load fails with the first, by line):
--   - an unknown step kind (ctx.step.wait), module function (http.post,
--     env.get(...)), ctx field (ctx.data), or key of a literal option table
--     (ctx.step.run("x", fn, { retires = 2 }), http.request{ jsn = v });
--   - a literal `match` of wait_for_event that api.match_pairs refuses
--     (a nested value, a key that is not a path, an empty table);
--   - a step called inside a step body (nested lexically in the function
--     given to step.run or step.parallel), except step.invoke in a
--     function of step.parallel (its child runs in that branch);
--   - I/O (http, llm, runs, skills) called in the run function itself,
--     outside any step body;
--   - a module function called with ':' (http:get(u));
--   - (in the loader, which knows the configuration) env.NAME of a name
--     the configuration does not grant to the skill.
-- Warnings (the file loads): code in the run function, outside step bodies,
-- that is not deterministic: os.time() and os.date() of now, os.clock(),
-- math.random(), and time.now() (the time of the last step there); a call
-- of an os function the sandbox does not have (os.getenv: use env.NAME);
-- a step body that changes a local of the run function declared outside
-- it (x = ..., x[k] = ..., table.insert(x, ...)): a replay does not run
-- the body, so the code after the step would see x unchanged.

local api = require("api")
local parser = require("luacheck.parser")
local M = {}

local type, ipairs, tostring, pcall, setmetatable = type, ipairs, tostring, pcall, setmetatable
local sort = table.sort

-- The source as luacheck's lexer reads it: an object with the interface
-- of its decoder (bytes read as Latin-1: the syntax is ASCII; strings and
-- comments may hold anything).
local Chars = {}
Chars.__index = Chars
function Chars:get_codepoint(i) return self.s:byte(i) end
function Chars:get_substring(a, b) return self.s:sub(a, b) end
function Chars:get_printable_substring(a, b)
  return (self.s:sub(a, b):gsub("[^\32-\126]", function(c) return ("\\x%02X"):format(c:byte()) end))
end
function Chars:get_length() return #self.s end
function Chars:find(pattern, from) return self.s:find(pattern, from) end

-- The functions of os that read the clock.
local CLOCK = api.set_of(api.os_functions)

-- The walk -----------------------------------------------------------------------

-- A checker: the AST's state while it is walked.
--   scopes   a stack of {name -> decl}; decl: {step_alias=, ctx=, in_run=, body=}
--            (in_run: declared inside a run function; body: the step body
--            it was declared in, or nil)
--   body     the step body being walked ({id=, line=}), or nil
--   direct   true while walking the run (or on_failure) function's own code
--   in_run   true while walking inside a run (or on_failure) function
--   changed  {body -> {name -> true}}: the outer locals said to change
--   runs     set of the Function nodes that are run or on_failure
--   globals  names assigned as globals somewhere (then not the modules)
local function new_checker()
  return { scopes = { {} }, errors = {}, warnings = {}, runs = {}, globals = {}, env_reads = {},
           changed = {} }
end

local function report(list, node, msg)
  list[#list + 1] = { line = node.line or 0, message = msg }
end

local function err(C, node, msg) report(C.errors, node, msg) end
local function warn(C, node, msg) report(C.warnings, node, msg) end

local function lookup(C, name)
  for i = #C.scopes, 1, -1 do
    local d = C.scopes[i][name]
    if d then return d end
  end
  return nil
end

local function declare(C, name, decl)
  decl = decl or {}
  decl.in_run, decl.body = C.in_run, C.body
  C.scopes[#C.scopes][name] = decl
end

local function push(C) C.scopes[#C.scopes + 1] = {} end
local function pop(C) C.scopes[#C.scopes] = nil end

-- The module a node names: "http" for the global http when no local
-- shadows it and the file assigns no global of that name; else nil.
local function module_of(C, node)
  if node.tag ~= "Id" then return nil end
  local name = node[1]
  if lookup(C, name) or C.globals[name] then return nil end
  if api.module[name] or name == "os" or name == "math" then return name end
  return nil
end

-- Whether node is ctx: the run function's first parameter ("run"), or a
-- parameter named ctx ("named": a helper the run passes its ctx to, most
-- likely; its fields are not checked, it may be some other ctx).
local function is_ctx(C, node, run_only)
  if node.tag ~= "Id" then return false end
  local d = lookup(C, node[1])
  if not d or not d.ctx then return false end
  return not run_only or d.ctx == "run"
end

-- Whether node is the step API: ctx.step, or a local aliased from it.
local function is_step_api(C, node)
  if node.tag == "Id" then
    local d = lookup(C, node[1])
    return d ~= nil and d.step_alias == true
  end
  return node.tag == "Index" and node[2].tag == "String" and node[2][1] == "step" and is_ctx(C, node[1])
end

-- Warn when node (a target being set or changed: x, x.f, x[k]) is a local
-- of the run function declared outside the step body being walked: a
-- replay returns the body's recorded result without running it, so the
-- change is lost there (after a crash, and in moonloop test's replay).
local function outer_change(C, node)
  if not C.body then return end
  while node.tag == "Index" or node.tag == "Paren" do node = node[1] end
  if node.tag ~= "Id" then return end
  local name = node[1]
  local d = lookup(C, name)
  if not d or not d.in_run or d.body == C.body then return end
  local seen = C.changed[C.body] or {}
  C.changed[C.body] = seen
  if seen[name] then return end
  seen[name] = true
  warn(C, node, ("the body of step '%s' (line %d) changes '%s', a local of the run function: a replay "
    .. "(after a crash, and in moonloop test) returns the step's recorded result without running the body, "
    .. "so the code after the step sees '%s' unchanged. Return what the run needs from the body and change "
    .. "'%s' outside it (local r = ctx.step.run(...); then use r)")
    :format(tostring(C.body.id or "?"), C.body.line or 0, name, name, name))
end

-- The string a node is, when it is a literal string.
local function literal(node)
  return node and node.tag == "String" and node[1] or nil
end

-- The keys of a literal table: {key, node} for each string key (Pair)
-- and each positional item (its index), in order.
local function table_keys(node)
  local out, n = {}, 0
  for _, item in ipairs(node) do
    if item.tag == "Pair" then
      local k = literal(item[1])
      if k then out[#out + 1] = { k, item } end
    else
      n = n + 1
      out[#out + 1] = { n, item }
    end
  end
  return out
end

-- A literal `match` table of wait_for_event (node: the Table), checked as
-- api.match_pairs checks it when the step runs: what is written literally
-- is taken as it is; any other value or key stands for a valid one.
local function check_match(C, name, node)
  if node and node.tag == "String" then
    local ok, msg = api.match_pairs(name, node[1])
    if not ok then err(C, node, msg) end
    return
  end
  if not node or node.tag ~= "Table" then return end
  local m, n = {}, 0
  local scalar = { String = true, Number = true, True = true, False = true }
  for _, item in ipairs(node) do
    if item.tag == "Pair" then
      local k, v = item[1], item[2]
      local key = k.tag == "String" and k[1] or k.tag == "Number" and tonumber(k[1]) or k.tag == "True" or nil
      if k.tag == "False" then key = false end
      local val = v.tag == "Table" and {} or v.tag == "String" and v[1] or (scalar[v.tag] and 1) or "x"
      if key == nil then m["data.unknown" .. #item] = "x" -- a key the code computes
      elseif key ~= false then m[key] = val
      elseif key == false then return err(C, item, ("%s: 'match' keys must be paths such as \"data.service\", got a boolean key (false): "
        .. "write match = { [\"data.service\"] = value }"):format(name)) end
    else
      n = n + 1
      m[n] = item.tag == "String" and item[1] or (scalar[item.tag] and 1) or (item.tag == "Table" and {}) or "data.x"
    end
  end
  local ok, msg = api.match_pairs(name, m)
  if not ok then err(C, node, msg) end
end

-- Check the keys of a literal options table against an api entry.
local function check_table(C, name, entry, node)
  if not node or node.tag ~= "Table" or not entry.opts_set then return end
  for _, kv in ipairs(table_keys(node)) do
    local msg = api.unknown_key(name, entry, kv[1])
    if msg then err(C, kv[2], msg) end
  end
end

local expr, block, stmt, func

-- Walk a list of expressions.
local function exprs(C, list, from)
  for i = from or 1, #list do expr(C, list[i]) end
end

-- A step call: ctx.step.KIND(args...) at node (a Call whose function is an
-- Index of the step API).
local function step_call(C, node, kind)
  local s = api.step[kind]
  local id = literal(node[2])
  if not s then
    err(C, node, api.unknown("step", kind))
  elseif C.body and not (kind == "invoke" and C.body.branch) then
    -- (step.invoke may be called in a step.parallel function: its child
    -- runs in that branch.)
    err(C, node, ("steps cannot be nested: step.%s('%s') is inside the body of step '%s' (line %d): "
      .. "call it in the run function, before or after that step%s"):format(kind, tostring(id or "?"),
      tostring(C.body.id or "?"), C.body.line,
      kind == "invoke" and " (or in a function of step.parallel: one child run per function)" or ""))
  end
  local args = {}
  for i = 2, #node do args[i - 1] = node[i] end
  if s and s.opts_arg then check_table(C, "step." .. kind, s, args[s.opts_arg]) end
  if kind == "wait_for_event" and args[2] and args[2].tag == "Table" then
    for _, item in ipairs(args[2]) do
      if item.tag == "Pair" and literal(item[1]) == "match" then check_match(C, "step.wait_for_event", item[2]) end
    end
  end
  if s and s.event_arg then
    local ev = args[s.event_arg]
    if ev and ev.tag == "Table" then
      local keyed = false
      for _, item in ipairs(ev) do if item.tag == "Pair" then keyed = true end end
      local list = keyed and { ev } or ev
      for i, e in ipairs(list) do
        if e.tag == "Table" then
          for _, kv in ipairs(table_keys(e)) do
            if not api.event_key_set[kv[1]] then
              local m = api.check_event_keys("step." .. kind, i, { [kv[1]] = true })
              if m then err(C, kv[2], m) end
            end
          end
        end
      end
    end
  end
  -- The step's bodies are walked as such; the other arguments as they are.
  local bodies = {}
  if s and s.body_arg then
    local b = args[s.body_arg]
    if b and b.tag == "Function" and not s.body_list then bodies[b] = true end
    if b and b.tag == "Table" and s.body_list then
      for _, item in ipairs(b) do if item.tag == "Function" then bodies[item] = true end end
    end
  end
  for i, a in ipairs(args) do
    if bodies[a] then
      func(C, a, { id = id, line = node.line })
    elseif a.tag == "Table" and s and s.body_list and i == s.body_arg then
      for _, item in ipairs(a) do
        if bodies[item] then func(C, item, { id = id, line = node.line, branch = true }) else expr(C, item) end
      end
    else
      expr(C, a)
    end
  end
end

-- A call of module.fn(args...) at node.
local function module_call(C, node, mod, fn)
  local args = {}
  for i = 2, #node do args[i - 1] = node[i] end
  local call = mod .. "." .. fn .. "()"
  -- (What the sandbox lacks beyond os, io say, is refused when it runs:
  -- the sandbox's own errors, not these checks, say so.)
  if mod == "os" then
    -- (A warning: the call raises when it runs, which a pcall may expect.)
    if not CLOCK[fn] then warn(C, node, api.unknown("os", fn)) end
    -- Of now only: os.date(fmt, t) and os.time(t) are of a given time.
    local of_now = (fn ~= "date" or #args < 2) and (fn ~= "time" or #args == 0)
    if CLOCK[fn] and C.direct and not C.body and of_now then
      warn(C, node, ("%s outside a step body gives another value when the run is replayed after a restart: "
        .. "call it inside a step (local t = ctx.step.run(\"now\", function() return %s end))"):format(call, call))
    end
  elseif mod == "math" then
    if fn == "random" and C.direct and not C.body then
      warn(C, node, "math.random() outside a step body gives another value when the run is replayed after "
        .. "a restart: call it inside a step (local n = ctx.step.run(\"pick\", function() return math.random(6) end))")
    end
  else
    local f = api.func[mod][fn]
    if not f or (mod == "env") then
      err(C, node, api.unknown(mod, fn))
    else
      if f.opts_arg then check_table(C, mod .. "." .. fn, f, args[f.opts_arg]) end
      if api.module[mod].io and not f.pure and C.direct and not C.body then
        err(C, node, ("%s.%s must be called inside a step body (ctx.step.run(\"name\", function() ... end)), "
          .. "where its result is checkpointed"):format(mod, fn))
      end
      if mod == "time" and fn == "now" and C.direct and not C.body then
        warn(C, node, "time.now() outside a step body is the time recorded at the last step (so that a replay "
          .. "sees the same), not the clock: to read the clock, call it inside a step")
      end
    end
  end
  exprs(C, args)
end

-- Walk an expression.
function expr(C, node)
  if type(node) ~= "table" then return end
  local tag = node.tag
  if tag == "Call" then
    local f = node[1]
    if f.tag == "Index" and literal(f[2]) then
      if is_step_api(C, f[1]) then return step_call(C, node, f[2][1]) end
      -- table.insert(x, ...), table.remove(x), table.sort(x): x changes.
      if f[1].tag == "Id" and f[1][1] == "table" and not lookup(C, "table") and node[2]
        and (literal(f[2]) == "insert" or literal(f[2]) == "remove" or literal(f[2]) == "sort") then
        outer_change(C, node[2])
      end
      local mod = module_of(C, f[1])
      if mod then return module_call(C, node, mod, f[2][1]) end
    end
    expr(C, f)
    exprs(C, node, 2)
  elseif tag == "Invoke" then
    local mod = module_of(C, node[1])
    local m = literal(node[2])
    if mod and m and api.module[mod] then
      err(C, node, ("%s:%s(...) passes the module as the first argument: call it with a dot, %s.%s(...)")
        :format(mod, m, mod, m))
    end
    expr(C, node[1])
    exprs(C, node, 3)
  elseif tag == "Index" then
    local k = literal(node[2])
    if k and is_step_api(C, node[1]) and not api.step[k] then
      err(C, node, api.unknown("step", k))
    elseif k and is_ctx(C, node[1], true) and not api.ctx_field_set[k] then
      err(C, node, api.unknown("ctx", k))
    else
      local mod = k and module_of(C, node[1])
      if mod and api.func[mod] and mod ~= "env" and not api.func[mod][k] then err(C, node, api.unknown(mod, k)) end
      -- env.NAME: checked against the configuration by the loader, which knows it.
      if mod == "env" then C.env_reads[#C.env_reads + 1] = { line = node.line or 0, name = k } end
    end
    expr(C, node[1])
    expr(C, node[2])
  elseif tag == "Function" then
    func(C, node, C.body)
  elseif tag == "Table" then
    for _, item in ipairs(node) do
      if item.tag == "Pair" then
        expr(C, item[1])
        expr(C, item[2])
      else
        expr(C, item)
      end
    end
  elseif tag == "Op" then
    expr(C, node[2])
    expr(C, node[3])
  elseif tag == "Paren" then
    expr(C, node[1])
  end
end

-- Walk a function: its parameters in a new scope; body is the step body
-- it is part of (nil when none). A run (or on_failure) function's first
-- parameter is ctx; its own code is `direct`.
function func(C, node, body)
  local saved_body, saved_direct, saved_in_run = C.body, C.direct, C.in_run
  local is_run = C.runs[node]
  C.body, C.direct = body, is_run and not body or false
  C.in_run = C.in_run or is_run
  push(C)
  for i, p in ipairs(node[1]) do
    -- ctx: the run function's first parameter, or a parameter named ctx
    -- (a helper the run passes its ctx to).
    if p.tag == "Id" then
      declare(C, p[1], { ctx = (is_run and i == 1) and "run" or (p[1] == "ctx" and "named") or nil })
    end
  end
  block(C, node[2])
  pop(C)
  C.body, C.direct, C.in_run = saved_body, saved_direct, saved_in_run
end

-- Declare the names of a Local statement; a name given ctx.step is an alias.
local function declare_locals(C, names, values)
  for i, id in ipairs(names) do
    local v = values and values[i]
    declare(C, id[1], { step_alias = v ~= nil and is_step_api(C, v) or nil })
  end
end

-- Walk a statement.
function stmt(C, node)
  local tag = node.tag
  if tag == "Local" then
    if node[2] then exprs(C, node[2]) end
    declare_locals(C, node[1], node[2])
  elseif tag == "Localrec" then
    declare(C, node[1][1][1])
    expr(C, node[2][1])
  elseif tag == "Set" then
    for _, t in ipairs(node[1]) do
      outer_change(C, t)
      -- A field being set is not read: module.x = ... is not a lookup.
      if t.tag == "Index" then
        expr(C, t[1])
        expr(C, t[2])
      end
    end
    exprs(C, node[2])
  elseif tag == "OpSet" then
    expr(C, node[2])
    expr(C, node[3])
  elseif tag == "Call" or tag == "Invoke" then
    expr(C, node)
  elseif tag == "Do" then
    block(C, node)
  elseif tag == "While" then
    expr(C, node[1])
    block(C, node[2])
  elseif tag == "Repeat" then
    push(C)
    for _, s in ipairs(node[1]) do stmt(C, s) end
    expr(C, node[2])
    pop(C)
  elseif tag == "If" then
    for i = 1, #node, 2 do
      if node[i + 1] then
        expr(C, node[i])
        block(C, node[i + 1])
      else
        block(C, node[i]) -- else
      end
    end
  elseif tag == "Fornum" then
    for i = 2, #node - 1 do expr(C, node[i]) end
    push(C)
    declare(C, node[1][1])
    block(C, node[#node], true)
    pop(C)
  elseif tag == "Forin" then
    exprs(C, node[2])
    push(C)
    for _, id in ipairs(node[1]) do declare(C, id[1]) end
    block(C, node[3], true)
    pop(C)
  elseif tag == "Return" then
    exprs(C, node)
  end
end

-- Walk a block in a new scope (or in the current one: same_scope).
function block(C, list, same_scope)
  if not same_scope then push(C) end
  for _, s in ipairs(list) do stmt(C, s) end
  if not same_scope then pop(C) end
end

-- Finding the run function -----------------------------------------------------------

-- Names assigned as globals anywhere (x = 1 without local): such a name is
-- the file's own, not a module.
local function find_globals(C, node)
  if type(node) ~= "table" then return end
  if node.tag == "Set" then
    for _, t in ipairs(node[1]) do
      if t.tag == "Id" then C.globals[t[1]] = true end
    end
  end
  for _, child in ipairs(node) do find_globals(C, child) end
end

-- The Function nodes of run and on_failure in the file's top level: the
-- table it returns (a constructor, or a local table), its fields given as
-- functions or as top-level local functions.
local function find_runs(C, ast)
  local locals = {} -- top-level local name -> its value node
  for _, s in ipairs(ast) do
    if s.tag == "Local" and s[2] then
      for i, id in ipairs(s[1]) do locals[id[1]] = s[2][i] end
    elseif s.tag == "Localrec" then
      locals[s[1][1][1]] = s[2][1]
    end
  end
  local function fn_of(v)
    if v and v.tag == "Id" then v = locals[v[1]] end
    return v and v.tag == "Function" and v or nil
  end
  local function mark(tbl)
    for _, item in ipairs(tbl) do
      if item.tag == "Pair" and (literal(item[1]) == "run" or literal(item[1]) == "on_failure") then
        local f = fn_of(item[2])
        if f then C.runs[f] = true end
      end
    end
  end
  local last = ast[#ast]
  if not last or last.tag ~= "Return" or not last[1] then return end
  local ret = last[1]
  if ret.tag == "Table" then
    mark(ret)
  elseif ret.tag == "Id" and locals[ret[1]] then
    local t = locals[ret[1]]
    if t.tag == "Table" then mark(t) end
    -- NAME.run = function ... at the top level.
    for _, s in ipairs(ast) do
      if s.tag == "Set" then
        for i, target in ipairs(s[1]) do
          local k = target.tag == "Index" and literal(target[2])
          if k and (k == "run" or k == "on_failure") and target[1].tag == "Id" and target[1][1] == ret[1] then
            local f = fn_of(s[2][i])
            if f then C.runs[f] = true end
          end
        end
      end
    end
  end
end

-- Entry point ------------------------------------------------------------------------

local function by_line(a, b) return a.line < b.line end

-- Check src: returns the errors and the warnings, each a list of
-- {line=, message=} sorted by line, and the literal env.NAME reads,
-- {line=, name=} by line (the loader checks them against the
-- configuration); all empty when the parser cannot read src.
function M.check(src)
  local ok, ast = pcall(parser.parse, setmetatable({ s = src }, Chars))
  if not ok or type(ast) ~= "table" then return {}, {}, {} end
  local C = new_checker()
  find_globals(C, ast)
  find_runs(C, ast)
  block(C, ast)
  sort(C.errors, by_line)
  sort(C.warnings, by_line)
  sort(C.env_reads, function(a, b) return a.line < b.line or (a.line == b.line and a.name < b.name) end)
  return C.errors, C.warnings, C.env_reads
end

return M
