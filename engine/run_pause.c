/*
** run_pause.c: pausing a run before each live step (see run_pause.h).
** The Lua half is lua/run_pause.lua: run.lua's next_step calls R.pause
** for a step past the journal's end, which yields
**
**   PAUSE seq id kind   -> "run" | "skip", value JSON   (never resumed after "stop")
**
** The handler runs on the loop thread inside run_resume's op dispatch, so
** it may block (the REPL reads the person's answer from the terminal);
** nothing else runs meanwhile.
*/
#include "run_pause.h"
#include "run.h"

#include <lauxlib.h>
#include <stdlib.h>

/* The one handler of this process (there is one REPL per process). */
static struct {
  sched_t *s;
  run_pause_cb cb;
  void *arg;
} handler;

void run_pause_handler(sched_t *s, run_pause_cb cb, void *arg) {
  handler.s = cb ? s : NULL;
  handler.cb = cb;
  handler.arg = arg;
}

int run_pause_enable(sched_t *s, const char *run_id, err_t *e) {
  struct run *r = sched__find(s, run_id);
  if (!r || r->aborted || r->finished || !r->main.co)
    return err_set(e, ERR_NOTFOUND, "run %s is not live in this process", run_id);
  lrt_t *lrt = sched__opts(s)->lrt;
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
  return ok ? 0 : err_set(e, ERR_NOTFOUND, "run %s has no task to pause", run_id);
}

void run_op_pause(struct task *t, lua_State *co) {
  struct run *r = t->run;
  struct run_pause_step p = {
    .run_id = r->id, .skill = r->skill ? r->skill->id : "", .seq = (int)lua_tointeger(co, 2),
    .step_id = lua_tostring(co, 3), .kind = lua_tostring(co, 4),
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
  if (d == PAUSE_SKIP) {
    lua_pushliteral(co, "skip");
    lua_pushstring(co, value ? value : "null");
    t->nres = 2;
  } else {
    lua_pushliteral(co, "run");
    t->nres = 1;
  }
  free(value);
  run__park(t, 1);
  run__complete(t);
}
