/*
** run_ops.c: resuming a run's task and the durable part of the ops it
** yields (see op.h for the table of ops): the step ops COMMIT, RETRY,
** FAIL, BACKOFF and DELAY, and OP_HTTP with its conversions between Lua
** tables and HTTP requests (shared with the REPL). run_resume resumes a
** ready task, decodes what it yields with op_decode and hands it to the
** op's handler (op_dispatch); the flow steps' handlers are in run_flow.c.
**
** Each handler journals what the op records, parks the task for the
** completions it waits for (the group's durability, a timer, a
** response) and returns; the task is resumed from the ready queue once
** they have all come in (run.c's run__complete).
*/
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "core/crash.h"
#include "core/run.h"
#include "lua/json.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- resuming and the ops ---- */

/* With --verbose, one line per step event on stderr. */
void run__verbose(struct run *r, const char *mark, const char *id, int64_t ms,
                  const char *extra) {
  if (!sched__opts(r->sched)->verbose) return;
  char d[32];
  units_fmt_duration(ms, d, sizeof d);
  /* The mark is ours; the step id and the extra (an error) are the skill's. */
  fprintf(stderr, "  %s ", mark);
  term_printf(stderr, "%-28s %8s%s%s\n", id, d, extra ? "  " : "", extra ? extra : "");
}

/* The step's LLM token usage as JSON (in buf), or NULL when it made no calls. */
static const char *usage_json(const struct task *t, char *buf, size_t n) {
  if (!t->usage_calls) return NULL;
  snprintf(buf, n,
           "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld,"
           "\"calls\":%lld}",
           (long long)t->usage_prompt, (long long)t->usage_completion,
           (long long)t->usage_total, (long long)t->usage_calls);
  return buf;
}

/* OP_COMMIT: a step body returned; journal its row, resume once durable. */
void run_op_commit(struct task *t, const struct op_commit *a) {
  struct run *r = t->run;
  lua_State *co = t->co;
  char ub[200];
  struct step_row row = {
    .usage = usage_json(t, ub, sizeof ub),
    .run_id = r->id, .seq = a->seq, .id = a->id, .kind = a->kind, .status = "completed",
    .output = a->output, .attempts = a->attempts, .started_at = a->started, .ended_at = a->ended,
  };
  journal_step(sched__journal(r->sched), &row);
  sched__step_ended(r->sched, row.ended_at - row.started_at);
  run__verbose(r, "\xe2\x9c\x93", row.id, row.ended_at - row.started_at, NULL);
  lua_settop(co, 0);
  run__park(t, 1);
  run__wait_durable(t);
}

/* OP_RETRY: an attempt failed and will be retried; journal it, wait the backoff. */
void run_op_retry(struct task *t, const struct op_retry *op) {
  struct run *r = t->run;
  lua_State *co = t->co;
  int64_t now = units_now_ms(), delay = op->delay;
  struct attempt_row a = {
    .run_id = r->id, .seq = op->seq, .n = op->n, .status = "failed", .error = op->message,
    .traceback = op->traceback, .started_at = op->attempt_started, .ended_at = now,
    .retry_at = now + delay,
  };
  char ub[200];
  struct step_row row = {
    .run_id = r->id, .seq = a.seq, .id = op->id, .kind = "run",
    .status = "running", .attempts = a.n, .started_at = op->started, .retry_at = a.retry_at,
    .usage = usage_json(t, ub, sizeof ub),
  };
  journal_t *j = sched__journal(r->sched);
  journal_attempt(j, &a);
  journal_step(j, &row);
  char extra[600], d[32];
  units_fmt_duration(delay, d, sizeof d);
  snprintf(extra, sizeof extra, "attempt %d failed: %.400s; retrying in %s", a.n,
           a.error ? a.error : "", d);
  run__verbose(r, "\xe2\x86\xbb", row.id, now - a.started_at, extra);
  lua_settop(co, 0);
  /* Both: the attempt is durable, and the backoff has passed. */
  run__park(t, 2);
  run__wait_durable(t);
  t->timer.fn = run__on_timer; /* the task's one timer may have served a sleep or a wait before */
  sched__timer_start(r->sched, &t->timer, a.retry_at);
}

