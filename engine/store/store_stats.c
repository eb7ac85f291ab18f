/*
** store_stats.c: a skill's health over a window of history (store.h's
** store_stats_skill and store_stats_overview) and the event stream
** (store_list_events), read from the runs, steps and events tables.
**
** The window [since, until) is cut into equal intervals, the first one
** starting at a multiple of the interval, so two queries a minute apart
** show the same intervals. A run belongs to the interval its created_at
** falls in (the time it was triggered); its outcome is its status now.
**
** Where each figure comes from, and why it stays fast over a million runs:
**
**   runs        ended runs: runs_ended, a partial index on (skill, status,
**               created_at, started_at, ended_at, steps, failed_steps,
**               retries, tokens, id) over ended runs only: one range of it
**               per skill, status and window, never the table; partial, so
**               a run's entry is written once, when it ends. The runs not
**               ended yet: runs_status (status, id) from the window's
**               first ULID on, for every skill at once in the overview. The overview's window before is
**               only counted, range by range, without reading an entry.
**               Counts by outcome, failure rate (failed among completed and
**               failed: a cancelled run is no failure, an unfinished one has
**               no outcome yet), run duration (started_at to ended_at of
**               ended runs), queue wait (created_at to started_at: 0 for a
**               run that starts at once; it grows once runs wait for a slot
**               or a throttle).
**   step sums   an ended run's summary of its steps (written with its
**               ending status, in the same write: store_sqlite.c's
**               W_RUN_SET, or store__run_ended for a failed or cancelled
**               run): steps, failed steps, retries (attempts after the
**               first), LLM tokens. Exact, per interval and over
**               the window, without reading a step.
**   steps       step durations (of kind "run": a sleep's or a wait's length
**               is what it waited for), the slowest steps and the most
**               failing ones, by step id (a repeat's "#N" dropped: "poll#3"
**               is "poll"). Reading the steps of every run of a busy week
**               is a hundred megabytes, so they are read for at most
**               STEP_SAMPLE ended runs spread evenly over the window (all of
**               them below that), and, for the failing list, for the runs
**               whose summary has a failed step or a retry (at most
**               FAILING_SAMPLE, spread evenly); "step_sample" says how many
**               of how many were read. Each run's steps are one lookup of
**               the steps table's key.
**   percentiles nearest rank (the smallest value with at least p of the
**               values at or below it), found by selection (linear, no
**               sort), per interval and over the window.
**   versions    versions_skill (skill, loaded_at).
**
** Every function reads through the reader connection, inside one read
** transaction, so the figures of one answer come from one snapshot; but
** the overview hands every other skill's passes to a second thread with a
** read-only connection of its own (when the backend has one: SQLite),
** whose snapshot may be a commit newer (each skill's figures are still
** from one snapshot).
**
** Written once for both backends: the rows come from the backend's named
** read queries (store_backend.h's RQ_ENDED and the others; SQLite's SQL
** is in store_sqlite_read.c, PostgreSQL's in store_pg_read.c).
*/
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "store/store_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOP_STEPS 10          /* slowest and most failing steps listed */
#define MAX_STEP_IDS 2000     /* distinct step ids tracked; more go to "(other)" */
#define STEP_SAMPLE 2000      /* ended runs whose step durations are read, at most */
#define FAILING_SAMPLE 5000   /* runs with a failed step or a retry read, at most */
#define EVENT_DATA_MAX 4096   /* event data shown in the stream, in bytes */
#define RUN_ID_MAX 43         /* longer run ids (never made by moonloop) have no step figures */
#define AUTO_INTERVALS 60     /* intervals an automatic interval gives at most */

#define ROLLUP_MS 3600000     /* the rollup's time bucket, an hour (store_rollup.c) */
#define NOW_SLACK 60000       /* a window ending this close to now ends now */

/* For tests: read the steps of every n-th run (n > 0) instead of the sample. */
int store__stats_steps_mode = 0;
/* For tests: 0 reads every ended run instead of the rollup. */
int store__stats_rollup = 1;

/* ---- values in groups, and their percentiles ----------------------------- */

/* A growing list of (group, value) pairs: durations by interval or by step. */
struct vals {
  uint32_t *g;
  int64_t *v;
  size_t n, cap;
};

static void vals_add(struct vals *x, uint32_t g, int64_t v) {
  if (x->n == x->cap) {
    x->cap = x->cap ? x->cap * 2 : 1024;
    x->g = mem_realloc(x->g, x->cap * sizeof *x->g);
    x->v = mem_realloc(x->v, x->cap * sizeof *x->v);
  }
  x->g[x->n] = g;
  x->v[x->n++] = v;
}

static void vals_free(struct vals *x) {
  free(x->g);
  free(x->v);
  memset(x, 0, sizeof *x);
}

/* Order the values by group (a counting sort: linear): afterwards group
** k's values are v[off[k]] .. v[off[k+1]-1]. *off (ngroups + 1 entries)
** is malloc'd. */
static size_t *vals_group(struct vals *x, uint32_t ngroups) {
  size_t *off = mem_calloc((size_t)ngroups + 1, sizeof *off);
  int64_t *nv = mem_alloc(x->n * sizeof *nv);
  size_t *fill = mem_alloc(((size_t)ngroups + 1) * sizeof *fill);
  for (size_t i = 0; i < x->n; i++) off[x->g[i] + 1]++;
  for (uint32_t k = 0; k < ngroups; k++) off[k + 1] += off[k];
  memcpy(fill, off, ((size_t)ngroups + 1) * sizeof *fill);
  for (size_t i = 0; i < x->n; i++) nv[fill[x->g[i]]++] = x->v[i];
  free(fill);
  free(x->v);
  x->v = nv;
  return off;
}

static void swap64(int64_t *a, int64_t *b) {
  int64_t t = *a;
  *a = *b;
  *b = t;
}

/* Put the k-th smallest of a[0..n) at a[k], smaller or equal ones before
** it and greater or equal ones after (Wirth's FIND with a median of three:
** the three ordered values are sentinels for the inner loops). */
static void select_k(int64_t *a, long n, long k) {
  long lo = 0, hi = n - 1;
  while (lo < hi) {
    long mid = lo + (hi - lo) / 2;
    if (a[mid] < a[lo]) swap64(&a[mid], &a[lo]);
    if (a[hi] < a[lo]) swap64(&a[hi], &a[lo]);
    if (a[hi] < a[mid]) swap64(&a[hi], &a[mid]);
    int64_t pivot = a[mid];
    long i = lo, j = hi;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) swap64(&a[i++], &a[j--]);
    }
    /* Now a[lo..j] <= pivot <= a[i..hi], and what lies between equals it. */
    if (k <= j) hi = j;
    else if (k >= i) lo = i;
    else return;
  }
}

/* The nearest rank of per-mille p among n values (0-based). */
static size_t rank_of(int p, size_t n) { return ((size_t)p * n + 999) / 1000 - 1; }

