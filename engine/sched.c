/*
** sched.c: the scheduler (see sched.h for the loop iteration it drives).
**
** The commit pipeline runs one job at a time on libuv's thread pool: a
** journal group to commit, a claim of unowned runs, or a reap of dead
** leases. Jobs use the store's writer connection, which nothing else
** touches while a job is in flight; the loop thread only reads.
**
** Timers live in one binary min-heap driven by a single uv_timer_t, so a
** hundred thousand sleeping runs cost a heap slot each, not a handle each.
*/
#include "sched.h"
#include "ids.h"
#include "proc.h"
#include "run.h"
#include "units.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLAIM_BATCH 500
#define DRAIN_MAX 20000
#define TICK_MS 50

/* Something to call once the group it belongs to is durable: fn, or efn
** with the journal entry idx of that group (to read the store's answer). */
struct gwait {
  void (*fn)(void *arg);
  void (*efn)(void *arg, const struct jentry *e);
  void *arg;
  size_t idx;
};

struct group {
  journal_t *j;
  struct gwait *w;
  size_t nw, cap;
};

enum job_kind { JOB_COMMIT, JOB_CLAIM, JOB_REAP, JOB_DISPATCH, JOB_PRUNE };

struct job {
  uv_work_t work;
  sched_t *s;
  enum job_kind kind;
  struct group g;
  int rc;
  err_t err;
  struct run_row *rows;
  size_t nrows;
};

struct done_waiter {
  char run_id[27];
  sched_done_cb cb;
  void *arg;
  struct done_waiter *next;
};

struct sched {
  struct sched_opts o;
  char owner[40];
  uv_idle_t idle;
  uv_prepare_t prepare;
  uv_timer_t heap_timer;
  uv_timer_t tick;
  int handles_open;
  struct group open;
  struct group retry;    /* a group whose commit failed, to commit first */
  int64_t retry_at;
  struct job *inflight;
  struct task *ready_head, *ready_tail;
  struct stimer **heap;
  size_t heap_n, heap_cap;
  struct task *cur;
  struct run *runs;
  int nruns;
  struct done_waiter *done;
  int stopping;
  int claim_wanted;
  int dispatch_wanted;
  int poll_wanted;
  struct run **map; /* live runs by id: open addressing, NULL or TOMBSTONE */
  size_t map_cap, map_n;
  int parked;       /* main tasks parked on a sleep, wait or invoke, in memory */
  struct cron_entry *crons;
  struct stimer grace;       /* the end of the shutdown's grace period */
  struct { sched_done_cb cb; void *arg; } finish[4];
  int nfinish;
  struct run **slot_waiters; /* runs refused a slot, to try again at the next poll */
  int nslot_waiters;
  int64_t data_version;
  int64_t last_commit_ms, last_claim_ms, last_reap_ms, last_prune_ms;
  struct sched_stats stats;
  sched_observer_cb observer; /* sched_observe (the REPL) */
  void *observer_arg;
};

static void maybe_submit(sched_t *s);
static void idle_cb(uv_idle_t *h);

const double sched_step_bounds_ms[SCHED_STEP_BUCKETS] = {1, 5, 10, 50, 100, 500, 1000, 5000, 30000,
                                                         1e300};

void sched__step_ended(sched_t *s, int64_t ms) {
  int i = 0;
  while (i < SCHED_STEP_BUCKETS - 1 && (double)ms > sched_step_bounds_ms[i]) i++;
  s->stats.step_buckets[i]++;
  s->stats.step_count++;
  s->stats.step_sum_ms += (double)ms;
}

const char *sched_owner(const sched_t *s) { return s->owner; }
const struct sched_opts *sched__opts(const sched_t *s) { return &s->o; }
journal_t *sched__journal(sched_t *s) { return s->open.j; }
struct task *sched__current(sched_t *s) { return s->cur; }
void sched__set_current(sched_t *s, struct task *t) { s->cur = t; }
int sched_active(const sched_t *s) { return s->nruns; }

static int group_init(struct group *g) {
  memset(g, 0, sizeof *g);
  g->j = journal_new();
  return g->j ? 0 : ERR_NOMEM;
}

static int group_empty(const struct group *g) { return !g->j || (!journal_count(g->j) && !g->nw); }

static struct gwait *add_wait(sched_t *s) {
  struct group *g = &s->open;
  if (g->nw == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 256;
    struct gwait *w = realloc(g->w, cap * sizeof *w);
    if (!w) abort(); /* cannot keep the promise to resume: nothing sane is left */
    g->w = w;
    g->cap = cap;
  }
  struct gwait *w = &g->w[g->nw++];
  memset(w, 0, sizeof *w);
  return w;
}

void sched__after_commit(sched_t *s, void (*fn)(void *arg), void *arg) {
  struct gwait *w = add_wait(s);
  w->fn = fn;
  w->arg = arg;
}

