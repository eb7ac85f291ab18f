/*
** run_flow.c: the ops of the steps that park a run or fan out (see
** lua/flow.lua for their arguments): sleep, wait_for_event, invoke,
** send_event, parallel; and what parks and wakes runs: timers,
** deliveries, eviction.
**
** A wait (an event or a child run) is registered in the store; the store
** answers at once when what it waits for is already there. Otherwise the
** run parks until the store reports a delivery (run_delivered, from the
** scheduler's poll) or its timeout passes; either way the wait is ended
** in the store (J_WAIT_END, which returns a result delivered meanwhile and
** closes a wait that got nothing), and the step completes with that
** result, or with null, in a group that also removes the wait: until then
** the wait's row keeps what it took, for a replay after a crash.
**
** Eviction: when more main tasks are parked on long waits than the
** scheduler keeps in memory (sched_opts.max_parked), a run that parks is
** evicted: its coroutine is dropped, and it is replayed from its journal
** when it wakes. Its journal already holds everything it needs.
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "core/run.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parking long, and eviction ---- */

/* Drop r's coroutine: it stays dormant until wake_at (0: a delivery).
** Its task forgets the wait it parked on: the replay registers it again
** and finds there what it took. A delivery reported once more after the
** wake-up (PostgreSQL's notification and the poll can both report one)
** must not end that old wait, whose result would go to the new
** coroutine, at whatever op its replay has reached. */
static void evict(struct run *r, int64_t wake_at) {
  struct task *t = &r->main;
  run__task_cancel(t); /* stops its timer and uncounts it */
  run__task_release(t);
  t->waiting = 0;
  r->dormant = 1;
  r->wake_at = wake_at;
  if (wake_at) sched__timer_start(r->sched, &r->wake, wake_at);
}

/* t parked until wake_at (0: until a delivery): count it, and evict its
** run if too many are parked in memory. */
static void parked_long(struct task *t, int64_t wake_at) {
  struct run *r = t->run;
  sched_t *s = r->sched;
  if (!t->parked_long) {
    t->parked_long = 1;
    sched__parked(s, 1);
  }
  /* A parked run does not count against its concurrency limit. */
  run__release_slot(r);
  /* A run about to wake is not worth a replay. */
  int max = sched__opts(s)->max_parked;
  int soon = wake_at && wake_at - units_now_ms() < 1000;
  if (max > 0 && sched__parked_count(s) > max && !soon && !t->nkids && t == &r->main)
    evict(r, wake_at);
}

/* t is no longer parked for long: uncount it. */
static void unpark_long(struct task *t) {
  if (t->parked_long) {
    t->parked_long = 0;
    sched__parked(t->run->sched, -1);
  }
}

/* Note the step that parks t: its seq and id, kind, until when, and when
** it started. */
static void set_wait(struct task *t, int seq, const char *id, const char *kind, int64_t until,
                     int64_t started) {
  t->wait_seq = seq;
  free(t->wait_id);
  t->wait_id = mem_strdup(id);
  t->wait_kind = kind;
  t->wait_until = until;
  t->wait_started = started;
}

/* ---- sleep ---- */

static void on_sleep_end(struct stimer *tm);

/* OP_SLEEP (op.h): journal the sleeping step and park
** until wake_at. */
void run_op_sleep(struct task *t, const struct op_sleep *a) {
  struct run *r = t->run;
  lua_State *co = t->co;
  int64_t wake_at = a->wake_at;
  set_wait(t, a->seq, a->id, "sleep", wake_at, a->started);
  struct step_row row = {
    .run_id = r->id, .seq = t->wait_seq, .id = t->wait_id, .kind = "sleep",
    .status = "sleeping", .attempts = 1, .started_at = t->wait_started, .wake_at = wake_at,
  };
  struct run_set set = {.run_id = r->id, .status = "sleeping", .wake_at = wake_at};
  journal_t *j = sched__journal(r->sched);
  journal_step(j, &row);
  journal_run_set(j, &set);
  lua_settop(co, 0);
  run__park(t, 1);
  t->timer.fn = on_sleep_end;
  sched__timer_start(r->sched, &t->timer, wake_at);
  parked_long(t, wake_at);
}