/* p50, p95 and p99 of a[0..n) (reordered) into out; n > 0. Each selection
** leaves the larger values to its right, so the next one looks there only. */
static void pcts(int64_t *a, size_t n, int64_t out[3]) {
  static const int per_mille[3] = {500, 950, 990};
  size_t from = 0;
  for (int i = 0; i < 3; i++) {
    size_t k = rank_of(per_mille[i], n);
    select_k(a + from, (long)(n - from), (long)(k - from));
    out[i] = a[k];
    from = k;
  }
}

/* o[key] = {"p50", "p95", "p99", "n"} of a[0..n) (nulls when n is 0). */
static void add_pcts(cJSON *o, const char *key, int64_t *a, size_t n) {
  cJSON *p = cJSON_AddObjectToObject(o, key);
  static const char *const names[3] = {"p50", "p95", "p99"};
  int64_t v[3];
  if (n) pcts(a, n, v);
  for (int i = 0; i < 3; i++) {
    if (n) cJSON_AddNumberToObject(p, names[i], (double)v[i]);
    else cJSON_AddNullToObject(p, names[i]);
  }
  cJSON_AddNumberToObject(p, "n", (double)n);
}

/* o[key] = num / den, or null when den is 0. */
static void add_ratio(cJSON *o, const char *key, int64_t num, int64_t den) {
  if (den) cJSON_AddNumberToObject(o, key, round((double)num / (double)den * 10000) / 10000);
  else cJSON_AddNullToObject(o, key);
}

/* ---- run figures ------------------------------------------------------------ */

/* Counts over a window or one interval. The step sums come from the
** summaries of ended runs. */
/* The counts of a window, each also its name in the answer: X(field). The
** runs' counts, then the sums of their steps' summaries. */
#define COUNTS_RUNS(X) X(started) X(completed) X(failed) X(cancelled) X(skipped) X(active) X(queued)
#define COUNTS_STEPS(X) X(steps) X(failed_steps) X(retries) X(tokens)
#define COUNTS_FIELD(f) int64_t f;
struct counts {
  COUNTS_RUNS(COUNTS_FIELD)
  COUNTS_STEPS(COUNTS_FIELD)
};

/* An ended run whose steps may be read. */
struct runref {
  char id[RUN_ID_MAX + 1];
  uint32_t bucket;
  int problem; /* its summary has a failed step or a retry */
};

/* One skill's run figures over a window, with a series when nb > 0. */
struct runagg {
  int64_t since, iv;
  uint32_t nb;             /* intervals (0: totals only) */
  struct counts tot;
  struct counts *b;        /* per interval */
  struct vals dur, wait;   /* durations and queue waits, grouped by interval */
  int sums;                /* read the step sums (the skill view; not the overview) */
  int waits;               /* queue waits too (the skill view; not the overview) */
  int want_refs;           /* keep the ended runs' ids, in creation order */
  struct runref *refs;
  size_t nrefs, caprefs, nproblem;
};

static void runagg_free(struct runagg *a) {
  free(a->b);
  free(a->refs);
  vals_free(&a->dur);
  vals_free(&a->wait);
}

/* One run as count_run reads it. */
struct runrow {
  int64_t created, started, ended, steps, failed_steps, retries, tokens;
  int queued, summed; /* no start yet; the summary is there (the run ended) */
  int outcome;        /* its status (enum run_status): an ended one, or any other for active */
};

/* The count of c that a run in status st adds to: one per ended status,
** active for the others. The switch names every status of vocab.h, so a
** status added there fails the build (-Wswitch) until it is counted here. */
static int64_t *count_of(struct counts *c, enum run_status st) {
  switch (st) {
  case RUN_COMPLETED: return &c->completed;
  case RUN_FAILED: return &c->failed;
  case RUN_CANCELLED: return &c->cancelled;
  case RUN_SKIPPED: return &c->skipped;
  case RUN_QUEUED:
  case RUN_RUNNING:
  case RUN_SLEEPING:
  case RUN_WAITING: break;
  }
  return &c->active;
}

/* Add a run to c. */
static void count_into(struct counts *c, const struct runrow *r) {
  c->started++;
  (*count_of(c, (enum run_status)r->outcome))++;
  c->queued += r->queued;
  c->steps += r->steps;
  c->failed_steps += r->failed_steps;
  c->retries += r->retries;
  c->tokens += r->tokens;
}

/* Keep an ended run's id (in interval k; problem: its summary has a
** failed step or a retry) for the step sample. */
static void add_ref(struct runagg *a, const char *id, uint32_t k, int problem) {
  size_t len = id ? strlen(id) : 0;
  if (!len || len > RUN_ID_MAX) return;
  if (a->nrefs == a->caprefs) {
    a->caprefs = a->caprefs ? a->caprefs * 2 : 1024;
    a->refs = mem_realloc(a->refs, a->caprefs * sizeof *a->refs);
  }
  struct runref *ref = &a->refs[a->nrefs++];
  memcpy(ref->id, id, len + 1);
  ref->bucket = k;
  ref->problem = problem;
  a->nproblem += problem;
}

/* The interval of a that time t falls in (0 without a series). */
static uint32_t bucket_of(const struct runagg *a, int64_t t) {
  if (!a->nb) return 0;
  int64_t k = (t - a->since) / a->iv;
  return k < 0 ? 0 : k >= a->nb ? a->nb - 1 : (uint32_t)k;
}

/* Add the counts of x to c. */
static void counts_add(struct counts *c, const struct counts *x) {
#define COUNTS_ADD(f) c->f += x->f;
  COUNTS_RUNS(COUNTS_ADD)
  COUNTS_STEPS(COUNTS_ADD)
#undef COUNTS_ADD
}

/* Count one run with outcome (its status, enum run_status; RUN_RUNNING
** for any run not ended): the current row of st, whose columns are created_at, (a
** column not read), started_at, ended_at, steps, failed_steps, retries,
** tokens, id. */
static void count_run(struct runagg *a, const struct store_cur *st, int outcome) {
  struct runrow r;
  r.outcome = outcome;
  r.created = cur_i64(st, 0);
  r.queued = cur_null(st, 2);
  r.started = r.queued ? 0 : cur_i64(st, 2);
  r.ended = cur_i64(st, 3);
  r.summed = a->sums && !cur_null(st, 4);
  r.steps = r.summed ? cur_i64(st, 4) : 0;
  r.failed_steps = r.summed ? cur_i64(st, 5) : 0;
  r.retries = r.summed ? cur_i64(st, 6) : 0;
  r.tokens = r.summed ? cur_i64(st, 7) : 0;
  uint32_t k = bucket_of(a, r.created);
  count_into(&a->tot, &r);
  if (a->nb) count_into(&a->b[k], &r);
  if (r.started && r.ended >= r.started && r.ended) vals_add(&a->dur, k, r.ended - r.started);
  if (a->waits && r.started && r.started >= r.created) vals_add(&a->wait, k, r.started - r.created);
  if (!a->want_refs || !vocab_run_ended(vocab_run_statuses[r.outcome])) return;
  add_ref(a, cur_text(st, 8), k, r.failed_steps > 0 || r.retries > 0);
}

