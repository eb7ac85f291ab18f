/* Unit tests for the SQLite store: journal groups, run records, claiming,
** leases (reaping, fencing, taking a run), migrations. */
#include "base/ids.h"
#include "base/proc.h"
#include "base/units.h"
#include "store/store.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/mlstore-XXXXXX";
static char path[256];

static store_t *open_db(void) {
  store_t *s = NULL;
  err_t e;
  if (store_open(path, STORE_FULL, &s, &e)) FAILF("store_open: %s", e.msg);
  return s;
}

static void new_run(journal_t *j, const char *id, const char *status, const char *owner) {
  struct run_row r = {.id = id, .skill = "demo", .version = "v1", .status = status,
                      .trigger = "{\"kind\":\"invoke\"}", .input = "{\"a\":1}", .owner = owner,
                      .created_at = units_now_ms()};
  journal_run_new(j, &r);
}

static int take_lease(store_t *s, const char *owner, long pid, long long start, int64_t expires) {
  struct lease l = {.owner = owner, .kind = "run", .host = proc_hostname(), .pid = pid,
                    .pid_start = start, .expires_at = expires};
  err_t e;
  return store_lease_acquire(s, &l, &e);
}

TEST(commit_and_read_a_run_record) {
  store_t *s = open_db();
  journal_t *j = journal_new();
  new_run(j, "01RUNA", "running", NULL);
  struct step_row st = {.run_id = "01RUNA", .seq = 1, .id = "fetch", .kind = "run",
                        .status = "completed", .output = "{\"x\":[1,2]}", .attempts = 2,
                        .started_at = 1000, .ended_at = 3000};
  struct attempt_row at = {.run_id = "01RUNA", .seq = 1, .n = 1, .status = "failed",
                           .error = "timeout", .started_at = 1000, .ended_at = 1500,
                           .retry_at = 2000};
  struct log_row lg = {.run_id = "01RUNA", .seq = 1, .ts = 1200, .level = "info", .msg = "hi"};
  struct log_row lg0 = {.run_id = "01RUNA", .seq = 0, .ts = 900, .level = "warn", .msg = "top"};
  journal_step(j, &st);
  journal_attempt(j, &at);
  journal_log(j, &lg);
  journal_log(j, &lg0);
  struct run_set done = {.run_id = "01RUNA", .status = "completed", .output = "42",
                         .ended_at = 4000};
  journal_run_set(j, &done);
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  cJSON *r;
  CHECK(store_get_run(s, "01RUNA", 1, &r, &e) == 0);
  CHECK_STR_EQ(cJSON_GetObjectItem(r, "status")->valuestring, "completed");
  CHECK_INT_EQ(cJSON_GetObjectItem(r, "output")->valueint, 42);
  CHECK_INT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "input"), "a")->valueint, 1);
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "trigger"), "kind")->valuestring, "invoke");
  cJSON *steps = cJSON_GetObjectItem(r, "steps");
  CHECK_INT_EQ(cJSON_GetArraySize(steps), 1);
  cJSON *p = cJSON_GetArrayItem(steps, 0);
  CHECK_STR_EQ(cJSON_GetObjectItem(p, "id")->valuestring, "fetch");
  cJSON *atts = cJSON_GetObjectItem(p, "attempts");
  CHECK_INT_EQ(cJSON_GetArraySize(atts), 2);
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(atts, 0), "error")->valuestring, "timeout");
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(atts, 1), "status")->valuestring, "completed");
  /* The successful attempt started when the failed one's backoff ended. */
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(atts, 1), "started_at")->valuestring,
               "1970-01-01T00:00:02.000Z");
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "logs"), 0), "msg")->valuestring, "hi");
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "logs"), 0), "msg")->valuestring, "top");
  cJSON_Delete(r);
  CHECK(store_get_run(s, "nope", 1, &r, &e) == ERR_NOTFOUND);
  CHECK_CONTAINS(e.msg, "no run with id 'nope'");
  store_close(s);
}

TEST(a_failed_group_changes_nothing) {
  store_t *s = open_db();
  journal_t *j = journal_new();
  new_run(j, "01DUP", "queued", NULL);
  new_run(j, "01DUP", "queued", NULL); /* a primary key clash aborts the group */
  err_t e;
  CHECK(store_commit(s, j, &e) != 0);
  journal_free(j);
  cJSON *r;
  CHECK(store_get_run(s, "01DUP", 0, &r, &e) == ERR_NOTFOUND);
  store_close(s);
}