/* The sleep is over: complete the step; resume once that is durable. */
static void on_sleep_end(struct stimer *tm) {
  struct task *t = (struct task *)((char *)tm - offsetof(struct task, timer));
  struct run *r = t->run;
  unpark_long(t);
  int64_t now = units_now_ms();
  struct step_row row = {
    .run_id = r->id, .seq = t->wait_seq, .id = t->wait_id, .kind = "sleep",
    .status = "completed", .attempts = 1, .started_at = t->wait_started, .ended_at = now,
  };
  struct run_set set = {.run_id = r->id, .status = "running"};
  journal_t *j = sched__journal(r->sched);
  journal_step(j, &row);
  journal_run_set(j, &set);
  run__verbose(r, "\xe2\x9c\x93", t->wait_id, now - t->wait_started, "(sleep)");
  if (run__push_values(t, "n", (double)now)) return;
  run__wait_durable(t); /* waits stays 1: the durable write is the completion */
}

/* ---- waits: events and child runs ---- */

/* Why an invoke's outcome (JSON text, NULL: timed out) fails its step, in
** msg; 0 when the child completed. The skill raises the same words. */
static int invoke_failure(const char *outcome, char *msg, size_t cap) {
  if (!outcome) {
    snprintf(msg, cap, "child run did not end within its timeout");
    return 1;
  }
  cJSON *o = cJSON_Parse(outcome);
  const char *st = cJSON_GetStringValue(cJSON_GetObjectItem(o, "status"));
  int failed = vocab_run_status(st) != RUN_COMPLETED;
  if (failed) {
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message"));
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(o, "run_id"));
    snprintf(msg, cap, "child run %s %s: %s", id ? id : "?", st ? st : "?",
             m ? m : (st ? st : "?"));
  }
  cJSON_Delete(o);
  return failed;
}

/* An invoke in a step.parallel branch's body ended with result (the
** child's outcome, or NULL: its timeout, or its step's, passed): the body
** goes on, so no step row is written; the wait is removed (the outcome
** stays in the child's row, where a replay of the body finds it again),
** and a child not waited for any more is cancelled. The branch resumes
** with (outcome or nil, the time[, why its step's time ran out]). */
static void branch_wait_finish(struct task *t, const char *result, int64_t now) {
  struct run *r = t->run;
  journal_t *j = sched__journal(r->sched);
  struct wait_end we = {.run_id = r->id, .seq = t->wait_seq};
  journal_wait_end(j, &we);
  if (!result && t->wait_child) {
    struct cancel_row c = {.run_id = t->wait_child, .reason = "its parent stopped waiting",
                           .at = now, .by_run = r->id};
    journal_cancel(j, &c);
  }
  run__verbose(r, result ? "\xe2\x9c\x93" : "\xe2\x9c\x97", t->wait_id, now - t->wait_started,
               result ? "(child ended)" : "(timed out)");
  char why[600];
  const char *timed_out = NULL;
  if (!result && t->step_timed_out) {
    char d[32];
    units_fmt_duration(t->step_timeout_ms, d, sizeof d);
    snprintf(why, sizeof why, "step '%s' timed out after %s while waiting for its child run %s",
             t->step_id ? t->step_id : "?", d, t->wait_child ? t->wait_child : "?");
    timed_out = why;
  }
  if (run__push_values(t, timed_out ? "sns" : "sn", result, (double)now, timed_out)) return;
  run__wait_durable(t);
}