/* The ended runs of skill created in [from, until) into a (on conn, or
** the reader), read run by run: one query per ended status, which the
** query says (the status is not read). */
static int ended_pass(store_t *s, void *conn, const char *skill, int64_t from, int64_t until,
                      struct runagg *a, err_t *e) {
  if (a->nb && !a->b) a->b = mem_calloc(a->nb, sizeof *a->b);
  int rc = 0, src = 0;
  for (int i = 0; vocab_run_statuses[i] && !rc && src == 0; i++) {
    if (!vocab_run_ended(vocab_run_statuses[i])) continue;
    struct store_val v[4] = {SV_TEXT(skill), SV_INT(from), SV_INT(until),
                             SV_TEXT(vocab_run_statuses[i])};
    struct store_cur st;
    /* Each column read costs on every row: the overview reads only three. */
    if (store__rq(s, conn, a->sums ? RQ_ENDED_SUMS : RQ_ENDED, v, 4, &st, e)) return e->code;
    while ((src = cur_next(&st)) == 1) count_run(a, &st, i);
    if (src < 0) rc = st.ops->err(&st, e, "reading runs for the figures");
    cur_close(&st);
  }
  return rc;
}

/* store__hist_each's each: n copies of value into a group's values. */
struct hist_into {
  struct vals *x;
  uint32_t k;
};
static void hist_into(void *arg, int64_t value, int64_t n) {
  struct hist_into *h = arg;
  for (int64_t i = 0; i < n; i++) vals_add(h->x, h->k, value);
}

/* The rollup's hours of skill in [from, until) into a (on conn, or the
** reader): counts, the step sums when a has them, and the durations and
** waits from the histograms (hists; each value as many times as counted).
** An hour goes to the interval it starts in: whole, as a's intervals are
** whole hours (rollup_fits). */
static int rollup_pass(store_t *s, void *conn, const char *skill, int64_t from, int64_t until,
                       struct runagg *a, int hists, err_t *e) {
  if (a->nb && !a->b) a->b = mem_calloc(a->nb, sizeof *a->b);
  struct store_val v[3] = {SV_TEXT(skill), SV_INT(from), SV_INT(until)};
  struct store_cur st;
  if (store__rq(s, conn, RQ_ROLLUP, v, 3, &st, e)) return e->code;
  int src, rc = 0;
  while ((src = cur_next(&st)) == 1) {
    uint32_t k = bucket_of(a, cur_i64(&st, 0));
    struct counts c = {0};
    c.completed = cur_i64(&st, 1);
    c.failed = cur_i64(&st, 2);
    c.cancelled = cur_i64(&st, 3);
    c.skipped = cur_i64(&st, 4);
    c.started = c.completed + c.failed + c.cancelled + c.skipped;
    if (hists) c.queued = cur_i64(&st, 5);
    if (a->sums) {
      c.steps = cur_i64(&st, 6);
      c.failed_steps = cur_i64(&st, 7);
      c.retries = cur_i64(&st, 8);
      c.tokens = cur_i64(&st, 9);
    }
    counts_add(&a->tot, &c);
    if (a->nb) counts_add(&a->b[k], &c);
    if (!hists) continue;
    struct hist_into d = {&a->dur, k}, w = {&a->wait, k};
    if (store__hist_each(cur_text(&st, 10), hist_into, &d) ||
        (a->waits && store__hist_each(cur_text(&st, 11), hist_into, &w))) {
      rc = err_set(e, ERR_IO, "store: the figures' rollup of '%s' is damaged (hour %lld)", skill,
                   (long long)cur_i64(&st, 0));
      break;
    }
  }
  if (!rc && src < 0) rc = st.ops->err(&st, e, "reading the figures' rollup");
  cur_close(&st);
  return rc;
}

/* Whether a's figures may come from the rollup: its intervals, if any,
** are whole hours. */
static int rollup_fits(const struct runagg *a) {
  return store__stats_rollup &&
         (!a->nb || (a->iv % ROLLUP_MS == 0 && a->since % ROLLUP_MS == 0));
}

/* The ended runs of skill created in [from, until) into a: the whole
** hours from the rollup when it fits (hists: with durations and waits),
** the part hours at either end run by run. A window that ends now (within
** NOW_SLACK: until is taken before the store is asked) takes its last hour
** whole from the rollup: no run was created after it yet. */
static int ended_runs(store_t *s, void *conn, const char *skill, int64_t from, int64_t until,
                      struct runagg *a, int hists, err_t *e) {
  if (!rollup_fits(a) || from < 0) return ended_pass(s, conn, skill, from, until, a, e);
  int64_t h0 = (from + ROLLUP_MS - 1) / ROLLUP_MS * ROLLUP_MS;
  int64_t h1 = until / ROLLUP_MS * ROLLUP_MS;
  if (h1 < until && until >= units_now_ms() - NOW_SLACK) h1 += ROLLUP_MS;
  if (h1 <= h0) return ended_pass(s, conn, skill, from, until, a, e);
  if (from < h0 && ended_pass(s, conn, skill, from, h0, a, e)) return e->code;
  if (rollup_pass(s, conn, skill, h0, h1, a, hists, e)) return e->code;
  if (h1 < until && ended_pass(s, conn, skill, h1, until, a, e)) return e->code;
  return 0;
}

/* The ended runs' ids of skill created in [a->since, until) into a's refs
** (the step sample), from runs_ended, reading their ids and summaries only. */
static int refs_pass(store_t *s, const char *skill, int64_t until, struct runagg *a, err_t *e) {
  int rc = 0, src = 0;
  for (int i = 0; vocab_run_statuses[i] && !rc; i++) {
    /* (skipped runs ran no step: the sample has nothing to take from them) */
    if (!vocab_run_ended(vocab_run_statuses[i]) || i == RUN_SKIPPED) continue;
    struct store_val v[4] = {SV_TEXT(skill), SV_INT(a->since), SV_INT(until),
                             SV_TEXT(vocab_run_statuses[i])};
    struct store_cur st;
    if (store__rq(s, NULL, RQ_ENDED_REFS, v, 4, &st, e)) return e->code;
    while ((src = cur_next(&st)) == 1) {
      int problem = (!cur_null(&st, 2) && cur_i64(&st, 2) > 0) ||
                    (!cur_null(&st, 3) && cur_i64(&st, 3) > 0);
      add_ref(a, cur_text(&st, 1), bucket_of(a, cur_i64(&st, 0)), problem);
    }
    if (src < 0) rc = st.ops->err(&st, e, "reading runs for the step figures");
    cur_close(&st);
  }
  return rc;
}

