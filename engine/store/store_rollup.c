/*
** store_rollup.c: the figures' rollup (docs/architecture.md, "The figures'
** rollup"). Per skill and hour of creation (stats_rollup, migration 10),
** the ended runs' counts by outcome, the runs that never started, the sums
** of their steps' summaries, and two histograms: run durations (started_at
** to ended_at) and queue waits (created_at to started_at). store_stats.c
** reads it instead of every ended run.
**
** It is kept by the store in the write transaction that ends a run
** (store__run_ended, store__pg_run_ended call store__rollup_run once the
** run's summary is written), so it is exactly as durable as the runs:
** after a crash both are as the last commit left them. Retention takes a
** run out again before deleting it (delta -1). Migration 10 builds it for
** the runs of an existing database. Written once for both backends: the
** statements are in both dialects (struct store_wq) and run on the writer
** inside the transaction open. On PostgreSQL, engines whose groups end
** runs side by side (under the shared write lock) would update one
** skill's row at once: each transaction takes ROLLUP_LOCK first, so they
** take turns for the rollup's few statements, and never deadlock on two
** rows taken in opposite orders.
**
** A histogram is text, "value:count value:count ..." (no order needed),
** exact while it holds at most HIST_EXACT distinct values (every hour of
** a quiet skill); past that, and always when built by the migration, it
** starts with "~" and counts buckets instead: "key:count ...", where a
** value's key keeps its 7 highest bits (store__hist_key): exact below
** 128 ms, otherwise rounded down by less than 1/64 of the value (1.6%). A
** percentile read from it is the lower bound of the bucket the nearest
** rank falls in: never above the exact one, and below it by less than
** 1/64 of it. The text stays short: at most HIST_EXACT entries, or 64 per
** doubling of the values.
*/
#include "base/mem.h"
#include "base/vocab.h"
#include "store/store_backend.h"

#include <stdlib.h>
#include <string.h>

#define HIST_EXACT 64         /* distinct values kept exact in one row's histogram */
#define ROLLUP_HOUR 3600000LL /* the rollup's time bucket (store_stats.c's STATS_ROLLUP_MS) */

/* See store_backend.h: values below 128 are their own key; above, the
** key is e * 64 + (v >> e), e such that v >> e is in [64, 128): keys
** increase with values and continue 0..127 without a gap. */
int64_t store__hist_key(int64_t v) {
  if (v < 128) return v < 0 ? 0 : v;
  int e = 63 - __builtin_clzll((unsigned long long)v) - 6;
  return (int64_t)e * 64 + (v >> e);
}

/* See store_backend.h: the smallest value of key's bucket. */
int64_t store__hist_floor(int64_t key) {
  if (key < 128) return key;
  int64_t e = key / 64 - 1;
  return (key - e * 64) << e;
}

/* See store_backend.h. */
int store__hist_each(const char *text, void (*each)(void *arg, int64_t value, int64_t n),
                     void *arg) {
  if (!text) return 0;
  int coarse = *text == '~';
  const char *p = text + coarse;
  while (*p) {
    char *end;
    while (*p == ' ') p++;
    if (!*p) break;
    long long k = strtoll(p, &end, 10);
    if (end == p || *end != ':') return -1;
    p = end + 1;
    long long n = strtoll(p, &end, 10);
    if (end == p) return -1;
    p = end;
    if (n > 0) each(arg, coarse ? store__hist_floor(k) : k, n);
  }
  return 0;
}

/* One entry of a histogram being changed. */
struct hent {
  int64_t k, n;
};
struct hist {
  struct hent *v;
  size_t n, cap;
  int coarse;
};