void sched__after_entry(sched_t *s, void (*fn)(void *arg, const struct jentry *e), void *arg) {
  size_t n = journal_count(s->open.j);
  struct gwait *w = add_wait(s);
  w->efn = fn;
  w->arg = arg;
  w->idx = n ? n - 1 : 0;
}

/* ---- the map of live runs ---- */

#define TOMBSTONE ((struct run *)1)

static size_t hash_id(const char *id) {
  size_t h = 1469598103934665603u;
  for (; *id; id++) h = (h ^ (unsigned char)*id) * 1099511628211u;
  return h;
}

static void map_put(sched_t *s, struct run *r);

static void map_grow(sched_t *s) {
  struct run **old = s->map;
  size_t oldcap = s->map_cap;
  s->map_cap = oldcap ? oldcap * 2 : 1024;
  s->map = calloc(s->map_cap, sizeof *s->map);
  if (!s->map) abort();
  s->map_n = 0;
  for (size_t i = 0; i < oldcap; i++)
    if (old[i] && old[i] != TOMBSTONE) map_put(s, old[i]);
  free(old);
}

static void map_put(sched_t *s, struct run *r) {
  if ((s->map_n + 1) * 2 > s->map_cap) map_grow(s);
  size_t i = hash_id(r->id) & (s->map_cap - 1);
  while (s->map[i] && s->map[i] != TOMBSTONE) i = (i + 1) & (s->map_cap - 1);
  s->map[i] = r;
  s->map_n++;
}

struct run *sched__find(sched_t *s, const char *id) {
  if (!s->map_cap) return NULL;
  size_t i = hash_id(id) & (s->map_cap - 1);
  while (s->map[i]) {
    if (s->map[i] != TOMBSTONE && !strcmp(s->map[i]->id, id)) return s->map[i];
    i = (i + 1) & (s->map_cap - 1);
  }
  return NULL;
}

static void map_del(sched_t *s, struct run *r) {
  if (!s->map_cap) return;
  size_t i = hash_id(r->id) & (s->map_cap - 1);
  while (s->map[i]) {
    if (s->map[i] == r) {
      s->map[i] = TOMBSTONE;
      /* Tombstones count towards the load; map_n tracks live entries only
      ** for growth, which is fine at these sizes. */
      return;
    }
    i = (i + 1) & (s->map_cap - 1);
  }
}

void sched__parked(sched_t *s, int delta) { s->parked += delta; }
int sched__parked_count(const sched_t *s) { return s->parked; }
void sched__want_poll(sched_t *s) { s->poll_wanted = 1; }
void sched__want_dispatch(sched_t *s) { s->dispatch_wanted = 1; }

/* ---- the ready queue ---- */

static void gate(sched_t *s, struct run *r);

void sched__ready(sched_t *s, struct task *t) {
  struct run *r = t->run;
  if (t == &r->main && r->skill && r->skill->concurrency_limit > 0 && !r->slot_held) {
    /* A run executes only while it holds a concurrency slot. */
    gate(s, r);
    return;
  }
  t->run->refs++; /* released once the task has been resumed (or skipped) */
  t->state = T_READY;
  t->next_ready = NULL;
  if (s->ready_tail) s->ready_tail->next_ready = t;
  else s->ready_head = t;
  s->ready_tail = t;
  if (s->handles_open && !uv_is_active((uv_handle_t *)&s->idle)) uv_idle_start(&s->idle, idle_cb);
}

/* Resume ready tasks. Bounded, so I/O is polled between batches. */
static void idle_cb(uv_idle_t *h) {
  sched_t *s = h->data;
  int n = 0;
  while (s->ready_head && n++ < DRAIN_MAX) {
    struct task *t = s->ready_head;
    s->ready_head = t->next_ready;
    if (!s->ready_head) s->ready_tail = NULL;
    t->next_ready = NULL;
    struct run *r = t->run;
    s->stats.resumes++;
    if (s->stats.nsamples < s->stats.cap) {
      uint64_t t0 = units_mono_ns();
      run_resume(t);
      s->stats.samples[s->stats.nsamples++] = (uint32_t)(units_mono_ns() - t0);
    } else {
      run_resume(t);
    }
    run_unref(r);
  }
  if (!s->ready_head) uv_idle_stop(&s->idle);
}

/* ---- concurrency slots ---- */

static void on_slot(void *arg, const struct jentry *je) {
  struct run *r = arg;
  sched_t *s = r->sched;
  r->slot_pending = 0;
  if (!r->aborted && !r->finished && !r->dormant) {
    if (je->result) {
      r->slot_held = 1;
      sched__ready(s, &r->main);
    } else {
      sched__slot_wait(s, r);
    }
  }
  run_unref(r);
}

