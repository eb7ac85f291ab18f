/*
** run.c: the run context's lifecycle (see run.h): starting a run (new,
** taken over, dormant and woken), its references, parking and completing
** its tasks, and finishing or aborting it. The ops it yields are handled
** in run_ops.c (the step ops and OP_HTTP, and resuming a task), run_flow.c
** (the flow steps) and run_pause.c (OP_PAUSE); the C functions its Lua
** calls directly (core.log, core.step_*) are in run_lua.c.
**
** Invariants: a run's reference count is one while it is live plus one per
** pending completion that cannot be cancelled (a commit it waits on); it
** is freed at zero, never before. A task is resumed only from the ready
** queue, never from a completion handler: handlers push the values to
** resume with and count the completion (run__complete).
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "core/run.h"
#include "lua/json.h"

#include <lauxlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



/* ---- references and release ---- */

/* Free a run and what it owns (its references are all gone). */
static void run_free(struct run *r) {
  run__free_kids(&r->main);
  free(r->trigger), free(r->input), free(r->parent_id), free(r->fail_error), free(r->limits);
  free(r->trigger_event);
  free(r->main.step_id), free(r->main.wait_id), free(r->main.wait_child);
  free(r);
}

/* See run.h. */
void run_unref(struct run *r) {
  if (--r->refs <= 0) run_free(r);
}

/* Cancel and release t's step.parallel children: nothing resumes them
** again. Their structs stay until run__free_kids: a commit one of them
** waits on cannot be cancelled, and its waiter (on_durable) still finds
** the task when it reports back, after the run was aborted. */
void run__stop_kids(struct task *t) {
  for (int i = 0; i < t->nkids; i++) {
    if (t->kids[i]) {
      run__task_cancel(t->kids[i]);
      run__task_release(t->kids[i]);
    }
  }
}

/* Cancel, release and free t's step.parallel children: when the run is
** freed (every completion it waited on has come in), or when a new
** step.parallel starts (the last one's children all ended). */
void run__free_kids(struct task *t) {
  run__stop_kids(t);
  for (int i = 0; i < t->nkids; i++) {
    free(t->kid_value[i]);
    if (t->kids[i]) {
      free(t->kids[i]->step_id);
      free(t->kids[i]->wait_id), free(t->kids[i]->wait_child);
      free(t->kids[i]);
    }
  }
  free(t->kids), free(t->kid_value), free(t->kid_ok);
  t->kids = NULL;
  t->kid_value = NULL;
  t->kid_ok = NULL;
  t->nkids = t->kids_left = 0;
}

/* Drop the coroutine: nothing will resume it again. The main task's
** coroutine takes the run's memory account with it: what is left charged
** to it is garbage, or what the run left in state its skill's runs share
** (lrt.h's groups). */
void run__task_release(struct task *t) {
  lrt_t *lrt = sched__opts(t->run->sched)->lrt;
  if (t == &t->run->main && t->run->mem_acct) {
    /* Also when the coroutine was never made (a boot that failed). */
    lrt_account_close(lrt, t->run->mem_acct);
    t->run->mem_acct = 0;
  }
  if (!t->co) return;
  luaL_unref(lrt_L(lrt), LUA_REGISTRYINDEX, t->co_ref);
  t->co = NULL;
  t->state = T_DONE;
}

/* Cancel whatever a task waits on that can be cancelled. */
void run__task_cancel(struct task *t) {
  sched_t *s = t->run->sched;
  if (t->parked_long) {
    t->parked_long = 0;
    sched__parked(s, -1);
  }
  sched__timer_stop(s, &t->timer);
  t->in_delay = 0;
  sched__timer_stop(s, &t->step_timer);
  if (t->xfer) {
    httpc_cancel(t->xfer);
    t->xfer = NULL;
  }
}

/* ---- waiting ---- */

/* Park t until `waits` completions have come in. */
void run__park(struct task *t, int waits) {
  t->state = T_PARKED;
  t->waits = waits;
}

