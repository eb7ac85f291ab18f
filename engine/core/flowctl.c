/*
** flowctl.c: flow control in the core: a run of a skill with limits
** executes only while it holds their slots (see docs/architecture.md,
** "Flow control", and store_queue.c for the queues in the store).
**
**   run ready to resume --(has limits, no slots)--> J_SLOT acquire
**        ^                                             |
**        |  "1": slots held (status running)           | refused: its places in
**        +---------------------------------------------+ the queues, status queued
**        |                                             |
**        |   a release here (J_SLOT release, result:   | (no timer, no retry:
**        +-- this engine's runs it granted: held now)  |  the store hands the
**        |                                             |  room on at release)
**        +-- store_poll's "grants" (a release by another engine) -- acquire
**
** A run parked for long gives its slots back (run_flow.c's parked_long)
** and asks again when it wakes; a run that ends releases them before its
** terminal status, so the runs it hands them to start in the same turn.
*/
#include "core/flowctl.h"

#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "core/run.h"
#include "lua/json.h"

#include <lauxlib.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prio_call {
  struct run *r;
  const cJSON *ev; /* its event (made outside: an error thrown past it would leak it) */
  double prio;
};

/* run_priority's call of priority(event), under lrt_protect. */
static int call_priority(void *arg, err_t *e) {
  struct prio_call *pc = arg;
  struct run *r = pc->r;
  lrt_t *lrt = sched__opts(r->sched)->lrt;
  lua_State *L = lrt_L(lrt);
  int top = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->skill->def_ref);
  lua_getfield(L, -1, "priority");
  int bad = json_push(L, pc->ev, e);
  if (!bad) bad = lrt_pcall(lrt, 1, 1, e);
  if (!bad && lua_type(L, -1) == LUA_TNUMBER) pc->prio = lua_tonumber(L, -1);
  else if (!bad) bad = err_set(e, ERR_INVALID, "it returned a %s, not a number", luaL_typename(L, -1));
  lua_settop(L, top);
  return bad;
}

/* r's priority: its skill's priority(event), called in the sandbox under
** the slice budget, in the run's memory account. A function that fails or
** does not return a number gives 0, with a line in the run's trace. */
static double run_priority(struct run *r) {
  sched_t *s = r->sched;
  lrt_t *lrt = sched__opts(s)->lrt;
  err_t e = {0};
  cJSON *ev = run__event(r); /* the event priority(event) is given */
  struct prio_call pc = {r, ev, 0};
  int prev = r->mem_acct ? lrt_account_use(lrt, r->mem_acct) : -1;
  if (lrt_protect(lrt, call_priority, &pc, &e)) pc.prio = 0;
  if (prev >= 0) lrt_account_use(lrt, prev);
  cJSON_Delete(ev);
  double prio = pc.prio;
  if (e.msg[0]) {
    char msg[1200];
    snprintf(msg, sizeof msg, "priority: %s; queued with priority 0", e.msg);
    struct log_row l = {.run_id = r->id, .seq = 0, .ts = units_now_ms(), .level = "warn", .msg = msg};
    journal_log(sched__journal(s), &l);
  }
  return prio != prio ? 0 : prio; /* NaN counts as 0 */
}

/* r's priority in its queues, a whole number (the store's queues order by
** one): the one recorded in the store by its first acquire (the run was
** taken up from another process), else its skill's function, called now,
** once per run: the value goes with the acquire, which records it. */
static int64_t queue_prio(struct run *r) {
  if (!r->has_prio) {
    double p = run_priority(r);
    /* Within the whole numbers a double holds exactly (and JSON carries). */
    r->prio = p > 9e15 ? (int64_t)9e15 : p < -9e15 ? (int64_t)-9e15 : (int64_t)p;
    r->has_prio = 1;
  }
  return r->prio;
}