/* Ask the store for r's slot; the answer makes the run ready or queues it. */
static void gate(sched_t *s, struct run *r) {
  if (r->slot_pending) return;
  r->slot_pending = 1;
  struct slot_row sl = {.run_id = r->id, .skill = r->skill->id, .key = r->ckey ? r->ckey : "",
                        .limit = r->skill->concurrency_limit, .acquire = 1, .at = r->created_at};
  journal_slot(s->open.j, &sl);
  r->refs++;
  sched__after_entry(s, on_slot, r);
}

void sched__slot_wait(sched_t *s, struct run *r) {
  struct run **w = realloc(s->slot_waiters, (size_t)(s->nslot_waiters + 1) * sizeof *w);
  if (!w) return;
  s->slot_waiters = w;
  r->refs++;
  s->slot_waiters[s->nslot_waiters++] = r;
}

/* Try again for every run waiting for a slot (something may have freed one). */
static void retry_slots(sched_t *s) {
  int n = s->nslot_waiters;
  struct run **w = s->slot_waiters;
  s->slot_waiters = NULL;
  s->nslot_waiters = 0;
  for (int i = 0; i < n; i++) {
    struct run *r = w[i];
    if (!r->aborted && !r->finished && !r->dormant && !r->slot_held) gate(s, r);
    run_unref(r);
  }
  free(w);
}

/* ---- the timer heap ---- */

static void heap_swap(sched_t *s, size_t a, size_t b) {
  struct stimer *t = s->heap[a];
  s->heap[a] = s->heap[b];
  s->heap[b] = t;
  s->heap[a]->idx = a + 1;
  s->heap[b]->idx = b + 1;
}

static void heap_up(sched_t *s, size_t i) {
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (s->heap[p]->at <= s->heap[i]->at) break;
    heap_swap(s, p, i);
    i = p;
  }
}

static void heap_down(sched_t *s, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->heap_n && s->heap[l]->at < s->heap[m]->at) m = l;
    if (r < s->heap_n && s->heap[r]->at < s->heap[m]->at) m = r;
    if (m == i) break;
    heap_swap(s, i, m);
    i = m;
  }
}

static void heap_timer_cb(uv_timer_t *h);

/* Arm the loop timer for the earliest entry of the heap. */
static void heap_rearm(sched_t *s) {
  if (!s->handles_open) return;
  if (!s->heap_n) {
    uv_timer_stop(&s->heap_timer);
    return;
  }
  int64_t d = s->heap[0]->at - units_now_ms();
  uv_timer_start(&s->heap_timer, heap_timer_cb, d > 0 ? (uint64_t)d : 0, 0);
}

void sched__timer_start(sched_t *s, struct stimer *t, int64_t at_ms) {
  if (t->idx) sched__timer_stop(s, t);
  if (s->heap_n == s->heap_cap) {
    size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
    struct stimer **h = realloc(s->heap, cap * sizeof *h);
    if (!h) abort();
    s->heap = h;
    s->heap_cap = cap;
  }
  t->at = at_ms;
  s->heap[s->heap_n] = t;
  t->idx = ++s->heap_n;
  heap_up(s, s->heap_n - 1);
  if (s->heap[0] == t) heap_rearm(s);
}

void sched__timer_stop(sched_t *s, struct stimer *t) {
  if (!t->idx) return;
  size_t i = t->idx - 1;
  int was_first = i == 0;
  s->heap_n--;
  if (i != s->heap_n) {
    s->heap[i] = s->heap[s->heap_n];
    s->heap[i]->idx = i + 1;
    heap_down(s, i);
    heap_up(s, i);
  }
  t->idx = 0;
  if (was_first) heap_rearm(s);
}

static void heap_timer_cb(uv_timer_t *h) {
  sched_t *s = h->data;
  int64_t now = units_now_ms();
  while (s->heap_n && s->heap[0]->at <= now) {
    struct stimer *t = s->heap[0];
    sched__timer_stop(s, t);
    t->fn(t);
  }
  heap_rearm(s);
}

/* ---- runs ---- */

void sched__run_link(sched_t *s, struct run *r) {
  map_put(s, r);
  r->prev = NULL;
  r->next = s->runs;
  if (s->runs) s->runs->prev = r;
  s->runs = r;
  s->nruns++;
}

void sched__run_unlink(sched_t *s, struct run *r) {
  map_del(s, r);
  if (r->prev) r->prev->next = r->next;
  else if (s->runs == r) s->runs = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
  s->nruns--;
}

void sched_on_done(sched_t *s, const char *run_id, sched_done_cb cb, void *arg) {
  struct done_waiter *w = calloc(1, sizeof *w);
  if (!w) return;
  snprintf(w->run_id, sizeof w->run_id, "%s", run_id);
  w->cb = cb;
  w->arg = arg;
  w->next = s->done;
  s->done = w;
}

