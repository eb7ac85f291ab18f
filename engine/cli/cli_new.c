/*
** cli_new.c: moonloop new ID [--event NAME | --cron SPEC] [--workspace DIR]:
** write a skill skeleton and its test, as `cargo new` does.
**
** The skill file is ID with '-' and '.' turned into '_' (order-saga ->
** order_saga.lua), beside its test (order_saga_test.lua), in --workspace
** DIR or the current folder. Both pass `moonloop check` and `moonloop test`
** as written: the skeleton is checked by the engine's own loader before
** anything is written, so a bad id or cron spec is refused with the same
** message `check` would give. Existing files are never overwritten.
*/
#include "base/jsontext.h"
#include "cli/cli.h"
#include "base/mem.h"
#include "core/engine.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A growing string (the files are a few hundred bytes). */
struct text {
  char *p;
  size_t len, cap;
};

/* Append the NUL-terminated s to t. */
static void put(struct text *t, const char *s) {
  size_t n = strlen(s);
  if (t->len + n + 1 > t->cap) {
    t->cap = (t->len + n + 1) * 2;
    t->p = mem_realloc(t->p, t->cap);
  }
  memcpy(t->p + t->len, s, n + 1);
  t->len += n;
}

/* Append s as a Lua string literal: quoted, with backslashes, quotes and
** control bytes escaped, so any event name or cron spec stays one literal. */
static void put_lua_string(struct text *t, const char *s) {
  put(t, "\"");
  for (; *s; s++) {
    char b[8];
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') snprintf(b, sizeof b, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f) snprintf(b, sizeof b, "\\%03u", ch);
    else snprintf(b, sizeof b, "%c", ch);
    put(t, b);
  }
  put(t, "\"");
}

/* The skeleton of skill id in file name (no folder), with its trigger. */
static void skill_source(struct text *t, const char *id, const char *name, const char *event,
                         const char *cron) {
  put(t, "-- "), put(t, name), put(t, ": TODO: say what this skill does, in a sentence.\n");
  put(t, "-- Written by `moonloop new`; docs/agents.md has every key, step and module.\n");
  put(t, "return {\n  id = "), put_lua_string(t, id), put(t, ",\n");
  put(t, "  description = \"TODO: one line for `moonloop skills` and the dashboard\",\n");
  if (event) {
    put(t, "  triggers = { { event = "), put_lua_string(t, event), put(t, " } },\n");
  } else if (cron) {
    put(t, "  triggers = { { cron = "), put_lua_string(t, cron), put(t, ", tz = \"UTC\" } },\n");
  } else {
    put(t, "  -- no triggers: started by `moonloop invoke`, the API, the REPL or another\n"
           "  -- skill's step.invoke (add { event = \"NAME\" } or { cron = \"*/5 * * * *\" })\n");
  }
  put(t, "  retries = 3,     -- each step is tried again this often when it fails\n"
         "  timeout = \"1h\",  -- the whole run\n"
         "  run = function(ctx)\n"
         "    -- ctx.input: the run's input (the event's data, or invoke's --data).\n"
         "    local input = ctx.input\n"
         "    -- A step's result is checkpointed: after a crash it is returned, not\n"
         "    -- run again. Do outside calls (http, llm) inside steps.\n"
         "    local result = ctx.step.run(\"handle\", function()\n"
         "      log.info(\"handling the input\")\n"
         "      return { received = input }\n"
         "    end)\n"
         "    return result\n"
         "  end,\n"
         "}\n");
}

/* The skeleton's test: one case that runs it the way its trigger would. */
static void test_source(struct text *t, const char *name, const char *test_name,
                        const char *event) {
  put(t, "-- "), put(t, test_name), put(t, ": tests of "), put(t, name);
  put(t, " (run: moonloop test "), put(t, test_name), put(t, ").\n");
  put(t, "-- docs/testing.md has the test API: mocks, supplied events, virtual time.\n");
  put(t, "local t = test.skill("), put_lua_string(t, name), put(t, ")\n\n");
  put(t, "t:case(\"hands its input back\", function(c)\n");
  if (event) {
    put(t, "  local out = c:run({ example = 1 }, { event = "), put_lua_string(t, event), put(t, " })\n");
  } else {
    put(t, "  local out = c:run({ example = 1 })\n");
  }
  put(t, "  c:eq(out, { received = { example = 1 } })\n"
         "  c:steps({ \"handle\" })\n"
         "end)\n\n"
         "return t\n");
}

