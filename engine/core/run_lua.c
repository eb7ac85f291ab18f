/*
** run_lua.c: the run context's C functions that the runtime's Lua calls
** without yielding (lua/run.lua): core.log (a line in the current run's
** trace), core.step_begin and core.step_end (a step body's attempt and
** its timeout), core.step_interrupted (replay found an attempt cut by a
** crash) and core.step_usage (an LLM call's tokens), and the op table's
** Lua view (op.h's op_register). Each acts on the task running now
** (sched__current), so a call outside a run does nothing, or writes to
** stderr.
*/
#include "base/fault.h"
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "core/run.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- core functions for the runtime's Lua ---- */

/* The scheduler, the C function's upvalue. */
static sched_t *up_sched(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* core.log(level, msg, seq): a line in the current run's trace. */
static int c_log(lua_State *L) {
  sched_t *s = up_sched(L);
  const char *level = luaL_checkstring(L, 1);
  size_t len;
  const char *msg = luaL_checklstring(L, 2, &len);
  int seq = (int)luaL_optinteger(L, 3, 0);
  struct task *t = sched__current(s);
  char cut[65536 + 32];
  if (len > 65536) {
    snprintf(cut, sizeof cut, "%.65536s [cut]", msg);
    msg = cut;
    len = strlen(cut);
  }
  if (!t) {
    term_printf(stderr, "[%s] %s\n", level, msg);
    return 0;
  }
  fault_log(msg); /* tests: a real crash here, or faults armed by the run (base/fault.h) */
  /* A run's lines are held until their commit and kept with it: past its
  ** budget they are dropped (one line says so, run__finish how many). */
  struct run *r = t->run;
  int64_t limit = sched__opts(s)->run_log_limit;
  if (r->log_bytes + (int64_t)len > limit) {
    if (!r->log_dropped++) {
      char d[32], note[200];
      units_fmt_size(limit, d, sizeof d);
      snprintf(note, sizeof note, "this run logged %s, its budget (limits.run_logs): its further "
               "log lines are dropped", d);
      struct log_row over = {.run_id = r->id, .seq = seq, .ts = units_now_ms(), .level = "warn",
                             .msg = note};
      journal_log(sched__journal(s), &over);
    }
    return 0;
  }
  r->log_bytes += (int64_t)len;
  struct log_row row = {.run_id = r->id, .seq = seq, .ts = units_now_ms(), .level = level,
                        .msg = msg};
  journal_log(sched__journal(s), &row);
  if (sched__opts(s)->verbose) term_printf(stderr, "    %s: %s\n", level, msg);
  return 0;
}

/* A step body's time is up: its request in flight, or its wait before a
** retry (llm.chat's), ends now, and it gets no more I/O in this attempt. */
static void on_step_timeout(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, step_timer));
  t->step_timed_out = 1;
  if (t->waiting) {
    /* A branch's body waiting for its child run (step.invoke). */
    run__wait_stop(t);
    return;
  }
  if (t->in_delay) {
    sched__timer_stop(t->run->sched, &t->timer);
    t->in_delay = 0;
    run__step_timed_out(t);
  } else if (t->xfer) {
    httpc_cancel(t->xfer);
    t->xfer = NULL;
    run__step_timed_out(t);
  }
}

/* core.step_begin(seq, id, attempt, timeout_ms, started): a body starts. */
static int c_step_begin(lua_State *L) {
  sched_t *s = up_sched(L);
  struct task *t = sched__current(s);
  if (!t) return 0;
  t->step_seq = (int)luaL_checkinteger(L, 1);
  free(t->step_id);
  t->step_id = mem_strdup(luaL_checkstring(L, 2));
  t->step_attempt = (int)luaL_checkinteger(L, 3);
  t->step_timeout_ms = (int64_t)luaL_optnumber(L, 4, 0);
  t->step_started = (int64_t)luaL_optnumber(L, 5, (lua_Number)units_now_ms());
  t->step_marked = 0;
  t->step_timed_out = 0;
  t->in_body = 1;
  if (t->step_attempt <= 1) t->usage_prompt = t->usage_completion = t->usage_total = t->usage_calls = 0;
  t->step_timer.fn = on_step_timeout;
  if (t->step_timeout_ms > 0) sched__timer_start(s, &t->step_timer, units_now_ms() + t->step_timeout_ms);
  return 0;
}

/* core.step_end(): the body returned or raised. */
static int c_step_end(lua_State *L) {
  sched_t *s = up_sched(L);
  struct task *t = sched__current(s);
  if (t) {
    sched__timer_stop(s, &t->step_timer);
    t->in_body = 0;
  }
  return 0;
}

/* core.step_interrupted(seq, id, n, started): replay found attempt n of a
** step in flight when its process stopped (a crash, a kill, a lost lease):
** record it as interrupted; the body runs again as attempt n + 1, from now
** (the attempt row's retry_at, which the trace shows as the next start). */
static int c_step_interrupted(lua_State *L) {
  sched_t *s = up_sched(L);
  struct task *t = sched__current(s);
  if (!t) return 0;
  int64_t now = units_now_ms();
  struct attempt_row a = {
    .run_id = t->run->id, .seq = (int)luaL_checkinteger(L, 1), .n = (int)luaL_checkinteger(L, 3),
    .status = "interrupted",
    .error = "the process running this attempt stopped before it ended (a crash, a kill, a "
             "shutdown past its grace period or a lost lease); the step ran again",
    .started_at = (int64_t)luaL_optnumber(L, 4, 0), .retry_at = now,
  };
  journal_attempt(sched__journal(s), &a);
  run__verbose(t->run, "\xe2\x86\xbb", luaL_checkstring(L, 2), 0, "attempt interrupted; running it again");
  return 0;
}

/* core.step_usage(prompt, completion, total): an LLM call's tokens, added
** to the step whose body is running. */
static int c_step_usage(lua_State *L) {
  struct task *t = sched__current(up_sched(L));
  if (t) {
    t->usage_prompt += (int64_t)luaL_optnumber(L, 1, 0);
    t->usage_completion += (int64_t)luaL_optnumber(L, 2, 0);
    t->usage_total += (int64_t)luaL_optnumber(L, 3, 0);
    t->usage_calls++;
  }
  return 0;
}

/* See run.h: core.log, core.step_*, and the op table (core.OP, op.h). */
void run_register_core(lrt_t *lrt, sched_t *s) {
  lrt_register(lrt, "log", c_log, s);
  lrt_register(lrt, "step_begin", c_step_begin, s);
  lrt_register(lrt, "step_end", c_step_end, s);
  lrt_register(lrt, "step_usage", c_step_usage, s);
  lrt_register(lrt, "step_interrupted", c_step_interrupted, s);
  op_register(lrt);
}