void sched_on_finish(sched_t *s, sched_done_cb cb, void *arg) {
  if (s->nfinish < 4) {
    s->finish[s->nfinish].cb = cb;
    s->finish[s->nfinish++].arg = arg;
  }
}

void sched__run_done(sched_t *s, struct run *r, const char *status, const char *output,
                     const char *error) {
  struct sched_result res = {r->id, status, output, error};
  if (!strcmp(status, "completed")) s->stats.runs_completed++;
  else if (!strcmp(status, "failed")) s->stats.runs_failed++;
  else if (!strcmp(status, "cancelled")) s->stats.runs_cancelled++;
  if (strcmp(status, "abandoned"))
    for (int i = 0; i < s->nfinish; i++) s->finish[i].cb(&res, s->finish[i].arg);
  for (struct done_waiter **p = &s->done; *p;) {
    struct done_waiter *w = *p;
    if (!strcmp(w->run_id, r->id)) {
      *p = w->next;
      w->cb(&res, w->arg);
      free(w);
    } else {
      p = &w->next;
    }
  }
}

/* A run struct for a run that starts now. */
static struct run *run_new(sched_t *s, struct skill *skill, const char *id, const char *trigger,
                           const char *input, const char *parent_id, int64_t now) {
  struct run *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  snprintf(r->id, sizeof r->id, "%s", id);
  r->sched = s;
  r->skill = skill;
  r->entry = "run";
  r->trigger = strdup(trigger ? trigger : "{\"kind\":\"invoke\"}");
  r->input = input ? strdup(input) : NULL;
  r->parent_id = parent_id ? strdup(parent_id) : NULL;
  r->created_at = r->started_at = now;
  r->deadline_at = skill->timeout_ms ? now + skill->timeout_ms : 0;
  return r;
}

/* A run of skill from here: journal it and start it. */
int sched_run_new(sched_t *s, struct skill *skill, const char *trigger, const char *input,
                  const char *parent_id, char *run_id, err_t *e) {
  int64_t now = units_now_ms();
  char id[27];
  ids_ulid(now, id);
  struct run *r = run_new(s, skill, id, trigger, input, parent_id, now);
  if (!r) return err_set(e, ERR_NOMEM, "out of memory");
  struct run_row row = {
    .id = r->id, .skill = skill->id, .version = skill->version, .status = "running",
    .entry = "run", .trigger = r->trigger, .parent_id = parent_id, .input = input,
    .owner = s->owner, .created_at = now, .started_at = now, .deadline_at = r->deadline_at,
  };
  if (journal_run_new(s->open.j, &row)) {
    run_unref(r);
    return err_set(e, ERR_NOMEM, "out of memory");
  }
  if (run_id) memcpy(run_id, r->id, sizeof r->id);
  return run_start(s, r, NULL, e);
}

int sched__start_existing(sched_t *s, struct skill *skill, const char *id, const char *trigger,
                          const char *input, int64_t at, err_t *e) {
  struct run *r = run_new(s, skill, id, trigger, input, NULL, at);
  if (!r) return err_set(e, ERR_NOMEM, "out of memory");
  return run_start(s, r, NULL, e);
}

int sched__version_skill(sched_t *s, const char *version, struct skill **out, err_t *e) {
  if ((*out = skills_find(s->o.skills, version))) return 0;
  char *source = NULL, *file = NULL, *skill = NULL;
  struct skill_error se;
  int rc = store_get_version(s->o.store, version, &source, &skill, &file, &se.err);
  if (!rc) rc = skills_load(s->o.skills, source, strlen(source), file ? file : skill, out, &se);
  if (rc) err_set(e, rc, "cannot load version %.12s of skill '%s': %s", version,
                  skill ? skill : "?", se.err.msg);
  free(source), free(file), free(skill);
  return rc;
}

int sched__live_skill(sched_t *s, const char *id, struct skill **out, err_t *e) {
  cJSON *rec;
  if (store_get_skill(s->o.store, id, &rec, e)) return e->code;
  cJSON *v = cJSON_GetObjectItem(rec, "version");
  int rc = cJSON_IsString(v) ? sched__version_skill(s, v->valuestring, out, e)
                             : err_set(e, ERR_NOTFOUND, "skill '%s' has no live version", id);
  cJSON_Delete(rec);
  return rc;
}

