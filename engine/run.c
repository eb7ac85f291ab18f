/*
** run.c: the run context (see run.h): starting a run's coroutine,
** resuming it, and doing the durable part of each op it yields.
*/
#include "run.h"
#include "ids.h"
#include "json.h"
#include "units.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void task_complete(struct task *t);

/* ---- references and release ---- */

static void run_free(struct run *r) {
  free(r->trigger), free(r->input), free(r->parent_id), free(r->fail_error);
  free(r->main.step_id);
  free(r);
}

void run_unref(struct run *r) {
  if (--r->refs <= 0) run_free(r);
}

/* Drop the coroutine: nothing will resume it again. */
static void task_release(struct task *t) {
  if (!t->co) return;
  lrt_t *lrt = sched__opts(t->run->sched)->lrt;
  luaL_unref(lrt_L(lrt), LUA_REGISTRYINDEX, t->co_ref);
  t->co = NULL;
  t->state = T_DONE;
}

/* Cancel whatever a task waits on that can be cancelled. */
static void task_cancel(struct task *t) {
  sched_t *s = t->run->sched;
  sched__timer_stop(s, &t->timer);
  sched__timer_stop(s, &t->step_timer);
  if (t->xfer) {
    httpc_cancel(t->xfer);
    t->xfer = NULL;
  }
}

/* ---- waiting ---- */

/* Park t until `waits` completions have come in. */
static void park(struct task *t, int waits) {
  t->state = T_PARKED;
  t->waits = waits;
}

static void task_complete(struct task *t) {
  if (t->run->aborted || t->state != T_PARKED) return;
  if (--t->waits <= 0) sched__ready(t->run->sched, t);
}

static void on_durable(void *arg) {
  struct task *t = arg;
  struct run *r = t->run;
  task_complete(t);
  run_unref(r);
}

/* Count one completion for t once the open group is durable. */
static void wait_durable(struct task *t) {
  t->run->refs++;
  sched__after_commit(t->run->sched, on_durable, t);
}

static void on_timer(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, timer));
  task_complete(t);
}

/* ---- finishing ---- */

struct done_ctx {
  struct run *r;
  char *status, *output, *error;
};

static void on_finished_durable(void *arg) {
  struct done_ctx *d = arg;
  struct run *r = d->r;
  sched__run_done(r->sched, r, d->status, d->output, d->error);
  free(d->status), free(d->output), free(d->error);
  free(d);
  run_unref(r);
}

/* Journal the end of a run, its on_failure run if it has one, and report
** it once durable. */
static void finish(struct run *r, const char *status, const char *output, const char *error) {
  sched_t *s = r->sched;
  const struct sched_opts *o = sched__opts(s);
  journal_t *j = sched__journal(s);
  int64_t now = units_now_ms();
  struct run_set set = {.run_id = r->id, .status = status, .output = output, .error = error,
                        .ended_at = now};
  journal_run_set(j, &set);
  r->finished = 1;
  task_cancel(&r->main);
  task_release(&r->main);
  sched__timer_stop(s, &r->deadline);
  if (o->verbose) {
    char d[32];
    units_fmt_duration(now - r->started_at, d, sizeof d);
    fprintf(stderr, "run %s %s in %s\n", r->id, status, d);
  }
  /* on_failure runs as its own durable run, created in the same group as
  ** the failure, so it cannot be lost between the two. */
  if (!strcmp(status, "failed") && r->skill && r->skill->has_on_failure &&
      !strcmp(r->entry, "run")) {
    cJSON *trig = cJSON_CreateObject();
    cJSON_AddStringToObject(trig, "kind", "on_failure");
    cJSON_AddStringToObject(trig, "run_id", r->id);
    cJSON *ej = error ? cJSON_Parse(error) : NULL;
    cJSON_AddItemToObject(trig, "error", ej ? ej : cJSON_CreateNull());
    char *tj = cJSON_PrintUnformatted(trig);
    cJSON_Delete(trig);
    struct run *f = calloc(1, sizeof *f);
    if (f && tj) {
      err_t e;
      ids_ulid(now, f->id);
      f->sched = s;
      f->skill = r->skill;
      f->entry = "on_failure";
      f->trigger = tj;
      f->input = r->input ? strdup(r->input) : NULL;
      f->created_at = f->started_at = now;
      struct run_row row = {
        .id = f->id, .skill = r->skill->id, .version = r->skill->version, .status = "running",
        .entry = "on_failure", .trigger = tj, .input = r->input, .owner = sched_owner(s),
        .created_at = now, .started_at = now,
      };
      journal_run_new(j, &row);
      if (run_start(s, f, NULL, &e)) fprintf(stderr, "moonloop: on_failure of %s: %s\n", r->id, e.msg);
    } else {
      free(tj);
      free(f);
    }
  }
  struct done_ctx *d = calloc(1, sizeof *d);
  if (d) {
    d->r = r;
    d->status = strdup(status);
    d->output = output ? strdup(output) : NULL;
    d->error = error ? strdup(error) : NULL;
    r->refs++;
    sched__after_commit(s, on_finished_durable, d);
  }
  sched__run_unlink(s, r);
  run_unref(r); /* the live reference */
}

