/*
** cli_replay.c: moonloop replay RUN_ID...: replay recorded runs from their
** journals against their own versions, as an engine does after a crash,
** and say whether each run's code still takes the path its journal holds.
**
** Nothing leaves the process: every step the journal holds returns (or
** raises) what it recorded, and the replay stops at the first op it would
** need served live (a run in flight goes on there; a run that ended must
** not reach one): a step body it would run live gets as far as its first
** request, which is never sent. Code
** outside steps that reads the clock or random numbers and branches on
** them, or a version whose source no longer loads, shows here before an
** engine meets it. The replays run in the test engine (skilltest.c), with
** the configuration's env, against the runs of the configured database,
** which is only read.
**
** Output: a line per run, "RUN_ID  ok        WHAT", "RUN_ID  diverged  WHY"
** (WHY names the skill's line) or "RUN_ID  error     WHY" (no such run, a
** version that no longer loads); --json prints [{run_id, ok, message}].
** Exit status 0 when every run replayed along its journal, 1 otherwise, 2
** for a usage error.
*/
#include "base/jsontext.h"
#include "cli/cli.h"
#include "base/mem.h"
#include "cli/skilltest.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Remove the test engine's throwaway database and its folder. */
static void remove_tmp(const char *dir, const char *db) {
  static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
  char p[4200];
  for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
    snprintf(p, sizeof p, "%s%s", db, suffix[i]);
    unlink(p);
  }
  rmdir(dir);
}

int cli_replay(struct cli *c) {
  if (c->nargs == 0) return cli_fail(EXIT_USAGE, "usage: moonloop replay RUN_ID...");
  const char *path = c->cfg.db ? c->cfg.db : "moonloop.db";
  if (!store_is_server(path) && access(path, F_OK)) return cli_fail(EXIT_FAILED, "replay: no database at '%s'", path);
  store_t *src;
  err_t e;
  if (store_open(path, STORE_NORMAL, &src, &e)) return cli_fail(EXIT_FAILED, "replay: %s", e.msg);
  const char *tmp = getenv("TMPDIR");
  char dir[4096], db[4200];
  snprintf(dir, sizeof dir, "%s/moonloop-replay-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    store_close(src);
    return cli_fail(EXIT_FAILED, "replay: cannot create a temporary folder in %s: %m",
                    tmp && *tmp ? tmp : "/tmp");
  }
  snprintf(db, sizeof db, "%s/replay.db", dir);
  skilltest_t *t = NULL;
  if (skilltest_open(&c->cfg, db, &t, &e)) {
    skilltest_close(t);
    store_close(src);
    remove_tmp(dir, db);
    return cli_fail(EXIT_FAILED, "replay: %s", e.msg);
  }
  int bad = 0;
  cJSON *all = c->json ? cJSON_CreateArray() : NULL;
  for (int i = 0; i < c->nargs; i++) {
    int ok = 0, failed = 0;
    char *msg = NULL;
    if (skilltest_replay(t, src, c->args[i], &ok, &msg, &e)) {
      ok = 0, failed = 1;
      free(msg);
      msg = mem_strdup(e.msg);
    }
    bad += !ok;
    if (all) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "run_id", c->args[i]);
      cJSON_AddBoolToObject(o, "ok", ok);
      cJSON_AddStringToObject(o, "message", msg ? msg : "");
      cJSON_AddItemToArray(all, o);
    } else {
      printf("%-26s  %-8s  %s\n", c->args[i], ok ? "ok" : failed ? "error" : "diverged",
             msg ? msg : "");
    }
    free(msg);
  }
  if (all) {
    char *s = jsontext_print_text(all);
    printf("%s\n", s ? s : "[]");
    free(s);
    cJSON_Delete(all);
  }
  fflush(stdout);
  skilltest_close(t);
  store_close(src);
  remove_tmp(dir, db);
  return bad ? EXIT_FAILED : EXIT_OK;
}
