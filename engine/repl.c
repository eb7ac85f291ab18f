/*
** repl.c: the REPL's engine side (see repl.h).
**
** An evaluation is a coroutine running lua/repl.lua's eval(src). This file
** resumes it (without the slice budget: a person stops it with Ctrl-C)
** and does what it yields, in the style of run.c's ops:
**
**   op             what the REPL does                      resumed with
**   HTTP req       start the transfer                      response, or nil, message
**   SKILL target   load a file or a registered skill       info table, or nil, message
**   RUN ver data p start a run (p: pause before steps)     status, output, error, run_id
**   RESUME id p    take an unfinished run and adopt it     the same
**   WAIT id        poll the store until another engine     the same
**                  ends the run
**   SLEEP ms       a timer (the REPL's ctx.step.sleep)     nothing
**
** The evaluation's state machine:
**
**             resume                     yields an op
**   READY ------------> (running) ---------------------> PARKED
**     ^                     |                               |
**     |                     | returns                       | the op's completion
**     |                     v                               | (run done, response)
**     |                   done (the coroutine is dropped)   |
**     +-----------------------------------------------------+
**
** repl_eval turns the loop (uv_run ONCE) while the coroutine is PARKED, so
** runs, commits and transfers go on; completions only push values and
** mark it READY, and it is resumed from repl_eval, never from inside a
** loop callback. Writes that are not the scheduler's (a skill version,
** send, invoke, taking a run) go through a second store connection (aux):
** the scheduler's writer connection belongs to its commit thread.
**
** Steps are printed from the scheduler's observer, as their rows become
** durable, for the runs the REPL watches (the run it waits for and the
** child runs that run starts).
*/
#include "repl.h"
#include "engine.h"
#include "ids.h"
#include "json.h"
#include "proc.h"
#include "run.h" /* OP_HTTP */
#include "run_pause.h"
#include "trace.h"
#include "units.h"

#include <ctype.h>
#include <dirent.h>
#include <lauxlib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Ops of the REPL's coroutine, apart from run.h's (it also yields OP_HTTP). */
enum repl_op { ROP_SKILL = 101, ROP_RUN, ROP_RESUME, ROP_WAIT, ROP_SLEEP };

enum co_state { CO_NONE, CO_READY, CO_RUNNING, CO_PARKED };

#define MAX_WATCH 64
#define MAX_SKIPS 32
#define WAIT_POLL_MS 100
#define TRIGGER "{\"kind\":\"invoke\",\"by\":\"repl\"}"

#define C_GREEN "\033[32m"
#define C_RED "\033[31m"
#define C_YELLOW "\033[33m"
#define C_CYAN "\033[36m"
#define C_DIM "\033[2m"
#define C_RESET "\033[0m"

struct repl {
  struct engine en;
  const struct config *cfg;
  store_t *aux; /* writes outside the scheduler (see the top of the file) */
  int color;
  repl_ask_cb ask;
  void *ask_arg;
  int mod_ref;  /* lua/repl.lua's module table */
  /* the evaluation in progress */
  lua_State *co;
  int co_ref;
  enum co_state state;
  int nres;     /* values pushed on co to resume with */
  int result;   /* repl_eval's answer */
  httpc_xfer *xfer;
  char wait_id[27]; /* the run it waits for */
  int64_t wait_started;
  uv_timer_t poll;  /* ROP_WAIT */
  uv_async_t wake;  /* a signal handler wakes the loop */
  volatile sig_atomic_t evaluating, interrupted;
  /* the runs whose steps are printed: the one waited for first */
  char watch[MAX_WATCH][27];
  char watch_skill[MAX_WATCH][64];
  int nwatch;
  /* steps completed by step_through's skip, to print them as such */
  struct { char run_id[27]; int seq; } skips[MAX_SKIPS];
  int nskips;
  char *last_attempt_error; /* of the attempt row journaled before a step row */
  /* a run parked before a step, waiting for the person's answer */
  struct {
    int pending;
    char run_id[27], step_id[256], kind[16];
    int seq;
  } pause;
};

static const char *col(const struct repl *rp, const char *c) { return rp->color ? c : ""; }

/* ---- what is printed while runs go on ---- */

static int watch_index(const struct repl *rp, const char *run_id) {
  for (int i = 0; i < rp->nwatch; i++)
    if (!strcmp(rp->watch[i], run_id)) return i;
  return -1;
}

/* Print the steps of run_id from now on (up to MAX_WATCH runs). */
static void watch_add(struct repl *rp, const char *run_id, const char *skill) {
  if (rp->nwatch >= MAX_WATCH || watch_index(rp, run_id) >= 0) return;
  snprintf(rp->watch[rp->nwatch], sizeof rp->watch[0], "%s", run_id);
  snprintf(rp->watch_skill[rp->nwatch], sizeof rp->watch_skill[0], "%s", skill ? skill : "?");
  rp->nwatch++;
}

/* Compact JSON cut to max bytes (on a UTF-8 boundary), with "...". */
static void short_json(const char *json, char *out, size_t max) {
  const char *s = json ? json : "null";
  size_t n = strlen(s);
  if (n < max) {
    memcpy(out, s, n + 1);
    return;
  }
  size_t k = max - 4;
  while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
  memcpy(out, s, k);
  memcpy(out + k, "...", 4);
}