void run_abort(struct run *r, const char *status, const char *error_json) {
  if (r->aborted || r->finished) return;
  r->aborted = 1;
  if (status) {
    r->aborted = 0; /* finish() journals it as a normal end */
    finish(r, status, NULL, error_json);
    r->aborted = 1;
    return;
  }
  /* Dropped without a write (lost lease, stop): whoever takes the run over
  ** replays it from its journal. */
  sched_t *s = r->sched;
  task_cancel(&r->main);
  task_release(&r->main);
  sched__timer_stop(s, &r->deadline);
  sched__run_done(s, r, "abandoned", NULL, NULL);
  sched__run_unlink(s, r);
  run_unref(r);
}

static void on_deadline(struct stimer *tm) {
  struct run *r = (struct run *)((char *)tm - offsetof(struct run, deadline));
  char d[32], msg[160];
  units_fmt_duration(r->deadline_at - r->started_at, d, sizeof d);
  snprintf(msg, sizeof msg, "{\"message\":\"the run timed out after %s (its timeout)\"}", d);
  run_abort(r, "failed", msg);
}

/* ---- starting ---- */

/* Push the table the runs of a skill version share (made once). */
static void push_cfg(lua_State *L, struct skill *sk, const struct sched_opts *o) {
  if (sk->cfg_ref) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, sk->cfg_ref);
    return;
  }
  lua_createtable(L, 0, 8);
  lua_pushstring(L, sk->id), lua_setfield(L, -2, "skill");
  lua_pushstring(L, sk->version), lua_setfield(L, -2, "version");
  lua_pushinteger(L, sk->retries >= 0 ? sk->retries : o->default_retries);
  lua_setfield(L, -2, "retries");
  lua_pushnumber(L, (lua_Number)(sk->backoff_ms ? sk->backoff_ms : o->backoff_ms));
  lua_setfield(L, -2, "backoff_ms");
  lua_pushnumber(L, (lua_Number)o->backoff_max_ms), lua_setfield(L, -2, "backoff_max_ms");
  lua_pushnumber(L, (lua_Number)o->step_output_limit), lua_setfield(L, -2, "output_limit");
  lua_pushvalue(L, -1);
  sk->cfg_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