int sched_adopt(sched_t *s, const struct run_row *row, err_t *e) {
  struct skill *skill = NULL;
  struct run *r = calloc(1, sizeof *r);
  if (!r) return err_set(e, ERR_NOMEM, "out of memory");
  snprintf(r->id, sizeof r->id, "%s", row->id);
  r->sched = s;
  r->entry = row->entry && !strcmp(row->entry, "on_failure") ? "on_failure" : "run";
  r->trigger = strdup(row->trigger ? row->trigger : "{}");
  r->input = row->input ? strdup(row->input) : NULL;
  r->parent_id = row->parent_id ? strdup(row->parent_id) : NULL;
  r->created_at = row->created_at;
  r->started_at = row->started_at ? row->started_at : units_now_ms();
  r->deadline_at = row->deadline_at;
  err_t le;
  if (sched__version_skill(s, row->version, &skill, &le)) {
    /* The version cannot run here any more: the run fails, saying why. */
    cJSON *err = cJSON_CreateObject();
    cJSON_AddStringToObject(err, "message", le.msg);
    char *ej = cJSON_PrintUnformatted(err);
    cJSON_Delete(err);
    r->skill = NULL;
    sched__run_link(s, r);
    r->refs = 1;
    run_abort(r, "failed", ej);
    free(ej);
    return 0;
  }
  r->skill = skill;
  if (strcmp(row->status, "queued")) {
    /* Taken over: say so in the run's trace. */
    s->stats.takeovers++;
    char msg[300];
    snprintf(msg, sizeof msg, "engine: resumed by %s on %s after its previous process stopped; "
             "replaying its journal", s->owner, proc_hostname());
    struct log_row l = {.run_id = r->id, .seq = 0, .ts = units_now_ms(), .level = "info",
                        .msg = msg};
    journal_log(s->open.j, &l);
  }
  if (!strcmp(row->status, "queued")) {
    if (!r->deadline_at && skill->timeout_ms) r->deadline_at = r->started_at + skill->timeout_ms;
    struct run_set set = {.run_id = r->id, .status = "running", .started_at = r->started_at};
    journal_run_set(s->open.j, &set);
    return run_start(s, r, NULL, e);
  }
  /* A parked run costs no coroutine until it wakes: it is replayed then. */
  if (!strcmp(row->status, "sleeping") || !strcmp(row->status, "waiting"))
    return run_start_dormant(s, r, row->wake_at);
  cJSON *steps = NULL;
  if (store_get_steps(s->o.store, r->id, &steps, e)) {
    run_unref(r);
    return e->code;
  }
  int rc = run_start(s, r, steps, e);
  cJSON_Delete(steps);
  return rc;
}

struct cron_entry *sched__crons(sched_t *s) { return s->crons; }
void sched__set_crons(sched_t *s, struct cron_entry *list) { s->crons = list; }

/* ---- the commit pipeline ---- */

static void work_cb(uv_work_t *w) {
  struct job *j = w->data;
  sched_t *s = j->s;
  switch (j->kind) {
  case JOB_COMMIT:
    j->rc = store_commit(s->o.store, j->g.j, &j->err);
    break;
  case JOB_CLAIM:
    j->rc = store_claim(s->o.store, s->owner, CLAIM_BATCH, &j->rows, &j->nrows, &j->err);
    break;
  case JOB_REAP:
    j->rc = store_reap(s->o.store, proc_hostname(), units_now_ms(), &j->err);
    break;
  case JOB_PRUNE: {
    int64_t runs = 0, events = 0;
    j->rc = store_prune(s->o.store, units_now_ms() - s->o.retention_ms, &runs, &events, &j->err);
    j->nrows = (size_t)runs;
    break;
  }
  case JOB_DISPATCH: {
    int runs = 0;
    j->rc = store_dispatch(s->o.store, units_now_ms(), 200, &runs, &j->err);
    j->nrows = (size_t)runs;
    break;
  }
  }
}

static void lease_lost(sched_t *s, const char *why);

/* Errors of the engine that concern a run go into its trace: a group that
** failed to commit gets a warning line for each run it touches (it is
** retried as a whole, so the lines land with the writes). */
static void note_commit_failure(journal_t *j, const char *why) {
  const char *done[32];
  int n = 0;
  size_t count = journal_count(j);
  char msg[1200];
  snprintf(msg, sizeof msg, "engine: writing this run's journal failed, retrying: %s", why);
  for (size_t i = 0; i < count && n < 32; i++) {
    const struct jentry *e = journal_entry(j, i);
    const char *id = e->kind == J_STEP ? e->u.step.run_id : e->kind == J_RUN_SET ? e->u.set.run_id
                   : NULL;
    if (!id) continue;
    int seen = 0;
    for (int k = 0; k < n && !seen; k++) seen = !strcmp(done[k], id);
    if (seen) continue;
    done[n++] = id;
    struct log_row l = {.run_id = id, .seq = 0, .ts = units_now_ms(), .level = "warn", .msg = msg};
    journal_log(j, &l);
  }
}

static void call_waiters(struct group *g) {
  for (size_t i = 0; i < g->nw; i++) {
    struct gwait *w = &g->w[i];
    if (w->efn) w->efn(w->arg, journal_entry(g->j, w->idx));
    else w->fn(w->arg);
  }
}