/* Complete the wait step with result (JSON text, or NULL: timed out). An
** invoke whose child did not complete is a failed step, its outcome kept. */
static void wait_finish(struct task *t, const char *result) {
  struct run *r = t->run;
  unpark_long(t);
  t->waiting = 0;
  sched__timer_stop(r->sched, &t->timer);
  int64_t now = units_now_ms();
  if (t->parent) {
    branch_wait_finish(t, result, now);
    return;
  }
  char why[1024];
  int failed = !strcmp(t->wait_kind, "invoke") && invoke_failure(result, why, sizeof why);
  struct step_row row = {
    .run_id = r->id, .seq = t->wait_seq, .id = t->wait_id, .kind = t->wait_kind,
    .status = failed ? "failed" : "completed", .output = result ? result : "null",
    .error = failed ? why : NULL, .attempts = 1, .started_at = t->wait_started, .ended_at = now,
  };
  struct wait_end we = {.run_id = r->id, .seq = t->wait_seq};
  struct run_set set = {.run_id = r->id, .status = "running"};
  journal_t *j = sched__journal(r->sched);
  journal_step(j, &row);
  journal_wait_end(j, &we);
  journal_run_set(j, &set);
  if (!result && t->wait_child) {
    /* An invoke that timed out: its child is not wanted any more. */
    struct cancel_row c = {.run_id = t->wait_child, .reason = "its parent stopped waiting",
                           .at = now, .by_run = r->id};
    journal_cancel(j, &c);
  }
  run__verbose(r, failed ? "\xe2\x9c\x97" : "\xe2\x9c\x93", t->wait_id, now - t->wait_started,
               failed ? why : result ? "(delivered)" : "(timed out)");
  if (run__push_values(t, "sn", result, (double)now)) return;
  run__wait_durable(t);
}

/* J_WAIT_END is durable: finish the step with what the store held. */
static void on_wait_ended(void *arg, const struct jentry *je) {
  struct task *t = arg;
  struct run *r = t->run;
  if (!r->aborted && !r->finished && !r->dormant) wait_finish(t, je->result);
  run_unref(r);
}

/* End the wait in the store (its timeout passed, or a delivery was seen),
** then finish the step with whatever the store holds. The wait's row
** stays (closed, if nothing came) until the group that completes the step
** removes it: a crash in between finds what it took there again. */
static void wait_end(struct task *t) {
  struct run *r = t->run;
  if (!t->waiting) return;
  t->waiting = 0;
  sched__timer_stop(r->sched, &t->timer);
  struct wait_end we = {.run_id = r->id, .seq = t->wait_seq, .keep = 1};
  journal_wait_end(sched__journal(r->sched), &we);
  r->refs++;
  sched__after_entry(r->sched, on_wait_ended, t);
}

/* A wait's timeout passed. */
static void on_wait_timeout(struct stimer *tm) {
  wait_end((struct task *)((char *)tm - offsetof(struct task, timer)));
}

/* J_WAIT is durable: finish at once with what the store already had, or
** park (with the timeout armed) until a delivery or the timeout. */
static void on_wait_registered(void *arg, const struct jentry *je) {
  struct task *t = arg;
  struct run *r = t->run;
  if (r->aborted || r->finished || r->dormant) {
    run_unref(r);
    return;
  }
  if (je->result) {
    wait_finish(t, je->result);
  } else {
    t->waiting = 1;
    t->timer.fn = on_wait_timeout;
    if (t->wait_until) sched__timer_start(r->sched, &t->timer, t->wait_until);
    /* A branch's wait is inside its body: the run stays in memory (a run
    ** with branches is never evicted), and its step's time may be up. */
    if (!t->parent) parked_long(t, t->wait_until);
    else if (t->step_timed_out) wait_end(t);
  }
  run_unref(r);
}