/* The first ten digits of the ULIDs made at ms: its time, in Crockford's
** base 32 (ids.c), which sorts as the time does. */
static void ulid_time(int64_t ms, char out[11]) {
  static const char digits[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  for (int k = 0; k < 10; k++) out[k] = digits[((uint64_t)ms >> (45 - 5 * k)) & (k ? 31 : 7)];
  out[10] = 0;
}

/* The runs not ended yet, created in [since, until), of skill (NULL: of
** every skill), one at a time to each(arg, row of st, skill): read through
** runs_status (status, id) and their rows. A run's id is a ULID of its
** creation time (or later, when ids.c keeps them increasing), so those
** created since `since` are the ids from since's ULID time on: parked runs
** of older windows are not even looked at. (No upper bound: an id's time
** may run ahead of its creation time, when the clock stepped back.) st's
** columns are count_run's, then the skill. */
static int open_pass(store_t *s, const char *skill, int64_t since, int64_t until,
                     void (*each)(void *arg, const struct store_cur *st, const char *skill),
                     void *arg, err_t *e) {
  char from[11];
  ulid_time(since, from);
  struct store_val v[4] = {SV_INT(since), SV_INT(until), SV_TEXT(skill), SV_TEXT(from)};
  struct store_cur st;
  if (store__rq(s, NULL, RQ_OPEN, v, 4, &st, e)) return e->code;
  int rc = 0, src = 0;
  while ((src = cur_next(&st)) == 1) each(arg, &st, cur_text(&st, 9));
  if (src < 0) rc = st.ops->err(&st, e, "reading unfinished runs for the figures");
  cur_close(&st);
  return rc;
}

/* open_pass's each for one skill's window: arg is a runagg. */
static void open_into(void *arg, const struct store_cur *st, const char *skill) {
  (void)skill;
  count_run(arg, st, RUN_RUNNING);
}

/* Every run of skill created in [a->since, until) into a. The step
** sample's ids, when the rollup gives the figures, are read on their own. */
static int run_pass(store_t *s, const char *skill, int64_t until, struct runagg *a, err_t *e) {
  int refs = a->want_refs && rollup_fits(a);
  if (refs) a->want_refs = 0;
  int rc = ended_runs(s, NULL, skill, a->since, until, a, 1, e);
  if (refs) {
    a->want_refs = 1;
    if (!rc) rc = refs_pass(s, skill, until, a, e);
  }
  if (rc) return rc;
  return open_pass(s, skill, a->since, until, open_into, a, e);
}

/* The ended runs of skill created in [since, until) by status into c,
** counted without reading an entry (on conn, or the reader). */
static int count_pass(store_t *s, void *conn, const char *skill, int64_t since, int64_t until,
                      struct counts *c, err_t *e) {
  int rc = 0;
  for (int i = 0; vocab_run_statuses[i] && !rc; i++) {
    if (!vocab_run_ended(vocab_run_statuses[i])) continue;
    struct store_val v[4] = {SV_TEXT(skill), SV_INT(since), SV_INT(until),
                             SV_TEXT(vocab_run_statuses[i])};
    struct store_cur st;
    if (store__rq(s, conn, RQ_COUNT_ENDED, v, 4, &st, e)) return e->code;
    int src = cur_next(&st);
    if (src != 1) {
      rc = src < 0 ? st.ops->err(&st, e, "counting runs for the figures")
                   : err_set(e, ERR_IO, "store: counting runs for the figures: no answer");
    } else {
      int64_t n = cur_i64(&st, 0);
      c->started += n;
      *count_of(c, (enum run_status)i) += n;
    }
    cur_close(&st);
  }
  return rc;
}

/* The ended runs of skill created in [since, until) by status into c: the
** whole hours counted by the rollup, the part hours by count_pass. */
static int prev_counts(store_t *s, void *conn, const char *skill, int64_t since, int64_t until,
                       struct counts *c, err_t *e) {
  if (!store__stats_rollup) return count_pass(s, conn, skill, since, until, c, e);
  struct runagg a = {.since = since};
  int64_t h0 = (since + ROLLUP_MS - 1) / ROLLUP_MS * ROLLUP_MS, h1 = until / ROLLUP_MS * ROLLUP_MS;
  if (since < 0 || h1 <= h0) return count_pass(s, conn, skill, since, until, c, e);
  if (since < h0 && count_pass(s, conn, skill, since, h0, c, e)) return e->code;
  if (rollup_pass(s, conn, skill, h0, h1, &a, 0, e)) return e->code;
  c->started += a.tot.started;
  c->completed += a.tot.completed;
  c->failed += a.tot.failed;
  c->cancelled += a.tot.cancelled;
  c->skipped += a.tot.skipped;
  runagg_free(&a);
  if (h1 < until && count_pass(s, conn, skill, h1, until, c, e)) return e->code;
  return 0;
}

/* The counts of c into o (the run counts; with the step sums when steps). */
static void add_counts(cJSON *o, const struct counts *c, int steps) {
#define COUNTS_JSON(f) cJSON_AddNumberToObject(o, #f, (double)c->f);
  COUNTS_RUNS(COUNTS_JSON)
  add_ratio(o, "failure_rate", c->failed, c->completed + c->failed);
  if (!steps) return;
  COUNTS_STEPS(COUNTS_JSON)
#undef COUNTS_JSON
}

/* The window's figures: counts, failure rate, step sums, duration and wait
** percentiles (this reorders the values: call it after the series). */
static void add_run_totals(cJSON *o, struct runagg *a) {
  add_counts(o, &a->tot, a->sums);
  add_pcts(o, "duration_ms", a->dur.v, a->dur.n);
  if (a->waits) add_pcts(o, "queue_wait_ms", a->wait.v, a->wait.n);
}

/* ---- step figures --------------------------------------------------------------- */

/* One step id's figures: failed rows and retries (from the runs read for
** the failing list); durations go into stepagg's dur, grouped by its index. */
struct stepent {
  char *id;
  char kind[12];
  int64_t failed, retries;
};

struct stepagg {
  struct stepent *ids;
  size_t nids, cap;
  size_t sampled, problems_read; /* runs read for durations, for the failing list */
  struct vals dur;                /* durations of "run" steps (sample), grouped by step id */
  struct vals bdur;               /* the same, grouped by interval */
};

static void stepagg_free(struct stepagg *g) {
  for (size_t i = 0; i < g->nids; i++) free(g->ids[i].id);
  free(g->ids);
  vals_free(&g->dur);
  vals_free(&g->bdur);
}

/* The index of step id (len bytes, "#N" already dropped) in g, added when
** new; past MAX_STEP_IDS ids, everything else is "(other)". */
static long step_index(struct stepagg *g, const char *id, size_t len, const char *kind) {
  /* A skill's step ids are few: a linear search, from the newest. */
  for (size_t i = g->nids; i-- > 0;)
    if (!strncmp(g->ids[i].id, id, len) && !g->ids[i].id[len]) return (long)i;
  if (g->nids >= MAX_STEP_IDS) {
    id = "(other)";
    len = 7;
    for (size_t i = g->nids; i-- > 0;)
      if (!strcmp(g->ids[i].id, id)) return (long)i;
  }
  if (g->nids == g->cap) {
    g->cap = g->cap ? g->cap * 2 : 32;
    g->ids = mem_realloc(g->ids, g->cap * sizeof *g->ids);
  }
  struct stepent *x = &g->ids[g->nids];
  memset(x, 0, sizeof *x);
  x->id = mem_strndup(id, len);
  snprintf(x->kind, sizeof x->kind, "%s", kind ? kind : "run");
  return (long)g->nids++;
}

/* Count one step row of st (id, kind, status, attempts, started_at,
** ended_at) of a run in interval k: its duration when the run is in the
** sample, its failure and retries when it is read for the failing list. */
static void count_step(struct stepagg *g, const struct store_cur *st, uint32_t k, int sample,
                       int failing) {
  const char *id = cur_text(st, 0);
  const char *kind = cur_text(st, 1);
  const char *status = cur_text(st, 2);
  if (!id) return;
  /* A repeat of a step id ("poll#3") counts as the id itself. */
  const char *hash = strrchr(id, '#');
  size_t len = hash && hash[1] >= '0' && hash[1] <= '9' ? (size_t)(hash - id) : strlen(id);
  long i = step_index(g, id, len, kind);
  if (failing) {
    struct stepent *x = &g->ids[i];
    int64_t retries = cur_i64(st, 3) - 1;
    x->retries += retries > 0 ? retries : 0;
    x->failed += vocab_step_status(status) == STEP_FAILED;
  }
  if (sample && vocab_step_kind(kind) == STEP_KIND_RUN && !cur_null(st, 4) && !cur_null(st, 5)) {
    int64_t d = cur_i64(st, 5) - cur_i64(st, 4);
    if (d >= 0) {
      vals_add(&g->dur, (uint32_t)i, d);
      vals_add(&g->bdur, k, d);
    }
  }
}

/* Read the steps of a's ended runs into g: every run when there are at
** most STEP_SAMPLE, else every k-th (k = ceil(n / STEP_SAMPLE)) for the
** durations; the runs with a failed step or a retry likewise up to
** FAILING_SAMPLE for the failing list. Each run read is one lookup. */
static int step_pass(store_t *s, const struct runagg *a, struct stepagg *g, err_t *e) {
  size_t every = (a->nrefs + STEP_SAMPLE - 1) / STEP_SAMPLE;
  size_t every_problem = (a->nproblem + FAILING_SAMPLE - 1) / FAILING_SAMPLE;
  if (store__stats_steps_mode) every = every_problem = (size_t)store__stats_steps_mode;
  if (!every) every = 1;
  if (!every_problem) every_problem = 1;
  int rc = 0, src = 0;
  size_t nproblem = 0;
  for (size_t i = 0; i < a->nrefs; i++) {
    const struct runref *r = &a->refs[i];
    int sample = i % every == 0;
    int failing = r->problem && nproblem++ % every_problem == 0;
    if (!sample && !failing) continue;
    g->sampled += sample;
    g->problems_read += failing;
    struct store_val v[1] = {SV_TEXT(r->id)};
    struct store_cur st;
    if (store__rq(s, NULL, RQ_RUN_STEP_TIMES, v, 1, &st, e)) return e->code;
    while ((src = cur_next(&st)) == 1) count_step(g, &st, r->bucket, sample, failing);
    if (src < 0) rc = st.ops->err(&st, e, "reading steps for the figures");
    cur_close(&st);
    if (rc) break;
  }
  return rc;
}

/* ---- the window ------------------------------------------------------------------ */

/* The interval as people write it: "3h", "30m", "1d", "500ms". */
static void fmt_interval(int64_t ms, char *out, size_t n) {
  if (ms % 86400000 == 0) snprintf(out, n, "%lldd", (long long)(ms / 86400000));
  else if (ms % 3600000 == 0) snprintf(out, n, "%lldh", (long long)(ms / 3600000));
  else if (ms % 60000 == 0) snprintf(out, n, "%lldm", (long long)(ms / 60000));
  else if (ms % 1000 == 0) snprintf(out, n, "%llds", (long long)(ms / 1000));
  else snprintf(out, n, "%lldms", (long long)ms);
}

/* The window of q made whole: the interval (picked when q has none),
** since moved back to a multiple of it, and the number of intervals. */
static int window_of(const struct stats_query *q, int64_t *since, int64_t *iv, uint32_t *nb,
                     err_t *e) {
  static const int64_t nice[] = {
    1000, 5000, 10000, 30000, 60000, 300000, 600000, 900000, 1800000, 3600000, 7200000,
    10800000, 21600000, 43200000, 86400000, 172800000, 604800000, 1209600000, 2592000000LL,
  };
  if (q->since <= 0) return err_set(e, ERR_INVALID, "since must be a time after 1970");
  if (q->until <= q->since)
    return err_set(e, ERR_INVALID, "the window is empty: since must come before until");
  int64_t len = q->until - q->since;
  *iv = q->interval;
  if (*iv < 0) return err_set(e, ERR_INVALID, "the interval must be positive");
  if (!*iv) {
    size_t i = 0;
    while (i + 1 < sizeof nice / sizeof nice[0] && len > nice[i] * AUTO_INTERVALS) i++;
    *iv = nice[i];
  }
  *since = q->since / *iv * *iv;
  int64_t n = (q->until - *since + *iv - 1) / *iv;
  if (n > STORE_STATS_MAX_INTERVALS) {
    char a[32], b[32];
    fmt_interval(*iv, a, sizeof a);
    units_fmt_duration(len, b, sizeof b);
    return err_set(e, ERR_INVALID, "an interval of %s cuts %s into %lld intervals; at most %d: "
                   "choose a longer interval", a, b, (long long)n, STORE_STATS_MAX_INTERVALS);
  }
  *nb = (uint32_t)n;
  return 0;
}

/* o's "since", "until", "interval", "interval_ms". */
static void add_window(cJSON *o, int64_t since, int64_t until, int64_t iv) {
  char ts[40];
  units_rfc3339(since, ts, sizeof ts);
  cJSON_AddStringToObject(o, "since", ts);
  units_rfc3339(until, ts, sizeof ts);
  cJSON_AddStringToObject(o, "until", ts);
  fmt_interval(iv, ts, sizeof ts);
  cJSON_AddStringToObject(o, "interval", ts);
  cJSON_AddNumberToObject(o, "interval_ms", (double)iv);
}

/* The versions of skill loaded in [since, until), oldest first, into o's
** "versions", and the one loaded last before since into "version_before"
** (null when none). */
static int add_versions(store_t *s, cJSON *o, const char *skill, int64_t since, int64_t until,
                        err_t *e) {
  struct store_val v[3] = {SV_TEXT(skill), SV_INT(since), SV_INT(until)};
  struct store_cur st;
  if (store__rq(s, NULL, RQ_VERSIONS_IN, v, 3, &st, e)) return e->code;
  cJSON *list = cJSON_AddArrayToObject(o, "versions");
  char ts[40];
  while (cur_next(&st) == 1) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "version", cur_text(&st, 0));
    units_rfc3339(cur_i64(&st, 1), ts, sizeof ts);
    cJSON_AddStringToObject(x, "loaded_at", ts);
    cJSON_AddItemToArray(list, x);
  }
  cur_close(&st);
  if (store__rq(s, NULL, RQ_VERSION_BEFORE, v, 2, &st, e)) return e->code;
  if (cur_next(&st) == 1) {
    cJSON *x = cJSON_AddObjectToObject(o, "version_before");
    cJSON_AddStringToObject(x, "version", cur_text(&st, 0));
    units_rfc3339(cur_i64(&st, 1), ts, sizeof ts);
    cJSON_AddStringToObject(x, "loaded_at", ts);
  } else {
    cJSON_AddNullToObject(o, "version_before");
  }
  cur_close(&st);
  return 0;
}

