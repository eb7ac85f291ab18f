/*
** cli_db.c: moonloop db copy SRC DST: a SQLite database copied into an
** empty PostgreSQL database (store_copy, store_copy.c), for a team that
** moves its engines onto PostgreSQL and keeps its history and its
** unfinished runs. Progress goes to stderr while it copies (on a terminal
** only), the rows copied per table to stdout at the end.
*/
#include "base/jsontext.h"
#include "base/units.h"
#include "cli/cli.h"
#include "store/store.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What the progress line needs: whether to draw it, when it was last. */
struct progress {
  int on;
  int64_t last_ms;
};

/* store_copy's callback: one line on stderr, drawn again in place at
** most ten times a second, and at the end of each table. */
static void on_progress(void *arg, const char *table, int64_t done, int64_t total) {
  struct progress *p = arg;
  if (!p->on) return;
  int64_t now = units_now_ms();
  if (done && done < total && now - p->last_ms < 100) return;
  p->last_ms = now;
  fprintf(stderr, "\r\033[Kcopying %s: %lld of %lld rows", table, (long long)done,
          (long long)total);
  fflush(stderr);
}

/* moonloop db copy SRC DST. */
int cli_db(struct cli *c) {
  static const char usage[] = "usage: moonloop db copy SRC DST (a SQLite file into an empty "
                              "PostgreSQL database: postgresql://...)";
  if (c->nargs != 3 || strcmp(c->args[0], "copy")) return cli_fail(EXIT_USAGE, "%s", usage);
  const char *src = c->args[1], *dst = c->args[2];
  if (store_is_server(src) || !store_is_server(dst))
    return cli_fail(EXIT_USAGE, "db copy copies a SQLite file into PostgreSQL: SRC is the file, "
                    "DST a postgresql:// URL (%s)", usage);
  if (c->cfg.server)
    return cli_fail(EXIT_USAGE, "%s", cli_needs_file("db copy", c->cfg.server));
  /* Opening a path that is not there would make a new, empty database. */
  struct stat sb;
  if (stat(src, &sb) || !S_ISREG(sb.st_mode))
    return cli_fail(EXIT_FAILED, "db copy: %s: no such database file", src);
  err_t e;
  store_t *from = NULL, *to = NULL;
  if (store_open(src, STORE_FULL, &from, &e)) return cli_fail(EXIT_FAILED, "%s: %s", src, e.msg);
  if (store_open(dst, STORE_FULL, &to, &e)) {
    store_close(from);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  struct progress p = {.on = isatty(2) && !c->quiet && !c->json, .last_ms = 0};
  cJSON *counts = NULL;
  int64_t t0 = units_now_ms();
  int rc = store_copy(from, to, on_progress, &p, &counts, &e);
  if (p.on) fputs("\r\033[K", stderr);
  char shown[512];
  snprintf(shown, sizeof shown, "%s", store_path(to));
  store_close(from);
  store_close(to);
  if (rc) return cli_fail(EXIT_FAILED, "db copy: %s", e.msg);
  long long rows = 0;
  const cJSON *t;
  cJSON_ArrayForEach(t, counts) rows += (long long)t->valuedouble;
  if (c->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rows", (double)rows);
    cJSON_AddItemToObject(o, "tables", counts);
    char *text = jsontext_print_text(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
    return EXIT_OK;
  }
  printf("copied %lld rows of %d tables from %s to %s in %.1f s\n", rows,
         cJSON_GetArraySize(counts), src, shown, (double)(units_now_ms() - t0) / 1000.0);
  cJSON_ArrayForEach(t, counts)
    if (t->valuedouble > 0) printf("  %-12s %lld\n", t->string, (long long)t->valuedouble);
  cJSON_Delete(counts);
  return EXIT_OK;
}