/* Journal the wait step, the run's status and the wait registration. */
static void register_wait(struct task *t, const char *kind, const char *name, const char *match,
                          const char *output) {
  struct run *r = t->run;
  sched_t *s = r->sched;
  journal_t *j = sched__journal(s);
  struct step_row row = {
    .run_id = r->id, .seq = t->wait_seq, .id = t->wait_id, .kind = t->wait_kind,
    .status = "waiting", .output = output, .attempts = 1, .started_at = t->wait_started,
    .wake_at = t->wait_until,
  };
  struct run_set set = {.run_id = r->id, .status = "waiting", .wake_at = t->wait_until};
  struct wait_row w = {
    .run_id = r->id, .seq = t->wait_seq, .kind = kind, .name = name, .match = match,
    .owner = sched_owner(s), .since = r->since,
    .exclude = r->trigger_event,
    .timeout_at = t->wait_until,
  };
  if (t->parent) {
    /* A branch's invoke: the branch's own row says what it waits for (its
    ** body is in flight; a replay reads the child and the timeout there). */
    row.id = t->step_id;
    row.kind = "run";
    row.status = "running";
    row.attempts = t->step_attempt;
    row.started_at = t->step_started;
    t->step_marked = 1;
    journal_step(j, &row);
  } else {
    journal_step(j, &row);
    journal_run_set(j, &set);
  }
  journal_wait(j, &w);
  r->refs++;
  sched__after_entry(s, on_wait_registered, t);
  run__park(t, 1);
}

/* OP_WAIT (op.h): wait for an event; match is a JSON object of path ->
** value, or NULL. */
void run_op_wait(struct task *t, const struct op_wait *a) {
  set_wait(t, a->seq, a->id, "wait", a->timeout_at, a->started);
  free(t->wait_child);
  t->wait_child = NULL;
  char *name = mem_strdup(a->event);
  char *match = a->match ? mem_strdup(a->match) : NULL;
  lua_settop(t->co, 0);
  register_wait(t, "event", name, match, NULL);
  free(name), free(match);
}

/* See run.h: a dormant run is replayed (it finds the result then). */
void run_delivered(struct run *r, int seq) {
  if (r->aborted || r->finished) return;
  if (r->dormant) {
    run_wake(r);
    return;
  }
  struct task *t = &r->main;
  if (t->waiting && t->wait_seq == seq) {
    wait_end(t);
    return;
  }
  /* An invoke in a step.parallel branch waits at the branch's seq. */
  for (int i = 0; i < t->nkids; i++) {
    struct task *k = t->kids[i];
    if (k && k->co && k->waiting && k->wait_seq == seq) wait_end(k);
  }
}

/* See run.h: the step's time is up while its body waits for a child. */
void run__wait_stop(struct task *t) {
  if (t->waiting) wait_end(t);
}

/* Where r is in a tree of runs invoking runs, from its trigger: how deep
** ("depth": 1 for a child of a run started otherwise, 0 for that run), and
** the tree's root ("root": that run's id; r's own when it is the root, or
** a child made before roots were named). */
static int invoke_lineage(const struct run *r, char *root, size_t n) {
  cJSON *trig = r->trigger ? cJSON_Parse(r->trigger) : NULL;
  const cJSON *d = cJSON_GetObjectItem(trig, "depth");
  const char *rt = cJSON_GetStringValue(cJSON_GetObjectItem(trig, "root"));
  int depth = cJSON_IsNumber(d) && d->valuedouble > 0 && d->valuedouble < 1e6 ? (int)d->valuedouble : 0;
  snprintf(root, n, "%s", rt && *rt ? rt : r->id);
  cJSON_Delete(trig);
  return depth;
}

/* Answer an invoke that could not start its child (or a send_event whose
** event is refused): the step fails. */
static void invoke_failed(struct task *t, const char *msg) {
  struct run *r = t->run;
  int64_t now = units_now_ms();
  if (t->parent) {
    /* In a branch's body: the body raises it, and its step records it. */
    run__park(t, 1);
    if (!run__push_values(t, "zns", (double)now, msg)) run__complete(t);
    return;
  }
  struct step_row row = {
    .run_id = r->id, .seq = t->wait_seq, .id = t->wait_id, .kind = t->wait_kind, /* or "send" */
    .status = "failed", .error = msg, .attempts = 1, .started_at = t->wait_started,
    .ended_at = now,
  };
  journal_step(sched__journal(r->sched), &row);
  run__park(t, 1);
  if (!run__push_values(t, "zns", (double)now, msg)) run__wait_durable(t);
}