/* Add n to key k's entry of h (kept in key order), made when new. */
static void hist_put(struct hist *h, int64_t k, int64_t n) {
  size_t lo = 0, hi = h->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (h->v[mid].k < k) lo = mid + 1;
    else hi = mid;
  }
  if (lo < h->n && h->v[lo].k == k) {
    h->v[lo].n += n;
    return;
  }
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 16;
    h->v = mem_realloc(h->v, h->cap * sizeof *h->v);
  }
  memmove(h->v + lo + 1, h->v + lo, (h->n - lo) * sizeof *h->v);
  h->v[lo] = (struct hent){k, n};
  h->n++;
}

static int by_key(const void *a, const void *b) {
  int64_t x = ((const struct hent *)a)->k, y = ((const struct hent *)b)->k;
  return x < y ? -1 : x > y;
}

/* Read text into h (keys as written: values, or buckets when coarse), in
** key order. A text holds each key once (hist_text and migration 10 write
** it so), in order but for SQLite's migration (group_concat promises no
** order): its entries are taken as they come, sorted only when out of
** order. */
static void hist_read(struct hist *h, const char *text) {
  memset(h, 0, sizeof *h);
  if (!text) return;
  h->coarse = *text == '~';
  const char *p = text + h->coarse;
  while (*p) {
    char *end;
    while (*p == ' ') p++;
    if (!*p) break;
    long long k = strtoll(p, &end, 10);
    if (end == p || *end != ':') break;
    p = end + 1;
    long long n = strtoll(p, &end, 10);
    if (end == p) break;
    p = end;
    if (h->n == h->cap) {
      h->cap = h->cap ? h->cap * 2 : 16;
      h->v = mem_realloc(h->v, h->cap * sizeof *h->v);
    }
    h->v[h->n++] = (struct hent){k, n};
  }
  for (size_t i = 1; i < h->n; i++)
    if (h->v[i - 1].k >= h->v[i].k) {
      qsort(h->v, h->n, sizeof *h->v, by_key);
      break;
    }
}

/* x (0 or more) in decimal at t; the number of digits. (snprintf's
** parsing of its format was most of a run end's cost here.) */
static size_t put_num(char *t, int64_t x) {
  char d[24];
  size_t n = 0;
  uint64_t u = x > 0 ? (uint64_t)x : 0;
  do d[n++] = (char)('0' + u % 10);
  while (u /= 10);
  for (size_t i = 0; i < n; i++) t[i] = d[n - 1 - i];
  return n;
}

/* h (in key order) as text (malloc'd), without the entries counted to 0. */
static char *hist_text(const struct hist *h) {
  size_t cap = 2 + h->n * 42, len = 0;
  char *t = mem_alloc(cap);
  if (h->coarse) t[len++] = '~';
  for (size_t i = 0; i < h->n; i++) {
    if (h->v[i].n <= 0) continue;
    if (len > (size_t)h->coarse) t[len++] = ' ';
    len += put_num(t + len, h->v[i].k);
    t[len++] = ':';
    len += put_num(t + len, h->v[i].n);
  }
  t[len] = 0;
  return t;
}

/* Add delta (1 or -1) of value v to h (read by hist_read). An exact
** histogram that would hold more than HIST_EXACT distinct values becomes
** coarse. */
static void hist_step(struct hist *h, int64_t v, int delta) {
  if (!h->coarse) {
    int found = 0;
    for (size_t i = 0; i < h->n && !found; i++) found = h->v[i].k == v && h->v[i].n > 0;
    size_t live = 0;
    for (size_t i = 0; i < h->n; i++) live += h->v[i].n > 0;
    if (!found && delta > 0 && live >= HIST_EXACT) {
      /* Into buckets: each value to its key, counts merged. */
      struct hist c = {.coarse = 1};
      for (size_t i = 0; i < h->n; i++) hist_put(&c, store__hist_key(h->v[i].k), h->v[i].n);
      free(h->v);
      *h = c;
    }
  }
  hist_put(h, h->coarse ? store__hist_key(v) : v, delta);
}

