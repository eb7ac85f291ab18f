/*
** repl_core.c: the C functions lua/repl.lua finds in core (see
** repl_int.h for how the REPL's files divide the work): sending an event,
** queueing a run for another engine, listing runs, reading a trace,
** printing runs and traces as the CLI does; and the REPL's op codes.
**
** They are plain C: none of them calls Lua or yields, so they are safe from
** any slice. Expected failures return nil, message (as moonloop's own
** commands would word them); misuse raises. Their writes go through the
** aux connection (one transaction each), never the scheduler's writer.
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/term.h"
#include "base/units.h"
#include "base/vocab.h"
#include "cli/repl_int.h"
#include "cli/trace.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The REPL, the C function's upvalue. */
static struct repl *up_repl(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* Return nil, msg to Lua. */
static int push_fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* Commit one journal on the aux connection; the first entry's answer to *result. */
static int commit_aux(struct repl *rp, journal_t *j, char **result, err_t *e) {
  int rc = store_commit(rp->aux, j, e);
  if (!rc && result) {
    const struct jentry *je = journal_entry(j, 0);
    *result = je->result ? mem_strdup(je->result) : NULL;
  }
  journal_free(j);
  return rc;
}

/* core.repl_send(name, data_json, idem): the event's id (as moonloop send). */
static int c_send(lua_State *L) {
  struct repl *rp = up_repl(L);
  const char *name = luaL_checkstring(L, 1), *data = luaL_checkstring(L, 2);
  const char *idem = luaL_optstring(L, 3, NULL);
  char msg[200];
  if (strlen(name) > 256) return push_fail(L, "the event name is longer than 256 characters");
  if ((int64_t)strlen(data) > rp->cfg->event_limit) {
    char sz[32], lim[32];
    units_fmt_over((int64_t)strlen(data), rp->cfg->event_limit, sz, lim, sizeof sz);
    snprintf(msg, sizeof msg, "the event's data is %s, over the limit of %s (limits.event)", sz, lim);
    return push_fail(L, msg);
  }
  char id[27];
  ids_ulid(units_now_ms(), id);
  journal_t *j = journal_new();
  struct event_row ev = {.id = id, .name = name, .data = data, .idem = idem, .ts = units_now_ms()};
  journal_event(j, &ev);
  char *got = NULL;
  err_t e;
  if (commit_aux(rp, j, &got, &e)) return push_fail(L, e.msg);
  lua_pushstring(L, got ? got : id);
  free(got);
  return 1;
}

/* core.repl_enqueue(skill_id, data_json): a queued run's id (as moonloop invoke). */
static int c_enqueue(lua_State *L) {
  struct repl *rp = up_repl(L);
  const char *skill = luaL_checkstring(L, 1), *data = luaL_checkstring(L, 2);
  cJSON *rec;
  err_t e;
  if (store_get_skill(rp->en.store, skill, &rec, &e)) return push_fail(L, e.msg);
  cJSON *v = cJSON_GetObjectItem(rec, "version");
  if (!cJSON_IsString(v)) {
    cJSON_Delete(rec);
    snprintf(e.msg, sizeof e.msg, "skill '%s' has no live version", skill);
    return push_fail(L, e.msg);
  }
  int64_t now = units_now_ms();
  char id[27];
  ids_ulid(now, id);
  struct run_row row = {.id = id, .skill = skill, .version = v->valuestring, .status = "queued",
                        .entry = "run", .trigger = REPL_TRIGGER, .input = data, .created_at = now};
  journal_t *j = journal_new();
  journal_run_new(j, &row);
  int rc = commit_aux(rp, j, NULL, &e);
  cJSON_Delete(rec);
  if (rc) return push_fail(L, e.msg);
  lua_pushstring(L, id);
  return 1;
}

/* core.repl_engine_alive(): whether a serve process holds the database. */
static int c_engine_alive(lua_State *L) {
  lua_pushboolean(L, store_engine_alive(up_repl(L)->en.store, units_now_ms()));
  return 1;
}

/* core.repl_runs(skill, status, since, limit, trigger): the run list (JSON). */
static int c_runs(lua_State *L) {
  struct repl *rp = up_repl(L);
  struct run_filter f = {.skill = luaL_optstring(L, 1, NULL), .status = luaL_optstring(L, 2, NULL),
                         .limit = (int)luaL_optinteger(L, 4, 20),
                         .trigger = luaL_optstring(L, 5, NULL)};
  const char *since = luaL_optstring(L, 3, NULL);
  err_t e;
  char msg[300];
  if (since) {
    int64_t ms;
    if (!units_duration(since, &ms, &e)) f.since = units_now_ms() - ms;
    else if (!units_parse_rfc3339(since, &ms, &e)) f.since = ms;
    else {
      snprintf(msg, sizeof msg, "since: expected a duration such as \"7d\" or an RFC 3339 time, got '%.60s'", since);
      return push_fail(L, msg);
    }
  }
  if (f.status) {
    if (!vocab_is_run_status(f.status)) {
      snprintf(msg, sizeof msg, "status must be one of %s; got '%.40s'", VOCAB_RUN_STATUSES,
               f.status);
      return push_fail(L, msg);
    }
  }
  if (f.limit <= 0) f.limit = 20;
  cJSON *runs;
  if (store_list_runs(rp->en.store, &f, &runs, &e)) return push_fail(L, e.msg);
  char *js = jsontext_print_text(runs);
  cJSON_Delete(runs);
  lua_pushstring(L, js ? js : "[]");
  free(js);
  return 1;
}

/* core.repl_trace(run_id): the run record with its steps (JSON). */
static int c_trace(lua_State *L) {
  struct repl *rp = up_repl(L);
  cJSON *run;
  err_t e;
  if (store_get_run(rp->en.store, luaL_checkstring(L, 1), 1, &run, &e)) return push_fail(L, e.msg);
  char *js = jsontext_print_text(run);
  cJSON_Delete(run);
  lua_pushstring(L, js);
  free(js);
  return 1;
}

/* core.repl_show(kind, json): print runs or a trace as the CLI does. */
static int c_show(lua_State *L) {
  struct repl *rp = up_repl(L);
  const char *kind = luaL_checkstring(L, 1);
  cJSON *v = cJSON_Parse(luaL_checkstring(L, 2));
  fflush(stdout);
  if (v && !strcmp(kind, "runs")) trace_print_runs(stdout, v, rp->color, units_now_ms());
  else if (v) trace_print_run(stdout, v, rp->color, units_now_ms());
  fflush(stdout);
  cJSON_Delete(v);
  return 0;
}

/* core.repl_term(s): s with term.h's escapes, for everything the REPL
** prints (values, errors, print()): a run's output or a skill's error can
** hold controls that would drive the terminal. */
static int c_term(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  if (term_is_clean(s, len)) {
    lua_settop(L, 1);
    return 1;
  }
  buf_t b = BUF_INIT;
  term_escape(&b, s, len, 0);
  lua_pushlstring(L, buf_str(&b), b.len);
  buf_free(&b);
  return 1;
}

/* core.repl_step_timeout(id, timeout_ms): the ctx.step.run body that runs
** now at the prompt has timeout_ms (a request it makes ends when it
** passes); core.repl_step_timeout() when it has ended. */
static int c_step_timeout(lua_State *L) {
  struct repl *rp = up_repl(L);
  double ms = luaL_optnumber(L, 2, 0);
  if (lua_isnoneornil(L, 1) || ms <= 0) {
    rp->step_deadline = rp->step_timeout_ms = 0;
    rp->step_id[0] = 0;
    return 0;
  }
  snprintf(rp->step_id, sizeof rp->step_id, "%s", luaL_checkstring(L, 1));
  rp->step_timeout_ms = ms < 1 ? 1 : (int64_t)ms;
  rp->step_deadline = units_now_ms() + rp->step_timeout_ms;
  return 0;
}

/* See repl_int.h. */
void repl__register_core(struct repl *rp) {
  lrt_t *lrt = rp->en.lrt;
  lua_State *L = lrt_L(lrt);
  lrt_register(lrt, "repl_send", c_send, rp);
  lrt_register(lrt, "repl_enqueue", c_enqueue, rp);
  lrt_register(lrt, "repl_engine_alive", c_engine_alive, rp);
  lrt_register(lrt, "repl_runs", c_runs, rp);
  lrt_register(lrt, "repl_trace", c_trace, rp);
  lrt_register(lrt, "repl_show", c_show, rp);
  lrt_register(lrt, "repl_term", c_term, rp);
  lrt_register(lrt, "repl_step_timeout", c_step_timeout, rp);
  lua_createtable(L, 0, 4);
  static const struct { const char *name; int op; } ops[] = {
    {"SKILL", ROP_SKILL}, {"RUN", ROP_RUN}, {"RESUME", ROP_RESUME}, {"WAIT", ROP_WAIT},
    {"SLEEP", ROP_SLEEP},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    lua_pushinteger(L, ops[i].op);
    lua_setfield(L, -2, ops[i].name);
  }
  lrt_register_value(lrt, "repl_ops");
}