/* OP_INVOKE (op.h): start the child
** run (unless a replay names it already) and wait for its outcome. */
void run_op_invoke(struct task *t, const struct op_invoke *a) {
  struct run *r = t->run;
  sched_t *s = r->sched;
  struct skill *sk = NULL;
  err_t le;
  int lrc = a->child ? 0 : sched__live_skill(s, a->skill, &sk, &le);
  if (lrc == ERR_IO || lrc == ERR_BUSY) {
    /* The store could not say which version is live (it is away for a
    ** moment): that is no answer about the skill, so the step does not
    ** fail; it asks again in a second, nothing changed meanwhile. */
    run__op_again(t, units_now_ms() + 1000);
    return;
  }
  set_wait(t, a->seq, a->id, "invoke", a->timeout_at, a->started);
  char *skill_id = mem_strdup(a->skill);
  char *data = mem_strdup(a->data);
  free(t->wait_child);
  t->wait_child = a->child ? mem_strdup(a->child) : NULL;
  lua_settop(t->co, 0);
  if (t->parent && t->step_timed_out) {
    /* A branch whose time is up starts no child in this attempt (as it
    ** sends no request: op_http). */
    char msg[300];
    snprintf(msg, sizeof msg, "step '%s' timed out before its child run started",
             t->step_id ? t->step_id : "?");
    invoke_failed(t, msg);
    free(skill_id), free(data);
    return;
  }
  if (!t->wait_child) {
    err_t e;
    if (lrc) {
      char msg[1200];
      snprintf(msg, sizeof msg, "cannot invoke '%s': %s", skill_id, le.msg);
      invoke_failed(t, msg);
      free(skill_id), free(data);
      return;
    }
    /* A chain of runs invoking runs (a skill that invokes itself, say)
    ** ends at limits.invoke_depth: each child's trigger says how deep it is. */
    char root[32];
    int depth = invoke_lineage(r, root, sizeof root) + 1, most = sched__opts(s)->invoke_depth;
    if (depth > most) {
      char msg[600];
      snprintf(msg, sizeof msg, "cannot invoke '%s': this run is %d deep in runs that invoke runs, "
               "the most limits.invoke_depth allows (%d); a skill that invokes itself needs an end",
               skill_id, depth - 1, most);
      invoke_failed(t, msg);
      free(skill_id), free(data);
      return;
    }
    cJSON *trig = cJSON_CreateObject();
    cJSON_AddStringToObject(trig, "kind", "invoke");
    cJSON_AddStringToObject(trig, "by", "skill");
    cJSON_AddStringToObject(trig, "step", t->wait_id);
    cJSON_AddNumberToObject(trig, "depth", depth);
    cJSON_AddStringToObject(trig, "root", root);
    char *tj = jsontext_print_text(trig);
    cJSON_Delete(trig);
    /* The child's id comes from this run's id and the step's, at the
    ** step's start (a replay's is the same): a replay of this step that
    ** creates the child again makes the same run, or finds it. */
    char child[27], key[640];
    int64_t now = units_now_ms();
    int64_t at = t->wait_started > 0 && t->wait_started < now ? t->wait_started : now;
    /* A branch's invoke (its key "branch/ID", at the parallel's start):
    ** a unit separator keeps its key apart from any step id's. A retry or
    ** replay of the body reaches it again with the same key: a child that
    ** exists already (here, or in the store: ended, or another
    ** process's) is awaited, not created again. */
    snprintf(key, sizeof key, "%s:%s%s", r->id, t->wait_id, t->parent ? "\x1f" : "");
    ids_ulid_derived(at, key, child);
    char st[32];
    err_t se;
    int exists = sched__find(s, child) != NULL ||
                 (t->parent && !store_run_status(sched__opts(s)->store, child, st, sizeof st, &se));
    int tree = sched__opts(s)->run_tree;
    if (!exists && sched__tree_count(s, root) >= tree) {
      char msg[600];
      snprintf(msg, sizeof msg, "cannot invoke '%s': the runs invoked from run %s (and from its "
               "children, theirs, ...) number %d, the most limits.run_tree allows; a skill that "
               "invokes itself from step.parallel multiplies its runs at every level",
               skill_id, root, tree);
      free(tj);
      invoke_failed(t, msg);
      free(skill_id), free(data);
      return;
    }
    if (!exists && sched__run_new(s, sk, child, t->parent ? now : at, tj, data, r->id, &e)) {
      invoke_failed(t, e.msg);
      free(tj), free(skill_id), free(data);
      return;
    }
    if (!exists) sched__tree_add(s, root);
    free(tj);
    t->wait_child = mem_strdup(child);
  }
  /* The step's record while it waits: the child; a branch's also names
  ** the invoke, whose replay (flow.lua's branch_invoke) reads it back. */
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "run_id", t->wait_child);
  if (t->parent) cJSON_AddStringToObject(o, "step", t->wait_id);
  char *out = jsontext_print_text(o);
  cJSON_Delete(o);
  register_wait(t, "child", t->wait_child, NULL, out);
  free(out), free(skill_id), free(data);
}