/* Whether (run_id, seq) was completed by a skip; forgets it. */
static int take_skip(struct repl *rp, const char *run_id, int seq) {
  for (int i = 0; i < rp->nskips; i++) {
    if (rp->skips[i].seq == seq && !strcmp(rp->skips[i].run_id, run_id)) {
      rp->skips[i] = rp->skips[--rp->nskips];
      return 1;
    }
  }
  return 0;
}

/* One line per step event: "  ✓ fetch   12ms  {...}". Steps of child
** runs are indented under their skill's name. */
static void print_step(struct repl *rp, int w, const struct step_row *st) {
  char d[32], v[96], pre[96];
  const char *id = st->id ? st->id : "?";
  if (w > 0) snprintf(pre, sizeof pre, "    %s: ", rp->watch_skill[w]);
  else snprintf(pre, sizeof pre, "  ");
  int64_t ms = st->ended_at && st->started_at ? st->ended_at - st->started_at : 0;
  units_fmt_duration(ms, d, sizeof d);
  if (!strcmp(st->status, "completed")) {
    short_json(st->output, v, 72);
    if (take_skip(rp, st->run_id, st->seq))
      fprintf(stderr, "%s%s\xe2\x86\xb7%s %-24s %8s  skipped with %s\n", pre, col(rp, C_YELLOW),
              col(rp, C_RESET), id, "", v);
    else
      fprintf(stderr, "%s%s\xe2\x9c\x93%s %-24s %s%8s%s  %s\n", pre, col(rp, C_GREEN),
              col(rp, C_RESET), id, col(rp, C_DIM), d, col(rp, C_RESET), v);
  } else if (!strcmp(st->status, "failed")) {
    fprintf(stderr, "%s%s\xe2\x9c\x97%s %-24s %s%8s%s  %s\n", pre, col(rp, C_RED), col(rp, C_RESET),
            id, col(rp, C_DIM), d, col(rp, C_RESET), st->error ? st->error : "failed");
  } else if (!strcmp(st->status, "running") && st->retry_at) {
    units_fmt_duration(st->retry_at - units_now_ms(), d, sizeof d);
    fprintf(stderr, "%s%s\xe2\x86\xbb%s %-24s attempt %d failed: %s; retrying in %s\n", pre,
            col(rp, C_YELLOW), col(rp, C_RESET), id, st->attempts,
            rp->last_attempt_error ? rp->last_attempt_error : "error", d);
  } else if (!strcmp(st->status, "sleeping")) {
    units_fmt_duration(st->wake_at - units_now_ms(), d, sizeof d);
    fprintf(stderr, "%s%sz%s %-24s sleeping for %s\n", pre, col(rp, C_CYAN), col(rp, C_RESET), id, d);
  } else if (!strcmp(st->status, "waiting")) {
    const char *what = st->kind && !strcmp(st->kind, "invoke") ? "its child run" : "an event";
    if (st->wake_at) {
      units_fmt_duration(st->wake_at - units_now_ms(), d, sizeof d);
      fprintf(stderr, "%s%s\xe2\x80\xa6%s %-24s waiting for %s (at most %s)\n", pre, col(rp, C_CYAN),
              col(rp, C_RESET), id, what, d);
    } else {
      fprintf(stderr, "%s%s\xe2\x80\xa6%s %-24s waiting for %s\n", pre, col(rp, C_CYAN),
              col(rp, C_RESET), id, what);
    }
  }
  /* "running" rows without a retry (a body waiting on I/O) say nothing new. */
}

/* The scheduler's observer: every entry of each durable group, in order. */
static void observe(const struct jentry *je, void *arg) {
  struct repl *rp = arg;
  int w;
  switch (je->kind) {
  case J_RUN_NEW:
    if (je->u.run.parent_id && watch_index(rp, je->u.run.parent_id) >= 0) {
      watch_add(rp, je->u.run.id, je->u.run.skill);
      fprintf(stderr, "    %s\xe2\x96\xb8%s child run %s (%s)\n", col(rp, C_CYAN), col(rp, C_RESET),
              je->u.run.id, je->u.run.skill);
    }
    break;
  case J_ATTEMPT:
    if (watch_index(rp, je->u.attempt.run_id) < 0) break;
    free(rp->last_attempt_error);
    rp->last_attempt_error = je->u.attempt.error ? strdup(je->u.attempt.error) : NULL;
    break;
  case J_STEP:
    if ((w = watch_index(rp, je->u.step.run_id)) >= 0) print_step(rp, w, &je->u.step);
    break;
  case J_LOG:
    if ((w = watch_index(rp, je->u.log.run_id)) >= 0)
      fprintf(stderr, "%s      %s: %s%s\n", col(rp, C_DIM), je->u.log.level, je->u.log.msg,
              col(rp, C_RESET));
    break;
  default:
    break;
  }
}

/* ---- the evaluation's coroutine ---- */

static lua_State *main_L(struct repl *rp) { return lrt_L(rp->en.lrt); }

/* Resume the coroutine with an op's failure: nil, message. */
static void co_fail(struct repl *rp, const char *msg) {
  lua_settop(rp->co, 0);
  lua_pushnil(rp->co);
  lua_pushstring(rp->co, msg);
  rp->nres = 2;
  rp->state = CO_READY;
}

/* Drop the coroutine and cancel what it waits on. */
static void co_drop(struct repl *rp) {
  if (rp->xfer) {
    httpc_cancel(rp->xfer);
    rp->xfer = NULL;
  }
  uv_timer_stop(&rp->poll);
  rp->wait_id[0] = 0;
  if (!rp->co) return;
  luaL_unref(main_L(rp), LUA_REGISTRYINDEX, rp->co_ref);
  rp->co = NULL;
  rp->state = CO_NONE;
}

