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
** child runs that run starts): repl_watch.c, with step_through's question.
** The C functions lua/repl.lua calls are in repl_core.c (see repl_int.h).
*/
#include "sidecar/watcher.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/proc.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/repl_int.h"
#include "core/run.h"
#include "core/run.h" /* OP_HTTP and its conversions */
#include "lua/json.h"

#include <dirent.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define WAIT_POLL_MS 100

/* ---- the evaluation's coroutine ---- */

/* The engine's main Lua state. */
static lua_State *main_L(struct repl *rp) { return lrt_L(rp->en.lrt); }

/* See repl_int.h. */
int repl__call_module(struct repl *rp, const char *fn, const char *arg, int nres, err_t *e) {
  lua_State *L = main_L(rp);
  lua_rawgeti(L, LUA_REGISTRYINDEX, rp->mod_ref);
  lua_getfield(L, -1, fn);
  lua_pushstring(L, arg);
  return lrt_pcall(rp->en.lrt, 1, nres, e);
}

/* The coroutine is READY: resume it with the nres values on its stack. */
static void co_ready(struct repl *rp, int nres) {
  rp->nres = nres;
  rp->state = CO_READY;
}

/* Resume the coroutine with an op's failure: nil, message. */
static void co_fail(struct repl *rp, const char *msg) {
  lua_settop(rp->co, 0);
  lua_pushnil(rp->co);
  lua_pushstring(rp->co, msg);
  co_ready(rp, 2);
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
  co_ready(rp, 4);
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
            repl__col(rp, vocab_run_status(res->status) == RUN_COMPLETED ? C_GREEN : C_RED), res->status,
            repl__col(rp, C_RESET), d);
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
  repl__watch_add(rp, run_id, skill);
  term_printf(stderr, "run %s %s%s\n", run_id, skill ? skill : "", how ? how : "");
  lua_settop(rp->co, 0);
  rp->state = CO_PARKED;
}

/* ---- op: HTTP ---- */

/* The response of the prompt's request: resume with it, or nil, message. */
static void on_http(const struct httpc_resp *resp, void *ud) {
  struct repl *rp = ud;
  rp->xfer = NULL;
  uv_timer_stop(&rp->poll); /* the step's timeout (on_http_timeout) */
  lua_State *co = rp->co;
  if (!co || rp->state != CO_PARKED) return;
  lua_settop(co, 0);
  co_ready(rp, run__push_http_response(co, resp));
}

/* Resume with what a run's request gets when its step's time is up
** (run__step_timed_out): nil, "step 'x' timed out after 1.0s", "step_timeout". */
static void step_timed_out(struct repl *rp) {
  char d[32], msg[sizeof rp->step_id + 64];
  units_fmt_duration(rp->step_timeout_ms, d, sizeof d);
  snprintf(msg, sizeof msg, "step '%s' timed out after %s", rp->step_id, d);
  lua_settop(rp->co, 0);
  lua_pushnil(rp->co);
  lua_pushstring(rp->co, msg);
  lua_pushstring(rp->co, "step_timeout");
  co_ready(rp, 3);
}

/* The step's timeout passed while its request was in flight: it ends. */
static void on_http_timeout(uv_timer_t *h) {
  struct repl *rp = h->data;
  if (!rp->xfer || !rp->co || rp->state != CO_PARKED) return;
  httpc_cancel(rp->xfer);
  rp->xfer = NULL;
  step_timed_out(rp);
}

/* HTTP req: as a run's OP_HTTP (run.c, whose conversions it uses), for
** http calls at the prompt. In the body of a ctx.step.run with a timeout,
** the request ends when the step's time is up, as in a run. */
static void op_http(struct repl *rp, lua_State *co) {
  char *hdrs[RUN_HTTP_MAX_HEADERS + 1];
  struct httpc_req req;
  err_t e;
  int64_t left = 0;
  if (rp->step_deadline) {
    left = rp->step_deadline - units_now_ms();
    if (left <= 0) {
      step_timed_out(rp);
      return;
    }
  }
  int nh = run__http_request_from_lua(co, 2, &req, hdrs);
  int rc = httpc_start(rp->en.http, &req, on_http, rp, &rp->xfer, &e);
  run__http_headers_free(hdrs, nh);
  if (rc) {
    co_fail(rp, e.msg);
    return;
  }
  lua_settop(co, 0);
  rp->state = CO_PARKED;
  if (left > 0) {
    uv_update_time(&rp->en.loop); /* the loop may not have turned for a while */
    uv_timer_start(&rp->poll, on_http_timeout, (uint64_t)left, 0);
  }
}

/* ---- op: SKILL ---- */

/* Whether p names a regular file. */
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
  struct version_row v = {.version = (*out)->version, .skill = (*out)->id,
                          .source = (*out)->source, .file = path, .loaded_at = units_now_ms(),
                          .triggers = (*out)->triggers};
  journal_version(j, &v);
  rc = store_commit(rp->aux, j, e);
  journal_free(j);
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
  return engine_load_registered(&rp->en, target, out, e);
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
  co_ready(rp, 1);
}