TEST(claim_takes_unowned_unfinished_runs_oldest_first) {
  store_t *s = open_db();
  journal_t *j = journal_new();
  new_run(j, "01C2", "queued", NULL);
  new_run(j, "01C1", "sleeping", NULL);
  new_run(j, "01C3", "completed", NULL);
  new_run(j, "01C4", "queued", "someone-else");
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  struct run_row *rows;
  size_t n;
  /* Only a live lease claims: a dead name would keep the runs for good. */
  CHECK(store_claim(s, "me", 10, &rows, &n, &e) == ERR_CONFLICT);
  CHECK_CONTAINS(e.msg, "lease lost");
  CHECK_INT_EQ(n, 0);
  long pid = (long)getpid();
  CHECK(take_lease(s, "me", pid, proc_start_time(pid), units_now_ms() - 1) == 0);
  CHECK(store_claim(s, "me", 10, &rows, &n, &e) == ERR_BUSY);
  CHECK_CONTAINS(e.msg, "expired");
  CHECK(take_lease(s, "me", pid, proc_start_time(pid), units_now_ms() + 60000) == 0);
  CHECK(take_lease(s, "other", pid, proc_start_time(pid), units_now_ms() + 60000) == 0);
  CHECK(store_claim(s, "me", 10, &rows, &n, &e) == 0);
  CHECK_INT_EQ(n, 2);
  if (n == 2) {
    CHECK_STR_EQ(rows[0].id, "01C1");
    CHECK_STR_EQ(rows[1].id, "01C2");
    CHECK_STR_EQ(rows[1].input, "{\"a\":1}");
  }
  store_rows_free(rows, n);
  CHECK(store_claim(s, "other", 10, &rows, &n, &e) == 0);
  CHECK_INT_EQ(n, 0);
  store_rows_free(rows, n);
  store_close(s);
}

TEST(reap_releases_runs_of_dead_and_expired_leases_only) {
  store_t *s = open_db();
  long me = (long)getpid();
  long long start = proc_start_time(me);
  int64_t far = units_now_ms() + 60000;
  CHECK(take_lease(s, "alive", me, start, far) == 0);
  CHECK(take_lease(s, "dead-pid", me, start + 12345, far) == 0); /* same pid, other start: gone */
  CHECK(take_lease(s, "expired", me, start, units_now_ms() - 1) == 0);
  journal_t *j = journal_new();
  new_run(j, "01R1", "running", "alive");
  new_run(j, "01R2", "running", "dead-pid");
  new_run(j, "01R3", "running", "expired");
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  CHECK_INT_EQ(store_reap(s, proc_hostname(), units_now_ms(), &e), 2);
  CHECK(take_lease(s, "me", me, start, far) == 0);
  struct run_row *rows;
  size_t n;
  CHECK(store_claim(s, "me", 10, &rows, &n, &e) == 0);
  CHECK_INT_EQ(n, 2);
  if (n == 2) {
    CHECK_STR_EQ(rows[0].id, "01R2");
    CHECK_STR_EQ(rows[1].id, "01R3");
  }
  store_rows_free(rows, n);
  store_close(s);
}

TEST(a_group_is_fenced_by_its_lease) {
  store_t *s = open_db();
  CHECK(take_lease(s, "fenced", (long)getpid(), proc_start_time(getpid()),
                   units_now_ms() + 60000) == 0);
  journal_t *j = journal_new();
  journal_set_owner(j, "fenced", units_now_ms() + 60000);
  new_run(j, "01F1", "running", "fenced");
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  CHECK(store_lease_release(s, "fenced", &e) == 0);
  journal_free(j);
  j = journal_new();
  journal_set_owner(j, "fenced", units_now_ms() + 60000);
  new_run(j, "01F2", "running", "fenced");
  CHECK(store_commit(s, j, &e) == ERR_CONFLICT);
  CHECK_CONTAINS(e.msg, "lease lost");
  journal_free(j);
  cJSON *r;
  CHECK(store_get_run(s, "01F2", 0, &r, &e) == ERR_NOTFOUND);
  store_close(s);
}

