/*
** run_pause.c: pausing a run before each live step (see run_pause.h).
** The Lua half is lua/run_pause.lua: run.lua's next_step calls R.pause
** for a step past the journal's end, which yields OP_PAUSE (op.h: seq id
** kind -> "run" | "skip", value JSON; never resumed after "stop").
**
** The handler runs on the loop thread inside run_resume's op dispatch: it
** answers at once, or leaves the run parked (PAUSE_WAIT) and answers later
** with run_pause_answer, from outside the loop's callbacks (the REPL asks
** the person while the loop goes on).
*/
#include "core/run_pause.h"
#include "core/run.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#define MAX_WAITING 64

/* The one handler of this process (there is one REPL per process), and
** the runs parked on a pause it has not answered yet. */
static struct {
  sched_t *s;
  run_pause_cb cb;
  void *arg;
  char waiting[MAX_WAITING][27];
  int nwaiting;
} handler;

/* The place of run_id among the runs waiting for an answer, or -1. */
static int waiting_index(const char *run_id) {
  for (int i = 0; i < handler.nwaiting; i++)
    if (!strcmp(handler.waiting[i], run_id)) return i;
  return -1;
}

/* Resume t after its pause with d (not PAUSE_STOP nor PAUSE_WAIT). */
static void go_on(struct task *t, enum run_pause_decision d, const char *value) {
  lua_settop(t->co, 0);
  int rc = d == PAUSE_SKIP ? run__push_values(t, "ss", "skip", value ? value : "null")
                           : run__push_values(t, "s", "run");
  if (!rc) run__complete(t);
}

void run_pause_handler(sched_t *s, run_pause_cb cb, void *arg) {
  handler.s = cb ? s : NULL;
  handler.cb = cb;
  handler.arg = arg;
}

/* run_pause_enable's call of run_pause.enable(co), under lrt_protect. */
static int enable(void *arg, err_t *e) {
  struct run *r = arg;
  lrt_t *lrt = sched__opts(r->sched)->lrt;
  lua_State *L = lrt_L(lrt);
  int top = lua_gettop(L);
  if (lrt_require(lrt, "run_pause", e)) return e->code;
  lua_getfield(L, -1, "enable");
  lua_pushthread(r->main.co);
  lua_xmove(r->main.co, L, 1);
  if (lrt_pcall(lrt, 1, 1, e)) {
    lua_settop(L, top);
    return e->code;
  }
  int ok = lua_toboolean(L, -1);
  lua_settop(L, top);
  return ok ? 0 : err_set(e, ERR_NOTFOUND, "run %s has no task to pause", r->id);
}

int run_pause_enable(sched_t *s, const char *run_id, err_t *e) {
  struct run *r = sched__find(s, run_id);
  if (!r || r->aborted || r->finished || !r->main.co)
    return err_set(e, ERR_NOTFOUND, "run %s is not live in this process", run_id);
  return lrt_protect(sched__opts(s)->lrt, enable, r, e);
}

/* OP_PAUSE (op.h): ask the handler about the step; answer now, or later. */
void run_op_pause(struct task *t, const struct op_pause *a) {
  struct run *r = t->run;
  lua_State *co = t->co;
  struct run_pause_step p = {
    .run_id = r->id, .skill = r->skill ? r->skill->id : "", .seq = a->seq, .step_id = a->id,
    .kind = a->kind,
  };
  char *value = NULL;
  enum run_pause_decision d = PAUSE_RUN;
  if (handler.cb && handler.s == r->sched) d = handler.cb(&p, &value, handler.arg);
  lua_settop(co, 0);
  if (d == PAUSE_STOP || r->aborted || r->finished) {
    free(value);
    run_abort(r, NULL, NULL); /* a no-op for a run that already ended */
    return;
  }
  run__park(t, 1);
  if (d == PAUSE_WAIT && t == &r->main && handler.nwaiting < MAX_WAITING) {
    /* Parked until run_pause_answer. */
    snprintf(handler.waiting[handler.nwaiting++], sizeof handler.waiting[0], "%s", r->id);
    free(value);
    return;
  }
  go_on(t, d == PAUSE_WAIT ? PAUSE_RUN : d, value);
  free(value);
}

int run_pause_answer(sched_t *s, const char *run_id, enum run_pause_decision d, const char *value,
                     err_t *e) {
  int i = waiting_index(run_id);
  if (i < 0) return err_set(e, ERR_NOTFOUND, "run %s is not waiting at a pause", run_id);
  memcpy(handler.waiting[i], handler.waiting[--handler.nwaiting], sizeof handler.waiting[0]);
  struct run *r = sched__find(s, run_id);
  if (!r || r->aborted || r->finished || r->main.state != T_PARKED || !r->main.co)
    return err_set(e, ERR_NOTFOUND, "run %s stopped while it waited at a pause", run_id);
  if (d == PAUSE_STOP) run_abort(r, NULL, NULL);
  else go_on(&r->main, d == PAUSE_WAIT ? PAUSE_RUN : d, value);
  return 0;
}
