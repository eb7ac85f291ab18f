/* Unit tests for the health figures (store_stats.c): percentiles by
** selection against a sort, counts per interval, the window's alignment,
** the step sums kept on ended runs, the step sample and the failing list,
** unfinished runs in the overview and its window before, the rollup's
** bounded percentiles against every run's exact ones. Runs are written
** through store_commit, with ULIDs of their creation time, as the engine
** writes them. */
#include "base/ids.h"
#include "store/store.h"
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

extern int store__stats_steps_mode;
extern int store__stats_rollup;

static char dir[] = "/tmp/mlstats-XXXXXX";
static char path[256];

#define T0 1767225600000LL /* 2026-01-01T00:00:00Z */
#define HOUR 3600000LL

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest rank of per-mille p among n sorted values. */
static int64_t rank(const int64_t *sorted, size_t n, int p) {
  size_t k = (size_t)((p * n + 999) / 1000);
  return sorted[k - 1];
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Check {"p50", "p95", "p99", "n"} against values (sorted here). */
static void check_pcts(const cJSON *p, int64_t *v, size_t n, const char *what) {
  qsort(v, n, sizeof *v, cmp64);
  if ((size_t)num(p, "n") != n) FAILF("%s: n %g, expected %zu", what, num(p, "n"), n);
  if (!n) return;
  static const int per[3] = {500, 950, 990};
  static const char *const names[3] = {"p50", "p95", "p99"};
  for (int i = 0; i < 3; i++)
    if ((int64_t)num(p, names[i]) != rank(v, n, per[i]))
      FAILF("%s: %s %g, expected %lld", what, names[i], num(p, names[i]), (long long)rank(v, n, per[i]));
}

static store_t *open_db(const char *name) {
  snprintf(path, sizeof path, "%s/%s.db", dir, name);
  store_t *s = NULL;
  err_t e;
  if (store_open(path, STORE_NORMAL, &s, &e)) FAILF("store_open: %s", e.msg);
  return s;
}

/* A run of skill created at c, started at st (0: not yet), ended at en
** with status (NULL: still running), with nsteps steps whose attempts and
** tokens come from the arguments. */
struct made {
  char id[27];
};
static void add_run(journal_t *j, struct made *m, const char *skill, int64_t c, int64_t st,
                    int64_t en, const char *status, int nsteps, int attempts, int tokens) {
  ids_ulid(c, m->id);
  struct run_row r = {.id = m->id, .skill = skill, .version = "v1", .status = st ? "running" : "queued",
                      .trigger = "{\"kind\":\"invoke\"}", .created_at = c, .started_at = st};
  journal_run_new(j, &r);
  char usage[128];
  snprintf(usage, sizeof usage, "{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":%d,\"calls\":1}", tokens);
  for (int k = 1; k <= nsteps; k++) {
    char sid[16];
    snprintf(sid, sizeof sid, k == 1 ? "fetch" : "poll#%d", k);
    struct step_row row = {.run_id = m->id, .seq = k, .id = sid, .kind = "run",
                           .status = status && !strcmp(status, "failed") && k == nsteps ? "failed" : "completed",
                           .usage = k == 1 && tokens ? usage : NULL, .attempts = k == 1 ? attempts : 1,
                           .started_at = st + k, .ended_at = st + k * 10};
    journal_step(j, &row);
  }
  if (status) {
    struct run_set set = {.run_id = m->id, .status = status, .ended_at = en};
    journal_run_set(j, &set);
  }
}

static void commit(store_t *s, journal_t *j) {
  err_t e;
  if (store_commit(s, j, &e)) FAILF("store_commit: %s", e.msg);
  journal_free(j);
}

/* 2,000 runs over a day with durations full of repeats and a few outliers:
** every percentile, over the day and per hour, is what a sort says. */
TEST(percentiles_and_counts_match_a_sort) {
  store_t *s = open_db("pcts");
  journal_t *j = journal_new();
  enum { N = 2000 };
  static int64_t created[N], dur[N], wait[N];
  static char status[N];
  srand(7);
  for (int i = 0; i < N; i++) {
    struct made m;
    created[i] = T0 + (int64_t)i * (24 * HOUR / N);
    wait[i] = i % 5 ? 0 : rand() % 300;
    dur[i] = (rand() % 50) * 10 + (i % 97 == 0 ? 60000 : 0);
    int r = rand() % 10;
    status[i] = i >= N - 5 ? 'a' : r < 7 ? 'c' : r < 9 ? 'f' : 'x';
    const char *st = status[i] == 'c' ? "completed" : status[i] == 'f' ? "failed"
                   : status[i] == 'x' ? "cancelled" : NULL;
    add_run(j, &m, "p", created[i], created[i] + wait[i], created[i] + wait[i] + dur[i], st, 1, 1, 0);
  }
  commit(s, j);
  struct stats_query q = {.skill = "p", .since = T0, .until = T0 + 24 * HOUR, .interval = HOUR};
  cJSON *o;
  err_t e;
  CHECK(store_stats_skill(s, &q, &o, &e) == 0);
  cJSON *t = cJSON_GetObjectItem(o, "totals");
  int64_t v[N], w[N];
  size_t n = 0, nw = 0;
  int completed = 0, failed = 0, cancelled = 0;
  for (int i = 0; i < N; i++) {
    if (status[i] != 'a') v[n++] = dur[i];
    w[nw++] = wait[i];
    completed += status[i] == 'c', failed += status[i] == 'f', cancelled += status[i] == 'x';
  }
  CHECK_INT_EQ(num(t, "started"), N);
  CHECK_INT_EQ(num(t, "completed"), completed);
  CHECK_INT_EQ(num(t, "failed"), failed);
  CHECK_INT_EQ(num(t, "cancelled"), cancelled);
  CHECK_INT_EQ(num(t, "active"), 5);
  CHECK(num(t, "failure_rate") > 0 && (int)(num(t, "failure_rate") * 10000 + 0.5) ==
        (int)((double)failed / (completed + failed) * 10000 + 0.5));
  check_pcts(cJSON_GetObjectItem(t, "duration_ms"), v, n, "duration over the day");
  check_pcts(cJSON_GetObjectItem(t, "queue_wait_ms"), w, nw, "queue wait over the day");
  cJSON *series = cJSON_GetObjectItem(o, "series");
  CHECK_INT_EQ(cJSON_GetArraySize(series), 24);
  for (int h = 0; h < 24; h++) {
    cJSON *p = cJSON_GetArrayItem(series, h);
    n = 0;
    int started = 0;
    for (int i = 0; i < N; i++) {
      if (created[i] < T0 + h * HOUR || created[i] >= T0 + (h + 1) * HOUR) continue;
      started++;
      if (status[i] != 'a') v[n++] = dur[i];
    }
    CHECK_INT_EQ(num(p, "started"), started);
    qsort(v, n, sizeof *v, cmp64);
    CHECK_INT_EQ(num(p, "p50"), rank(v, n, 500));
    CHECK_INT_EQ(num(p, "p95"), rank(v, n, 950));
    CHECK_INT_EQ(num(p, "p99"), rank(v, n, 990));
  }
  cJSON_Delete(o);
  /* A window that does not start on an interval moves back to one. */
  q.since = T0 + 90 * 60000, q.until = T0 + 5 * HOUR;
  CHECK(store_stats_skill(s, &q, &o, &e) == 0);
  CHECK_STR_EQ(cJSON_GetObjectItem(o, "since")->valuestring, "2026-01-01T01:00:00.000Z");
  CHECK_INT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(o, "series")), 4);
  cJSON_Delete(o);
  /* Too many intervals, an empty window, an unknown skill. */
  q = (struct stats_query){.skill = "p", .since = T0, .until = T0 + 24 * HOUR, .interval = 60};
  CHECK(store_stats_skill(s, &q, &o, &e) == ERR_INVALID);
  CHECK_CONTAINS(e.msg, "at most 1000");
  q = (struct stats_query){.skill = "p", .since = T0, .until = T0};
  CHECK(store_stats_skill(s, &q, &o, &e) == ERR_INVALID);
  q = (struct stats_query){.skill = "nope", .since = T0, .until = T0 + HOUR};
  CHECK(store_stats_skill(s, &q, &o, &e) == ERR_NOTFOUND);
  store_close(s);
}