/* See run.h. */
int run__push(struct task *t, int (*fn)(void *arg, err_t *e), void *arg) {
  struct run *r = t->run;
  err_t e;
  if (!t->co || !lrt_protect(sched__opts(r->sched)->lrt, fn, arg, &e)) return 0;
  /* The coroutine may be half pushed onto: it never runs again. */
  char *ej = jsontext_message(e.msg);
  run_abort(r, "failed", ej);
  free(ej);
  return e.code;
}

struct push_values {
  lua_State *co;
  const char *spec;
  lua_Number n[RUN_PUSH_MAX];
  const char *s[RUN_PUSH_MAX];
};

/* run__push_values's pushes, under lrt_protect. */
static int push_values(void *arg, err_t *e) {
  struct push_values *v = arg;
  (void)e;
  for (int i = 0; v->spec[i]; i++) {
    if (v->spec[i] == 'n') lua_pushnumber(v->co, v->n[i]);
    else if (v->spec[i] == 's' && v->s[i]) lua_pushstring(v->co, v->s[i]);
    else lua_pushnil(v->co);
  }
  return 0;
}

/* See run.h. */
int run__push_values(struct task *t, const char *spec, ...) {
  struct push_values v = {.co = t->co, .spec = spec};
  va_list ap;
  va_start(ap, spec);
  int n = 0;
  for (; spec[n] && n < RUN_PUSH_MAX; n++) {
    if (spec[n] == 'n') v.n[n] = va_arg(ap, double);
    else if (spec[n] == 's') v.s[n] = va_arg(ap, const char *);
  }
  va_end(ap);
  if (run__push(t, push_values, &v)) return ERR_NOMEM;
  t->nres = n;
  return 0;
}

/* One completion t was parked for came in: ready once all have. */
void run__complete(struct task *t) {
  if (t->run->aborted || t->state != T_PARKED) return;
  if (--t->waits <= 0) sched__ready(t->run->sched, t);
}

/* A group t waited on is durable. */
static void on_durable(void *arg) {
  struct task *t = arg;
  struct run *r = t->run;
  run__complete(t);
  run_unref(r);
}

/* Count one completion for t once the open group is durable. The run
** reached a checkpoint: a crash count it brought from the store goes back
** to 0 in the same group. */
void run__wait_durable(struct task *t) {
  struct run *r = t->run;
  if (r->crashes) {
    struct run_set set = {.run_id = r->id, .clear_crashes = 1};
    journal_run_set(sched__journal(r->sched), &set);
    r->crashes = 0;
  }
  t->run->refs++;
  sched__after_commit(t->run->sched, on_durable, t);
}

/* A task's timer (a sleep, a backoff, a delay) fired. */
void run__on_timer(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, timer));
  run__complete(t);
}

/* ---- finishing ---- */

/* Stop everything r holds in the loop: its step.parallel children, what
** its main task waits on, its coroutine, its deadline and wake timers. */
static void stop_run(struct run *r) {
  sched_t *s = r->sched;
  run__stop_kids(&r->main);
  run__task_cancel(&r->main);
  run__task_release(&r->main);
  sched__timer_stop(s, &r->deadline);
  sched__timer_stop(s, &r->wake);
  sched__timer_stop(s, &r->flow_timer);
}

/* Create and start r's on_failure run, in the group that records r's failure. */
static void start_on_failure(struct run *r, const char *error, int64_t now) {
  sched_t *s = r->sched;
  cJSON *trig = cJSON_CreateObject();
  cJSON_AddStringToObject(trig, "kind", "on_failure");
  cJSON_AddStringToObject(trig, "run_id", r->id);
  cJSON *ej = error ? cJSON_Parse(error) : NULL;
  cJSON_AddItemToObject(trig, "error", ej ? ej : cJSON_CreateNull());
  char *tj = jsontext_print_text(trig);
  cJSON_Delete(trig);
  struct run *f = mem_calloc(1, sizeof *f);
  err_t e;
  ids_ulid(now, f->id);
  f->sched = s;
  f->skill = r->skill;
  f->entry = "on_failure";
  f->trigger = tj;
  f->input = r->input ? mem_strdup(r->input) : NULL;
  f->created_at = f->started_at = now;
  struct run_row row = {
    .id = f->id, .skill = r->skill->id, .version = r->skill->version, .status = "running",
    .entry = "on_failure", .trigger = tj, .input = r->input, .owner = sched_owner(s),
    .created_at = now, .started_at = now, .by_run = r->id,
  };
  journal_run_new(sched__journal(s), &row);
  if (run_start_created(s, f, &e)) term_printf(stderr, "moonloop: on_failure of %s: %s\n", r->id, e.msg);
}