/* A step of run id as the process owner writes it. */
static journal_t *step_group(const char *owner, const char *id, const char *output) {
  journal_t *j = journal_new();
  journal_set_owner(j, owner, units_now_ms() + 60000);
  struct step_row st = {.run_id = id, .seq = 1, .id = "s", .kind = "run", .status = "completed",
                        .output = output, .attempts = 1, .started_at = 1, .ended_at = 2};
  journal_step(j, &st);
  return j;
}

TEST(a_write_for_a_run_another_process_holds_never_lands) {
  store_t *s = open_db();
  int64_t far = units_now_ms() + 60000;
  CHECK(take_lease(s, "A", (long)getpid(), proc_start_time(getpid()), far) == 0);
  CHECK(take_lease(s, "B", (long)getpid(), proc_start_time(getpid()), far) == 0);
  journal_t *j = journal_new();
  journal_set_owner(j, "B", far);
  new_run(j, "01TAKEN", "running", "B");
  struct step_row st = {.run_id = "01TAKEN", .seq = 1, .id = "s", .kind = "run",
                        .status = "completed", .output = "2", .attempts = 1};
  journal_step(j, &st);
  err_t e;
  CHECK(store_commit(s, j, &e) == 0); /* B's own new run and its step */
  CHECK_INT_EQ(journal_fenced(j), -1);
  journal_free(j);
  /* A still has a lease, but not this run: its stale result is refused,
  ** with the entries before it in the group. */
  j = journal_new();
  journal_set_owner(j, "A", far);
  new_run(j, "01MINE", "running", "A");
  journal_step(j, &(struct step_row){.run_id = "01MINE", .seq = 1, .id = "x", .kind = "run",
                                     .status = "completed", .output = "7", .attempts = 1});
  journal_step(j, &(struct step_row){.run_id = "01TAKEN", .seq = 1, .id = "s", .kind = "run",
                                     .status = "completed", .output = "1", .attempts = 1});
  CHECK(store_commit(s, j, &e) == ERR_CONFLICT);
  CHECK_CONTAINS(e.msg, "fenced: run 01TAKEN is running, held by B, not by this process (A)");
  CHECK_INT_EQ(journal_fenced(j), 2);
  /* Taken back, the rest commits. */
  journal_drop(j, 2);
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  cJSON *r;
  CHECK(store_get_run(s, "01TAKEN", 1, &r, &e) == 0);
  cJSON *out = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "steps"), 0), "output");
  CHECK_INT_EQ(out ? out->valueint : -1, 2);
  cJSON_Delete(r);
  CHECK(store_get_run(s, "01MINE", 1, &r, &e) == 0);
  cJSON_Delete(r);
  /* Nor a status, an attempt, a log line, a new run in the name of
  ** another owner, a run it creates for one it does not hold, or a run that
  ** does not exist. */
  struct { const char *what; int kind; } cases[] = {
    {"status", J_RUN_SET}, {"attempt", J_ATTEMPT}, {"log", J_LOG}, {"other owner", J_RUN_NEW},
    {"child", J_CRON}, {"missing", J_STEP},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    j = journal_new();
    journal_set_owner(j, "A", far);
    switch (cases[i].kind) {
    case J_RUN_SET:
      journal_run_set(j, &(struct run_set){.run_id = "01TAKEN", .status = "completed",
                                           .output = "1", .ended_at = 5});
      break;
    case J_ATTEMPT:
      journal_attempt(j, &(struct attempt_row){.run_id = "01TAKEN", .seq = 1, .n = 1,
                                               .status = "failed", .error = "x"});
      break;
    case J_LOG:
      journal_log(j, &(struct log_row){.run_id = "01TAKEN", .ts = 1, .level = "info", .msg = "m"});
      break;
    case J_RUN_NEW:
      new_run(j, "01NEWB", "running", "B");
      break;
    case J_CRON: {
      struct run_row c = {.id = "01CHILD", .skill = "demo", .version = "v1", .status = "running",
                          .trigger = "{}", .owner = "A", .created_at = 1, .by_run = "01TAKEN"};
      journal_run_new(j, &c);
      break;
    }
    default:
      journal_step(j, &(struct step_row){.run_id = "01NOPE", .seq = 1, .id = "s", .kind = "run",
                                         .status = "completed", .attempts = 1});
    }
    if (store_commit(s, j, &e) != ERR_CONFLICT) FAILF("%s: committed", cases[i].what);
    CHECK_CONTAINS(e.msg, "fenced: ");
    journal_free(j);
  }
  CHECK(store_get_run(s, "01TAKEN", 1, &r, &e) == 0);
  CHECK_STR_EQ(cJSON_GetObjectItem(r, "status")->valuestring, "running");
  CHECK_INT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(r, "logs")), 0);
  cJSON_Delete(r);
  CHECK(store_get_run(s, "01CHILD", 0, &r, &e) == ERR_NOTFOUND);
  /* A run that ends writes its last entries after giving up its owner: its
  ** parent's delivery and a run it creates (an on_failure run). */
  j = journal_new();
  journal_set_owner(j, "B", far);
  journal_run_set(j, &(struct run_set){.run_id = "01TAKEN", .status = "cancelled",
                                       .error = "{\"message\":\"x\"}", .ended_at = 5});
  journal_child_done(j, &(struct child_done){.child_id = "01TAKEN", .outcome = "{}"});
  struct run_row f = {.id = "01ONFAIL", .skill = "demo", .version = "v1", .status = "running",
                      .entry = "on_failure", .trigger = "{}", .owner = "B", .created_at = 1,
                      .by_run = "01TAKEN"};
  journal_run_new(j, &f);
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  /* Groups without an owner (the CLI's) are not fenced. */
  j = step_group(NULL, "01TAKEN", "3");
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  store_close(s);
}