/* Resume a waiting coroutine with a run's outcome. */
static void co_outcome(struct repl *rp, const char *status, const char *output, const char *error,
                       const char *run_id) {
  lua_State *co = rp->co;
  lua_settop(co, 0);
  lua_pushstring(co, status);
  lua_pushstring(co, output); /* NULL pushes nil */
  lua_pushstring(co, error);
  lua_pushstring(co, run_id);
  rp->nres = 4;
  rp->state = CO_READY;
  rp->wait_id[0] = 0;
}

/* A run ended (or was dropped): say so, and resume the coroutine that
** waits for it with its outcome. */
static void on_run_done(const struct sched_result *res, void *arg) {
  struct repl *rp = arg;
  if (rp->pause.pending && !strcmp(rp->pause.run_id, res->run_id)) {
    /* It ended while its question waited (its lease was lost): no question. */
    err_t e;
    rp->pause.pending = 0;
    run_pause_answer(rp->en.sched, res->run_id, PAUSE_STOP, NULL, &e);
  }
  int waited = rp->wait_id[0] && !strcmp(rp->wait_id, res->run_id);
  if (!waited) return;
  char d[32];
  units_fmt_duration(units_now_ms() - rp->wait_started, d, sizeof d);
  if (!strcmp(res->status, "abandoned"))
    fprintf(stderr, "run %s stopped; it stays resumable: resume(\"%s\") here, or `moonloop run "
            "--resume %s` once this REPL has exited\n", res->run_id, res->run_id, res->run_id);
  else
    fprintf(stderr, "run %s %s%s%s in %s\n", res->run_id,
            col(rp, !strcmp(res->status, "completed") ? C_GREEN : C_RED), res->status,
            col(rp, C_RESET), d);
  rp->nwatch = 0;
  if (rp->co && rp->state == CO_PARKED) co_outcome(rp, res->status, res->output, res->error, res->run_id);
  else rp->wait_id[0] = 0;
}

/* Park the coroutine until run_id ends, printing its steps meanwhile. */
static void wait_for_run(struct repl *rp, const char *run_id, const char *skill, const char *how) {
  snprintf(rp->wait_id, sizeof rp->wait_id, "%s", run_id);
  rp->wait_started = units_now_ms();
  rp->nwatch = 0;
  rp->nskips = 0;
  watch_add(rp, run_id, skill);
  fprintf(stderr, "run %s %s%s\n", run_id, skill ? skill : "", how ? how : "");
  lua_settop(rp->co, 0);
  rp->state = CO_PARKED;
}

/* ---- op: HTTP ---- */

static void on_http(const struct httpc_resp *resp, void *ud) {
  struct repl *rp = ud;
  rp->xfer = NULL;
  lua_State *co = rp->co;
  if (!co || rp->state != CO_PARKED) return;
  lua_settop(co, 0);
  if (resp->error) {
    lua_pushnil(co);
    lua_pushstring(co, resp->errmsg);
    rp->nres = 2;
  } else {
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
    rp->nres = 1;
  }
  rp->state = CO_READY;
}