struct done_ctx {
  struct run *r;
  char *status, *output, *error;
};

/* The run's end is durable: report it and drop the reference it held. */
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
void run__finish(struct run *r, const char *status, const char *output, const char *error) {
  sched_t *s = r->sched;
  const struct sched_opts *o = sched__opts(s);
  journal_t *j = sched__journal(s);
  int64_t now = units_now_ms();
  int word = vocab_run_status(status);
  sched__tree_drop(s, r->id); /* a root's count of its tree's runs (nothing for others) */
  if (word != RUN_COMPLETED) {
    /* A run that did not complete takes its live children with it (a
    ** cancel by the run itself: its descendants, not the run). */
    struct cancel_row c = {.run_id = r->id, .reason = "its parent run ended", .at = now,
                           .by_run = r->id};
    journal_cancel(j, &c);
  }
  /* Its slots go to the runs queued for them in the same group, and to
  ** those living here at once (flowctl.c). */
  run__release_slot(r);
  if (r->log_dropped) {
    char note[160];
    snprintf(note, sizeof note, "%lld log lines were dropped past this run's budget "
             "(limits.run_logs)", (long long)r->log_dropped);
    struct log_row l = {.run_id = r->id, .ts = now, .level = "warn", .msg = note};
    journal_log(j, &l);
  }
  struct run_set set = {.run_id = r->id, .status = status, .output = output, .error = error,
                        .ended_at = now};
  journal_run_set(j, &set);
  if (r->parent_id) {
    char *ocj = jsontext_run_outcome(r->id, status, output, error);
    struct child_done cd = {.child_id = r->id, .outcome = ocj};
    journal_child_done(j, &cd);
    free(ocj);
  }
  r->finished = 1;
  stop_run(r);
  if (o->verbose) {
    char d[32];
    units_fmt_duration(now - r->started_at, d, sizeof d);
    fprintf(stderr, "run %s %s in %s\n", r->id, status, d);
  }
  /* on_failure runs as its own durable run, created in the same group as
  ** the failure, so it cannot be lost between the two. */
  if (word == RUN_FAILED && r->skill && r->skill->has_on_failure &&
      !strcmp(r->entry, "run"))
    start_on_failure(r, error, now);
  struct done_ctx *d = mem_calloc(1, sizeof *d);
  if (d) {
    d->r = r;
    d->status = mem_strdup(status);
    d->output = output ? mem_strdup(output) : NULL;
    d->error = error ? mem_strdup(error) : NULL;
    r->refs++;
    sched__after_commit(s, on_finished_durable, d);
  }
  sched__run_unlink(s, r);
  run_unref(r); /* the live reference */
}

/* See run.h. */
void run_abort(struct run *r, const char *status, const char *error_json) {
  if (r->aborted || r->finished) return;
  if (status) {
    run__finish(r, status, NULL, error_json);
    r->aborted = 1;
    return;
  }
  /* Dropped without a write (lost lease, stop): whoever takes the run over
  ** replays it from its journal. */
  r->aborted = 1;
  sched_t *s = r->sched;
  stop_run(r);
  sched__run_done(s, r, "abandoned", NULL, NULL);
  sched__run_unlink(s, r);
  run_unref(r);
}

/* See run.h: the run ends "cancelled", with a message saying by what. */
void run_cancelled(struct run *r, const char *reason) {
  if (r->aborted || r->finished) return;
  char msg[600];
  /* The reason is a message, or the JSON of the event that cancelled it. */
  jsontext_cancel_message(reason, msg, sizeof msg);
  char *ej = jsontext_message(msg);
  run_abort(r, "cancelled", ej);
  free(ej);
}

/* The run's timeout passed: it fails. */
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