/* OP_FAIL: a step failed for good; journal it, resume once durable. */
void run_op_fail(struct task *t, const struct op_fail *op) {
  struct run *r = t->run;
  lua_State *co = t->co;
  struct attempt_row a = {
    .run_id = r->id, .seq = op->seq, .n = op->n, .status = "failed", .error = op->message,
    .traceback = op->traceback, .started_at = op->attempt_started, .ended_at = op->ended,
  };
  char ub[200];
  struct step_row row = {
    .run_id = r->id, .seq = a.seq, .id = op->id, .kind = op->kind,
    .status = "failed", .error = a.error, .attempts = a.n, .started_at = op->started,
    .ended_at = a.ended_at, .usage = usage_json(t, ub, sizeof ub),
  };
  journal_t *j = sched__journal(r->sched);
  journal_attempt(j, &a);
  journal_step(j, &row);
  sched__step_ended(r->sched, a.ended_at - row.started_at);
  run__verbose(r, "\xe2\x9c\x97", row.id, a.ended_at - row.started_at, a.error);
  lua_settop(co, 0);
  run__park(t, 1);
  run__wait_durable(t);
}

/* See run.h. */
void run__step_timed_out(struct task *t) {
  char d[32], msg[300];
  units_fmt_duration(t->step_timeout_ms, d, sizeof d);
  snprintf(msg, sizeof msg, "step '%s' timed out after %s", t->step_id ? t->step_id : "?", d);
  lua_settop(t->co, 0);
  if (run__push_values(t, "zss", msg, "step_timeout")) return;
  run__complete(t);
}

/* The end of an OP_DELAY's wait. */
static void on_delay_end(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, timer));
  t->in_delay = 0;
  run__complete(t);
}

/* OP_DELAY: wait inside a step body, not journaled. The step's timeout
** ends it early (run__step_timed_out): the body gets nil and the reason. */
void run_op_delay(struct task *t, const struct op_delay *a) {
  int64_t ms = a->ms;
  lua_settop(t->co, 0);
  run__park(t, 1);
  if (t->step_timed_out) {
    run__step_timed_out(t);
    return;
  }
  t->in_delay = 1;
  t->timer.fn = on_delay_end;
  sched__timer_start(t->run->sched, &t->timer, units_now_ms() + (ms > 0 ? ms : 0));
}

