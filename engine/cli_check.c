/*
** cli_check.c: moonloop check FILE...: load and validate skill files
** without deploying them.
*/
#include "cli.h"
#include "engine.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

int cli_check(struct cli *c) {
  if (!c->nargs) return cli_fail(EXIT_USAGE, "usage: moonloop check FILE...");
  struct engine en;
  memset(&en, 0, sizeof en);
  err_t e;
  if (engine_open_runtime(&en, &c->cfg, &e) || lrt_boot(en.lrt, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  int bad = 0;
  cJSON *all = cJSON_CreateArray();
  for (int i = 0; i < c->nargs; i++) {
    const char *path = c->args[i];
    char *src = NULL, *id = NULL;
    size_t len;
    struct skill_error se = {0};
    int rc = skills_read_file(path, &src, &len, &se.err);
    if (!rc) rc = skills_check(en.skills, src, len, path, &id, &se);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "file", path);
    if (rc) {
      bad++;
      cJSON_AddFalseToObject(r, "ok");
      cJSON_AddStringToObject(r, "error", se.err.msg);
      if (se.line) cJSON_AddNumberToObject(r, "line", se.line);
      if (!c->json) fprintf(stderr, "%s\n", se.err.msg);
    } else {
      cJSON_AddTrueToObject(r, "ok");
      cJSON_AddStringToObject(r, "id", id ? id : "");
      if (!c->json) printf("ok  %s  (%s)\n", path, id ? id : "?");
    }
    cJSON_AddItemToArray(all, r);
    free(src);
    free(id);
  }
  if (c->json) {
    char *s = cJSON_PrintUnformatted(all);
    printf("%s\n", s);
    free(s);
  }
  cJSON_Delete(all);
  engine_close(&en);
  return bad ? EXIT_FAILED : EXIT_OK;
}