/* Refuse a run of a skill whose earlier runs left more than a run's
** memory budget in state its runs share (a top-level table or upvalue):
** a skill cannot keep growing what every run holds (lrt.h's groups). */
static int check_shared_state(struct run *r, lrt_t *lrt, err_t *e) {
  size_t held;
  if (!lrt_group_over(lrt, r->skill->mem_group, &held)) return 0;
  char h[48], b[48];
  units_fmt_over((int64_t)held, (int64_t)lrt_budget(lrt), h, b, sizeof h);
  return err_set(e, ERR_NOMEM, "skill '%s': its earlier runs left %s in state its runs share "
                 "(a top-level table or variable), more than a run's memory budget of %s "
                 "(limits.run_memory): a skill cannot keep state across runs; this version "
                 "of it starts no more runs (change the skill, or restart the engine)",
                 r->skill->id, h, b);
}

struct boot {
  struct run *r;
  const cJSON *journal;
};

/* run_boot's calls into Lua, under lrt_protect: push the context, the
** input and the journal, call run.new, keep the coroutine it returns. */
static int boot(void *arg, err_t *e) {
  struct run *r = ((struct boot *)arg)->r;
  const cJSON *journal = ((struct boot *)arg)->journal;
  sched_t *s = r->sched;
  const struct sched_opts *o = sched__opts(s);
  lua_State *L = lrt_L(o->lrt);
  int top = lua_gettop(L);
  int prev = -1;
  if (check_shared_state(r, o->lrt, e)) goto fail;
  if (lrt_require(o->lrt, "run", e)) goto fail;
  lua_getfield(L, -1, "new");
  push_cfg(L, r->skill, o);
  if (!r->mem_acct) r->mem_acct = lrt_account_open(o->lrt, r->skill->mem_group);
  prev = lrt_account_use(o->lrt, r->mem_acct);
  lua_createtable(L, 0, 16);
  lua_insert(L, -2);
  lua_pushstring(L, r->id), lua_setfield(L, -3, "run_id");
  lua_pushstring(L, r->entry), lua_setfield(L, -3, "entry");
  lua_pushnumber(L, (lua_Number)r->started_at), lua_setfield(L, -3, "started_at");
  lua_setfield(L, -2, "cfg");
  if (r->trigger) lua_pushstring(L, r->trigger), lua_setfield(L, -2, "trigger");
  if (r->input) lua_pushstring(L, r->input), lua_setfield(L, -2, "input");
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->skill->def_ref);
  if (journal) {
    if (json_push(L, journal, e)) goto fail;
    if (cJSON_GetArraySize(journal) > 0) sched__count_replay(s);
  } else {
    lua_pushnil(L);
  }
  if (lrt_pcall(o->lrt, 3, 1, e)) goto fail;
  lrt_account_use(o->lrt, prev);
  prev = -1;
  lua_State *co = lua_tothread(L, -1);
  if (!co) {
    err_set(e, ERR_INTERNAL, "run.new did not return a coroutine");
    goto fail;
  }
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  r->main.co = co;
  r->main.co_ref = ref;
  lua_settop(L, top);
  return 0;
fail:
  if (prev >= 0) lrt_account_use(o->lrt, prev);
  lua_settop(L, top);
  return e->code ? e->code : ERR_INTERNAL;
}

/* See run.h: run.lua's new(ctx, def, journal) makes the coroutine, in
** the run's own memory account. Protected (lrt_protect): a state too full
** for the engine's own pushes fails this run's start, saying so. */
int run_boot(struct run *r, const cJSON *journal, err_t *e) {
  sched_t *s = r->sched;
  struct boot b = {r, journal};
  if (lrt_protect(sched__opts(s)->lrt, boot, &b, e))
    return err_prefix(e, "starting run %s", r->id);
  r->main.run = r;
  r->main.timer.fn = run__on_timer;
  r->main.state = T_PARKED;
  r->dormant = 0;
  sched__timer_stop(s, &r->wake);
  /* A run whose row is not durable yet waits for it (run_start_created). */
  if (r->unborn) run__park(&r->main, 1);
  else sched__ready(s, &r->main);
  return 0;
}

