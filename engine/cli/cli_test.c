/*
** cli_test.c: moonloop test [FILES or DIRS]: run skill tests.
**
** Directories are searched recursively for *_test.lua files (hidden
** entries skipped, names sorted); files named on the command line run
** whatever their name. With no argument the workspace (default skills/)
** is searched. Each case runs in the test engine (skilltest.c with
** lua/testing.lua) against one throwaway database for the whole command.
**
** Output: a line per failing case, "FILE:LINE: FAIL NAME: MESSAGE" with the
** rest of the message indented below; with -v a line per passing case too
** and the trace of each failed case's run; then "N passed, N failed".
** --json prints one document instead: {passed, failed, db, tests: [...]}.
** Exit status 0 when every case passed, 1 when any failed, 2 when there
** was nothing to run or an argument was wrong.
**
** The database is removed when every case passed; otherwise it is kept,
** and its path is printed, so `moonloop trace RUN_ID --db PATH` shows the
** failed runs.
*/
#include "base/jsontext.h"
#include "base/term.h"
#include "base/units.h"
#include "cli/cli.h"
#include "cli/skilltest.h"
#include "cli/trace.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether s ends with suffix. */
static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* Add the *_test.lua files under dir, recursively, in name order. */
static void find_tests(const char *dir, struct cli_paths *out) {
  struct cli_paths kids = {0};
  cli_paths_of_dir(&kids, dir);
  for (int i = 0; i < kids.n; i++) {
    struct stat st;
    if (stat(kids.v[i], &st) == 0) {
      if (S_ISDIR(st.st_mode)) find_tests(kids.v[i], out);
      else if (S_ISREG(st.st_mode) && ends_with(kids.v[i], "_test.lua")) cli_paths_add(out, kids.v[i]);
    }
  }
  cli_paths_free(&kids);
}

struct tally {
  const struct cli *c;
  skilltest_t *t;
  int passed, failed;
  cJSON *tests; /* --json */
};

/* Print a message's lines after the first, indented. */
static void print_rest(const char *msg) {
  const char *nl = strchr(msg, '\n');
  while (nl) {
    const char *next = strchr(nl + 1, '\n');
    int len = next ? (int)(next - nl - 1) : (int)strlen(nl + 1);
    term_printf(stdout, "    %.*s\n", len, nl + 1);
    nl = next;
  }
}

static void on_result(const struct skilltest_result *r, void *arg) {
  struct tally *ty = arg;
  if (r->ok) ty->passed++;
  else ty->failed++;
  if (ty->tests) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", r->file);
    if (r->line > 0) cJSON_AddNumberToObject(o, "line", r->line);
    else cJSON_AddNullToObject(o, "line");
    if (r->name) cJSON_AddStringToObject(o, "name", r->name);
    else cJSON_AddNullToObject(o, "name");
    cJSON_AddBoolToObject(o, "ok", r->ok);
    if (r->message) cJSON_AddStringToObject(o, "message", r->message);
    else cJSON_AddNullToObject(o, "message");
    if (r->run_id) cJSON_AddStringToObject(o, "run_id", r->run_id);
    else cJSON_AddNullToObject(o, "run_id");
    cJSON_AddNumberToObject(o, "ms", (double)(int64_t)(r->ms * 100) / 100);
    cJSON_AddItemToArray(ty->tests, o);
    return;
  }
  char where[1200];
  if (r->line > 0) snprintf(where, sizeof where, "%s:%d", r->file, r->line);
  else snprintf(where, sizeof where, "%s", r->file);
  if (r->ok) {
    if (ty->c->verbose) term_printf(stdout, "%s: ok %s (%.0fms)\n", where, r->name, r->ms);
    return;
  }
  const char *msg = r->message ? r->message : "failed";
  int first = (int)strcspn(msg, "\n");
  if (r->name) {
    term_printf(stdout, "%s: FAIL %s: %.*s\n", where, r->name, first, msg);
  } else {
    /* A file that cannot be loaded: its message often names the place
    ** already ("file:12: ..."); say it once. */
    size_t fl = strlen(r->file);
    const char *m = msg;
    if (!strncmp(m, r->file, fl) && m[fl] == ':') {
      m += fl + 1;
      while (*m >= '0' && *m <= '9') m++;
      if (*m == ':') m++;
      while (*m == ' ') m++;
    }
    first = (int)strcspn(m, "\n");
    term_printf(stdout, "%s: FAIL loading the test file: %.*s\n", where, first, m);
  }
  print_rest(msg);
  if (ty->c->verbose && r->run_id) {
    cJSON *rec;
    err_t e;
    if (!store_get_run(skilltest_store(ty->t), r->run_id, 1, &rec, &e)) {
      trace_print_run(stdout, rec, ty->c->color, units_now_ms());
      cJSON_Delete(rec);
    }
  }
  fflush(stdout);
}