/* The series of a, one object per interval (with the sampled step p95
** when g is not NULL). Groups a's values (and g's) by interval. */
static void add_series(cJSON *o, struct runagg *a, struct stepagg *g) {
  size_t *doff = vals_group(&a->dur, a->nb), *woff = vals_group(&a->wait, a->nb);
  size_t *soff = g ? vals_group(&g->bdur, a->nb) : NULL;
  cJSON *series = cJSON_AddArrayToObject(o, "series");
  char ts[40];
  for (uint32_t k = 0; k < a->nb; k++) {
    cJSON *p = cJSON_CreateObject();
    units_rfc3339(a->since + (int64_t)k * a->iv, ts, sizeof ts);
    cJSON_AddStringToObject(p, "t", ts);
    add_counts(p, &a->b[k], g != NULL);
    int64_t v[3];
    size_t n = doff[k + 1] - doff[k];
    if (n) pcts(a->dur.v + doff[k], n, v);
    cJSON_AddItemToObject(p, "p50", n ? cJSON_CreateNumber((double)v[0]) : cJSON_CreateNull());
    cJSON_AddItemToObject(p, "p95", n ? cJSON_CreateNumber((double)v[1]) : cJSON_CreateNull());
    cJSON_AddItemToObject(p, "p99", n ? cJSON_CreateNumber((double)v[2]) : cJSON_CreateNull());
    n = woff[k + 1] - woff[k];
    if (n) pcts(a->wait.v + woff[k], n, v);
    if (a->waits)
      cJSON_AddItemToObject(p, "queue_wait_p95", n ? cJSON_CreateNumber((double)v[1]) : cJSON_CreateNull());
    if (g) {
      n = soff[k + 1] - soff[k];
      if (n) pcts(g->bdur.v + soff[k], n, v);
      cJSON_AddItemToObject(p, "step_p95", n ? cJSON_CreateNumber((double)v[1]) : cJSON_CreateNull());
    }
    cJSON_AddItemToArray(series, p);
  }
  free(doff), free(woff), free(soff);
}