/* See flowctl.h. */
char *flowctl_limits(struct run *r) {
  cJSON *list = cJSON_Parse(r->skill->limits);
  cJSON *out = cJSON_CreateArray();
  const cJSON *l;
  cJSON_ArrayForEach(l, list) {
    const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(l, "key"));
    const char *scope = cJSON_GetStringValue(cJSON_GetObjectItem(l, "scope"));
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(l, "kind"));
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "kind", kind ? kind : "concurrency");
    if (kind && strcmp(kind, "concurrency")) {
      /* Admission: throttle, rate, idempotency, debounce (period), singleton (mode). */
      const cJSON *p = cJSON_GetObjectItem(l, "period"), *b = cJSON_GetObjectItem(l, "burst");
      const cJSON *m = cJSON_GetObjectItem(l, "mode");
      if (cJSON_IsNumber(p)) cJSON_AddNumberToObject(x, "period", p->valuedouble);
      if (cJSON_IsNumber(b)) cJSON_AddNumberToObject(x, "burst", b->valuedouble);
      if (cJSON_IsString(m)) cJSON_AddStringToObject(x, "mode", m->valuestring);
      const cJSON *mw = cJSON_GetObjectItem(l, "max_wait");
      if (cJSON_IsNumber(mw)) cJSON_AddNumberToObject(x, "max_wait", mw->valuedouble);
    }
    /* A limit the engine adds (singleton's one at a time) counts apart. */
    const char *tag = cJSON_GetStringValue(cJSON_GetObjectItem(l, "tag"));
    if (scope) {
      char *q = mem_printf("@%s", scope);
      cJSON_AddStringToObject(x, "q", q);
      free(q);
    } else {
      cJSON_AddStringToObject(x, "q", r->skill->id);
    }
    if (key) {
      /* The path names the count, so two keys of one skill never share it. */
      char *v = run__event_key(r, key);
      if (kind && !strcmp(kind, "idempotency") && !strcmp(v, "null")) {
        /* No key in this event: every such run would share the key null,
        ** and all but the first be skipped for the whole period. */
        char msg[600];
        snprintf(msg, sizeof msg, "idempotency: this run's event has no %s (or it is null): the run "
                 "is not deduplicated", key);
        struct log_row lr = {.run_id = r->id, .seq = 0, .ts = units_now_ms(), .level = "warn", .msg = msg};
        journal_log(sched__journal(r->sched), &lr);
        free(v);
        cJSON_Delete(x);
        continue;
      }
      char *k = skills_limit_key(tag, key, v);
      cJSON_AddStringToObject(x, "key", k);
      free(k), free(v);
    } else {
      cJSON_AddStringToObject(x, "key", tag ? tag : "");
    }
    cJSON_AddNumberToObject(x, "limit", cJSON_GetNumberValue(cJSON_GetObjectItem(l, "limit")));
    /* Sent also when 0, so the store records it (see queue_prio). */
    if (r->skill->has_priority && (!kind || !strcmp(kind, "concurrency")))
      cJSON_AddNumberToObject(x, "priority", (double)queue_prio(r));
    cJSON_AddItemToArray(out, x);
  }
  cJSON_Delete(list);
  char *js = jsontext_print_text(out);
  cJSON_Delete(out);
  return js;
}

/* See flowctl.h. */
int flowctl_needed(const struct run *r) { return r->skill && r->skill->nlimits > 0; }

/* A throttled run's start time came: ask again (answered "1", or queued
** for its concurrency slots). */
static void on_flow_timer(struct stimer *tm) {
  struct run *r = (struct run *)((char *)tm - offsetof(struct run, flow_timer));
  if (!r->aborted && !r->finished && !r->dormant) flowctl_gate(r->sched, r);
}

/* r starts executing (its started_at set): its timeout counts from here,
** so time spent queued does not shorten it. A run that started before
** (it parked and asked again) keeps its deadline. */
static void run_deadline(struct run *r) {
  if (r->deadline_at || !r->skill->timeout_ms) return;
  r->deadline_at = r->started_at + r->skill->timeout_ms;
  sched__timer_start(r->sched, &r->deadline, r->deadline_at);
}

/* Whether queued r can never start: its parent run lives here, is inside
** a step.parallel (whose branches never give the run's slots back) and
** holds the only slot of a limit r waits on, so the parent waits for r
** and r for the parent. msg gets why. Only the certain case: a limit of
** 1 (with more, another run may free a slot). */
static int parent_deadlock(struct run *r, char *msg, size_t n) {
  struct run *p = r->parent_id ? sched__find(r->sched, r->parent_id) : NULL;
  if (!p || !p->slot_held || !p->limits || !r->limits || p->main.kids_left <= 0) return 0;
  cJSON *mine = cJSON_Parse(r->limits), *theirs = cJSON_Parse(p->limits);
  const cJSON *a, *b;
  int found = 0;
  cJSON_ArrayForEach(a, mine) {
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(a, "kind"));
    const char *q = cJSON_GetStringValue(cJSON_GetObjectItem(a, "q"));
    const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(a, "key"));
    if ((kind && strcmp(kind, "concurrency")) || !q || !key ||
        cJSON_GetNumberValue(cJSON_GetObjectItem(a, "limit")) != 1)
      continue;
    cJSON_ArrayForEach(b, theirs) {
      const char *bq = cJSON_GetStringValue(cJSON_GetObjectItem(b, "q"));
      const char *bk = cJSON_GetStringValue(cJSON_GetObjectItem(b, "key"));
      if (bq && bk && !strcmp(q, bq) && !strcmp(key, bk)) found = 1;
    }
    if (found) {
      snprintf(msg, n, "cannot start: its parent run %s holds the only slot of concurrency limit 1 "
               "of %s %s%s%s while it waits for this run inside step.parallel (a parallel's "
               "branches keep the run's slots), so neither could ever go on; invoke it with "
               "step.invoke outside step.parallel (a parked run gives its slots back), or raise the limit",
               p->id, q[0] == '@' ? "scope" : "skill", q[0] == '@' ? q + 1 : q, key[0] ? ", key " : "",
               key);
      break;
    }
  }
  cJSON_Delete(mine), cJSON_Delete(theirs);
  return found;
}