/* ---- send_event ---- */

/* A send_event step waiting for its events to be accepted. */
struct send_ctx {
  struct task *t;
  int n;
};

/* The events are durable: complete the step with their ids. */
static void on_sent(void *arg, const struct jentry *last) {
  struct send_ctx *sc = arg;
  struct task *t = sc->t;
  struct run *r = t->run;
  if (!r->aborted && !r->finished) {
    /* The n J_EVENT entries are the last n of the group, in order. */
    cJSON *ids = cJSON_CreateArray();
    for (int i = sc->n - 1; i >= 0; i--) {
      const struct jentry *je = last - i;
      cJSON_AddItemToArray(ids, cJSON_CreateString(je->result ? je->result : je->u.event.id));
    }
    char *js = jsontext_print_text(ids);
    cJSON_Delete(ids);
    int64_t now = units_now_ms();
    struct step_row row = {
      .run_id = r->id, .seq = t->wait_seq, .id = t->wait_id, .kind = "send",
      .status = "completed", .output = js, .attempts = 1, .started_at = t->wait_started,
      .ended_at = now,
    };
    journal_step(sched__journal(r->sched), &row);
    run__verbose(r, "\xe2\x9c\x93", t->wait_id, now - t->wait_started, "(sent)");
    int rc = run__push_values(t, "sn", js, (double)now);
    free(js);
    if (!rc) run__wait_durable(t);
  }
  run_unref(r);
  free(sc);
}

/* OP_SEND (op.h): journal the events (each with an
** idempotency key, so a replay sends nothing twice). */
void run_op_send(struct task *t, const struct op_send *a) {
  struct run *r = t->run;
  sched_t *s = r->sched;
  set_wait(t, a->seq, a->id, "send", 0, a->started);
  cJSON *list = cJSON_Parse(a->events);
  lua_settop(t->co, 0);
  journal_t *j = sched__journal(s);
  int64_t now = units_now_ms(), limit = sched__opts(s)->event_limit;
  int n = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, list) {
    char id[27], idem[300];
    ids_ulid(now, id);
    const cJSON *key = cJSON_GetObjectItem(ev, "id");
    /* Without a key of the caller's, the step's own makes a replay harmless. */
    if (cJSON_IsString(key)) snprintf(idem, sizeof idem, "%s", key->valuestring);
    else snprintf(idem, sizeof idem, "%s:%s:%d", r->id, t->wait_id, n + 1);
    char *data = jsontext_print_text(cJSON_GetObjectItem(ev, "data"));
    if (limit > 0 && data && (int64_t)strlen(data) > limit) {
      char msg[200], sz[32], lim[32];
      units_fmt_over((int64_t)strlen(data), limit, sz, lim, sizeof sz);
      snprintf(msg, sizeof msg, "event %d is %s, over the limit of %s (limits.event)", n + 1, sz,
               lim);
      free(data);
      cJSON_Delete(list);
      invoke_failed(t, msg); /* the same shape: nil, end time, message */
      return;
    }
    struct event_row er = {.id = id, .name = cJSON_GetObjectItem(ev, "name")->valuestring,
                           .data = data ? data : "null", .idem = idem, .ts = now,
                           .by_run = r->id};
    journal_event(j, &er);
    free(data);
    n++;
  }
  cJSON_Delete(list);
  struct send_ctx *sc = mem_calloc(1, sizeof *sc);
  sc->t = t;
  sc->n = n;
  r->refs++;
  sched__after_entry(s, on_sent, sc);
  run__park(t, 1);
}