/* A dormant run's wake time came. */
static void on_wake(struct stimer *tm) {
  run_wake((struct run *)((char *)tm - offsetof(struct run, wake)));
}

/* See run.h. */
cJSON *run__event(const struct run *r) {
  cJSON *trig = r->trigger ? cJSON_Parse(r->trigger) : NULL;
  cJSON *ev = cJSON_DetachItemFromObject(trig, "event");
  cJSON_Delete(trig);
  if (cJSON_IsObject(ev)) return ev;
  cJSON_Delete(ev);
  ev = cJSON_CreateObject();
  cJSON *in = r->input ? cJSON_Parse(r->input) : NULL;
  cJSON_AddItemToObject(ev, "data", in ? in : cJSON_CreateNull());
  return ev;
}

/* The value (compact JSON) at a path such as "event.data.service" or
** "data.service" in r's event, whose data is the input for runs not
** started by an event; "null" when it is not there. canonical: its
** objects' keys sorted (jsontext_sort_keys). */
static char *event_value(struct run *r, const char *path, int canonical) {
  cJSON *ev = run__event(r);
  if (!strncmp(path, "event.", 6)) path += 6;
  cJSON *v = (cJSON *)jsontext_path(ev, path);
  if (v && canonical) jsontext_sort_keys(v);
  char *val = v ? jsontext_print_text(v) : mem_strdup("null");
  cJSON_Delete(ev);
  return val;
}

/* See run.h. */
char *run__event_value(struct run *r, const char *path) { return event_value(r, path, 0); }

/* See run.h. */
char *run__event_key(struct run *r, const char *path) { return event_value(r, path, 1); }

/* A cancel_on's match as its wait holds it: a JSON object of path ->
** value, from the pairs skill.lua made of it (api.match_pairs): [path]
** takes the value at path in r's event, [path, value] that value; NULL
** without pairs. */
static char *cancel_match(struct run *r, const cJSON *pairs) {
  if (!cJSON_IsArray(pairs)) return NULL;
  cJSON *o = cJSON_CreateObject();
  const cJSON *p;
  cJSON_ArrayForEach(p, pairs) {
    const cJSON *path = cJSON_GetArrayItem(p, 0);
    if (!cJSON_IsString(path)) continue;
    cJSON *v;
    if (cJSON_GetArraySize(p) > 1) {
      v = cJSON_Duplicate(cJSON_GetArrayItem(p, 1), 1);
    } else {
      char *text = run__event_value(r, path->valuestring);
      v = cJSON_Parse(text);
      free(text);
    }
    cJSON_AddItemToObject(o, path->valuestring, v ? v : cJSON_CreateNull());
  }
  char *js = jsontext_print_text(o);
  cJSON_Delete(o);
  return js;
}

/* Register r's cancel_on events as waits (again, harmlessly, on a replay). */
static void register_cancel_on(struct run *r) {
  cJSON *list = cJSON_Parse(r->skill->cancel_on);
  const cJSON *c;
  int i = 0;
  cJSON_ArrayForEach(c, list) {
    const cJSON *ev = cJSON_GetObjectItem(c, "event");
    if (!cJSON_IsString(ev)) continue;
    char *match = cancel_match(r, cJSON_GetObjectItem(c, "match"));
    struct wait_row w = {
      .run_id = r->id, .seq = -(++i), .kind = "cancel", .name = ev->valuestring, .match = match,
      .owner = sched_owner(r->sched), .since = r->since, .exclude = r->trigger_event,
    };
    journal_wait(sched__journal(r->sched), &w);
    free(match);
  }
  cJSON_Delete(list);
}