TEST(take_run_explains_who_holds_it) {
  store_t *s = open_db();
  CHECK(take_lease(s, "holder", (long)getpid(), proc_start_time(getpid()),
                   units_now_ms() + 60000) == 0);
  journal_t *j = journal_new();
  new_run(j, "01T1", "running", "holder");
  new_run(j, "01T2", "completed", NULL);
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  struct run_row *row;
  CHECK(store_take_run(s, "01T2", "no-lease", proc_hostname(), units_now_ms(), &row, &e) ==
        ERR_CONFLICT);
  CHECK_CONTAINS(e.msg, "lease lost"); /* the taker needs a live lease */
  CHECK(take_lease(s, "me", (long)getpid(), proc_start_time(getpid()), units_now_ms() + 60000) == 0);
  CHECK(take_lease(s, "other", (long)getpid(), proc_start_time(getpid()), units_now_ms() + 60000) == 0);
  CHECK(store_take_run(s, "01T1", "me", proc_hostname(), units_now_ms(), &row, &e) == ERR_CONFLICT);
  CHECK_CONTAINS(e.msg, "held by a live process");
  CHECK(store_take_run(s, "01T2", "me", proc_hostname(), units_now_ms(), &row, &e) == ERR_CONFLICT);
  CHECK_CONTAINS(e.msg, "already completed");
  CHECK(store_take_run(s, "01NOPE", "me", proc_hostname(), units_now_ms(), &row, &e) == ERR_NOTFOUND);
  CHECK(store_lease_release(s, "holder", &e) == 0);
  CHECK(store_take_run(s, "01T1", "me", proc_hostname(), units_now_ms(), &row, &e) == 0);
  CHECK_STR_EQ(row->id, "01T1");
  struct run_row *rows;
  size_t n;
  CHECK(store_claim(s, "other", 10, &rows, &n, &e) == 0);
  for (size_t i = 0; i < n; i++) CHECK(strcmp(rows[i].id, "01T1")); /* it is ours now */
  store_rows_free(rows, n);
  store_rows_free(row, 1);
  store_close(s);
}

TEST(list_runs_filters_and_pages) {
  store_t *s = open_db();
  journal_t *j = journal_new();
  for (int i = 0; i < 5; i++) {
    char id[32];
    snprintf(id, sizeof id, "01L%d", i);
    new_run(j, id, i % 2 ? "failed" : "completed", NULL);
  }
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  struct run_filter f = {.status = "failed"};
  cJSON *l;
  CHECK(store_list_runs(s, &f, &l, &e) == 0);
  CHECK_INT_EQ(cJSON_GetArraySize(l), 2);
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(l, 0), "id")->valuestring, "01L3");
  cJSON_Delete(l);
  struct run_filter g = {.skill = "demo", .before = "01L3", .limit = 2};
  CHECK(store_list_runs(s, &g, &l, &e) == 0);
  CHECK_INT_EQ(cJSON_GetArraySize(l), 2);
  CHECK_STR_EQ(cJSON_GetObjectItem(cJSON_GetArrayItem(l, 0), "id")->valuestring, "01L2");
  cJSON_Delete(l);
  store_close(s);
}