static void remove_db(const char *dir, const char *db) {
  static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
  char p[4200];
  for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
    snprintf(p, sizeof p, "%s%s", db, suffix[i]);
    unlink(p);
  }
  rmdir(dir);
}

int cli_test(struct cli *c) {
  struct cli_paths files = {0};
  int rc = EXIT_OK;
  if (c->nargs == 0) {
    const char *ws = c->cfg.workspace && *c->cfg.workspace ? c->cfg.workspace : ".";
    struct stat st;
    if (stat(ws, &st) || !S_ISDIR(st.st_mode)) ws = ".";
    find_tests(ws, &files);
  }
  for (int i = 0; i < c->nargs && rc == EXIT_OK; i++) {
    struct stat st;
    if (stat(c->args[i], &st)) {
      rc = cli_fail(EXIT_USAGE, "test: no such file or directory: %s", c->args[i]);
    } else if (S_ISDIR(st.st_mode)) {
      find_tests(c->args[i], &files);
    } else {
      cli_paths_add(&files, c->args[i]);
    }
  }
  if (rc == EXIT_OK && files.n == 0) {
    rc = cli_fail(EXIT_USAGE, "test: no test files (*_test.lua) in %s",
                  c->nargs ? "the given directories" : "the workspace");
  }
  if (rc != EXIT_OK) {
    cli_paths_free(&files);
    return rc;
  }

  const char *tmp = getenv("TMPDIR");
  char dir[4096], db[4200];
  snprintf(dir, sizeof dir, "%s/moonloop-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    cli_paths_free(&files);
    return cli_fail(EXIT_FAILED, "test: cannot create a temporary folder in %s: %m",
                    tmp && *tmp ? tmp : "/tmp");
  }
  snprintf(db, sizeof db, "%s/test.db", dir);

  skilltest_t *t = NULL;
  err_t e;
  if (skilltest_open(&c->cfg, db, &t, &e)) {
    skilltest_close(t);
    remove_db(dir, db);
    cli_paths_free(&files);
    return cli_fail(EXIT_FAILED, "test: %s", e.msg);
  }
  struct tally ty = {.c = c, .t = t, .tests = c->json ? cJSON_CreateArray() : NULL};
  for (int i = 0; i < files.n; i++) {
    if (skilltest_run_file(t, files.v[i], on_result, &ty, &e)) {
      rc = cli_fail(EXIT_FAILED, "test: %s", e.msg);
      break;
    }
  }
  skilltest_close(t);
  int keep = ty.failed > 0 || rc != EXIT_OK;
  if (c->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "passed", ty.passed);
    cJSON_AddNumberToObject(o, "failed", ty.failed);
    if (keep) cJSON_AddStringToObject(o, "db", db);
    else cJSON_AddNullToObject(o, "db");
    cJSON_AddItemToObject(o, "tests", ty.tests);
    char *s = jsontext_print_text(o);
    printf("%s\n", s ? s : "null");
    free(s);
    cJSON_Delete(o);
  } else {
    printf("%d passed, %d failed\n", ty.passed, ty.failed);
  }
  fflush(stdout);
  if (keep) {
    if (!c->json)
      fprintf(stderr, "moonloop: the runs of these tests are kept in %s (moonloop trace RUN_ID --db %s)\n",
              db, db);
  } else {
    remove_db(dir, db);
  }
  cli_paths_free(&files);
  if (rc != EXIT_OK) return rc;
  return ty.failed ? EXIT_FAILED : EXIT_OK;
}
