/*
** skilltest.c: the test engine under `moonloop test` (see skilltest.h):
** opening it, the core functions lua/testing*.lua need, and the loop that
** runs a test file's cases with the slice budget applied per slice.
*/
#include "base/jsontext.h"
#include "cli/skilltest.h"
#include "base/ids.h"
#include "base/mem.h"
#include "base/units.h"
#include "core/engine.h"
#include "lua/json.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct skilltest {
  struct engine en;      /* store (the throwaway one), lrt, skills, loop, sched (never started) */
  const struct config *cfg;
  journal_t *j;          /* rows appended since the last test_commit */
  int clock_on;
  double clock_ms;       /* the virtual clock, while clock_on */
};

/* The test engine, the C function's upvalue. */
static skilltest_t *up_test(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* See skilltest.h. */
store_t *skilltest_store(skilltest_t *t) { return t->en.store; }

/* An expected failure at the Lua boundary: return nil, msg. */
static int push_fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* ---- core functions ---- */

/* core.now(): the virtual clock while a test runs, else the wall clock. It
** replaces lrt.c's before the runtime boots, so run.lua's copy is this one. */
static int c_now(lua_State *L) {
  skilltest_t *t = up_test(L);
  lua_pushnumber(L, t->clock_on ? t->clock_ms : (lua_Number)units_now_ms());
  return 1;
}

/* core.test_clock(ms or nil): set (or clear) the virtual clock. */
static int c_clock(lua_State *L) {
  skilltest_t *t = up_test(L);
  if (lua_isnoneornil(L, 1)) {
    t->clock_on = 0;
  } else {
    t->clock_on = 1;
    t->clock_ms = luaL_checknumber(L, 1);
  }
  return 0;
}

/* core.test_compile(src, chunkname): the chunk compiled as a skill file is
** (text only, the JIT off for every function in it), or nil, message.
** Only from the main state: lrt_load_skill_text pushes there. */
static int c_compile(lua_State *L) {
  skilltest_t *t = up_test(L);
  size_t len;
  const char *src = luaL_checklstring(L, 1, &len);
  const char *name = luaL_checkstring(L, 2);
  if (L != lrt_L(t->en.lrt))
    return luaL_error(L, "test.skill and test files are loaded at the top of a test file, not inside a case");
  err_t e;
  if (lrt_load_skill_text(t->en.lrt, src, len, name, &e)) {
    return push_fail(L, e.msg);
  }
  return 1;
}

/* core.test_read(path): the file's text, or nil, message. */
static int c_read(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  char *src;
  size_t len;
  err_t e;
  if (skills_read_file(path, &src, &len, &e)) {
    return push_fail(L, e.msg);
  }
  lua_pushlstring(L, src, len);
  free(src);
  return 1;
}

/* core.test_is_file(path) */
static int c_is_file(lua_State *L) {
  struct stat st;
  lua_pushboolean(L, stat(luaL_checkstring(L, 1), &st) == 0 && S_ISREG(st.st_mode));
  return 1;
}

/* core.test_registered(id): source, file of the live version of a skill
** registered in the configured database, or nil, message. The database is
** only opened when it exists (a test never creates one). */
static int c_registered(lua_State *L) {
  skilltest_t *t = up_test(L);
  const char *id = luaL_checkstring(L, 1);
  const char *db = t->cfg->db ? t->cfg->db : "moonloop.db";
  if (!store_is_server(db) && access(db, F_OK)) {
    lua_pushnil(L);
    lua_pushfstring(L, "no skill file '%s', and no database (%s) to find a registered skill of that id",
                    id, db);
    return 2;
  }
  store_t *s;
  err_t e;
  cJSON *rec = NULL;
  char *source = NULL, *file = NULL;
  int rc = store_open(db, STORE_NORMAL, &s, &e);
  if (!rc) {
    rc = store_get_skill(s, id, &rec, &e);
    if (rc == ERR_NOTFOUND)
      err_set(&e, ERR_NOTFOUND, "no skill file '%s', and no skill '%s' registered in %s", id, id,
              store_path(s));
    cJSON *v = rc ? NULL : cJSON_GetObjectItem(rec, "version");
    if (!rc && !cJSON_IsString(v))
      rc = err_set(&e, ERR_NOTFOUND, "skill '%s' has no live version in %s", id, store_path(s));
    if (!rc) rc = store_get_version(s, v->valuestring, &source, NULL, &file, &e);
    cJSON_Delete(rec);
    store_close(s);
  }
  if (rc) {
    return push_fail(L, e.msg);
  }
  lua_pushstring(L, source);
  lua_pushstring(L, file ? file : id);
  free(source);
  free(file);
  return 2;
}

/* core.test_sha256(s): the hex digest (a skill version). */
static int c_sha256(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  char hex[IDS_SHA256_HEX + 1];
  ids_sha256_hex(s, len, hex);
  lua_pushstring(L, hex);
  return 1;
}

/* core.test_ulid(ms): a new ULID for that time. */
static int c_ulid(lua_State *L) {
  char id[IDS_ULID_LEN + 1];
  ids_ulid((int64_t)luaL_checknumber(L, 1), id);
  lua_pushstring(L, id);
  return 1;
}

/* core.test_fmt_duration(ms): "2h05m", as the engine's messages write it. */
static int c_fmt_duration(lua_State *L) {
  char d[32];
  units_fmt_duration((int64_t)luaL_checknumber(L, 1), d, sizeof d);
  lua_pushstring(L, d);
  return 1;
}

/* core.test_default_id(file): the skill id a file gets without an `id`. */
static int c_default_id(lua_State *L) {
  char id[160];
  skills_default_id(luaL_checkstring(L, 1), id, sizeof id);
  lua_pushstring(L, id);
  return 1;
}

/* Field k of the table at idx as a string (NULL when absent). The value
** stays on the stack, so the pointer lives until the caller resets it. */
static const char *fstr(lua_State *L, int idx, const char *k) {
  lua_getfield(L, idx, k);
  return lua_isstring(L, -1) ? lua_tostring(L, -1) : NULL;
}

/* Field k of the table at idx as an integer (0 when absent); popped. */
static int64_t fint(lua_State *L, int idx, const char *k) {
  lua_getfield(L, idx, k);
  int64_t v = lua_isnumber(L, -1) ? (int64_t)lua_tonumber(L, -1) : 0;
  lua_pop(L, 1);
  return v;
}

/* core.test_journal(kind, row): append a row to the open group. kind is
** one of journal.h's kinds by name ("run_new", "step"), row's keys are its
** fields (journal_kinds): absent ones are NULL or 0. */
static int c_journal(lua_State *L) {
  skilltest_t *t = up_test(L);
  const char *kind = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int k = 0;
  while (k < J_COUNT && strcmp(journal_kinds[k].name, kind)) k++;
  if (k == J_COUNT) return luaL_error(L, "test_journal: unknown kind '%s'", kind);
  const struct journal_kind *jk = &journal_kinds[k];
  luaL_checkstack(L, (int)jk->nfields + 8, "test_journal");
  int top = lua_gettop(L);
  union jrow row;
  memset(&row, 0, sizeof row);
  for (size_t i = 0; i < jk->nfields; i++) {
    const struct journal_field *f = &jk->fields[i];
    char *at = (char *)&row + f->offset;
    switch (f->type) {
    case JOURNAL_TEXT: *(const char **)at = fstr(L, 2, f->name); break;
    case JOURNAL_INT: *(int *)at = (int)fint(L, 2, f->name); break;
    case JOURNAL_I64: case JOURNAL_TIME: *(int64_t *)at = fint(L, 2, f->name); break;
    default: break; /* a skill's op (SKILL_PUT is 0), a cron's run: no test writes them */
    }
  }
  journal_add(t->j, (enum jkind)k, &row);
  lua_settop(L, top);
  return 0;
}

/* core.test_commit(): commit the open group; true, or nil, message. */
static int c_commit(lua_State *L) {
  skilltest_t *t = up_test(L);
  err_t e;
  int rc = journal_count(t->j) ? store_commit(t->en.store, t->j, &e) : 0;
  journal_free(t->j);
  t->j = journal_new();
  if (rc) {
    return push_fail(L, e.msg);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.test_trace(run_id): the run record with its steps, or nil, message. */
static int c_trace(lua_State *L) {
  skilltest_t *t = up_test(L);
  cJSON *rec = NULL;
  err_t e;
  int rc = store_get_run(t->en.store, luaL_checkstring(L, 1), 1, &rec, &e);
  if (!rc) rc = json_push(L, rec, &e);
  cJSON_Delete(rec);
  if (rc) {
    return push_fail(L, e.msg);
  }
  return 1;
}

/* The core functions and values lua/testing*.lua need (core.now replaced
** by the virtual clock, a hermetic LLM endpoint). */
static void register_core(skilltest_t *t) {
  lrt_t *r = t->en.lrt;
  lua_State *L = lrt_L(r);
  lrt_register(r, "now", c_now, t);
  lrt_register(r, "test_clock", c_clock, t);
  lrt_register(r, "test_compile", c_compile, t);
  lrt_register(r, "test_read", c_read, t);
  lrt_register(r, "test_is_file", c_is_file, t);
  lrt_register(r, "test_registered", c_registered, t);
  lrt_register(r, "test_sha256", c_sha256, t);
  lrt_register(r, "test_ulid", c_ulid, t);
  lrt_register(r, "test_fmt_duration", c_fmt_duration, t);
  lrt_register(r, "test_default_id", c_default_id, t);
  lrt_register(r, "test_journal", c_journal, t);
  lrt_register(r, "test_commit", c_commit, t);
  lrt_register(r, "test_trace", c_trace, t);
  const struct config *c = t->cfg;
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, c->retries >= 0 ? c->retries : 3), lua_setfield(L, -2, "retries");
  lua_pushnumber(L, (lua_Number)(c->backoff_ms > 0 ? c->backoff_ms : 1000));
  lua_setfield(L, -2, "backoff_ms");
  lua_pushnumber(L, (lua_Number)(c->backoff_max_ms > 0 ? c->backoff_max_ms : 600000));
  lua_setfield(L, -2, "backoff_max_ms");
  lua_pushnumber(L, (lua_Number)(c->step_output > 0 ? c->step_output : 1 << 20));
  lua_setfield(L, -2, "output_limit");
  lrt_register_value(r, "test_config");
  /* Tests are hermetic: the LLM endpoint is a made-up one that only the
  ** test's mocks answer, whatever the configuration says. */
  lua_createtable(L, 0, 2);
  lua_pushliteral(L, "http://llm.test/v1"), lua_setfield(L, -2, "base_url");
  lua_pushliteral(L, "test-model"), lua_setfield(L, -2, "model");
  lrt_register_value(r, "llm_settings");
}

/* See skilltest.h. */
int skilltest_open(const struct config *cfg, const char *db_path, skilltest_t **out, err_t *e) {
  skilltest_t *t = mem_calloc(1, sizeof *t);
  t->j = journal_new();
  t->cfg = cfg;
  struct engine *en = &t->en;
  en->cfg = cfg;
  *out = t;
  if (store_open(db_path, STORE_NORMAL, &en->store, e)) return e->code;
  if (engine_open_runtime(en, cfg, e)) return e->code;
  if (uv_loop_init(&en->loop)) return err_set(e, ERR_INTERNAL, "cannot create the event loop");
  en->loop_open = 1;
  /* The scheduler is never started: it is made only so that the run
  ** context registers its core functions and core.OP exactly as in
  ** production; testing.lua replaces the ones that need a scheduler. */
  struct sched_opts so = {
    .loop = &en->loop, .store = en->store, .lrt = en->lrt, .skills = en->skills,
    .mode = SCHED_SOLO, .default_retries = cfg->retries, .backoff_ms = cfg->backoff_ms,
    .backoff_max_ms = cfg->backoff_max_ms, .step_output_limit = cfg->step_output,
    .event_limit = cfg->event_limit,
  };
  if (sched_new(&so, &en->sched, e)) return e->code;
  register_core(t);
  if (lrt_boot(en->lrt, e)) return e->code;
  lua_State *L = lrt_L(en->lrt);
  if (lrt_require(en->lrt, "loader", e) || (lua_pop(L, 1), lrt_require(en->lrt, "testing", e)))
    return e->code;
  lua_pop(L, 1);
  return 0;
}

/* See skilltest.h. */
void skilltest_close(skilltest_t *t) {
  if (!t) return;
  engine_close(&t->en);
  journal_free(t->j);
  free(t);
}

/* ---- running a file ---- */

/* A monotonic clock in ms, for the durations of cases. */
static double mono_ms(void) { return (double)units_mono_ns() / 1e6; }

/* Push testing[fn]; returns 0 or fills e. */
static int push_fn(skilltest_t *t, const char *fn, err_t *e) {
  lua_State *L = lrt_L(t->en.lrt);
  if (lrt_require(t->en.lrt, "testing", e)) return e->code;
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  return 0;
}

/* Fill r from the result table on top of the stack (strings stay valid
** while the table is there). */
static void read_result(lua_State *L, const char *path, struct skilltest_result *r) {
  int idx = lua_gettop(L);
  memset(r, 0, sizeof *r);
  r->file = path;
  r->name = fstr(L, idx, "name");
  r->message = fstr(L, idx, "message");
  r->run_id = fstr(L, idx, "run_id");
  const char *file = fstr(L, idx, "file");
  if (file) r->file = file;
  r->line = (int)fint(L, idx, "line");
  lua_getfield(L, idx, "ok");
  r->ok = lua_toboolean(L, -1);
  lua_pop(L, 1);
}

/* Report the result table on top of the stack (timed from t0) to cb. */
static void report_result(lua_State *L, const char *path, double t0, skilltest_cb cb, void *arg) {
  struct skilltest_result r;
  read_result(L, path, &r);
  r.ms = mono_ms() - t0;
  cb(&r, arg);
}

/* Run case i (1-based) of the loaded file and report it. */
static int run_case(skilltest_t *t, const char *path, int i, skilltest_cb cb, void *arg, err_t *e) {
  lrt_t *lrt = t->en.lrt;
  lua_State *L = lrt_L(lrt);
  int top = lua_gettop(L);
  double t0 = mono_ms();
  if (push_fn(t, "start", e)) return e->code;
  lua_pushinteger(L, i);
  if (lrt_pcall(lrt, 1, 1, e)) return err_prefix(e, "%s: starting case %d", path, i);
  lua_State *co = lua_tothread(L, -1);
  if (!co) {
    lua_settop(L, top);
    return err_set(e, ERR_INTERNAL, "testing.start did not return a coroutine");
  }
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  int rc;
  /* The driver yields after every slice of skill code it resumed, so each
  ** slice gets a fresh budget, as each resume does in the engine. */
  while ((rc = lrt_resume(lrt, co, 0)) == LUA_YIELD) lua_settop(co, 0);
  char *escaped = NULL;
  if (rc) {
    const char *kill = lrt_killed(lrt);
    const char *msg = *kill ? kill : lua_isstring(co, -1) ? lua_tostring(co, -1) : "error";
    escaped = mem_strdup(msg);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  if (push_fn(t, "finish", e)) {
    free(escaped);
    return e->code;
  }
  if (escaped) lua_pushstring(L, escaped);
  else lua_pushnil(L);
  free(escaped);
  if (lrt_pcall(lrt, 1, 1, e)) return err_prefix(e, "%s: finishing case %d", path, i);
  report_result(L, path, t0, cb, arg);
  lua_settop(L, top);
  return 0;
}

/* Push info for run.new from run record rec of skill version sk: run_id,
** entry, started_at, cfg, trigger and input as JSON text. */
static void push_replay_info(skilltest_t *t, const cJSON *rec, struct skill *sk, int64_t started) {
  lua_State *L = lrt_L(t->en.lrt);
  const struct config *c = t->cfg;
  const cJSON *trig = cJSON_GetObjectItem(rec, "trigger");
  const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(trig, "kind"));
  lua_createtable(L, 0, 8);
  lua_pushstring(L, cJSON_GetStringValue(cJSON_GetObjectItem(rec, "id")));
  lua_setfield(L, -2, "run_id");
  lua_pushstring(L, kind && !strcmp(kind, "on_failure") ? "on_failure" : "run");
  lua_setfield(L, -2, "entry");
  lua_pushnumber(L, (lua_Number)started);
  lua_setfield(L, -2, "started_at");
  lua_createtable(L, 0, 6);
  lua_pushstring(L, sk->id), lua_setfield(L, -2, "skill");
  lua_pushstring(L, sk->version), lua_setfield(L, -2, "version");
  lua_pushinteger(L, sk->retries >= 0 ? sk->retries : c->retries >= 0 ? c->retries : 3);
  lua_setfield(L, -2, "retries");
  lua_pushnumber(L, (lua_Number)(sk->backoff_ms ? sk->backoff_ms : c->backoff_ms > 0 ? c->backoff_ms : 1000));
  lua_setfield(L, -2, "backoff_ms");
  lua_pushnumber(L, (lua_Number)(c->backoff_max_ms > 0 ? c->backoff_max_ms : 600000));
  lua_setfield(L, -2, "backoff_max_ms");
  lua_pushnumber(L, (lua_Number)(c->step_output > 0 ? c->step_output : 1 << 20));
  lua_setfield(L, -2, "output_limit");
  lua_setfield(L, -2, "cfg");
  char *tj = jsontext_print_text(trig);
  char *ij = jsontext_print_text(cJSON_GetObjectItem(rec, "input"));
  lua_pushstring(L, tj ? tj : "{}"), lua_setfield(L, -2, "trigger");
  lua_pushstring(L, ij ? ij : "null"), lua_setfield(L, -2, "input");
  free(tj), free(ij);
}

/* See skilltest.h. */
int skilltest_replay(skilltest_t *t, store_t *src, const char *run_id, int *ok, char **message,
                     err_t *e) {
  *ok = 0;
  *message = NULL;
  lrt_t *lrt = t->en.lrt;
  lua_State *L = lrt_L(lrt);
  int top = lua_gettop(L), rc = 0;
  cJSON *rec = NULL, *steps = NULL;
  char *source = NULL, *file = NULL;
  if ((rc = store_get_run(src, run_id, 0, &rec, e))) goto done;
  const char *version = cJSON_GetStringValue(cJSON_GetObjectItem(rec, "version"));
  if ((rc = store_get_version(src, version, &source, NULL, &file, e)) ||
      (rc = store_get_steps(src, run_id, &steps, e)))
    goto done;
  struct skill *sk;
  struct skill_error se;
  if ((rc = skills_load_recorded(t->en.skills, source, strlen(source), file ? file : "skill.lua", &sk,
                                  &se))) {
    rc = err_set(e, rc, "cannot load version %.12s of the run's skill: %s", version, se.err.msg);
    goto done;
  }
  int64_t started = 0;
  const char *sa = cJSON_GetStringValue(cJSON_GetObjectItem(rec, "started_at"));
  if (!sa) sa = cJSON_GetStringValue(cJSON_GetObjectItem(rec, "created_at"));
  if (sa) units_parse_rfc3339(sa, &started, NULL);
  const char *status = cJSON_GetStringValue(cJSON_GetObjectItem(rec, "status"));
  char *out = jsontext_print_text(cJSON_GetObjectItem(rec, "output"));
  const char *emsg = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "error"), "message"));
  if ((rc = push_fn(t, "replay", e))) {
    free(out);
    goto done;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, sk->def_ref);
  push_replay_info(t, rec, sk, started);
  if ((rc = json_push(L, steps, e))) {
    free(out);
    goto done;
  }
  lua_pushstring(L, status);
  lua_pushstring(L, out ? out : "null");
  if (emsg) lua_pushstring(L, emsg);
  else lua_pushnil(L);
  free(out);
  if ((rc = lrt_pcall(lrt, 6, 1, e))) goto done;
  lua_State *co = lua_tothread(L, -1);
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  int r;
  /* As a test case: each slice of the replayed code gets a fresh budget. */
  while ((r = lrt_resume(lrt, co, 0)) == LUA_YIELD) lua_settop(co, 0);
  if (r) {
    const char *kill = lrt_killed(lrt);
    *message = mem_strdup(*kill ? kill : lua_isstring(co, -1) ? lua_tostring(co, -1) : "error");
  } else {
    *ok = lua_toboolean(co, 1);
    *message = mem_strdup(lua_isstring(co, 2) ? lua_tostring(co, 2) : "");
  }
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
done:
  lua_settop(L, top);
  cJSON_Delete(rec);
  cJSON_Delete(steps);
  free(source), free(file);
  return rc;
}