/* dir/name, malloc'd ("name" when dir is NULL or "."). */
static char *join(const char *dir, const char *name) {
  size_t len = (dir ? strlen(dir) : 0) + strlen(name) + 2;
  char *p = mem_alloc(len);
  if (!dir || !strcmp(dir, ".")) snprintf(p, len, "%s", name);
  else snprintf(p, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
  return p;
}

/* Create path with text, refusing to replace a file: 0, or -1 after
** printing why. */
static int write_new(const char *path, const struct text *t) {
  FILE *f = fopen(path, "wx");
  if (!f) {
    if (errno == EEXIST) cli_fail(EXIT_FAILED, "new: %s exists; not overwritten", path);
    else cli_fail(EXIT_FAILED, "new: cannot create %s: %s", path, strerror(errno));
    return -1;
  }
  int bad = fwrite(t->p, 1, t->len, f) != t->len;
  if (fclose(f) || bad) {
    cli_fail(EXIT_FAILED, "new: cannot write %s: %s", path, strerror(errno));
    remove(path);
    return -1;
  }
  return 0;
}

/* Check the skeleton with the engine's own loader; 0 when it loads. */
static int check_skeleton(struct cli *c, const struct text *src, const char *name) {
  struct engine en;
  memset(&en, 0, sizeof en);
  err_t e;
  if (engine_open_runtime(&en, &c->cfg, &e) || lrt_boot(en.lrt, &e)) {
    engine_close(&en);
    return cli_fail(EXIT_FAILED, "%s", e.msg);
  }
  char *id = NULL;
  struct skill_error se = {0};
  int rc = skills_check(en.skills, src->p, src->len, name, &id, &se);
  free(id);
  engine_close(&en);
  if (!rc) return 0;
  /* The message names a line of a file that was never written: drop
  ** "NAME:LINE: " and keep what is wrong with the argument. */
  const char *msg = se.err.msg;
  size_t nl = strlen(name);
  if (!strncmp(msg, name, nl) && msg[nl] == ':') {
    const char *after = strstr(msg + nl + 1, ": ");
    if (after) msg = after + 2;
  }
  return cli_fail(EXIT_USAGE, "new: %s", msg);
}

/* moonloop new ID [--event NAME | --cron SPEC] [--workspace DIR]. */
int cli_new(struct cli *c) {
  if (c->nargs != 1)
    return cli_fail(EXIT_USAGE, "usage: moonloop new ID [--event NAME | --cron SPEC] [--workspace DIR]");
  if (c->event && c->cron)
    return cli_fail(EXIT_USAGE, "new: give --event or --cron, not both (a skill may have "
                    "several triggers: add the other to its triggers list)");
  const char *id = c->args[0], *dir = c->out_dir;
  struct stat st;
  if (dir && (stat(dir, &st) || !S_ISDIR(st.st_mode)))
    return cli_fail(EXIT_USAGE, "new: %s is not a folder", dir);
  /* The file names: the id with '-' and '.' as '_'. */
  size_t n = strlen(id);
  char *stem = mem_alloc(n + 1), *name = mem_alloc(n + 5), *test_name = mem_alloc(n + 10);
  struct text skill = {0}, test = {0};
  char *path = NULL, *test_path = NULL;
  int rc = EXIT_FAILED;
  for (size_t i = 0; i <= n; i++) stem[i] = (id[i] == '-' || id[i] == '.') ? '_' : id[i];
  snprintf(name, n + 5, "%s.lua", stem);
  snprintf(test_name, n + 10, "%s_test.lua", stem);
  skill_source(&skill, id, name, c->event, c->cron);
  test_source(&test, name, test_name, c->event);
  path = join(dir, name);
  test_path = join(dir, test_name);
  if ((rc = check_skeleton(c, &skill, name))) goto out;
  rc = EXIT_FAILED;
  if (write_new(path, &skill)) goto out;
  if (write_new(test_path, &test)) {
    remove(path); /* all or nothing: a skill without its test is half a skeleton */
    goto out;
  }
  if (c->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "skill", path);
    cJSON_AddStringToObject(o, "test", test_path);
    char *s = jsontext_print_text(o);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
  } else {
    printf("wrote %s (skill %s) and %s\n", path, id, test_path);
    printf("next: moonloop check %s && moonloop test %s\n", path, test_path);
  }
  rc = EXIT_OK;
out:
  free(stem), free(name), free(test_name), free(path), free(test_path);
  free(skill.p), free(test.p);
  return rc;
}