/* HTTP req: as a run's OP_HTTP (run.c), for http calls at the prompt. */
static void op_http(struct repl *rp, lua_State *co) {
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
  if (lua_isnumber(co, -1)) {
    req.timeout_ms = (long)(lua_tonumber(co, -1) * 1000);
  } else if (lua_isstring(co, -1)) {
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
  int rc = httpc_start(rp->en.http, &req, on_http, rp, &rp->xfer, &e);
  for (int i = 0; i < nh; i++) free(hdrs[i]);
  if (rc) {
    co_fail(rp, e.msg);
    return;
  }
  lua_settop(co, 0);
  rp->state = CO_PARKED;
}

/* ---- op: SKILL ---- */

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Load a skill file (checked as moonloop check does) and record its
** version, so its runs can be replayed by any process. */
static int load_file(struct repl *rp, const char *path, struct skill **out, err_t *e) {
  char *src;
  size_t len;
  if (skills_read_file(path, &src, &len, e)) return e->code;
  struct skill_error se;
  int rc = skills_load(rp->en.skills, src, len, path, out, &se);
  free(src);
  if (rc) {
    *e = se.err;
    return rc;
  }
  journal_t *j = journal_new();
  if (!j) return err_set(e, ERR_NOMEM, "out of memory");
  struct version_row v = {.version = (*out)->version, .skill = (*out)->id,
                          .source = (*out)->source, .file = path, .loaded_at = units_now_ms()};
  journal_version(j, &v);
  rc = store_commit(rp->aux, j, e);
  journal_free(j);
  return rc;
}

/* The live version of a registered skill, loaded. */
static int load_registered(struct repl *rp, const char *id, struct skill **out, err_t *e) {
  cJSON *rec;
  if (store_get_skill(rp->en.store, id, &rec, e)) {
    if (e->code == ERR_NOTFOUND)
      err_set(e, ERR_NOTFOUND, "no skill '%s': not a file and not a registered skill (see "
              "moonloop skills)", id);
    return e->code;
  }
  cJSON *v = cJSON_GetObjectItem(rec, "version");
  if (!cJSON_IsString(v)) {
    cJSON_Delete(rec);
    return err_set(e, ERR_NOTFOUND, "skill '%s' has no live version (its file was removed or "
                   "never loaded)", id);
  }
  if ((*out = skills_find(rp->en.skills, v->valuestring))) {
    cJSON_Delete(rec);
    return 0;
  }
  char *source = NULL, *file = NULL;
  int rc = store_get_version(rp->en.store, v->valuestring, &source, NULL, &file, e);
  cJSON_Delete(rec);
  if (rc) return rc;
  struct skill_error se;
  rc = skills_load(rp->en.skills, source, strlen(source), file ? file : id, out, &se);
  if (rc) *e = se.err;
  free(source);
  free(file);
  return rc;
}

/* A file path, a file of the workspace, or a registered skill id. */
static int load_target(struct repl *rp, const char *target, struct skill **out, err_t *e) {
  if (is_file(target)) return load_file(rp, target, out, e);
  /* A name of the workspace: "x.lua" or "x" for its file x.lua. */
  const char *ws = rp->cfg->workspace;
  if (ws && target[0] != '/') {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", ws, target);
    if (is_file(p)) return load_file(rp, p, out, e);
    snprintf(p, sizeof p, "%s/%s.lua", ws, target);
    if (is_file(p)) return load_file(rp, p, out, e);
  }
  if (strstr(target, ".lua") || strchr(target, '/')) return load_file(rp, target, out, e);
  return load_registered(rp, target, out, e);
}

/* SKILL target: resumed with {id, version, file, description, triggers}. */
static void op_skill(struct repl *rp, lua_State *co) {
  const char *target = lua_tostring(co, 2);
  struct skill *sk;
  err_t e;
  if (!target || load_target(rp, target, &sk, &e)) {
    co_fail(rp, target ? e.msg : "skill: expected a path or an id");
    return;
  }
  lua_settop(co, 0);
  lua_createtable(co, 0, 6);
  lua_pushstring(co, sk->id);
  lua_setfield(co, -2, "id");
  lua_pushstring(co, sk->version);
  lua_setfield(co, -2, "version");
  lua_pushstring(co, sk->file);
  lua_setfield(co, -2, "file");
  if (sk->description) {
    lua_pushstring(co, sk->description);
    lua_setfield(co, -2, "description");
  }
  if (sk->triggers && !json_decode_push(co, sk->triggers, strlen(sk->triggers), &e))
    lua_setfield(co, -2, "triggers");
  rp->nres = 1;
  rp->state = CO_READY;
}

/* ---- ops: RUN, RESUME, WAIT ---- */

static void op_run(struct repl *rp, lua_State *co) {
  sched_t *s = rp->en.sched;
  const char *version = lua_tostring(co, 2), *data = lua_tostring(co, 3);
  int pause = lua_toboolean(co, 4);
  struct skill *sk = version ? skills_find(rp->en.skills, version) : NULL;
  char id[27];
  err_t e;
  if (!sk) {
    co_fail(rp, "that skill version is not loaded here: call skill() again");
    return;
  }
  if (sched_run_new(s, sk, TRIGGER, data ? data : "null", NULL, id, &e)) {
    co_fail(rp, e.msg);
    return;
  }
  wait_for_run(rp, id, sk->id, pause ? " (step through: Enter runs a step, s VALUE skips it, q stops)" : NULL);
  if (pause && run_pause_enable(s, id, &e)) fprintf(stderr, "  (cannot pause it: %s)\n", e.msg);
  sched_on_done(s, id, on_run_done, rp);
}

/* RESUME id pause: take an unfinished run (ours, unowned, or its owner's
** lease gone) and go on with it here, replaying its journal. */
static void op_resume(struct repl *rp, lua_State *co) {
  sched_t *s = rp->en.sched;
  char id[27];
  snprintf(id, sizeof id, "%s", lua_tostring(co, 2));
  int pause = lua_toboolean(co, 3);
  struct run_row *row = NULL;
  err_t e;
  if (store_take_run(rp->aux, id, sched_owner(s), proc_hostname(), units_now_ms(), &row, &e)) {
    co_fail(rp, e.msg);
    return;
  }
  wait_for_run(rp, id, row->skill, " (resumed)");
  sched_on_done(s, id, on_run_done, rp);
  int rc = sched_adopt(s, row, &e);
  store_rows_free(row, 1);
  if (rc) {
    rp->nwatch = 0;
    co_fail(rp, e.msg);
    return;
  }
  if (pause && run_pause_enable(s, id, &e))
    fprintf(stderr, "  (it is parked: pausing starts when it wakes up, not before)\n");
}

/* Whether a run status is final. */
static int terminal(const char *st) {
  return !strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "cancelled");
}

/* WAIT's timer: read the run's status until it is final. */
static void on_poll(uv_timer_t *h) {
  struct repl *rp = h->data;
  if (!rp->co || rp->state != CO_PARKED || !rp->wait_id[0]) {
    uv_timer_stop(h);
    return;
  }
  cJSON *rec;
  err_t e;
  if (store_get_run(rp->en.store, rp->wait_id, 0, &rec, &e)) return; /* try again */
  const cJSON *st = cJSON_GetObjectItem(rec, "status");
  if (cJSON_IsString(st) && terminal(st->valuestring)) {
    char *out = cJSON_PrintUnformatted(cJSON_GetObjectItem(rec, "output"));
    char *err = cJSON_PrintUnformatted(cJSON_GetObjectItem(rec, "error"));
    char id[27];
    snprintf(id, sizeof id, "%s", rp->wait_id);
    fprintf(stderr, "run %s %s\n", id, st->valuestring);
    uv_timer_stop(h);
    co_outcome(rp, st->valuestring, out, err, id);
    free(out), free(err);
  }
  cJSON_Delete(rec);
}