static void after_work_cb(uv_work_t *w, int status) {
  struct job *j = w->data;
  sched_t *s = j->s;
  s->inflight = NULL;
  if (status == UV_ECANCELED) j->rc = err_set(&j->err, ERR_BUSY, "cancelled");
  switch (j->kind) {
  case JOB_COMMIT:
    if (j->rc == 0) {
      s->last_commit_ms = units_now_ms();
      s->stats.commits++;
      s->stats.committed_entries += journal_count(j->g.j);
      for (size_t i = 0, n = journal_count(j->g.j); i < n; i++) {
        const struct jentry *je = journal_entry(j->g.j, i);
        if (je->kind == J_EVENT) s->dispatch_wanted = 1;
        if (je->kind == J_CHILD_DONE || je->kind == J_CANCEL || (je->kind == J_WAIT && je->result))
          s->poll_wanted = 1;
      }
      if (s->observer)
        for (size_t i = 0, n = journal_count(j->g.j); i < n; i++)
          s->observer(journal_entry(j->g.j, i), s->observer_arg);
      call_waiters(&j->g);
      journal_free(j->g.j);
      free(j->g.w);
    } else if (j->rc == ERR_CONFLICT) {
      /* Fenced: another process owns our runs now. They are dropped first,
      ** without writing anything, so their waiters find them aborted. */
      lease_lost(s, j->err.msg);
      call_waiters(&j->g);
      journal_free(j->g.j);
      free(j->g.w);
    } else {
      fprintf(stderr, "moonloop: commit failed, retrying: %s\n", j->err.msg);
      note_commit_failure(j->g.j, j->err.msg);
      s->retry = j->g;
      s->retry_at = units_now_ms() + 200;
    }
    break;
  case JOB_CLAIM:
    s->last_claim_ms = units_now_ms();
    if (j->rc) {
      fprintf(stderr, "moonloop: claiming runs failed: %s\n", j->err.msg);
    } else {
      for (size_t i = 0; i < j->nrows && !s->stopping; i++) {
        err_t e;
        if (sched_adopt(s, &j->rows[i], &e))
          fprintf(stderr, "moonloop: cannot resume run %s: %s\n", j->rows[i].id, e.msg);
      }
      if (j->nrows == CLAIM_BATCH) s->claim_wanted = 1;
      store_rows_free(j->rows, j->nrows);
    }
    break;
  case JOB_REAP:
    s->last_reap_ms = units_now_ms();
    if (j->rc > 0) s->claim_wanted = 1;
    break;
  case JOB_PRUNE:
    s->last_prune_ms = units_now_ms();
    if (j->rc) fprintf(stderr, "moonloop: pruning history failed: %s\n", j->err.msg);
    else if (j->nrows) fprintf(stderr, "moonloop: pruned %zu runs past the retention\n", j->nrows);
    break;
  case JOB_DISPATCH:
    if (j->rc < 0) {
      fprintf(stderr, "moonloop: dispatching events failed: %s\n", j->err.msg);
    } else {
      if (j->rc == 200) s->dispatch_wanted = 1; /* more are waiting */
      if (j->nrows) s->claim_wanted = 1;
      if (j->rc > 0) s->poll_wanted = 1;
    }
    break;
  }
  free(j);
  maybe_submit(s);
}

static void submit(sched_t *s, struct job *j) {
  j->s = s;
  j->work.data = j;
  s->inflight = j;
  if (uv_queue_work(s->o.loop, &j->work, work_cb, after_work_cb)) {
    s->inflight = NULL;
    free(j);
  }
}

/* Start the next job if none is in flight: a failed group first, then the
** open group, then claiming or reaping when they are due. */
static void maybe_submit(sched_t *s) {
  if (s->inflight) return;
  int64_t now = units_now_ms();
  int64_t ttl = s->o.lease_ttl_ms;
  struct job *j;
  if (!group_empty(&s->retry)) {
    if (now < s->retry_at) return;
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_COMMIT;
    j->g = s->retry;
    memset(&s->retry, 0, sizeof s->retry);
    journal_set_owner(j->g.j, s->owner, now + ttl);
    submit(s, j);
    return;
  }
  /* An empty group still renews the lease when nothing else has lately. */
  int renew = s->handles_open && now - s->last_commit_ms > ttl / 3;
  if (!group_empty(&s->open) || renew) {
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_COMMIT;
    j->g = s->open;
    if (group_init(&s->open)) abort();
    journal_set_owner(j->g.j, s->owner, now + ttl);
    submit(s, j);
    return;
  }
  if (s->dispatch_wanted && !s->stopping) {
    s->dispatch_wanted = 0;
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_DISPATCH;
    submit(s, j);
    return;
  }
  if (s->o.mode != SCHED_SERVE || s->stopping) return;
  if (s->o.retention_ms > 0 && now - s->last_prune_ms > 3600 * 1000) {
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_PRUNE;
    submit(s, j);
    return;
  }
  if (now - s->last_reap_ms > ttl / 2) {
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_REAP;
    submit(s, j);
    return;
  }
  if (s->claim_wanted || now - s->last_claim_ms > 2000) {
    s->claim_wanted = 0;
    if (!(j = calloc(1, sizeof *j))) return;
    j->kind = JOB_CLAIM;
    submit(s, j);
  }
}