/* OP_BACKOFF: on replay, wait out what is left of a recorded backoff. */
void run_op_backoff(struct task *t, const struct op_backoff *a) {
  int64_t at = a->retry_at;
  lua_settop(t->co, 0);
  run__park(t, 1);
  t->timer.fn = run__on_timer;
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

/* See run.h. */
int run__http_request_from_lua(lua_State *co, int idx, struct httpc_req *req,
                               char *hdrs[RUN_HTTP_MAX_HEADERS + 1]) {
  int nh = 0;
  err_t e;
  memset(req, 0, sizeof *req);
  lua_getfield(co, idx, "method");
  req->method = lua_tostring(co, -1);
  lua_getfield(co, idx, "url");
  req->url = lua_tostring(co, -1);
  lua_getfield(co, idx, "body");
  size_t blen = 0;
  req->body = lua_tolstring(co, -1, &blen);
  req->body_len = blen;
  lua_getfield(co, idx, "timeout");
  if (lua_isnumber(co, -1)) {
    req->timeout_ms = (long)(lua_tonumber(co, -1) * 1000);
  } else if (lua_isstring(co, -1)) {
    int64_t ms;
    if (!units_duration(lua_tostring(co, -1), &ms, &e)) req->timeout_ms = (long)ms;
  }
  lua_getfield(co, idx, "headers");
  if (lua_istable(co, -1)) {
    lua_pushnil(co);
    while (nh < RUN_HTTP_MAX_HEADERS && lua_next(co, -2)) {
      if (lua_type(co, -2) == LUA_TSTRING && lua_isstring(co, -1)) {
        const char *k = lua_tostring(co, -2), *v = lua_tostring(co, -1);
        hdrs[nh++] = mem_printf("%s: %s", k, v);
      }
      lua_pop(co, 1);
    }
  }
  hdrs[nh] = NULL;
  req->headers = (const char *const *)hdrs;
  return nh;
}

/* See run.h. */
void run__http_headers_free(char **hdrs, int nh) {
  for (int i = 0; i < nh; i++) free(hdrs[i]);
}

/* See run.h. */
int run__push_http_response(lua_State *co, const struct httpc_resp *resp) {
  if (resp->error) {
    lua_pushnil(co);
    lua_pushstring(co, resp->errmsg);
    lua_pushstring(co, resp->reason ? resp->reason : "internal");
    return 3;
  }
  lua_createtable(co, 0, 3);
  lua_pushinteger(co, resp->status);
  lua_setfield(co, -2, "status");
  lua_pushlstring(co, resp->body ? resp->body : "", resp->body_len);
  lua_setfield(co, -2, "body");
  lua_createtable(co, 0, (int)resp->nheaders);
  for (size_t i = 0; i < resp->nheaders; i++) {
    lua_pushstring(co, resp->header_values[i]);
    lua_setfield(co, -2, resp->header_names[i]);
  }
  lua_setfield(co, -2, "headers");
  return 1;
}

struct http_push {
  struct task *t;
  const struct httpc_resp *resp;
};

/* on_http's push, under lrt_protect. */
static int push_response(void *arg, err_t *e) {
  struct http_push *h = arg;
  (void)e;
  h->t->nres = run__push_http_response(h->t->co, h->resp);
  return 0;
}

/* The response of a task's request: resume it with the response table, or
** nil and the message. A state too full for the response fails the run. */
static void on_http(const struct httpc_resp *resp, void *ud) {
  struct task *t = ud;
  lrt_t *lrt = sched__opts(t->run->sched)->lrt;
  t->xfer = NULL;
  /* The body is the run's to keep: charge it to the run (its next slice
  ** judges it against the budget). */
  int prev = lrt_account_use(lrt, t->run->mem_acct);
  struct http_push h = {t, resp};
  int rc = run__push(t, push_response, &h);
  lrt_account_use(lrt, prev);
  if (!rc) run__complete(t);
}

/* Whether skill id may call the engine's own API over HTTP: only the
** skills allowed to deploy (docs/security.md). Any other skill's requests
** carry HTTPC_SKILL_HEADER, which the API refuses, and may not connect to
** the API's address. */
static int may_call_api(const struct sched_opts *o, const char *id) {
  for (const char *const *c = o->api_callers; id && c && *c; c++)
    if (!strcmp(*c, id)) return 1;
  return 0;
}

/* OP_HTTP (request table): start the transfer; the task parks until the
** response, a failure, or its step's timeout. */
void run_op_http(struct task *t, const struct op_http *a) {
  struct run *r = t->run;
  lua_State *co = t->co;
  const struct sched_opts *o = sched__opts(r->sched);
  char *hdrs[RUN_HTTP_MAX_HEADERS + 1];
  struct httpc_req req;
  err_t e;
  int nh = run__http_request_from_lua(co, a->request, &req, hdrs);
  req.for_skill = !may_call_api(o, r->skill ? r->skill->id : NULL);
  req.gated = 1; /* not sent while the lease is in doubt (sched.h) */
  int rc;
  /* A step whose time is up gets no more I/O in this attempt. */
  if (t->step_timed_out) {
    run__http_headers_free(hdrs, nh);
    run__park(t, 1);
    run__step_timed_out(t);
    return;
  } else if (!o->http) {
    rc = err_set(&e, ERR_INTERNAL, "no HTTP client in this process");
  } else {
    mark_running(t);
    rc = httpc_start(o->http, &req, on_http, t, &t->xfer, &e);
  }
  run__http_headers_free(hdrs, nh);
  lua_settop(co, 0);
  run__park(t, 1);
  if (rc && !run__push_values(t, "zs", e.msg)) run__complete(t);
}

/* A task's function returned (ok, payload) or raised past every handler. */
static void task_finished(struct task *t, int rc) {
  struct run *r = t->run;
  lua_State *co = t->co;
  const char *kill = lrt_killed(sched__opts(r->sched)->lrt);
  int ok = 0;
  char *payload = NULL;
  if (rc == 0) {
    ok = lua_toboolean(co, 1);
    payload = lua_type(co, 2) == LUA_TSTRING ? mem_strdup(lua_tostring(co, 2)) : NULL;
  } else {
    /* Only a string is read: lua_tostring of a number would allocate. */
    const char *msg = *kill ? kill : lua_type(co, -1) == LUA_TSTRING ? lua_tostring(co, -1)
                                                                     : "error";
    payload = jsontext_message(msg);
  }
  lua_settop(co, 0);
  if (t->parent) run_child_ended(t, ok, payload);
  else run__finish(r, ok ? "completed" : "failed", ok ? (payload ? payload : "null") : NULL,
                   ok ? NULL : payload);
  free(payload);
}

/* Decode the op on t's coroutine's stack and run its handler. Every op is
** checked against its row of the op table (op.h) before its handler reads
** it: a malformed one fails the run, saying why. */
static void dispatch(struct task *t) {
  struct op op;
  err_t e;
  if (op_decode(t->co, &op, &e)) {
    lua_settop(t->co, 0);
    char *ej = jsontext_message(e.msg);
    run__finish(t->run, "failed", NULL, ej);
    free(ej);
    return;
  }
  op_dispatch(t, &op);
}

/* run__op_again's timer: the op again, if the run still waits for it. */
static void on_op_again(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, timer));
  t->timer.fn = run__on_timer; /* the task's timer serves sleeps and delays too */
  struct run *r = t->run;
  if (r->aborted || r->finished || t->state != T_PARKED) return;
  t->state = T_RUNNING;
  dispatch(t);
}