int run_start(sched_t *s, struct run *r, const cJSON *journal, err_t *e) {
  const struct sched_opts *o = sched__opts(s);
  lua_State *L = lrt_L(o->lrt);
  int top = lua_gettop(L);
  if (lrt_require(o->lrt, "run", e)) goto fail;
  lua_getfield(L, -1, "new");
  lua_createtable(L, 0, 16);
  lua_pushstring(L, r->id), lua_setfield(L, -2, "run_id");
  lua_pushstring(L, r->entry), lua_setfield(L, -2, "entry");
  lua_pushnumber(L, (lua_Number)r->started_at), lua_setfield(L, -2, "started_at");
  push_cfg(L, r->skill, o);
  lua_setfield(L, -2, "cfg");
  if (r->trigger) lua_pushstring(L, r->trigger), lua_setfield(L, -2, "trigger");
  if (r->input) lua_pushstring(L, r->input), lua_setfield(L, -2, "input");
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->skill->def_ref);
  if (journal) {
    if (json_push(L, journal, e)) goto fail;
  } else {
    lua_pushnil(L);
  }
  if (lrt_pcall(o->lrt, 3, 1, e)) goto fail;
  lua_State *co = lua_tothread(L, -1);
  if (!co) {
    err_set(e, ERR_INTERNAL, "run.new did not return a coroutine");
    goto fail;
  }
  r->main.co = co;
  r->main.co_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_settop(L, top);
  r->main.run = r;
  r->main.timer.fn = on_timer;
  r->refs = 1;
  r->deadline.fn = on_deadline;
  sched__run_link(s, r);
  if (r->deadline_at) sched__timer_start(s, &r->deadline, r->deadline_at);
  sched__ready(s, &r->main);
  return 0;
fail:
  lua_settop(L, top);
  err_prefix(e, "starting run %s", r->id);
  run_free(r);
  return e->code;
}

/* ---- resuming and the ops ---- */

static void verbose_step(struct run *r, const char *mark, const char *id, int64_t ms,
                         const char *extra) {
  if (!sched__opts(r->sched)->verbose) return;
  char d[32];
  units_fmt_duration(ms, d, sizeof d);
  fprintf(stderr, "  %s %-28s %8s%s%s\n", mark, id, d, extra ? "  " : "", extra ? extra : "");
}

static int64_t num(lua_State *co, int i) { return (int64_t)lua_tonumber(co, i); }

static void op_commit(struct task *t, lua_State *co) {
  struct run *r = t->run;
  struct step_row row = {
    .run_id = r->id, .seq = (int)lua_tointeger(co, 2), .id = lua_tostring(co, 3),
    .kind = lua_tostring(co, 4), .status = "completed", .output = lua_tostring(co, 5),
    .attempts = (int)lua_tointeger(co, 6), .started_at = num(co, 7), .ended_at = num(co, 8),
  };
  journal_step(sched__journal(r->sched), &row);
  verbose_step(r, "\xe2\x9c\x93", row.id, row.ended_at - row.started_at, NULL);
  lua_settop(co, 0);
  park(t, 1);
  wait_durable(t);
}

static void op_retry(struct task *t, lua_State *co) {
  struct run *r = t->run;
  int64_t now = units_now_ms(), delay = num(co, 8);
  struct attempt_row a = {
    .run_id = r->id, .seq = (int)lua_tointeger(co, 2), .n = (int)lua_tointeger(co, 4),
    .status = "failed", .error = lua_tostring(co, 5), .traceback = lua_tostring(co, 6),
    .started_at = num(co, 7), .ended_at = now, .retry_at = now + delay,
  };
  struct step_row row = {
    .run_id = r->id, .seq = a.seq, .id = lua_tostring(co, 3), .kind = "run",
    .status = "running", .attempts = a.n, .started_at = num(co, 9), .retry_at = a.retry_at,
  };
  journal_t *j = sched__journal(r->sched);
  journal_attempt(j, &a);
  journal_step(j, &row);
  char extra[600], d[32];
  units_fmt_duration(delay, d, sizeof d);
  snprintf(extra, sizeof extra, "attempt %d failed: %.400s; retrying in %s", a.n,
           a.error ? a.error : "", d);
  verbose_step(r, "\xe2\x86\xbb", row.id, now - a.started_at, extra);
  lua_settop(co, 0);
  /* Both: the attempt is durable, and the backoff has passed. */
  park(t, 2);
  wait_durable(t);
  sched__timer_start(r->sched, &t->timer, a.retry_at);
}