TEST(reopening_keeps_the_schema) {
  store_t *s = open_db();
  store_close(s);
  s = open_db();
  cJSON *r;
  err_t e;
  CHECK(store_get_run(s, "01RUNA", 0, &r, &e) == 0);
  cJSON_Delete(r);
  store_close(s);
}

/* Every kind of entry owns its strings once appended (journal.h's lists
** generate the copying): the caller's buffer can change at once, a cron
** tick's run included, and a READ field is not journaled. */
TEST(every_entry_kind_copies_its_strings) {
  journal_t *j = journal_new();
  char text[16];
  for (int k = 0; k < J_COUNT; k++) {
    const struct journal_kind *jk = &journal_kinds[k];
    union jrow row;
    memset(&row, 0, sizeof row);
    snprintf(text, sizeof text, "v%d", k);
    for (size_t i = 0; i < jk->nfields; i++) {
      char *at = (char *)&row + jk->fields[i].offset;
      if (jk->fields[i].type == JOURNAL_TEXT) *(const char **)at = text;
      if (jk->fields[i].type == JOURNAL_RUN) {
        const struct journal_kind *rk = &journal_kinds[J_RUN_NEW];
        for (size_t r = 0; r < rk->nfields; r++)
          if (rk->fields[r].type == JOURNAL_TEXT) *(const char **)(at + rk->fields[r].offset) = text;
      }
    }
    journal_add(j, (enum jkind)k, &row);
    strcpy(text, "changed");
    const struct jentry *e = journal_last(j);
    CHECK_INT_EQ(e->kind, k);
    for (size_t i = 0; i < jk->nfields; i++) {
      const char *at = (const char *)&e->u + jk->fields[i].offset;
      if (jk->fields[i].type != JOURNAL_TEXT) continue;
      const char *got = *(const char *const *)at;
      char want[16];
      snprintf(want, sizeof want, "v%d", k);
      if (jk->fields[i].use == JOURNAL_READ) CHECK(got == NULL);
      else if (!got || strcmp(got, want)) FAILF("%s.%s == %s", jk->name, jk->fields[i].name, got ? got : "NULL");
    }
  }
  const struct jentry *cron = journal_entry(j, J_CRON);
  snprintf(text, sizeof text, "v%d", J_CRON);
  CHECK_STR_EQ(cron->u.cron.run.id, text);
  CHECK(cron->u.cron.run.cancel_reason == NULL);
  journal_free(j);
}