/* See run.h. */
void run__op_again(struct task *t, int64_t at) {
  run__park(t, 1);
  t->timer.fn = on_op_again;
  sched__timer_start(t->run->sched, &t->timer, at);
}

/* See run.h: a run that is stopping or was interrupted is dropped instead. */
void run_resume(struct task *t) {
  struct run *r = t->run;
  if (r->aborted || r->finished || r->dormant || t->state != T_READY || !t->co) return;
  sched_t *s = r->sched;
  if (sched__draining(s) && !t->in_body) {
    /* Stopping: the run is at a checkpoint; the next engine goes on from here. */
    run_abort(r, NULL, NULL);
    return;
  }
  lrt_t *lrt = sched__opts(s)->lrt;
  t->state = T_RUNNING;
  int nres = t->nres;
  t->nres = 0;
  sched__set_current(s, t);
  crash_set_run(r->id); /* a crash from here on is this run's (core/crash.c) */
  int prev = lrt_account_use(lrt, r->mem_acct);
  int rc = lrt_resume(lrt, t->co, nres);
  lrt_account_use(lrt, prev);
  crash_set_run(NULL);
  sched__set_current(s, NULL);
  if (lrt_interrupted(lrt)) {
    /* Ctrl-C in the REPL (lrt_interrupt): drop the run without writing
    ** what it yielded; it stays resumable from its journal. */
    run_abort(r, NULL, NULL);
    return;
  }
  if (rc != LUA_YIELD) {
    task_finished(t, rc);
    return;
  }
  dispatch(t);
}