/* ---- parallel ---- */

struct kids_ref {
  struct task *t;
  lua_State *L;
  int first; /* the index of the first branch's coroutine on t's stack */
};

/* Anchor each branch's coroutine in the registry (luaL_ref allocates),
** under lrt_protect. A kid gets its coroutine once it is anchored. */
static int ref_kids(void *arg, err_t *e) {
  struct kids_ref *kr = arg;
  struct task *t = kr->t;
  (void)e;
  for (int i = 0; i < t->nkids; i++) {
    lua_pushvalue(t->co, kr->first + i);
    lua_xmove(t->co, kr->L, 1);
    lua_State *kco = lua_tothread(kr->L, -1);
    t->kids[i]->co_ref = luaL_ref(kr->L, LUA_REGISTRYINDEX);
    t->kids[i]->co = kco;
  }
  return 0;
}

/* OP_PARALLEL (op.h): run each body as a child
** task; the parent parks until all have ended. */
void run_op_parallel(struct task *t, const struct op_parallel *a) {
  struct run *r = t->run;
  sched_t *s = r->sched;
  lrt_t *lrt = sched__opts(s)->lrt;
  lua_State *co = t->co;
  int n = a->tasks.n;
  struct step_row row = {
    .run_id = r->id, .seq = a->seq, .id = a->id, .kind = "parallel",
    .status = "running", .attempts = 1, .started_at = a->started,
  };
  journal_step(sched__journal(s), &row);
  run__free_kids(t);
  t->kids = mem_calloc((size_t)n, sizeof *t->kids);
  t->kid_value = mem_calloc((size_t)n, sizeof *t->kid_value);
  t->kid_ok = mem_calloc((size_t)n, sizeof *t->kid_ok);
  t->nkids = t->kids_left = n;
  for (int i = 0; i < n; i++) {
    struct task *k = mem_calloc(1, sizeof *k);
    k->run = r;
    k->parent = t;
    k->child_index = i;
    k->timer.fn = t->timer.fn;
    t->kids[i] = k;
  }
  struct kids_ref kr = {t, lrt_L(lrt), a->tasks.first};
  if (run__push(t, ref_kids, &kr)) return;
  lua_settop(co, 0);
  run__park(t, n);
  for (int i = 0; i < n; i++) sched__ready(s, t->kids[i]);
}

/* Push the list of t's children's results, [{ok=, value=}...], under
** lrt_protect. */
static int push_kid_results(void *arg, err_t *e) {
  struct task *t = arg;
  lua_State *co = t->co;
  (void)e;
  lua_createtable(co, t->nkids, 0);
  for (int j = 0; j < t->nkids; j++) {
    lua_createtable(co, 0, 2);
    lua_pushboolean(co, t->kid_ok[j]);
    lua_setfield(co, -2, "ok");
    lua_pushstring(co, t->kid_value[j]);
    lua_setfield(co, -2, "value");
    lua_rawseti(co, -2, j + 1);
  }
  return 0;
}

/* See run.h: the last child resumes the parent with [{ok, value}...]. */
void run_child_ended(struct task *k, int ok, const char *value) {
  struct task *t = k->parent;
  int i = k->child_index;
  t->kid_ok[i] = ok;
  t->kid_value[i] = mem_strdup(value ? value : "null");
  run__task_release(k);
  if (--t->kids_left > 0) {
    run__complete(t);
    return;
  }
  /* The last child: hand the parent every result, in order. */
  if (run__push(t, push_kid_results, t)) return;
  t->nres = 1;
  run__complete(t);
}
