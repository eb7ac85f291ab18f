/*
** cli_check.c: moonloop check FILE-or-DIR...: load and validate skill files
** without deploying them.
**
** A file named on the command line is checked whatever its name. A folder
** is checked as the workspace watcher would load it (watcher_counts): every
** *.lua file in it and its subfolders, except skill tests (*_test.lua) and
** names starting with '.' or '#'; folders starting with '.' and symbolic
** links to folders are not entered; names in order.
*/
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/term.h"
#include "cli/cli.h"
#include "core/engine.h"
#include "sidecar/watcher.h"

#include <cJSON.h>
#include <dirent.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* See cli.h. */
void cli_paths_add(struct cli_paths *l, const char *p) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = mem_realloc(l->v, (size_t)l->cap * sizeof *l->v);
  }
  l->v[l->n++] = mem_strdup(p);
}

/* See cli.h. */
void cli_paths_free(struct cli_paths *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
}

/* qsort's comparison of two strings. */
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* See cli.h. */
void cli_paths_sort(struct cli_paths *l) {
  if (l->n) qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_str);
}

/* See cli.h. */
void cli_paths_of_dir(struct cli_paths *out, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct cli_paths names = {0};
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') cli_paths_add(&names, de->d_name);
  closedir(d);
  cli_paths_sort(&names);
  size_t dl = strlen(dir);
  for (int i = 0; i < names.n; i++) {
    size_t len = dl + strlen(names.v[i]) + 2;
    char *p = mem_alloc(len);
    if (!strcmp(dir, ".")) snprintf(p, len, "%s", names.v[i]); /* "x.lua", not "./x.lua" */
    else snprintf(p, len, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", names.v[i]);
    cli_paths_add(out, p);
    free(p);
  }
  cli_paths_free(&names);
}

/* Add the skill files under dir (the watcher's rule, see the top), in name
** order. */
static void find_skills(const char *dir, int depth, struct cli_paths *out) {
  struct cli_paths kids = {0};
  cli_paths_of_dir(&kids, dir);
  for (int i = 0; i < kids.n; i++) {
    const char *p = kids.v[i], *slash = strrchr(p, '/');
    struct stat st;
    if (lstat(p, &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        if (depth < WATCHER_MAX_DEPTH) find_skills(p, depth + 1, out);
      } else if (watcher_counts(slash ? slash + 1 : p) && stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
        cli_paths_add(out, p);
      }
    }
  }
  cli_paths_free(&kids);
}

/* moonloop check --api: the API's tables (lua/api.lua) that skills are
** checked against: every skill key, step, option and module function, as
** JSON (--json) or as one line each. */
static int print_api(struct cli *c) {
  if (c->nargs) return cli_fail(EXIT_USAGE, "usage: moonloop check --api [--json] (no files)");
  struct engine en;
  memset(&en, 0, sizeof en);
  err_t e;
  int rc = EXIT_OK;
  if (engine_open_runtime(&en, &c->cfg, &e) || lrt_boot(en.lrt, &e) ||
      lrt_require(en.lrt, "api", &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  lua_State *L = lrt_L(en.lrt);
  lua_getfield(L, -1, c->json ? "export_json" : "export_text");
  lua_remove(L, -2);
  if (lrt_pcall(en.lrt, 0, 1, &e)) rc = cli_fail(EXIT_FAILED, "%s", e.msg);
  else printf("%s\n", lua_tostring(L, -1));
  lua_settop(L, 0);
  engine_close(&en);
  return rc;
}

/* moonloop check: every file named, and the skill files of every folder
** named; exit 1 when any fails, 2 when a folder holds none at all. Warnings
** of the static checks are printed and do not change the exit status. */
int cli_check(struct cli *c) {
  if (c->api) return print_api(c);
  if (!c->nargs) return cli_fail(EXIT_USAGE, "usage: moonloop check FILE-or-DIR... | moonloop check --api");
  struct cli_paths files = {0};
  int dirs = 0;
  for (int i = 0; i < c->nargs; i++) {
    struct stat st;
    if (stat(c->args[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      dirs++;
      find_skills(c->args[i], 0, &files);
    } else {
      cli_paths_add(&files, c->args[i]); /* a missing file fails below, naming it */
    }
  }
  if (!files.n) {
    cli_paths_free(&files);
    return cli_fail(EXIT_USAGE, "check: no skill files (*.lua, not *_test.lua) in %s",
                    dirs == 1 ? c->args[0] : "the given folders");
  }
  /* A secret in the global env list reaches every skill checked here. */
  char warning[1200];
  if (config_env_warning(&c->cfg, warning, sizeof warning)) fprintf(stderr, "moonloop: %s\n", warning);
  struct engine en;
  memset(&en, 0, sizeof en);
  err_t e;
  if (engine_open_runtime(&en, &c->cfg, &e) || lrt_boot(en.lrt, &e)) {
    engine_close(&en);
    cli_paths_free(&files);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  int bad = 0;
  cJSON *all = cJSON_CreateArray();
  for (int i = 0; i < files.n; i++) {
    const char *path = files.v[i];
    char *src = NULL, *id = NULL, *warnings = NULL;
    size_t len;
    struct skill_error se = {0};
    int rc = skills_read_file(path, &src, &len, &se.err);
    if (!rc) rc = skills_check_warnings(en.skills, src, len, path, 1, &id, &warnings, &se);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "file", path);
    if (rc) {
      bad++;
      cJSON_AddFalseToObject(r, "ok");
      cJSON_AddStringToObject(r, "error", se.err.msg);
      if (se.line) cJSON_AddNumberToObject(r, "line", se.line);
      if (!c->json) term_printf(stderr, "%s\n", se.err.msg);
    } else {
      cJSON_AddTrueToObject(r, "ok");
      cJSON_AddStringToObject(r, "id", id ? id : "");
      if (!c->json) term_printf(stdout, "ok  %s  (%s)\n", path, id ? id : "?");
    }
    /* Warnings do not fail the check: FILE:LINE: warning: ... on stderr,
    ** after the file's line on stdout (flushed, so that the two stay in
    ** order when both go to one pipe). */
    fflush(stdout);
    cJSON *wl = warnings ? cJSON_Parse(warnings) : NULL;
    if (!cJSON_IsArray(wl)) {
      cJSON_Delete(wl);
      wl = cJSON_CreateArray();
    }
    const cJSON *w;
    cJSON_ArrayForEach(w, wl) {
      if (c->json) continue;
      const cJSON *line = cJSON_GetObjectItem(w, "line"), *msg = cJSON_GetObjectItem(w, "message");
      fprintf(stderr, "%s:%d: warning: %s\n", path, cJSON_IsNumber(line) ? line->valueint : 0,
              cJSON_IsString(msg) ? msg->valuestring : "?");
    }
    cJSON_AddItemToObject(r, "warnings", wl);
    cJSON_AddItemToArray(all, r);
    free(src);
    free(id);
    free(warnings);
  }
  if (c->json) {
    char *s = jsontext_print_text(all);
    printf("%s\n", s);
    free(s);
  }
  cJSON_Delete(all);
  engine_close(&en);
  cli_paths_free(&files);
  return bad ? EXIT_FAILED : EXIT_OK;
}