/* Add delta of each of the n values v to the histogram text (NULL:
** empty); the new text, malloc'd. The text is read and written once for
** all of them. */
static char *hist_add(const char *text, const int64_t *v, size_t n, int delta) {
  struct hist h;
  hist_read(&h, text);
  for (size_t i = 0; i < n; i++) hist_step(&h, v[i], delta);
  char *t = hist_text(&h);
  free(h.v);
  return t;
}

/* The statements, in both dialects. */
#define WQ(name, lite, pg) static const struct store_wq name = {lite, pg}
WQ(RUN_SQL,
   "SELECT skill, created_at, started_at, ended_at, status, steps, failed_steps, retries, tokens"
   " FROM runs WHERE id = ?1",
   "SELECT skill, created_at, started_at, ended_at, status, steps, failed_steps, retries, tokens"
   " FROM runs WHERE id = $1");
/* PostgreSQL: the rollup's own lock, until the transaction ends (see above). */
WQ(LOCK_SQL, "SELECT 1", "SELECT pg_advisory_xact_lock(469970677617)");
WQ(ROW_SQL, "SELECT dur, wait FROM stats_rollup WHERE skill = ?1 AND hour = ?2",
   "SELECT dur, wait FROM stats_rollup WHERE skill = $1 AND hour = $2");
WQ(NEW_SQL,
   "INSERT INTO stats_rollup(skill, hour, completed, failed, cancelled, skipped, unstarted, steps,"
   " failed_steps, retries, tokens, dur, wait) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,"
   " ?11, ?12, ?13)",
   "INSERT INTO stats_rollup(skill, hour, completed, failed, cancelled, skipped, unstarted, steps,"
   " failed_steps, retries, tokens, dur, wait) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,"
   " $11, $12, $13)");
WQ(SET_SQL,
   "UPDATE stats_rollup SET completed = completed + ?3, failed = failed + ?4,"
   " cancelled = cancelled + ?5, skipped = skipped + ?6, unstarted = unstarted + ?7,"
   " steps = steps + ?8, failed_steps = failed_steps + ?9, retries = retries + ?10,"
   " tokens = tokens + ?11, dur = ?12, wait = ?13 WHERE skill = ?1 AND hour = ?2",
   "UPDATE stats_rollup SET completed = completed + $3, failed = failed + $4,"
   " cancelled = cancelled + $5, skipped = skipped + $6, unstarted = unstarted + $7,"
   " steps = steps + $8, failed_steps = failed_steps + $9, retries = retries + $10,"
   " tokens = tokens + $11, dur = $12, wait = $13 WHERE skill = $1 AND hour = $2");

/* Run q to its end. */
static int wq_do(store_t *s, const struct store_wq *q, const struct store_val *v, int nv,
                 const char *what, err_t *e) {
  struct store_cur c;
  if (store__ops(s)->wq(s, q, v, nv, &c, what, e)) return e->code;
  int rc;
  while ((rc = cur_next(&c)) == 1) {
  }
  if (rc < 0) c.ops->err(&c, e, what);
  cur_close(&c);
  return rc < 0 ? e->code : 0;
}

/* Its count columns, one per ended status (vocab.h), in the table's order. */
_Static_assert(RUN_FAILED == RUN_COMPLETED + 1 && RUN_CANCELLED == RUN_COMPLETED + 2 &&
                   RUN_SKIPPED == RUN_COMPLETED + 3,
               "stats_rollup counts completed, failed, cancelled, skipped in vocab.h's order");

/* A run's part of the rollup, as store__rollup_run reads it. */
struct part {
  char *skill;
  int64_t hour, n[9]; /* completed, failed, cancelled, skipped, unstarted, steps, failed_steps,
                       ** retries, tokens */
  int has_dur, has_wait;
  int64_t dur, wait;
};