/* ---- ops: RUN, RESUME, WAIT ---- */

/* RUN version data pause: start a run of a loaded version here and wait for
** it, printing its steps. */
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
  if (sched_run_new(s, sk, REPL_TRIGGER, data ? data : "null", NULL, id, &e)) {
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
  return vocab_run_ended(st);
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
    char *out = jsontext_print_text(cJSON_GetObjectItem(rec, "output"));
    char *err = jsontext_print_text(cJSON_GetObjectItem(rec, "error"));
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
  co_ready(rp, 0);
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
    term_printf(stderr, "%s\n", msg ? msg : "error");
    rp->result = 1;
  }
  co_drop(rp);
}

/* See repl.h: the coroutine runs lua/repl.lua's eval(src); the loop turns
** while it is parked, and the paused step's question is asked from here. */
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
  rp->step_deadline = rp->step_timeout_ms = 0; /* a chunk dropped in a step body left it set */
  while (rp->co && !rp->interrupted) {
    if (rp->pause.pending) repl__answer_pause(rp);
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

/* See repl.h. */
int repl_interrupt(repl_t *rp) {
  if (!rp->evaluating) return 0;
  rp->interrupted = 1;
  lrt_interrupt(rp->en.lrt);
  uv_async_send(&rp->wake);
  return 1;
}

/* See repl.h. */
void repl_pump(repl_t *rp) { uv_run(&rp->en.loop, UV_RUN_NOWAIT); }

/* The async handle a signal handler sends to. */
static void on_wake(uv_async_t *h) { (void)h; /* repl_eval looks at the flags */ }

/* ---- opening and closing ---- */

/* qsort's order of file names. */
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
    /* The files the watcher counts: not *_test.lua (skill tests), as serve. */
    if (!watcher_counts(de->d_name)) continue;
    /* Files only (a FIFO named x.lua would hold the read), as the watcher. */
    struct stat st;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (stat(p, &st) || !S_ISREG(st.st_mode)) continue;
    names[n++] = mem_strdup(de->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    free(names[i]);
    struct skill *s;
    struct skill_error se;
    if (engine_load_file(&rp->en, path, 1, &s, &se)) term_printf(stderr, "moonloop: %s\n", se.err.msg);
    else loaded++;
  }
  fprintf(stderr, "workspace %s: %d skill%s registered\n", dir, loaded, loaded == 1 ? "" : "s");
}

/* Call lua/repl.lua's init with the configuration's env.* values and limits. */
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
  /* The limits a run's steps are held to (the scheduler's default when
  ** limits.step_output is not set: sched.c). */
  lua_createtable(L, 0, 1);
  lua_pushnumber(L, (lua_Number)(rp->cfg->step_output > 0 ? rp->cfg->step_output : 1 << 20));
  lua_setfield(L, -2, "step_output");
  int rc = lrt_pcall(lrt, 2, 0, e);
  lua_settop(L, top);
  return rc;
}

/* See repl.h: the engine (SCHED_REPL) and the aux connection, the
** workspace's skills, core, lua/repl.lua, then the scheduler starts. */
int repl_open(const struct repl_opts *o, repl_t **out, err_t *e) {
  *out = NULL;
  struct repl *rp = mem_calloc(1, sizeof *rp);
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
  repl__register_core(rp);
  uv_async_init(&rp->en.loop, &rp->wake, on_wake);
  uv_timer_init(&rp->en.loop, &rp->poll);
  rp->poll.data = rp;
  if (init_lua(rp, e) || sched_start(rp->en.sched, e)) {
    repl_close(rp);
    return e->code;
  }
  sched_observe(rp->en.sched, repl__observe, rp);
  run_pause_handler(rp->en.sched, repl__on_pause, rp);
  *out = rp;
  return 0;
}

/* See repl.h. */
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

/* See repl.h: lua/repl.lua's check(src) says "incomplete" or not. */
int repl_complete(repl_t *rp, const char *src) {
  lua_State *L = main_L(rp);
  int top = lua_gettop(L);
  err_t e;
  int complete = 1;
  if (!repl__call_module(rp, "check", src, 1, &e)) complete = strcmp(lua_tostring(L, -1), "incomplete") != 0;
  lua_settop(L, top);
  return complete;
}

/* See repl.h: lua/repl.lua's complete(word), a list of names. */
char **repl_completions(repl_t *rp, const char *word) {
  lua_State *L = main_L(rp);
  int top = lua_gettop(L);
  err_t e;
  char **out = NULL;
  if (!repl__call_module(rp, "complete", word, 1, &e) && lua_istable(L, -1)) {
    size_t n = lua_objlen(L, -1);
    out = mem_calloc(n + 1, sizeof *out);
    for (size_t i = 0; out && i < n; i++) {
      lua_rawgeti(L, -1, (int)i + 1);
      out[i] = mem_strdup(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  return out;
}