/* A step id's record for the slowest list: its sampled durations v[0..n)
** (reordered). */
static cJSON *slow_record(const struct stepent *x, int64_t *v, size_t n) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "step", x->id);
  cJSON_AddStringToObject(o, "kind", x->kind);
  int64_t max = 0, p[3];
  for (size_t i = 0; i < n; i++)
    if (v[i] > max) max = v[i];
  pcts(v, n, p);
  cJSON_AddNumberToObject(o, "p50", (double)p[0]);
  cJSON_AddNumberToObject(o, "p95", (double)p[1]);
  cJSON_AddNumberToObject(o, "p99", (double)p[2]);
  cJSON_AddNumberToObject(o, "max", (double)max);
  cJSON_AddNumberToObject(o, "n", (double)n);
  return o;
}

static double num_of(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* qsort orders of the two lists: slowest (p95, then max), most failing
** (failed, then retries); ties by step id. */
static int by_key(const cJSON *x, const cJSON *y, const char *k1, const char *k2) {
  double d = num_of(y, k1) - num_of(x, k1);
  if (!d) d = num_of(y, k2) - num_of(x, k2);
  return d > 0 ? 1 : d < 0 ? -1 : strcmp(cJSON_GetObjectItem(x, "step")->valuestring,
                                           cJSON_GetObjectItem(y, "step")->valuestring);
}
static int by_slowest(const void *a, const void *b) {
  return by_key(*(cJSON *const *)a, *(cJSON *const *)b, "p95", "max");
}
static int by_failing(const void *a, const void *b) {
  return by_key(*(cJSON *const *)a, *(cJSON *const *)b, "failed", "retries");
}

/* o's "slowest_steps" and "failing_steps", TOP_STEPS each. Groups g's
** durations by step id. */
static void add_step_lists(cJSON *o, struct stepagg *g) {
  size_t *off = vals_group(&g->dur, (uint32_t)g->nids);
  cJSON **recs = mem_calloc(g->nids, sizeof *recs);
  size_t n = 0;
  for (size_t i = 0; i < g->nids; i++)
    if (off[i + 1] > off[i]) recs[n++] = slow_record(&g->ids[i], g->dur.v + off[i], off[i + 1] - off[i]);
  qsort(recs, n, sizeof *recs, by_slowest);
  cJSON *slow = cJSON_AddArrayToObject(o, "slowest_steps");
  for (size_t i = 0; i < n; i++) {
    if (i < TOP_STEPS) cJSON_AddItemToArray(slow, recs[i]);
    else cJSON_Delete(recs[i]);
  }
  n = 0;
  for (size_t i = 0; i < g->nids; i++) {
    const struct stepent *x = &g->ids[i];
    if (!x->failed && !x->retries) continue;
    cJSON *r = recs[n++] = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "step", x->id);
    cJSON_AddStringToObject(r, "kind", x->kind);
    cJSON_AddNumberToObject(r, "failed", (double)x->failed);
    cJSON_AddNumberToObject(r, "retries", (double)x->retries);
  }
  qsort(recs, n, sizeof *recs, by_failing);
  cJSON *failing = cJSON_AddArrayToObject(o, "failing_steps");
  for (size_t i = 0; i < n; i++) {
    if (i < TOP_STEPS) cJSON_AddItemToArray(failing, recs[i]);
    else cJSON_Delete(recs[i]);
  }
  free(recs);
  free(off);
}