/* 3,000 runs with two steps: the sums are exact; the durations come from
** every second run (the sample: at most 2,000), the failing list from
** every run with a retry or a failure (at most 5,000). */
TEST(step_sums_sample_and_failing_steps) {
  store_t *s = open_db("steps");
  journal_t *j = journal_new();
  enum { N = 3000 };
  for (int i = 0; i < N; i++) {
    struct made m;
    int64_t c = T0 + i * 1000LL;
    add_run(j, &m, "s", c, c, c + 100, i % 10 == 0 ? "failed" : "completed", 2, i % 3 == 0 ? 3 : 1, 7);
  }
  commit(s, j);
  struct stats_query q = {.skill = "s", .since = T0, .until = T0 + 2 * HOUR};
  cJSON *o;
  err_t e;
  CHECK(store_stats_skill(s, &q, &o, &e) == 0);
  cJSON *t = cJSON_GetObjectItem(o, "totals");
  CHECK_INT_EQ(num(t, "steps"), 2 * N);
  CHECK_INT_EQ(num(t, "retries"), 2 * (N / 3));
  CHECK_INT_EQ(num(t, "failed_steps"), N / 10);
  CHECK_INT_EQ(num(t, "tokens"), 7 * N);
  cJSON *sm = cJSON_GetObjectItem(o, "step_sample");
  CHECK_INT_EQ(num(sm, "of"), N);
  CHECK_INT_EQ(num(sm, "runs"), N / 2);
  int problems = 0;
  for (int i = 0; i < N; i++) problems += i % 3 == 0 || i % 10 == 0;
  CHECK_INT_EQ(num(sm, "of_failing"), problems);
  CHECK_INT_EQ(num(sm, "failing_runs"), problems);
  cJSON *slow = cJSON_GetObjectItem(o, "slowest_steps");
  CHECK_INT_EQ(cJSON_GetArraySize(slow), 2);
  /* poll#2 is poll: its durations are 20 - 2 = 18 ms, fetch's 9 ms. */
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(slow, 0), "step")->valuestring, "poll");
  CHECK_INT_EQ(num(cJSON_GetArrayItem(slow, 0), "p95"), 18);
  CHECK_INT_EQ(num(cJSON_GetArrayItem(slow, 0), "n"), N / 2);
  cJSON *failing = cJSON_GetObjectItem(o, "failing_steps");
  for (cJSON *f = failing->child; f; f = f->next) {
    const char *id = cJSON_GetObjectItem(f, "step")->valuestring;
    if (!strcmp(id, "fetch")) CHECK_INT_EQ(num(f, "retries"), 2 * (N / 3));
    else if (!strcmp(id, "poll")) CHECK_INT_EQ(num(f, "failed"), N / 10);
    else FAILF("unexpected failing step %s", id);
  }
  CHECK_INT_EQ(cJSON_GetArraySize(failing), 2);
  cJSON_Delete(o);
  /* Every run read: the same figures, with every duration. */
  store__stats_steps_mode = 1;
  CHECK(store_stats_skill(s, &q, &o, &e) == 0);
  store__stats_steps_mode = 0;
  CHECK_INT_EQ(num(cJSON_GetObjectItem(o, "step_sample"), "runs"), N);
  CHECK_INT_EQ(num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "slowest_steps"), 0), "n"), N);
  cJSON_Delete(o);
  store_close(s);
}