/* The store answered r's acquire: "1", the slots are r's; otherwise r is
** queued in the store, and waits here with nothing armed until a release
** hands it the slots (flowctl_granted). */
static void on_acquired(void *arg, const struct jentry *je) {
  struct run *r = arg;
  r->slot_pending = 0;
  if (!r->aborted && !r->finished && !r->dormant && !je->dropped) {
    if (je->result && !strncmp(je->result, "wait:", 5)) {
      /* Throttled: its start time is reserved; ask again then. */
      if (!r->slot_ever) r->started_at = 0;
      r->flow_timer.fn = on_flow_timer;
      sched__timer_start(r->sched, &r->flow_timer, strtoll(je->result + 5, NULL, 10));
    } else if (je->result && !strncmp(je->result, "skip:", 5)) {
      /* Turned away (rate limit, singleton, idempotency, debounce, batch):
      ** it ends skipped at once, saying why, no code run. */
      char *ej = jsontext_message(je->result + 5);
      run_abort(r, "skipped", ej);
      free(ej);
    } else if (je->result) {
      r->slot_held = r->slot_ever = 1;
      /* Its executing time starts here (the store set started_at the same). */
      if (!r->started_at) r->started_at = units_now_ms();
      run_deadline(r);
      sched__ready(r->sched, &r->main);
    } else {
      /* Queued before it ever executed (a cron or on_failure run made as
      ** running): the store cleared its started_at too. */
      if (!r->slot_ever) r->started_at = 0;
      char msg[900];
      if (!r->slot_ever && parent_deadlock(r, msg, sizeof msg)) {
        /* It would wait forever: it fails at once, saying why. */
        char *ej = jsontext_message(msg);
        run_abort(r, "failed", ej);
        free(ej);
      }
    }
  }
  run_unref(r);
}

/* See flowctl.h. */
void flowctl_gate(sched_t *s, struct run *r) {
  if (r->slot_pending || r->slot_held) return;
  if (!r->limits) r->limits = flowctl_limits(r);
  r->slot_pending = 1;
  struct slot_row sl = {.run_id = r->id, .limits = r->limits, .acquire = 1, .at = r->created_at};
  journal_slot(sched__journal(s), &sl);
  r->refs++;
  sched__after_entry(s, on_acquired, r);
}

/* See flowctl.h. */
void flowctl_granted(sched_t *s, const char *run_id) {
  struct run *r = sched__find(s, run_id);
  /* Held or asked already: the answer in flight says so. Dormant: it
  ** asks when it wakes (the store answers "1"). */
  if (r && !r->aborted && !r->finished && !r->dormant && !r->slot_held && !r->slot_pending &&
      flowctl_needed(r))
    flowctl_gate(s, r);
}

/* A release is durable: the runs of this engine it handed slots to hold
** them now (the store made them running in that transaction, unmarked:
** see store_queue.c) and resume at once. One whose acquire is in flight
** finds them held; a dormant one when it wakes. */
static void on_released(void *arg, const struct jentry *je) {
  sched_t *s = arg;
  if (je->dropped || !je->result) return;
  cJSON *ids = cJSON_Parse(je->result);
  const cJSON *id;
  cJSON_ArrayForEach(id, ids) {
    struct run *r = cJSON_IsString(id) ? sched__find(s, id->valuestring) : NULL;
    if (!r || r->aborted || r->finished || r->dormant || r->slot_held || r->slot_pending ||
        !flowctl_needed(r))
      continue;
    r->slot_held = r->slot_ever = 1;
    if (!r->started_at) r->started_at = units_now_ms();
    run_deadline(r);
    sched__ready(s, &r->main);
  }
  cJSON_Delete(ids);
}

/* See run.h: give back r's slots (it parks for long, or ends). */
void run__release_slot(struct run *r) {
  if (!r->slot_held) return;
  r->slot_held = 0;
  struct slot_row sl = {.run_id = r->id, .acquire = 0};
  journal_slot(sched__journal(r->sched), &sl);
  sched__after_entry(r->sched, on_released, r->sched);
}