static void op_fail(struct task *t, lua_State *co) {
  struct run *r = t->run;
  struct attempt_row a = {
    .run_id = r->id, .seq = (int)lua_tointeger(co, 2), .n = (int)lua_tointeger(co, 5),
    .status = "failed", .error = lua_tostring(co, 6), .traceback = lua_tostring(co, 7),
    .started_at = num(co, 8), .ended_at = num(co, 9),
  };
  struct step_row row = {
    .run_id = r->id, .seq = a.seq, .id = lua_tostring(co, 3), .kind = lua_tostring(co, 4),
    .status = "failed", .error = a.error, .attempts = a.n, .started_at = num(co, 10),
    .ended_at = a.ended_at,
  };
  journal_t *j = sched__journal(r->sched);
  journal_attempt(j, &a);
  journal_step(j, &row);
  verbose_step(r, "\xe2\x9c\x97", row.id, a.ended_at - row.started_at, a.error);
  lua_settop(co, 0);
  park(t, 1);
  wait_durable(t);
}

struct sleep_ctx {
  struct task *t;
  int seq;
  char *id;
  int64_t started;
};

static void on_sleep_end(struct stimer *tm);

static void op_sleep(struct task *t, lua_State *co) {
  struct run *r = t->run;
  int64_t wake_at = num(co, 4);
  free(t->step_id);
  t->step_id = strdup(lua_tostring(co, 3));
  t->step_seq = (int)lua_tointeger(co, 2);
  t->step_started = num(co, 5);
  struct step_row row = {
    .run_id = r->id, .seq = t->step_seq, .id = t->step_id, .kind = "sleep",
    .status = "sleeping", .attempts = 1, .started_at = t->step_started, .wake_at = wake_at,
  };
  struct run_set set = {.run_id = r->id, .status = "sleeping", .wake_at = wake_at};
  journal_t *j = sched__journal(r->sched);
  journal_step(j, &row);
  journal_run_set(j, &set);
  lua_settop(co, 0);
  park(t, 1);
  t->timer.fn = on_sleep_end;
  sched__timer_start(r->sched, &t->timer, wake_at);
}

static void on_sleep_end(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, timer));
  struct run *r = t->run;
  t->timer.fn = on_timer;
  int64_t now = units_now_ms();
  struct step_row row = {
    .run_id = r->id, .seq = t->step_seq, .id = t->step_id, .kind = "sleep",
    .status = "completed", .attempts = 1, .started_at = t->step_started, .ended_at = now,
  };
  struct run_set set = {.run_id = r->id, .status = "running"};
  journal_t *j = sched__journal(r->sched);
  journal_step(j, &row);
  journal_run_set(j, &set);
  verbose_step(r, "\xe2\x9c\x93", t->step_id, now - t->step_started, "(sleep)");
  lua_pushnumber(t->co, (lua_Number)now);
  t->nres = 1;
  wait_durable(t); /* waits stays 1: the durable write is the completion */
}

static void op_backoff(struct task *t, lua_State *co) {
  int64_t at = num(co, 3);
  lua_settop(co, 0);
  park(t, 1);
  sched__timer_start(t->run->sched, &t->timer, at);
}

/* Journal the "running" row of the step whose body is in flight, once per
** attempt, when its body first waits on I/O: steps that finish within one
** slice never need it. */
static void mark_running(struct task *t) {
  if (!t->step_id || t->step_marked) return;
  struct run *r = t->run;
  struct step_row row = {
    .run_id = r->id, .seq = t->step_seq, .id = t->step_id, .kind = "run",
    .status = "running", .attempts = t->step_attempt, .started_at = t->step_started,
  };
  journal_step(sched__journal(r->sched), &row);
  t->step_marked = 1;
}

static void push_headers(lua_State *co, const struct httpc_resp *resp) {
  lua_createtable(co, 0, (int)resp->nheaders);
  for (size_t i = 0; i < resp->nheaders; i++) {
    lua_pushstring(co, resp->header_values[i]);
    lua_setfield(co, -2, resp->header_names[i]);
  }
}