/* The overview reads unfinished runs once for every skill, and counts the
** window before by status, unfinished runs included. */
TEST(overview_with_unfinished_runs) {
  store_t *s = open_db("overview");
  journal_t *j = journal_new();
  struct made m;
  /* The window before [T0 - 1h, T0): a, b ended; one of a unfinished. */
  add_run(j, &m, "a", T0 - 50 * 60000, T0 - 50 * 60000, T0 - 49 * 60000, "completed", 1, 1, 0);
  add_run(j, &m, "a", T0 - 40 * 60000, T0 - 40 * 60000, 0, NULL, 1, 1, 0);
  add_run(j, &m, "b", T0 - 30 * 60000, T0 - 30 * 60000, T0 - 29 * 60000, "failed", 1, 1, 0);
  /* The window [T0, T0 + 1h). */
  add_run(j, &m, "a", T0 + 60000, T0 + 60000, T0 + 62000, "completed", 1, 1, 0);
  add_run(j, &m, "a", T0 + 120000, 0, 0, NULL, 0, 1, 0);
  add_run(j, &m, "b", T0 + 180000, T0 + 180000, 0, NULL, 1, 1, 0);
  add_run(j, &m, "c", T0 + 240000, T0 + 240000, T0 + 250000, "cancelled", 1, 1, 0);
  commit(s, j);
  struct stats_query q = {.since = T0, .until = T0 + HOUR, .interval = 10 * 60000};
  cJSON *o;
  err_t e;
  CHECK(store_stats_overview(s, &q, &o, &e) == 0);
  cJSON *skills = cJSON_GetObjectItem(o, "skills");
  CHECK_INT_EQ(cJSON_GetArraySize(skills), 3);
  static const struct { const char *skill; int started, active, queued, prev_started, prev_active; } want[] = {
    {"a", 2, 1, 1, 2, 1}, {"b", 1, 1, 0, 1, 0}, {"c", 1, 0, 0, 0, 0}};
  for (int i = 0; i < 3; i++) {
    cJSON *x = cJSON_GetArrayItem(skills, i);
    CHECK_STR_EQ(cJSON_GetObjectItem(x, "skill")->valuestring, want[i].skill);
    cJSON *t = cJSON_GetObjectItem(x, "totals"), *p = cJSON_GetObjectItem(x, "previous");
    CHECK_INT_EQ(num(t, "started"), want[i].started);
    CHECK_INT_EQ(num(t, "active"), want[i].active);
    CHECK_INT_EQ(num(t, "queued"), want[i].queued);
    CHECK_INT_EQ(num(p, "started"), want[i].prev_started);
    CHECK_INT_EQ(num(p, "active"), want[i].prev_active);
    int sum = 0;
    for (cJSON *b = cJSON_GetObjectItem(x, "series")->child; b; b = b->next) sum += (int)num(b, "started");
    CHECK_INT_EQ(sum, want[i].started);
  }
  CHECK_INT_EQ(num(cJSON_GetObjectItem(cJSON_GetArrayItem(skills, 1), "previous"), "failed"), 1);
  cJSON_Delete(o);
  store_close(s);
}