/* Begin and end a read transaction on the reader: one snapshot for all
** the queries of an answer (none when one is already open). */
static int read_begin(store_t *s, err_t *e) { return store__ops(s)->rbegin(s, NULL, e); }
static void read_end(store_t *s, int began) { store__ops(s)->rend(s, NULL, began); }

/* Whether skill is registered or has ever run. */
static int skill_known(store_t *s, const char *skill) {
  struct store_val v[1] = {SV_TEXT(skill)};
  struct store_cur st;
  if (store__rq(s, NULL, RQ_SKILL_KNOWN, v, 1, &st, NULL))
    return 1; /* let the figures' own queries report the problem */
  int known = cur_next(&st) == 1;
  cur_close(&st);
  return known;
}

/* The skill's live version (malloc'd), or NULL. */
static char *live_version(store_t *s, const char *skill) {
  struct store_val v[1] = {SV_TEXT(skill)};
  struct store_cur st;
  if (store__rq(s, NULL, RQ_LIVE_VERSION, v, 1, &st, NULL)) return NULL;
  const char *t = cur_next(&st) == 1 ? cur_text(&st, 0) : NULL;
  char *out = t ? mem_strdup(t) : NULL;
  cur_close(&st);
  return out;
}

/* The run figures of the window before [since, until), of the same
** length, into o's "previous". */
static int add_previous(store_t *s, cJSON *o, const char *skill, int64_t since, int64_t until,
                        err_t *e) {
  struct runagg p = {.since = since - (until - since), .waits = 1};
  int rc = run_pass(s, skill, since, &p, e);
  if (!rc) {
    cJSON *x = cJSON_AddObjectToObject(o, "previous");
    char ts[40];
    units_rfc3339(p.since, ts, sizeof ts);
    cJSON_AddStringToObject(x, "since", ts);
    units_rfc3339(since, ts, sizeof ts);
    cJSON_AddStringToObject(x, "until", ts);
    add_run_totals(x, &p);
  }
  runagg_free(&p);
  return rc;
}

/* See store.h. */
int store_stats_skill(store_t *s, const struct stats_query *q, cJSON **out, err_t *e) {
  *out = NULL;
  int64_t since, iv;
  uint32_t nb;
  if (!q->skill || !*q->skill) return err_set(e, ERR_INVALID, "which skill? (no skill id given)");
  if (window_of(q, &since, &iv, &nb, e)) return e->code;
  int began = read_begin(s, e);
  if (began < 0) return e->code;
  if (!skill_known(s, q->skill)) {
    read_end(s, began);
    return err_set(e, ERR_NOTFOUND, "no skill '%s' is registered or has runs", q->skill);
  }
  struct runagg a = {.since = since, .iv = iv, .nb = nb, .sums = 1, .waits = 1, .want_refs = 1};
  struct stepagg g = {0};
  cJSON *o = cJSON_CreateObject();
  int rc = run_pass(s, q->skill, q->until, &a, e);
  if (!rc) rc = step_pass(s, &a, &g, e);
  if (!rc) {
    cJSON_AddStringToObject(o, "skill", q->skill);
    char *v = live_version(s, q->skill);
    cJSON_AddItemToObject(o, "version", v ? cJSON_CreateString(v) : cJSON_CreateNull());
    free(v);
    add_window(o, since, q->until, iv);
    add_series(o, &a, &g);
  }
  if (!rc) {
    cJSON *t = cJSON_AddObjectToObject(o, "totals");
    add_run_totals(t, &a);
    add_pcts(t, "step_duration_ms", g.bdur.v, g.bdur.n);
    cJSON *sm = cJSON_AddObjectToObject(o, "step_sample");
    cJSON_AddNumberToObject(sm, "runs", (double)g.sampled);
    cJSON_AddNumberToObject(sm, "of", (double)a.nrefs);
    cJSON_AddNumberToObject(sm, "failing_runs", (double)g.problems_read);
    cJSON_AddNumberToObject(sm, "of_failing", (double)a.nproblem);
    rc = add_previous(s, o, q->skill, since, q->until, e);
  }
  if (!rc) add_step_lists(o, &g);
  if (!rc) rc = add_versions(s, o, q->skill, since, q->until, e);
  read_end(s, began);
  runagg_free(&a);
  stepagg_free(&g);
  if (rc) {
    cJSON_Delete(o);
    return rc;
  }
  *out = o;
  return 0;
}

/* The overview's skills, in name order, each with its window's figures
** and the counts of the window before. */
struct ovskill {
  char *skill;
  int registered;
  struct runagg a;
  struct counts prev;
};
struct overview {
  struct ovskill *v;
  size_t n;
  int64_t since; /* the window's; the one before starts earlier */
};