static void prepare_cb(uv_prepare_t *h) {
  sched_t *s = h->data;
  maybe_submit(s);
}

static void close_handles(sched_t *s);

/* Hand what other processes delivered to this process's runs: waits that
** got their event or child outcome, and cancellations. */
static void poll_runs(sched_t *s) {
  if (s->nslot_waiters) retry_slots(s);
  if (!s->nruns) return;
  cJSON *out;
  err_t e;
  if (store_poll(s->o.store, s->owner, &out, &e)) {
    fprintf(stderr, "moonloop: polling: %s\n", e.msg);
    return;
  }
  const cJSON *x;
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(out, "cancels")) {
    struct run *r = sched__find(s, cJSON_GetObjectItem(x, "run_id")->valuestring);
    if (r) run_cancelled(r, cJSON_GetObjectItem(x, "reason")->valuestring);
  }
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(out, "deliveries")) {
    struct run *r = sched__find(s, cJSON_GetObjectItem(x, "run_id")->valuestring);
    if (r) run_delivered(r, cJSON_GetObjectItem(x, "seq")->valueint);
  }
  cJSON_Delete(out);
}

/* Every 50 ms: notice other processes' writes, and stop a solo scheduler
** whose work is done. */
static void tick_cb(uv_timer_t *h) {
  sched_t *s = h->data;
  if (!s->stopping) {
    int64_t v = store_data_version(s->o.store);
    if (v != s->data_version) {
      s->data_version = v;
      s->claim_wanted = s->o.mode == SCHED_SERVE;
      s->dispatch_wanted = 1;
      s->poll_wanted = 1;
    }
  }
  if (s->poll_wanted && !s->stopping) {
    s->poll_wanted = 0;
    poll_runs(s);
  }
  if ((s->stopping || s->o.mode == SCHED_SOLO) && !s->nruns && !s->inflight &&
      group_empty(&s->open) && group_empty(&s->retry)) {
    close_handles(s);
    return;
  }
  maybe_submit(s);
}

/* ---- the lease ---- */