/* See skilltest.h: a file that cannot be read or loaded is reported as a
** failed result, not an error. */
int skilltest_run_file(skilltest_t *t, const char *path, skilltest_cb cb, void *arg, err_t *e) {
  lrt_t *lrt = t->en.lrt;
  lua_State *L = lrt_L(lrt);
  int top = lua_gettop(L);
  char *src;
  size_t len;
  err_t fe;
  if (skills_read_file(path, &src, &len, &fe)) {
    struct skilltest_result r = {.file = path, .message = fe.msg};
    cb(&r, arg);
    return 0;
  }
  double t0 = mono_ms();
  if (push_fn(t, "load", e)) {
    free(src);
    return e->code;
  }
  lua_pushstring(L, path);
  lua_pushlstring(L, src, len);
  free(src);
  int rc = lrt_pcall(lrt, 2, 1, e);
  if (rc) {
    /* A load killed by the budget (a test file looping at its top level). */
    struct skilltest_result r = {.file = path, .message = e->msg, .ms = mono_ms() - t0};
    cb(&r, arg);
    lua_settop(L, top);
    return 0;
  }
  if (!lua_isnumber(L, -1)) {
    report_result(L, path, t0, cb, arg);
    lua_settop(L, top);
    return 0;
  }
  int n = (int)lua_tointeger(L, -1);
  lua_settop(L, top);
  for (int i = 1; i <= n; i++) {
    if ((rc = run_case(t, path, i, cb, arg, e))) {
      lua_settop(L, top);
      return rc;
    }
  }
  return 0;
}