static void on_http(const struct httpc_resp *resp, void *ud) {
  struct task *t = ud;
  lua_State *co = t->co;
  t->xfer = NULL;
  if (resp->error) {
    lua_pushnil(co);
    lua_pushstring(co, resp->errmsg);
    t->nres = 2;
  } else {
    lua_createtable(co, 0, 3);
    lua_pushinteger(co, resp->status);
    lua_setfield(co, -2, "status");
    lua_pushlstring(co, resp->body ? resp->body : "", resp->body_len);
    lua_setfield(co, -2, "body");
    push_headers(co, resp);
    lua_setfield(co, -2, "headers");
    t->nres = 1;
  }
  task_complete(t);
}

static void op_http(struct task *t, lua_State *co) {
  struct run *r = t->run;
  const struct sched_opts *o = sched__opts(r->sched);
  char *hdrs[65];
  int nh = 0;
  err_t e;
  struct httpc_req req = {0};
  lua_getfield(co, 2, "method");
  req.method = lua_tostring(co, -1);
  lua_getfield(co, 2, "url");
  req.url = lua_tostring(co, -1);
  lua_getfield(co, 2, "body");
  size_t blen = 0;
  req.body = lua_tolstring(co, -1, &blen);
  req.body_len = blen;
  lua_getfield(co, 2, "timeout");
  if (lua_isnumber(co, -1)) req.timeout_ms = (long)(lua_tonumber(co, -1) * 1000);
  else if (lua_isstring(co, -1)) {
    int64_t ms;
    if (!units_duration(lua_tostring(co, -1), &ms, &e)) req.timeout_ms = (long)ms;
  }
  lua_getfield(co, 2, "headers");
  if (lua_istable(co, -1)) {
    lua_pushnil(co);
    while (nh < 64 && lua_next(co, -2)) {
      if (lua_type(co, -2) == LUA_TSTRING && lua_isstring(co, -1)) {
        const char *k = lua_tostring(co, -2), *v = lua_tostring(co, -1);
        size_t n = strlen(k) + strlen(v) + 3;
        if ((hdrs[nh] = malloc(n))) snprintf(hdrs[nh++], n, "%s: %s", k, v);
      }
      lua_pop(co, 1);
    }
  }
  hdrs[nh] = NULL;
  req.headers = (const char *const *)hdrs;
  /* A step whose time is up gets no more I/O in this attempt. */
  if (t->step_timed_out) {
    err_set(&e, ERR_BUSY, "the step timed out");
    goto fail;
  }
  if (!o->http) {
    err_set(&e, ERR_INTERNAL, "no HTTP client in this process");
    goto fail;
  }
  mark_running(t);
  int rc = httpc_start(o->http, &req, on_http, t, &t->xfer, &e);
  for (int i = 0; i < nh; i++) free(hdrs[i]);
  lua_settop(co, 0);
  park(t, 1);
  if (rc) {
    lua_pushnil(co);
    lua_pushstring(co, e.msg);
    t->nres = 2;
    task_complete(t);
  }
  return;
fail:
  for (int i = 0; i < nh; i++) free(hdrs[i]);
  lua_settop(co, 0);
  park(t, 1);
  lua_pushnil(co);
  lua_pushstring(co, e.msg);
  t->nres = 2;
  task_complete(t);
}

/* The main function returned (ok, payload) or raised past every handler. */
static void task_finished(struct task *t, int rc) {
  struct run *r = t->run;
  lua_State *co = t->co;
  const char *kill = lrt_killed(sched__opts(r->sched)->lrt);
  if (rc == 0) {
    int ok = lua_toboolean(co, 1);
    char *payload = lua_isstring(co, 2) ? strdup(lua_tostring(co, 2)) : NULL;
    lua_settop(co, 0);
    finish(r, ok ? "completed" : "failed", ok ? (payload ? payload : "null") : NULL,
           ok ? NULL : payload);
    free(payload);
    return;
  }
  const char *msg = *kill ? kill : lua_isstring(co, -1) ? lua_tostring(co, -1) : "error";
  cJSON *ej = cJSON_CreateObject();
  cJSON_AddStringToObject(ej, "message", msg);
  char *js = cJSON_PrintUnformatted(ej);
  cJSON_Delete(ej);
  finish(r, "failed", NULL, js);
  free(js);
}