/* When the events a run may wait for begin: its triggering event's
** acceptance (a run is created only when that event is dispatched, and an
** answer sent right after the event must count), or its creation. */
static int64_t events_since(struct run *r) {
  int64_t since = r->created_at;
  /* Most runs are not started by an event (an invoke, a cron tick): no
  ** parse for those. */
  if (!r->trigger || !strstr(r->trigger, "\"event\"")) return since;
  cJSON *trig = cJSON_Parse(r->trigger);
  /* Only the run an event started: a rerun carries its event for ctx.event,
  ** but counts events from its own creation. */
  const cJSON *kind = cJSON_GetObjectItem(trig, "kind");
  const cJSON *ev = cJSON_IsString(kind) && !strcmp(kind->valuestring, "event")
                        ? cJSON_GetObjectItem(trig, "event") : NULL;
  const cJSON *ts = cJSON_GetObjectItem(ev, "ts"), *id = cJSON_GetObjectItem(ev, "id");
  int64_t ms;
  if (cJSON_IsString(ts) && !units_parse_rfc3339(ts->valuestring, &ms, NULL) && ms < since) since = ms;
  if (cJSON_IsString(id) && !r->trigger_event) r->trigger_event = mem_strdup(id->valuestring);
  cJSON_Delete(trig);
  return since;
}

/* Take a run into the scheduler: references, timers, the map. */
static void link_run(sched_t *s, struct run *r) {
  r->since = events_since(r);
  if (r->skill && r->skill->cancel_on) register_cancel_on(r);
  r->sched = s;
  r->main.run = r;
  r->main.timer.fn = run__on_timer;
  r->refs = 1;
  r->deadline.fn = on_deadline;
  r->wake.fn = on_wake;
  sched__run_link(s, r);
  if (r->deadline_at) sched__timer_start(s, &r->deadline, r->deadline_at);
}

/* See run.h: a run that cannot start here fails, saying why (its row is
** journaled already: it must not stay "running" with no one to run it). */
int run_start(sched_t *s, struct run *r, const cJSON *journal, err_t *e) {
  link_run(s, r);
  if (run_boot(r, journal, e)) {
    char *js = jsontext_message(e->msg);
    run_abort(r, "failed", js);
    free(js);
  }
  return 0;
}

/* The J_RUN_NEW that creates r came back from its group: durable, so r's
** main task may go; or taken back before its commit (a lost lease, a
** fenced parent, a refused request, a run started from outside handed to
** whoever claims it), or found there already (its result): then this copy
** of r is dropped without a write. */
static void on_created(void *arg, const struct jentry *je) {
  struct run *r = arg;
  r->unborn = 0;
  if (je->dropped || je->result || !je->u.run.owner) run_abort(r, NULL, NULL);
  else run__complete(&r->main);
  run_unref(r);
}

/* See run.h. The waiter is added before link_run, which may journal
** entries of its own (cancel_on's waits): it names the J_RUN_NEW. */
int run_start_created(sched_t *s, struct run *r, err_t *e) {
  r->unborn = 1;
  sched__after_entry(s, on_created, r);
  link_run(s, r);
  r->refs++; /* on_created's */
  if (run_boot(r, NULL, e)) {
    char *js = jsontext_message(e->msg);
    run_abort(r, "failed", js);
    free(js);
  }
  return 0;
}

/* See run.h. */
int run_start_dormant(sched_t *s, struct run *r, int64_t wake_at) {
  link_run(s, r);
  r->dormant = 1;
  r->wake_at = wake_at;
  if (wake_at) sched__timer_start(s, &r->wake, wake_at);
  return 0;
}

/* See run.h: a run that cannot be replayed here fails, saying why; one
** whose journal cannot be read just now (the database busy, an I/O error)
** stays parked and wakes again in a second. */
void run_wake(struct run *r) {
  if (!r->dormant || r->aborted || r->finished) return;
  sched_t *s = r->sched;
  cJSON *steps = NULL;
  err_t e;
  int rc = store_get_steps(sched__opts(s)->store, r->id, &steps, &e);
  if (rc == ERR_BUSY || rc == ERR_IO) {
    fprintf(stderr, "moonloop: run %s: reading its journal failed, trying again in 1s: %s\n",
                r->id, e.msg);
    sched__timer_start(s, &r->wake, units_now_ms() + 1000);
    return;
  }
  if (rc || run_boot(r, steps, &e)) {
    /* The run cannot go on here: fail it with the reason in its trace. */
    char *js = jsontext_message(e.msg);
    run_abort(r, "failed", js);
    free(js);
  }
  cJSON_Delete(steps);
}
