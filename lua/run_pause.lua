-- run_pause.lua: the Lua half of pausing a run before each live step, for
-- the REPL's step_through (engine/core/run_pause.c).
--
-- run.lua's next_step calls R.pause(R, seq, sid, kind) for a step past the
-- journal's end when the run has one (set by M.enable). It yields PAUSE
-- (engine/core/op.h: seq id kind -> "run" | "skip", value JSON text),
-- and the core never resumes it when the answer is "stop" (the run is
-- dropped there, resumable from its journal). "skip" completes the step
-- with the value without running it: its completed row is journaled
-- (COMMIT), and the step then returns it as it returns a recorded result
-- on replay, whatever its kind.

local core = ...
local run = require("run")
local M = {}

local OP = core.OP
local yield = coroutine.yield

-- Returns nil (go on live), or the journal record the step should replay.
function M.pause(R, seq, sid, kind)
  local decision, value = yield(OP.PAUSE, seq, sid, kind)
  if decision ~= "skip" then return nil end
  local out = value or "null"
  -- An invoke step records its child's outcome, and returns its output.
  if kind == "invoke" then out = '{"run_id":null,"status":"completed","output":' .. out .. '}' end
  local now = core.now()
  yield(OP.COMMIT, seq, sid, kind, out, 1, now, now)
  R.now = now
  return { seq = seq, id = sid, kind = kind, status = "completed", output = out, attempts = 1,
           started_at = now, ended_at = now }
end

-- Pause the run whose main coroutine is co from now on; false if unknown.
function M.enable(co)
  local R = run.tasks[co]
  if not R then return false end
  R.pause = M.pause
  return true
end

return M