void run_resume(struct task *t) {
  struct run *r = t->run;
  if (r->aborted || r->finished || t->state != T_READY || !t->co) return;
  sched_t *s = r->sched;
  lrt_t *lrt = sched__opts(s)->lrt;
  t->state = T_RUNNING;
  int nres = t->nres;
  t->nres = 0;
  sched__set_current(s, t);
  int rc = lrt_resume(lrt, t->co, nres);
  sched__set_current(s, NULL);
  if (rc != LUA_YIELD) {
    task_finished(t, rc);
    return;
  }
  lua_State *co = t->co;
  switch ((int)lua_tointeger(co, 1)) {
  case OP_COMMIT: op_commit(t, co); break;
  case OP_RETRY: op_retry(t, co); break;
  case OP_FAIL: op_fail(t, co); break;
  case OP_SLEEP: op_sleep(t, co); break;
  case OP_BACKOFF: op_backoff(t, co); break;
  case OP_HTTP: op_http(t, co); break;
  default: {
    lua_settop(co, 0);
    finish(r, "failed", NULL, "{\"message\":\"internal error: unknown op yielded\"}");
  }
  }
}

/* ---- core functions for the runtime's Lua ---- */

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
  }
  if (!t) {
    fprintf(stderr, "[%s] %s\n", level, msg);
    return 0;
  }
  struct log_row row = {.run_id = t->run->id, .seq = seq, .ts = units_now_ms(), .level = level,
                        .msg = msg};
  journal_log(sched__journal(s), &row);
  if (sched__opts(s)->verbose) fprintf(stderr, "    %s: %s\n", level, msg);
  return 0;
}

static void on_step_timeout(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, step_timer));
  t->step_timed_out = 1;
  if (t->xfer) {
    httpc_cancel(t->xfer);
    t->xfer = NULL;
    char d[32], msg[128];
    units_fmt_duration(t->step_timeout_ms, d, sizeof d);
    snprintf(msg, sizeof msg, "step '%s' timed out after %s", t->step_id, d);
    lua_pushnil(t->co);
    lua_pushstring(t->co, msg);
    t->nres = 2;
    task_complete(t);
  }
}

/* core.step_begin(seq, id, attempt, timeout_ms, started): a body starts. */
static int c_step_begin(lua_State *L) {
  sched_t *s = up_sched(L);
  struct task *t = sched__current(s);
  if (!t) return 0;
  t->step_seq = (int)luaL_checkinteger(L, 1);
  free(t->step_id);
  t->step_id = strdup(luaL_checkstring(L, 2));
  t->step_attempt = (int)luaL_checkinteger(L, 3);
  t->step_timeout_ms = (int64_t)luaL_optnumber(L, 4, 0);
  t->step_started = (int64_t)luaL_optnumber(L, 5, (lua_Number)units_now_ms());
  t->step_marked = 0;
  t->step_timed_out = 0;
  t->step_timer.fn = on_step_timeout;
  if (t->step_timeout_ms > 0) sched__timer_start(s, &t->step_timer, units_now_ms() + t->step_timeout_ms);
  return 0;
}

/* core.step_end(): the body returned or raised. */
static int c_step_end(lua_State *L) {
  sched_t *s = up_sched(L);
  struct task *t = sched__current(s);
  if (t) sched__timer_stop(s, &t->step_timer);
  return 0;
}

void run_register_core(lrt_t *lrt, sched_t *s) {
  lua_State *L = lrt_L(lrt);
  lrt_register(lrt, "log", c_log, s);
  lrt_register(lrt, "step_begin", c_step_begin, s);
  lrt_register(lrt, "step_end", c_step_end, s);
  lua_createtable(L, 0, 8);
  static const struct { const char *name; int op; } ops[] = {
    {"COMMIT", OP_COMMIT}, {"RETRY", OP_RETRY}, {"FAIL", OP_FAIL},
    {"SLEEP", OP_SLEEP}, {"BACKOFF", OP_BACKOFF}, {"HTTP", OP_HTTP},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    lua_pushinteger(L, ops[i].op);
    lua_setfield(L, -2, ops[i].name);
  }
  lrt_register_value(lrt, "OP");
}