/* open_pass's each for the overview: the run goes to its skill's window,
** or, created before it, to the counts of the window before. */
static void open_overview(void *arg, const struct store_cur *st, const char *skill) {
  struct overview *o = arg;
  size_t lo = 0, hi = o->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(o->v[mid].skill, skill ? skill : "");
    if (!c) {
      struct ovskill *x = &o->v[mid];
      if (cur_i64(st, 0) >= o->since) count_run(&x->a, st, RUN_RUNNING);
      else x->prev.started++, x->prev.active++;
      return;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  /* a skill the list has not seen: it had no run when the list was read */
}

/* One share of the overview's skills (from, from + step, ...): their
** ended runs in the window and the counts of the window before. On a
** connection of its own (own: opened and closed here, in a read
** transaction begun when the main one's was, give or take a commit), or
** on the reader. */
struct ovhalf {
  store_t *s;
  struct overview *ov;
  size_t from, step;
  int64_t since, prev_since, until;
  int own, rc;
  err_t e;
};

static void *ov_passes(void *arg) {
  struct ovhalf *h = arg;
  const struct store_ops *ops = store__ops(h->s);
  void *conn = NULL;
  h->rc = 0;
  if (h->own) {
    if (!(conn = ops->reader_open(h->s, &h->e))) {
      h->rc = h->e.code;
      err_prefix(&h->e, "opening a second reader for the figures");
      return NULL;
    }
    if (ops->rbegin(h->s, conn, &h->e) < 0) h->rc = h->e.code;
  }
  for (size_t i = h->from; i < h->ov->n && !h->rc; i += h->step) {
    struct ovskill *x = &h->ov->v[i];
    h->rc = ended_runs(h->s, conn, x->skill, x->a.since, h->until, &x->a, 1, &h->e);
    if (!h->rc) h->rc = prev_counts(h->s, conn, x->skill, h->prev_since, h->since, &x->prev, &h->e);
  }
  if (h->own) {
    ops->rend(h->s, conn, 1);
    ops->reader_close(h->s, conn);
  }
  return NULL;
}

/* See store.h: the skills are the registered ones and those with runs
** (found by a loose scan of runs_skill: one seek per skill); a skill that
** is not registered and has no run in either window is left out. The
** runs not ended yet are read once for every skill. */
int store_stats_overview(store_t *s, const struct stats_query *q, cJSON **out, err_t *e) {
  *out = NULL;
  int64_t since, iv;
  uint32_t nb;
  if (window_of(q, &since, &iv, &nb, e)) return e->code;
  int began = read_begin(s, e);
  if (began < 0) return e->code;
  int64_t prev_since = since - (q->until - since);
  struct overview ov = {.since = since};
  size_t cap = 0;
  int rc = 0, src = 0;
  struct store_cur names = {0};
  if (store__rq(s, NULL, RQ_SKILL_NAMES, NULL, 0, &names, e)) rc = e->code;
  while (!rc && (src = cur_next(&names)) == 1) {
    if (ov.n == cap) {
      cap = cap ? cap * 2 : 16;
      ov.v = mem_realloc(ov.v, cap * sizeof *ov.v);
    }
    struct ovskill *x = &ov.v[ov.n++];
    memset(x, 0, sizeof *x);
    const char *name = cur_text(&names, 0);
    x->skill = mem_strdup(name ? name : "");
    x->registered = cur_int(&names, 1);
    x->a = (struct runagg){.since = since, .iv = iv, .nb = nb};
  }
  if (!rc && src < 0) rc = names.ops->err(&names, e, "listing the skills");
  cur_close(&names);
  if (!rc) {
    /* The skills' own passes are most of the work: a second thread takes
    ** every other skill, on a connection of its own. */
    struct ovhalf half = {.s = s, .ov = &ov, .from = 1, .step = 2, .since = since,
                          .prev_since = prev_since, .until = q->until, .own = 1};
    struct ovhalf mine = half;
    mine.from = 0, mine.own = 0;
    pthread_t th;
    int threaded = ov.n > 1 && store__ops(s)->reader_open &&
                   !pthread_create(&th, NULL, ov_passes, &half);
    if (!threaded) mine.step = 1;
    ov_passes(&mine);
    if (threaded) pthread_join(th, NULL);
    if (mine.rc || (threaded && half.rc)) {
      *e = mine.rc ? mine.e : half.e;
      rc = e->code;
    }
  }
  if (!rc) rc = open_pass(s, NULL, prev_since, q->until, open_overview, &ov, e);
  cJSON *o = cJSON_CreateObject();
  add_window(o, since, q->until, iv);
  cJSON *list = cJSON_AddArrayToObject(o, "skills");
  char ts[40];
  for (size_t i = 0; i < ov.n && !rc; i++) {
    struct ovskill *x = &ov.v[i];
    if (!x->registered && !x->a.tot.started && !x->prev.started) continue;
    cJSON *y = cJSON_CreateObject();
    cJSON_AddItemToArray(list, y);
    cJSON_AddStringToObject(y, "skill", x->skill);
    cJSON_AddBoolToObject(y, "registered", x->registered);
    char *v = x->registered ? live_version(s, x->skill) : NULL;
    cJSON_AddItemToObject(y, "version", v ? cJSON_CreateString(v) : cJSON_CreateNull());
    free(v);
    add_series(y, &x->a, NULL);
    add_run_totals(cJSON_AddObjectToObject(y, "totals"), &x->a);
    cJSON *p = cJSON_AddObjectToObject(y, "previous");
    units_rfc3339(prev_since, ts, sizeof ts);
    cJSON_AddStringToObject(p, "since", ts);
    units_rfc3339(since, ts, sizeof ts);
    cJSON_AddStringToObject(p, "until", ts);
    add_counts(p, &x->prev, 0);
    rc = add_versions(s, y, x->skill, since, q->until, e);
  }
  for (size_t i = 0; i < ov.n; i++) {
    free(ov.v[i].skill);
    runagg_free(&ov.v[i].a);
  }
  free(ov.v);
  read_end(s, began);
  if (rc) {
    cJSON_Delete(o);
    return rc;
  }
  *out = o;
  return 0;
}

/* ---- the event stream ------------------------------------------------------------------ */

/* See store.h: events by id (ULIDs: newest first), each with the runs
** whose trigger names it (runs_event). */
int store_list_events(store_t *s, const struct event_filter *f, cJSON **out, err_t *e) {
  *out = NULL;
  int began = read_begin(s, e);
  if (began < 0) return e->code;
  struct store_val ev_v[2] = {SV_TEXT(f->before), SV_INT(f->limit > 0 ? f->limit : 50)};
  struct store_cur ev;
  if (f->before ? store__rq(s, NULL, RQ_EVENTS_BEFORE, ev_v, 2, &ev, e)
                : store__rq(s, NULL, RQ_EVENTS, ev_v + 1, 1, &ev, e)) {
    read_end(s, began);
    return e->code;
  }
  cJSON *list = cJSON_CreateArray();
  int src, rc = 0;
  char ts[40];
  while ((src = cur_next(&ev)) == 1) {
    cJSON *x = cJSON_CreateObject();
    const char *id = cur_text(&ev, 0);
    cJSON_AddStringToObject(x, "id", id);
    cJSON_AddStringToObject(x, "name", cur_text(&ev, 1));
    units_rfc3339(cur_i64(&ev, 3), ts, sizeof ts);
    cJSON_AddStringToObject(x, "ts", ts);
    cJSON_AddBoolToObject(x, "dispatched", cur_int(&ev, 4));
    int64_t bytes = cur_i64(&ev, 5);
    const char *data = cur_text(&ev, 2);
    cJSON *d = data && bytes <= EVENT_DATA_MAX ? cJSON_Parse(data) : NULL;
    cJSON_AddItemToObject(x, "data", d ? d : cJSON_CreateNull());
    if (data && bytes > EVENT_DATA_MAX) cJSON_AddNumberToObject(x, "data_bytes", (double)bytes);
    cJSON *runs = cJSON_AddArrayToObject(x, "runs");
    cJSON_AddItemToArray(list, x);
    struct store_val rv[1] = {SV_TEXT(id)};
    struct store_cur rs;
    if (store__rq(s, NULL, RQ_EVENT_RUNS, rv, 1, &rs, e)) {
      rc = e->code;
      break;
    }
    while (cur_next(&rs) == 1) {
      cJSON *r = cJSON_CreateObject();
      cJSON_AddStringToObject(r, "id", cur_text(&rs, 0));
      cJSON_AddStringToObject(r, "skill", cur_text(&rs, 1));
      cJSON_AddStringToObject(r, "status", cur_text(&rs, 2));
      cJSON_AddItemToArray(runs, r);
    }
    cur_close(&rs);
  }
  if (!rc && src < 0) rc = ev.ops->err(&ev, e, "listing events");
  cur_close(&ev);
  read_end(s, began);
  if (rc) {
    cJSON_Delete(list);
    return rc;
  }
  *out = list;
  return 0;
}