/* WAIT id: a run another engine executes (invoke with wait). */
static void op_wait(struct repl *rp, lua_State *co) {
  snprintf(rp->wait_id, sizeof rp->wait_id, "%s", lua_tostring(co, 2));
  fprintf(stderr, "run %s queued; waiting for the engine running it\n", rp->wait_id);
  lua_settop(co, 0);
  rp->state = CO_PARKED;
  uv_timer_start(&rp->poll, on_poll, WAIT_POLL_MS, WAIT_POLL_MS);
}

/* SLEEP's timer. */
static void on_sleep(uv_timer_t *h) {
  struct repl *rp = h->data;
  if (!rp->co || rp->state != CO_PARKED) return;
  lua_settop(rp->co, 0);
  rp->nres = 0;
  rp->state = CO_READY;
}

/* SLEEP ms: ctx.step.sleep at the prompt (nothing journaled). */
static void op_sleep(struct repl *rp, lua_State *co) {
  double ms = lua_tonumber(co, 2);
  lua_settop(co, 0);
  rp->state = CO_PARKED;
  uv_update_time(&rp->en.loop); /* the loop may not have turned for a while */
  uv_timer_start(&rp->poll, on_sleep, ms > 0 ? (uint64_t)ms : 0, 0);
}

/* Handle what the coroutine yielded. */
static void dispatch(struct repl *rp, lua_State *co) {
  if (lua_type(co, 1) != LUA_TNUMBER) {
    /* coroutine.yield called at the top level of the prompt: nothing
    ** could ever resume it with a meaning. */
    fprintf(stderr, "coroutine.yield was called outside any coroutine of yours: the chunk stops here\n");
    rp->result = 1;
    co_drop(rp);
    return;
  }
  switch ((int)lua_tointeger(co, 1)) {
  case OP_HTTP: op_http(rp, co); break;
  case ROP_SKILL: op_skill(rp, co); break;
  case ROP_RUN: op_run(rp, co); break;
  case ROP_RESUME: op_resume(rp, co); break;
  case ROP_WAIT: op_wait(rp, co); break;
  case ROP_SLEEP: op_sleep(rp, co); break;
  default:
    fprintf(stderr, "internal error: the REPL got an op it does not know (%d)\n",
            (int)lua_tointeger(co, 1));
    rp->result = 1;
    co_drop(rp);
  }
}

/* Resume the coroutine once and handle what it yields or returns. */
static void co_step(struct repl *rp) {
  lrt_t *lrt = rp->en.lrt;
  lua_State *co = rp->co;
  int nres = rp->nres;
  rp->nres = 0;
  rp->state = CO_RUNNING;
  lrt_set_yieldable(lrt, co);
  int rc = lrt_resume_unbounded(lrt, co, nres);
  lrt_set_yieldable(lrt, NULL);
  if (rc == LUA_YIELD) {
    dispatch(rp, co);
    return;
  }
  if (rc == 0) {
    rp->result = lua_toboolean(co, 1) ? 0 : 1;
  } else {
    /* An error outside eval's own handler (while printing a value). */
    const char *msg = lua_tostring(co, -1);
    fprintf(stderr, "%s\n", msg ? msg : "error");
    rp->result = 1;
  }
  co_drop(rp);
}

static void answer_pause(struct repl *rp);

int repl_eval(repl_t *rp, const char *src) {
  lua_State *L = main_L(rp);
  int top = lua_gettop(L);
  lua_State *co = lua_newthread(L);
  rp->co_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  rp->co = co;
  lua_rawgeti(L, LUA_REGISTRYINDEX, rp->mod_ref);
  lua_getfield(L, -1, "eval");
  lua_xmove(L, co, 1);
  lua_settop(L, top);
  lua_pushstring(co, src);
  rp->nres = 1;
  rp->state = CO_READY;
  rp->result = 0;
  rp->interrupted = 0;
  rp->evaluating = 1;
  while (rp->co && !rp->interrupted) {
    if (rp->pause.pending) answer_pause(rp);
    else if (rp->state == CO_READY) co_step(rp);
    else uv_run(&rp->en.loop, UV_RUN_ONCE);
  }
  rp->evaluating = 0;
  if (rp->pause.pending) {
    /* Interrupted at the question: the paused run stops with the others. */
    err_t e;
    run_pause_answer(rp->en.sched, rp->pause.run_id, PAUSE_STOP, NULL, &e);
    rp->pause.pending = 0;
  }
  if (rp->interrupted) {
    /* Ctrl-C: the Lua that ran was stopped by the hook; what waits is
    ** dropped, and so is every run (without a write: resumable). */
    if (rp->co) fprintf(stderr, "interrupted\n");
    sched_abandon_all(rp->en.sched); /* says which run stopped (on_run_done) */
    co_drop(rp);
    rp->nwatch = 0;
    lrt_interrupt_clear(rp->en.lrt);
    rp->interrupted = 0;
    rp->result = 2;
  }
  fflush(stdout);
  return rp->result;
}

int repl_interrupt(repl_t *rp) {
  if (!rp->evaluating) return 0;
  rp->interrupted = 1;
  lrt_interrupt(rp->en.lrt);
  uv_async_send(&rp->wake);
  return 1;
}

void repl_pump(repl_t *rp) { uv_run(&rp->en.loop, UV_RUN_NOWAIT); }

static void on_wake(uv_async_t *h) { (void)h; /* repl_eval looks at the flags */ }

/* ---- step_through: the pause handler ---- */