TEST(ulids_sort_by_time_and_are_unique) {
  char a[27], b[27], c[27];
  ids_ulid(1000, a);
  ids_ulid(1000, b);
  ids_ulid(2000, c);
  CHECK(strcmp(a, b) < 0);
  CHECK(strcmp(b, c) < 0);
  CHECK_INT_EQ(strlen(a), 26);
  char h[65];
  ids_sha256_hex("abc", 3, h);
  CHECK_STR_EQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(a_run_made_again_by_a_replay_is_the_same_run) {
  /* A child's id comes from its parent's step: the same key and time give
  ** the same id, sorting at that time. */
  char a[27], b[27], c[27], t[27];
  ids_ulid_derived(5000, "01PARENT:kid", a);
  ids_ulid_derived(5000, "01PARENT:kid", b);
  ids_ulid_derived(5000, "01PARENT:kid#2", c);
  ids_ulid(5000, t);
  CHECK_STR_EQ(a, b);
  CHECK(strcmp(a, c) != 0);
  CHECK(strncmp(a, t, 10) == 0);
  /* Created again (a replay of the step), it is not created twice: the
  ** entry's result names the run that is there. */
  store_t *s = open_db();
  int64_t far = units_now_ms() + 60000;
  CHECK(take_lease(s, "P", (long)getpid(), proc_start_time(getpid()), far) == 0);
  err_t e;
  for (int i = 0; i < 3; i++) {
    journal_t *j = journal_new();
    journal_set_owner(j, "P", far);
    if (i == 0) new_run(j, "01PARENT", "running", "P");
    struct run_row kid = {.id = a, .skill = "demo", .version = "v1", .status = "running",
                          .trigger = "{}", .parent_id = "01PARENT", .owner = "P",
                          .created_at = 5000, .by_run = "01PARENT"};
    journal_run_new(j, &kid);
    CHECK(store_commit(s, j, &e) == 0);
    const struct jentry *je = journal_last(j);
    if (i == 0) CHECK(je->result == NULL);
    else CHECK_STR_EQ(je->result ? je->result : "(none)", a);
    journal_free(j);
  }
  struct run_filter f = {.parent_id = "01PARENT"};
  cJSON *l;
  CHECK(store_list_runs(s, &f, &l, &e) == 0);
  CHECK_INT_EQ(cJSON_GetArraySize(l), 1);
  cJSON_Delete(l);
  /* The creator held it and made a copy: released, a claim resumes it. */
  struct run_row *rows;
  size_t n;
  CHECK(store_claim(s, "P", 10, &rows, &n, &e) == 0);
  CHECK_INT_EQ(n, 1);
  if (n == 1) CHECK_STR_EQ(rows[0].id, a);
  store_rows_free(rows, n);
  store_close(s);
}

/* Commit a J_WAIT (for event "go", since 1) or a J_WAIT_END (keep) of run
** id at seq, alone; returns the entry's result (malloc'd, or NULL). */
static char *commit_wait_entry(store_t *s, int kind, const char *id, int seq, int keep) {
  journal_t *j = journal_new();
  if (kind == J_WAIT)
    journal_wait(j, &(struct wait_row){.run_id = id, .seq = seq, .kind = "event", .name = "go",
                                       .since = 1});
  else
    journal_wait_end(j, &(struct wait_end){.run_id = id, .seq = seq, .keep = keep});
  err_t e;
  if (store_commit(s, j, &e)) FAILF("commit: %s", e.msg);
  const struct jentry *je = journal_last(j);
  char *r = je->result ? strdup(je->result) : NULL;
  journal_free(j);
  return r;
}

TEST(a_wait_ended_keeps_what_it_took_until_its_step_completes) {
  store_t *s = open_db();
  journal_t *j = journal_new();
  new_run(j, "01W1", "waiting", NULL);
  new_run(j, "01W2", "waiting", NULL);
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  CHECK(commit_wait_entry(s, J_WAIT, "01W1", 1, 0) == NULL);
  CHECK(commit_wait_entry(s, J_WAIT, "01W2", 1, 0) == NULL);
  /* 01W2's wait ends with nothing (its timeout): closed, it takes nothing more. */
  CHECK(commit_wait_entry(s, J_WAIT_END, "01W2", 1, 1) == NULL);
  j = journal_new();
  journal_event(j, &(struct event_row){.id = "01EV", .name = "go", .data = "{\"v\":7}",
                                       .idem = "go-1", .ts = units_now_ms()});
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  int runs;
  CHECK_INT_EQ(store_dispatch(s, units_now_ms(), 10, &runs, &e), 1);
  /* 01W1's wait took the event, and ends; a crash before its step completes
  ** finds the event again when the replay registers the wait again. */
  char *r = commit_wait_entry(s, J_WAIT_END, "01W1", 1, 1);
  CHECK_CONTAINS(r ? r : "", "\"v\":7");
  free(r);
  r = commit_wait_entry(s, J_WAIT, "01W1", 1, 0);
  CHECK_CONTAINS(r ? r : "", "\"v\":7");
  free(r);
  CHECK(commit_wait_entry(s, J_WAIT, "01W2", 1, 0) == NULL);
  /* The step's end removes it. */
  free(commit_wait_entry(s, J_WAIT_END, "01W1", 1, 0));
  r = commit_wait_entry(s, J_WAIT_END, "01W1", 1, 1);
  CHECK(r == NULL);
  free(r);
  store_close(s);
}

TEST(a_run_that_ends_cancels_its_children_not_itself_and_first_reasons_stay) {
  store_t *s = open_db();
  int64_t far = units_now_ms() + 60000;
  CHECK(take_lease(s, "L", (long)getpid(), proc_start_time(getpid()), far) == 0);
  journal_t *j = journal_new();
  journal_set_owner(j, "L", far);
  new_run(j, "01ROOT", "running", "L");
  struct run_row kid = {.id = "01KID", .skill = "demo", .version = "v1", .status = "running",
                        .trigger = "{}", .parent_id = "01ROOT", .owner = "L", .created_at = 1,
                        .by_run = "01ROOT"};
  journal_run_new(j, &kid);
  /* Asked first by a timed-out invoke, then by the parent's end. */
  journal_cancel(j, &(struct cancel_row){.run_id = "01KID", .reason = "its parent stopped waiting",
                                         .at = units_now_ms(), .by_run = "01ROOT"});
  journal_cancel(j, &(struct cancel_row){.run_id = "01ROOT", .reason = "its parent run ended",
                                         .at = units_now_ms(), .by_run = "01ROOT"});
  err_t e;
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  cJSON *out;
  CHECK(store_poll(s, "L", &out, &e) == 0);
  cJSON *cancels = cJSON_GetObjectItem(out, "cancels");
  CHECK_INT_EQ(cJSON_GetArraySize(cancels), 1);
  cJSON *c = cJSON_GetArrayItem(cancels, 0);
  CHECK_STR_EQ(c ? cJSON_GetObjectItem(c, "run_id")->valuestring : "", "01KID");
  CHECK_STR_EQ(c ? cJSON_GetObjectItem(c, "reason")->valuestring : "", "its parent stopped waiting");
  cJSON_Delete(out);
  store_close(s);
}

static long long file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

/* Commits fill the WAL; the store's checkpointer (not the commit that
** crosses 1,000 pages) copies it into the database file while the store is
** open, and the WAL starts again from its start instead of growing. */
TEST(the_wal_is_checkpointed_while_commits_go_on) {
  char p[300], wal[310];
  snprintf(p, sizeof p, "%s/ckpt.db", dir);
  snprintf(wal, sizeof wal, "%s-wal", p);
  store_t *s = NULL;
  err_t e;
  if (store_open(p, STORE_NORMAL, &s, &e)) FAILF("store_open: %s", e.msg);
  journal_t *j = journal_new();
  new_run(j, "01CKPT", "running", NULL);
  CHECK(store_commit(s, j, &e) == 0);
  journal_free(j);
  long long db0 = file_size(p);
  char out[3000];
  memset(out, 'x', sizeof out - 3);
  out[0] = '"';
  out[sizeof out - 2] = '"';
  out[sizeof out - 1] = 0;
  /* 500 commits of 2-3 pages: past 1,000 pages of WAL, short of the
  ** 4,000 at which the writer would checkpoint itself. Only the
  ** checkpointer copies them into the file, while the store stays open. */
  int n = 0;
  for (int round = 0; round < 2; round++) {
    int upto = round ? 8000 : 500; /* then 80 MB and more, back to back */
    for (n++; n <= upto; n++) {
      j = journal_new();
      struct step_row st = {.run_id = "01CKPT", .seq = n, .id = "s", .kind = "run",
                            .status = "completed", .output = out, .attempts = 1};
      journal_step(j, &st);
      if (store_commit(s, j, &e)) FAILF("commit %d: %s", n, e.msg);
      journal_free(j);
    }
    n--;
    int copied = 0;
    for (int i = 0; i < 500 && !copied; i++) {
      copied = file_size(p) >= db0 + (long long)(round ? n * 3000 : 1 << 20);
      if (!copied) usleep(10000);
    }
    CHECK(copied);
    /* Started again from its start: at 4,000 pages, and what the writer
    ** committed while the checkpointer held the WAL's checkpoint lock. */
    CHECK(file_size(wal) < 32 * 1024 * 1024);
  }
  cJSON *r;
  CHECK(store_get_run(s, "01CKPT", 1, &r, &e) == 0);
  CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(r, "steps")) == n);
  cJSON_Delete(r);
  store_close(s);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/t.db", dir);
  RUN(commit_and_read_a_run_record);
  RUN(a_failed_group_changes_nothing);
  RUN(claim_takes_unowned_unfinished_runs_oldest_first);
  RUN(reap_releases_runs_of_dead_and_expired_leases_only);
  RUN(a_group_is_fenced_by_its_lease);
  RUN(a_write_for_a_run_another_process_holds_never_lands);
  RUN(take_run_explains_who_holds_it);
  RUN(list_runs_filters_and_pages);
  RUN(reopening_keeps_the_schema);
  RUN(every_entry_kind_copies_its_strings);
  RUN(ulids_sort_by_time_and_are_unique);
  RUN(a_run_made_again_by_a_replay_is_the_same_run);
  RUN(a_wait_ended_keeps_what_it_took_until_its_step_completes);
  RUN(a_run_that_ends_cancels_its_children_not_itself_and_first_reasons_stay);
  RUN(the_wal_is_checkpointed_while_commits_go_on);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) return 1;
  return test_summary();
}