/* Read run_id's part: 1 (an ended run), 0 (none: not ended, or gone), -1. */
static int read_part(store_t *s, const char *run_id, struct part *p, err_t *e) {
  static const char *const what = "reading a run for the figures' rollup";
  struct store_val id[1] = {SV_TEXT(run_id)};
  struct store_cur c;
  memset(p, 0, sizeof *p);
  if (store__ops(s)->wq(s, &RUN_SQL, id, 1, &c, what, e)) return -1;
  int rc = cur_next(&c);
  if (rc < 0) c.ops->err(&c, e, what);
  if (rc == 1) {
    /* The count columns are vocab.h's ended statuses, in its order. */
    int st = vocab_run_status(cur_text(&c, 4));
    int k = st >= RUN_COMPLETED && st <= RUN_SKIPPED ? st - RUN_COMPLETED : -1;
    if (k < 0) rc = 0;
    else {
      const char *skill = cur_text(&c, 0);
      p->skill = mem_strdup(skill ? skill : "");
      int64_t created = cur_i64(&c, 1);
      int64_t started = cur_null(&c, 2) ? 0 : cur_i64(&c, 2);
      int64_t ended = cur_null(&c, 3) ? 0 : cur_i64(&c, 3);
      p->hour = (created < 0 ? 0 : created) / ROLLUP_HOUR * ROLLUP_HOUR;
      p->n[k] = 1;
      p->n[4] = !started;
      for (int i = 0; i < 4; i++) p->n[5 + i] = cur_null(&c, 5 + i) ? 0 : cur_i64(&c, 5 + i);
      /* The same conditions as store_stats.c's count_run. */
      p->has_dur = started && ended && ended >= started;
      p->dur = ended - started;
      p->has_wait = started && started >= created;
      p->wait = started - created;
    }
  }
  cur_close(&c);
  return rc;
}

/* See store_backend.h. */
/* The parts of runs of one skill and hour, summed up: the counts, and
** the values for the two histograms. */
struct sum {
  char *skill;
  int64_t hour, n[9];
  int64_t *dur, *wait;
  size_t ndur, nwait, capdur, capwait;
};

/* The run ends of the open transaction, summed up per skill and hour
** while the store gathers them (store__rollup_gather). */
struct rollup_batch {
  struct sum *v;
  size_t n, cap;
};

static void push(int64_t **v, size_t *n, size_t *cap, int64_t x) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 16;
    *v = mem_realloc(*v, *cap * sizeof **v);
  }
  (*v)[(*n)++] = x;
}

/* Add p's run to sum (its counts times delta; its values once each). */
static void sum_add(struct sum *m, const struct part *p, int delta) {
  for (int i = 0; i < 9; i++) m->n[i] += p->n[i] * delta;
  if (p->has_dur) push(&m->dur, &m->ndur, &m->capdur, p->dur);
  if (p->has_wait) push(&m->wait, &m->nwait, &m->capwait, p->wait);
}

static void sum_free(struct sum *m) {
  free(m->skill);
  free(m->dur);
  free(m->wait);
}

/* Write m into the rollup (its row made when new): the counts added,
** each value added to (delta 1) or taken from (delta -1) its histogram. */
static int sum_write(store_t *s, const struct sum *m, int delta, err_t *e) {
  static const char *const what = "keeping the figures' rollup";
  struct store_val key[2] = {SV_TEXT(m->skill), SV_INT(m->hour)};
  struct store_cur c;
  int rc = wq_do(s, &LOCK_SQL, NULL, 0, what, e);
  int found = 0;
  char *dur = NULL, *wait = NULL;
  if (!rc && !(rc = store__ops(s)->wq(s, &ROW_SQL, key, 2, &c, what, e))) {
    int got = cur_next(&c);
    if (got < 0) rc = c.ops->err(&c, e, what);
    if (got == 1) {
      found = 1;
      const char *t = cur_text(&c, 0);
      dur = mem_strdup(t ? t : "");
      t = cur_text(&c, 1);
      wait = mem_strdup(t ? t : "");
    }
    cur_close(&c);
  }
  if (!rc) {
    char *nd = m->ndur ? hist_add(dur, m->dur, m->ndur, delta) : mem_strdup(dur ? dur : "");
    char *nw = m->nwait ? hist_add(wait, m->wait, m->nwait, delta) : mem_strdup(wait ? wait : "");
    struct store_val v[13] = {SV_TEXT(m->skill), SV_INT(m->hour)};
    for (int i = 0; i < 9; i++) v[2 + i] = SV_INT(m->n[i]);
    v[11] = SV_TEXT(nd);
    v[12] = SV_TEXT(nw);
    rc = wq_do(s, found ? &SET_SQL : &NEW_SQL, v, 13, what, e);
    free(nd);
    free(nw);
  }
  free(dur);
  free(wait);
  return rc;
}