/* p's percentiles from the rollup (got) against the exact ones (want):
** never above, below by less than 1/64. */
static void check_bounded(const cJSON *got, const cJSON *want, const char *what) {
  static const char *const names[3] = {"p50", "p95", "p99"};
  CHECK_INT_EQ(num(got, "n"), num(want, "n"));
  for (int i = 0; i < 3; i++) {
    double g = num(got, names[i]), x = num(want, names[i]);
    if (g > x || (g != x && g <= x - x / 64)) FAILF("%s: %s %g from the rollup, %g exact", what, names[i], g, x);
  }
}

/* 3,000 runs over six hours, 500 an hour, with durations and waits spread
** over four decades: the rollup's histograms turn to buckets, and every
** percentile is within its bound of the exact one (read with the rollup
** turned off); the counts and sums are the same. */
TEST(rollup_percentiles_are_bounded) {
  store_t *s = open_db("rollup");
  journal_t *j = journal_new();
  srand(11);
  for (int i = 0; i < 3000; i++) {
    struct made m;
    int64_t c = T0 + (int64_t)i * (6 * HOUR / 3000);
    int64_t w = i % 3 ? 0 : rand() % 100000, d = 10 + (int64_t)rand() * rand() % 3000000;
    add_run(j, &m, "r", c, c + w, c + w + d, i % 4 ? "completed" : "failed", 2, 1 + i % 3, 5);
  }
  commit(s, j);
  struct stats_query q = {.skill = "r", .since = T0, .until = T0 + 6 * HOUR, .interval = HOUR};
  cJSON *a, *b;
  err_t e;
  CHECK(store_stats_skill(s, &q, &a, &e) == 0);
  store__stats_rollup = 0;
  CHECK(store_stats_skill(s, &q, &b, &e) == 0);
  store__stats_rollup = 1;
  cJSON *ta = cJSON_GetObjectItem(a, "totals"), *tb = cJSON_GetObjectItem(b, "totals");
  static const char *const exact[] = {"started", "completed", "failed", "cancelled", "queued",
                                      "steps", "failed_steps", "retries", "tokens"};
  for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
    if (num(ta, exact[i]) != num(tb, exact[i]))
      FAILF("%s: %g from the rollup, %g from the runs", exact[i], num(ta, exact[i]), num(tb, exact[i]));
  check_bounded(cJSON_GetObjectItem(ta, "duration_ms"), cJSON_GetObjectItem(tb, "duration_ms"), "duration");
  check_bounded(cJSON_GetObjectItem(ta, "queue_wait_ms"), cJSON_GetObjectItem(tb, "queue_wait_ms"), "wait");
  cJSON *sa = cJSON_GetObjectItem(a, "series"), *sb = cJSON_GetObjectItem(b, "series");
  CHECK_INT_EQ(cJSON_GetArraySize(sa), 6);
  for (int h = 0; h < 6; h++) {
    cJSON *pa = cJSON_GetArrayItem(sa, h), *pb = cJSON_GetArrayItem(sb, h);
    CHECK_INT_EQ(num(pa, "started"), num(pb, "started"));
    CHECK(num(pa, "p95") <= num(pb, "p95") && num(pa, "p95") > num(pb, "p95") * 63 / 64);
  }
  /* The rollup's rows did turn to buckets: some value is not exact. */
  CHECK(num(cJSON_GetObjectItem(ta, "duration_ms"), "p50") != num(cJSON_GetObjectItem(tb, "duration_ms"), "p50") ||
        num(cJSON_GetObjectItem(ta, "duration_ms"), "p95") != num(cJSON_GetObjectItem(tb, "duration_ms"), "p95"));
  cJSON_Delete(a);
  cJSON_Delete(b);
  store_close(s);
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(percentiles_and_counts_match_a_sort);
  RUN(step_sums_sample_and_failing_steps);
  RUN(overview_with_unfinished_runs);
  RUN(rollup_percentiles_are_bounded);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  return test_summary();
}