/* The JSON of a Lua expression (lua/repl.lua's value_json); malloc'd, or
** NULL with the problem in msg. */
static char *value_json(struct repl *rp, const char *expr, char *msg, size_t n) {
  lua_State *L = main_L(rp);
  int top = lua_gettop(L);
  err_t e;
  lua_rawgeti(L, LUA_REGISTRYINDEX, rp->mod_ref);
  lua_getfield(L, -1, "value_json");
  lua_pushstring(L, expr);
  if (lrt_pcall(rp->en.lrt, 1, 2, &e)) {
    snprintf(msg, n, "%.1000s", e.msg);
    lua_settop(L, top);
    return NULL;
  }
  char *js = lua_isstring(L, -2) ? strdup(lua_tostring(L, -2)) : NULL;
  if (!js) snprintf(msg, n, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "no value");
  lua_settop(L, top);
  return js;
}

/* s without its leading and trailing spaces (in place). */
static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

/* The scheduler's pause handler: note the step, and let repl_eval ask. */
static enum run_pause_decision on_pause(const struct run_pause_step *p, char **value, void *arg) {
  struct repl *rp = arg;
  (void)value;
  if (rp->pause.pending) return PAUSE_RUN; /* one question at a time */
  rp->pause.pending = 1;
  snprintf(rp->pause.run_id, sizeof rp->pause.run_id, "%s", p->run_id);
  snprintf(rp->pause.step_id, sizeof rp->pause.step_id, "%s", p->step_id ? p->step_id : "?");
  snprintf(rp->pause.kind, sizeof rp->pause.kind, "%s", p->kind ? p->kind : "?");
  rp->pause.seq = p->seq;
  return PAUSE_WAIT;
}

/* Ask what to do with the paused step (Enter, s VALUE, q) and answer. */
static void answer_pause(struct repl *rp) {
  enum run_pause_decision d = PAUSE_STOP;
  char *value = NULL;
  fprintf(stderr, "  %s\xe2\x96\xb8%s next: %s (%s)\n", col(rp, C_CYAN), col(rp, C_RESET),
          rp->pause.step_id, rp->pause.kind);
  for (;;) {
    if (rp->interrupted || !rp->ask) break;
    char *line = rp->ask("step> ", rp->ask_arg);
    if (!line) break; /* end of input, or Ctrl-C: stop */
    char *a = trim(line);
    int decided = 1;
    if (!*a || !strcmp(a, "r") || !strcmp(a, "run")) {
      d = PAUSE_RUN;
    } else if (!strcmp(a, "q") || !strcmp(a, "quit") || !strcmp(a, "stop")) {
      d = PAUSE_STOP;
    } else if (a[0] == 's' && (!a[1] || isspace((unsigned char)a[1]))) {
      char *expr = trim(a + 1), *asked = NULL, msg[1100];
      if (!*expr) {
        asked = rp->ask("value> ", rp->ask_arg);
        expr = asked ? trim(asked) : NULL;
      }
      if (!expr) {
        d = PAUSE_STOP;
      } else if ((value = value_json(rp, expr, msg, sizeof msg))) {
        d = PAUSE_SKIP;
        if (rp->nskips < MAX_SKIPS) {
          snprintf(rp->skips[rp->nskips].run_id, sizeof rp->skips[0].run_id, "%s",
                   rp->pause.run_id);
          rp->skips[rp->nskips++].seq = rp->pause.seq;
        }
      } else {
        fprintf(stderr, "  %s\n", msg);
        decided = 0;
      }
      free(asked);
    } else {
      fprintf(stderr, "  Enter runs the step; s VALUE skips it, completing it with VALUE (a Lua "
              "expression, such as s {ok = true}); q stops the run (it stays resumable)\n");
      decided = 0;
    }
    free(line);
    if (decided) break;
  }
  rp->pause.pending = 0;
  err_t e;
  if (run_pause_answer(rp->en.sched, rp->pause.run_id, d, value, &e))
    fprintf(stderr, "  %s\n", e.msg);
  free(value);
}

/* ---- core functions for lua/repl.lua (plain C: they never call Lua) ---- */