static int take_lease(sched_t *s, err_t *e) {
  unsigned char rnd[6];
  ids_random(rnd, sizeof rnd);
  snprintf(s->owner, sizeof s->owner, "%s-%ld-%02x%02x%02x%02x%02x%02x", s->o.lease_kind,
           (long)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
  struct lease l = {
    .owner = s->owner, .kind = s->o.lease_kind, .host = proc_hostname(), .pid = (long)getpid(),
    .pid_start = proc_start_time((long)getpid()),
    .expires_at = units_now_ms() + s->o.lease_ttl_ms,
  };
  s->last_commit_ms = units_now_ms();
  return store_lease_acquire(s->o.store, &l, e);
}

static void lease_lost(sched_t *s, const char *why) {
  fprintf(stderr, "moonloop: %s; dropping this process's runs\n", why);
  while (s->runs) run_abort(s->runs, NULL, NULL);
  /* Long-lived engines go on with a new lease (the REPL too: its next
  ** runs need one). */
  if ((s->o.mode == SCHED_SERVE || s->o.mode == SCHED_REPL) && !s->stopping) {
    err_t e;
    if (take_lease(s, &e)) fprintf(stderr, "moonloop: cannot take a new lease: %s\n", e.msg);
    s->claim_wanted = s->o.mode == SCHED_SERVE;
  }
}

int sched_new(const struct sched_opts *o, sched_t **out, err_t *e) {
  sched_t *s = calloc(1, sizeof *s);
  if (!s) return err_set(e, ERR_NOMEM, "out of memory");
  s->o = *o;
  if (!s->o.lease_kind)
    s->o.lease_kind = o->mode == SCHED_SERVE ? "serve" : o->mode == SCHED_REPL ? "repl" : "run";
  if (s->o.lease_ttl_ms <= 0) s->o.lease_ttl_ms = 15000;
  if (s->o.default_retries < 0) s->o.default_retries = 3;
  if (s->o.backoff_ms <= 0) s->o.backoff_ms = 1000;
  if (s->o.backoff_max_ms <= 0) s->o.backoff_max_ms = 600000;
  if (s->o.step_output_limit <= 0) s->o.step_output_limit = 1 << 20;
  if (s->o.event_limit <= 0) s->o.event_limit = 1 << 20;
  if (s->o.max_parked == 0) s->o.max_parked = 10000;
  if (group_init(&s->open)) {
    free(s);
    return err_set(e, ERR_NOMEM, "out of memory");
  }
  s->data_version = -1;
  run_register_core(o->lrt, s);
  *out = s;
  return 0;
}

int sched_start(sched_t *s, err_t *e) {
  if (take_lease(s, e)) return e->code;
  uv_loop_t *loop = s->o.loop;
  uv_idle_init(loop, &s->idle);
  uv_prepare_init(loop, &s->prepare);
  uv_timer_init(loop, &s->heap_timer);
  uv_timer_init(loop, &s->tick);
  s->idle.data = s->prepare.data = s->heap_timer.data = s->tick.data = s;
  s->handles_open = 1;
  uv_prepare_start(&s->prepare, prepare_cb);
  uv_timer_start(&s->tick, tick_cb, TICK_MS, TICK_MS);
  if (s->ready_head) uv_idle_start(&s->idle, idle_cb);
  heap_rearm(s);
  if (s->o.mode == SCHED_SERVE) s->claim_wanted = 1;
  sched__skills_changed(s);
  return 0;
}

static void close_handles(sched_t *s) {
  if (!s->handles_open) return;
  s->handles_open = 0;
  uv_close((uv_handle_t *)&s->idle, NULL);
  uv_close((uv_handle_t *)&s->prepare, NULL);
  uv_close((uv_handle_t *)&s->heap_timer, NULL);
  uv_close((uv_handle_t *)&s->tick, NULL);
  err_t e;
  if (store_lease_release(s->o.store, s->owner, &e))
    fprintf(stderr, "moonloop: releasing the lease: %s\n", e.msg);
}

/* A run with a step body in flight (in its main task or a parallel child). */
static int in_body(const struct run *r) {
  if (r->main.in_body) return 1;
  for (int i = 0; i < r->main.nkids; i++)
    if (r->main.kids[i] && r->main.kids[i]->in_body) return 1;
  return 0;
}

/* Release every run that is not inside a step body (all of them when force). */
static void release_runs(sched_t *s, int force) {
  for (struct run *r = s->runs, *next; r; r = next) {
    next = r->next;
    if (force || !in_body(r)) run_abort(r, NULL, NULL);
  }
}

static void on_grace_over(struct stimer *t) {
  sched_t *s = (sched_t *)((char *)t - offsetof(struct sched, grace));
  if (s->nruns)
    fprintf(stderr, "moonloop: grace period over: releasing %d run%s with a step in flight "
            "(the next engine runs those steps again)\n", s->nruns, s->nruns == 1 ? "" : "s");
  release_runs(s, 1);
}

int sched__draining(const sched_t *s) { return s->stopping; }

void sched_stop(sched_t *s, int64_t grace_ms) {
  if (s->stopping) return;
  s->stopping = 1;
  sched__crons_free(s);
  /* Runs are left to whoever takes them over: dropped here without a
  ** write; the lease release makes them claimable. Bodies in flight may
  ** first reach their checkpoint (run_resume releases them there). */
  release_runs(s, grace_ms <= 0);
  if (s->nruns) {
    s->grace.fn = on_grace_over;
    sched__timer_start(s, &s->grace, units_now_ms() + grace_ms);
  }
  if (!s->inflight && s->handles_open) {
    /* Commit what is open first; the tick closes the handles after. */
    maybe_submit(s);
  }
}

void sched_observe(sched_t *s, sched_observer_cb cb, void *arg) {
  s->observer = cb;
  s->observer_arg = arg;
}

void sched_abandon_all(sched_t *s) {
  while (s->runs) run_abort(s->runs, NULL, NULL);
}

void sched_stats_enable(sched_t *s, size_t cap) {
  free(s->stats.samples);
  s->stats.samples = calloc(cap, sizeof *s->stats.samples);
  s->stats.cap = s->stats.samples ? cap : 0;
  s->stats.nsamples = 0;
}

const struct sched_stats *sched_stats(const sched_t *s) {
  int n = 0;
  for (struct task *t = s->ready_head; t; t = t->next_ready) n++;
  ((sched_t *)s)->stats.ready = n;
  return &s->stats;
}

void sched_free(sched_t *s) {
  if (!s) return;
  free(s->stats.samples);
  while (s->done) {
    struct done_waiter *w = s->done;
    s->done = w->next;
    free(w);
  }
  journal_free(s->open.j);
  free(s->open.w);
  journal_free(s->retry.j);
  free(s->retry.w);
  free(s->heap);
  free(s->map);
  free(s->slot_waiters);
  free(s);
}