/* See store_backend.h. While the store gathers (a journal group's
** transaction), a run's end is added to the batch: a group that ends 50
** runs of a skill reads and writes its row and histograms once, not 50
** times (each a parse and a print of two texts of up to a few hundred
** entries: most of a run end's cost). */
int store__rollup_run(store_t *s, const char *run_id, int delta, err_t *e) {
  struct part p;
  int r = read_part(s, run_id, &p, e);
  if (r <= 0) return r < 0 ? e->code : 0;
  struct rollup_batch *b = store__base(s)->rollup;
  if (b && delta > 0) {
    struct sum *m = NULL;
    for (size_t i = 0; i < b->n && !m; i++)
      if (b->v[i].hour == p.hour && !strcmp(b->v[i].skill, p.skill)) m = &b->v[i];
    if (!m) {
      if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 4;
        b->v = mem_realloc(b->v, b->cap * sizeof *b->v);
      }
      m = &b->v[b->n++];
      *m = (struct sum){.skill = p.skill, .hour = p.hour};
      p.skill = NULL;
    }
    sum_add(m, &p, 1);
    free(p.skill);
    return 0;
  }
  struct sum m = {.skill = p.skill, .hour = p.hour};
  sum_add(&m, &p, delta);
  int rc = sum_write(s, &m, delta, e);
  sum_free(&m);
  return rc;
}

/* See store_backend.h. */
void store__rollup_gather(store_t *s) {
  store__rollup_drop(s);
  store__base(s)->rollup = mem_calloc(1, sizeof(struct rollup_batch));
}

/* See store_backend.h. */
void store__rollup_drop(store_t *s) {
  struct rollup_batch *b = store__base(s)->rollup;
  if (!b) return;
  for (size_t i = 0; i < b->n; i++) sum_free(&b->v[i]);
  free(b->v);
  free(b);
  store__base(s)->rollup = NULL;
}

/* See store_backend.h: in the order the batch first met each skill and
** hour. */
int store__rollup_flush(store_t *s, err_t *e) {
  struct rollup_batch *b = store__base(s)->rollup;
  int rc = 0;
  for (size_t i = 0; b && i < b->n && !rc; i++) rc = sum_write(s, &b->v[i], 1, e);
  store__rollup_drop(s);
  return rc;
}

/* See store_backend.h: the ids first (a cursor of the writer is not kept
** open while other statements run on it), then each run out. */
int store__rollup_forget(store_t *s, const struct store_wq *ids, const struct store_val *v, int nv,
                         err_t *e) {
  static const char *const what = "reading the runs to take out of the figures' rollup";
  struct store_cur c;
  if (store__ops(s)->wq(s, ids, v, nv, &c, what, e)) return e->code;
  char **list = NULL;
  size_t n = 0, cap = 0;
  int rc;
  while ((rc = cur_next(&c)) == 1) {
    const char *id = cur_text(&c, 0);
    if (!id) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 256;
      list = mem_realloc(list, cap * sizeof *list);
    }
    list[n++] = mem_strdup(id);
  }
  rc = rc < 0 ? c.ops->err(&c, e, what) : 0;
  cur_close(&c);
  for (size_t i = 0; i < n && !rc; i++) rc = store__rollup_run(s, list[i], -1, e);
  for (size_t i = 0; i < n; i++) free(list[i]);
  free(list);
  return rc;
}