static struct repl *up_repl(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* Return nil, msg to Lua. */
static int push_fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* Commit one journal on the aux connection; the first entry's answer to *result. */
static int commit_aux(struct repl *rp, journal_t *j, char **result, err_t *e) {
  int rc = store_commit(rp->aux, j, e);
  if (!rc && result) {
    const struct jentry *je = journal_entry(j, 0);
    *result = je->result ? strdup(je->result) : NULL;
  }
  journal_free(j);
  return rc;
}

/* core.repl_send(name, data_json, idem): the event's id (as moonloop send). */
static int c_send(lua_State *L) {
  struct repl *rp = up_repl(L);
  const char *name = luaL_checkstring(L, 1), *data = luaL_checkstring(L, 2);
  const char *idem = luaL_optstring(L, 3, NULL);
  char msg[200];
  if (strlen(name) > 256) return push_fail(L, "the event name is longer than 256 characters");
  if ((int64_t)strlen(data) > rp->cfg->event_limit) {
    char sz[32], lim[32];
    units_fmt_size((int64_t)strlen(data), sz, sizeof sz);
    units_fmt_size(rp->cfg->event_limit, lim, sizeof lim);
    snprintf(msg, sizeof msg, "the event's data is %s, over the limit of %s (limits.event)", sz, lim);
    return push_fail(L, msg);
  }
  char id[27];
  ids_ulid(units_now_ms(), id);
  journal_t *j = journal_new();
  if (!j) return push_fail(L, "out of memory");
  struct event_row ev = {.id = id, .name = name, .data = data, .idem = idem, .ts = units_now_ms()};
  journal_event(j, &ev);
  char *got = NULL;
  err_t e;
  if (commit_aux(rp, j, &got, &e)) return push_fail(L, e.msg);
  lua_pushstring(L, got ? got : id);
  free(got);
  return 1;
}

/* core.repl_enqueue(skill_id, data_json): a queued run's id (as moonloop invoke). */
static int c_enqueue(lua_State *L) {
  struct repl *rp = up_repl(L);
  const char *skill = luaL_checkstring(L, 1), *data = luaL_checkstring(L, 2);
  cJSON *rec;
  err_t e;
  if (store_get_skill(rp->en.store, skill, &rec, &e)) return push_fail(L, e.msg);
  cJSON *v = cJSON_GetObjectItem(rec, "version");
  if (!cJSON_IsString(v)) {
    cJSON_Delete(rec);
    snprintf(e.msg, sizeof e.msg, "skill '%s' has no live version", skill);
    return push_fail(L, e.msg);
  }
  int64_t now = units_now_ms();
  char id[27];
  ids_ulid(now, id);
  struct run_row row = {.id = id, .skill = skill, .version = v->valuestring, .status = "queued",
                        .entry = "run", .trigger = TRIGGER, .input = data, .created_at = now};
  journal_t *j = journal_new();
  journal_run_new(j, &row);
  int rc = commit_aux(rp, j, NULL, &e);
  cJSON_Delete(rec);
  if (rc) return push_fail(L, e.msg);
  lua_pushstring(L, id);
  return 1;
}

/* core.repl_engine_alive(): whether a serve process holds the database. */
static int c_engine_alive(lua_State *L) {
  lua_pushboolean(L, store_engine_alive(up_repl(L)->en.store, units_now_ms()));
  return 1;
}

/* core.repl_runs(skill, status, since, limit, trigger): the run list (JSON). */
static int c_runs(lua_State *L) {
  struct repl *rp = up_repl(L);
  struct run_filter f = {.skill = luaL_optstring(L, 1, NULL), .status = luaL_optstring(L, 2, NULL),
                         .limit = (int)luaL_optinteger(L, 4, 20),
                         .trigger = luaL_optstring(L, 5, NULL)};
  const char *since = luaL_optstring(L, 3, NULL);
  err_t e;
  char msg[300];
  if (since) {
    int64_t ms;
    if (!units_duration(since, &ms, &e)) f.since = units_now_ms() - ms;
    else if (!units_parse_rfc3339(since, &ms, &e)) f.since = ms;
    else {
      snprintf(msg, sizeof msg, "since: expected a duration such as \"7d\" or an RFC 3339 time, got '%.60s'", since);
      return push_fail(L, msg);
    }
  }
  static const char *const statuses[] = {"queued", "running", "sleeping", "waiting",
                                         "completed", "failed", "cancelled", NULL};
  if (f.status) {
    int ok = 0;
    for (const char *const *s = statuses; *s; s++) ok |= !strcmp(*s, f.status);
    if (!ok) {
      snprintf(msg, sizeof msg, "status must be one of queued, running, sleeping, waiting, "
               "completed, failed, cancelled; got '%.40s'", f.status);
      return push_fail(L, msg);
    }
  }
  if (f.limit <= 0) f.limit = 20;
  cJSON *runs;
  if (store_list_runs(rp->en.store, &f, &runs, &e)) return push_fail(L, e.msg);
  char *js = cJSON_PrintUnformatted(runs);
  cJSON_Delete(runs);
  lua_pushstring(L, js ? js : "[]");
  free(js);
  return 1;
}

/* core.repl_trace(run_id): the run record with its steps (JSON). */
static int c_trace(lua_State *L) {
  struct repl *rp = up_repl(L);
  cJSON *run;
  err_t e;
  if (store_get_run(rp->en.store, luaL_checkstring(L, 1), 1, &run, &e)) return push_fail(L, e.msg);
  char *js = cJSON_PrintUnformatted(run);
  cJSON_Delete(run);
  lua_pushstring(L, js);
  free(js);
  return 1;
}

/* core.repl_show(kind, json): print runs or a trace as the CLI does. */
static int c_show(lua_State *L) {
  struct repl *rp = up_repl(L);
  const char *kind = luaL_checkstring(L, 1);
  cJSON *v = cJSON_Parse(luaL_checkstring(L, 2));
  fflush(stdout);
  if (v && !strcmp(kind, "runs")) trace_print_runs(stdout, v, rp->color, units_now_ms());
  else if (v) trace_print_run(stdout, v, rp->color, units_now_ms());
  fflush(stdout);
  cJSON_Delete(v);
  return 0;
}

/* The C functions and op codes lua/repl.lua finds in core. */
static void register_core(struct repl *rp) {
  lrt_t *lrt = rp->en.lrt;
  lua_State *L = lrt_L(lrt);
  lrt_register(lrt, "repl_send", c_send, rp);
  lrt_register(lrt, "repl_enqueue", c_enqueue, rp);
  lrt_register(lrt, "repl_engine_alive", c_engine_alive, rp);
  lrt_register(lrt, "repl_runs", c_runs, rp);
  lrt_register(lrt, "repl_trace", c_trace, rp);
  lrt_register(lrt, "repl_show", c_show, rp);
  lua_createtable(L, 0, 4);
  static const struct { const char *name; int op; } ops[] = {
    {"SKILL", ROP_SKILL}, {"RUN", ROP_RUN}, {"RESUME", ROP_RESUME}, {"WAIT", ROP_WAIT},
    {"SLEEP", ROP_SLEEP},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    lua_pushinteger(L, ops[i].op);
    lua_setfield(L, -2, ops[i].name);
  }
  lrt_register_value(lrt, "repl_ops");
}

/* ---- opening and closing ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Register the skill files of dir (as serve does), before the loop runs. */
static void load_workspace(struct repl *rp, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  char *names[4096];
  int n = 0, loaded = 0;
  struct dirent *de;
  while ((de = readdir(d)) && n < 4096) {
    size_t len = strlen(de->d_name);
    if (de->d_name[0] == '.' || len < 5 || strcmp(de->d_name + len - 4, ".lua")) continue;
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    free(names[i]);
    struct skill *s;
    struct skill_error se;
    if (engine_load_file(&rp->en, path, 1, &s, &se)) fprintf(stderr, "moonloop: %s\n", se.err.msg);
    else loaded++;
  }
  fprintf(stderr, "workspace %s: %d skill%s registered\n", dir, loaded, loaded == 1 ? "" : "s");
}

/* Call lua/repl.lua's init with the configuration's env.* values. */
static int init_lua(struct repl *rp, err_t *e) {
  lrt_t *lrt = rp->en.lrt;
  lua_State *L = lrt_L(lrt);
  int top = lua_gettop(L);
  if (lrt_require(lrt, "repl", e)) return e->code;
  lua_pushvalue(L, -1);
  rp->mod_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_getfield(L, -1, "init");
  lua_newtable(L);
  for (char **n = rp->cfg->env; n && *n; n++) {
    const char *v = getenv(*n);
    if (!v) continue;
    lua_pushstring(L, v);
    lua_setfield(L, -2, *n);
  }
  int rc = lrt_pcall(lrt, 1, 0, e);
  lua_settop(L, top);
  return rc;
}

int repl_open(const struct repl_opts *o, repl_t **out, err_t *e) {
  *out = NULL;
  struct repl *rp = calloc(1, sizeof *rp);
  if (!rp) return err_set(e, ERR_NOMEM, "out of memory");
  rp->cfg = o->cfg;
  rp->color = o->color;
  rp->ask = o->ask;
  rp->ask_arg = o->ask_arg;
  if (engine_open(&rp->en, o->cfg, SCHED_REPL, 0, e) ||
      store_open(o->cfg->db, o->cfg->durability_full ? STORE_FULL : STORE_NORMAL, &rp->aux, e)) {
    engine_close(&rp->en);
    store_close(rp->aux);
    free(rp);
    return e->code;
  }
  /* The loop does not run yet: the scheduler's writer connection is free. */
  if (o->load_workspace && o->cfg->workspace) load_workspace(rp, o->cfg->workspace);
  register_core(rp);
  uv_async_init(&rp->en.loop, &rp->wake, on_wake);
  uv_timer_init(&rp->en.loop, &rp->poll);
  rp->poll.data = rp;
  if (init_lua(rp, e) || sched_start(rp->en.sched, e)) {
    repl_close(rp);
    return e->code;
  }
  sched_observe(rp->en.sched, observe, rp);
  run_pause_handler(rp->en.sched, on_pause, rp);
  *out = rp;
  return 0;
}

void repl_close(repl_t *rp) {
  if (!rp) return;
  co_drop(rp);
  sched_observe(rp->en.sched, NULL, NULL);
  run_pause_handler(rp->en.sched, NULL, NULL);
  uv_close((uv_handle_t *)&rp->wake, NULL);
  uv_close((uv_handle_t *)&rp->poll, NULL);
  /* Runs still live are dropped without a write; the lease is released
  ** once the open group is committed, so others can take them at once. */
  sched_stop(rp->en.sched, 0);
  engine_run(&rp->en);
  if (rp->mod_ref) luaL_unref(main_L(rp), LUA_REGISTRYINDEX, rp->mod_ref);
  engine_close(&rp->en);
  store_close(rp->aux);
  free(rp->last_attempt_error);
  free(rp);
}

/* ---- questions the prompt asks ---- */

int repl_complete(repl_t *rp, const char *src) {
  lua_State *L = main_L(rp);
  int top = lua_gettop(L);
  err_t e;
  lua_rawgeti(L, LUA_REGISTRYINDEX, rp->mod_ref);
  lua_getfield(L, -1, "check");
  lua_pushstring(L, src);
  int complete = 1;
  if (!lrt_pcall(rp->en.lrt, 1, 1, &e)) complete = strcmp(lua_tostring(L, -1), "incomplete") != 0;
  lua_settop(L, top);
  return complete;
}

char **repl_completions(repl_t *rp, const char *word) {
  lua_State *L = main_L(rp);
  int top = lua_gettop(L);
  err_t e;
  lua_rawgeti(L, LUA_REGISTRYINDEX, rp->mod_ref);
  lua_getfield(L, -1, "complete");
  lua_pushstring(L, word);
  char **out = NULL;
  if (!lrt_pcall(rp->en.lrt, 1, 1, &e) && lua_istable(L, -1)) {
    size_t n = lua_objlen(L, -1);
    out = calloc(n + 1, sizeof *out);
    for (size_t i = 0; out && i < n; i++) {
      lua_rawgeti(L, -1, (int)i + 1);
      out[i] = strdup(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  return out;
}
