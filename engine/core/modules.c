/*
** modules.c: core functions behind the `runs` and `skills` modules (see
** modules.h). Reads go to the store's reader connection on the loop
** thread; answers travel to Lua as JSON text, decoded there.
**
** skills.deploy writes a skill file into the workspace (atomically: a
** temporary file renamed over it), so the sidecar registers it the way it
** registers any file an agent writes: deploying is saving a file. Only the
** skills the configuration lists in `deployers` may call it.
**
** runs.cancel journals the same cancel entry as `moonloop cancel` (OP_CANCEL)
** and answers once it is durable; only the skills the configuration lists
** in `cancellers` may call it. A refused permission is fatal for the step
** (a third value "fatal" tells lua/modules.lua so): retrying cannot help.
*/
#include "base/ids.h"
#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/workspace.h"
#include "core/engine.h"
#include "core/modules.h"
#include "core/run.h"

#include <errno.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct engine *up_engine(lua_State *L) {
  struct engine *en = lua_touserdata(L, lua_upvalueindex(1));
  /* `moonloop check` loads skills with no database open. */
  if (!en->store) luaL_error(L, "this needs the engine's database, which is not open here");
  return en;
}

static int push_json(lua_State *L, cJSON *v) {
  char *s = jsontext_print_text(v);
  cJSON_Delete(v);
  lua_pushstring(L, s);
  free(s);
  return 1;
}

static int fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

static const char *opt_field(lua_State *L, const char *k) {
  lua_getfield(L, 1, k);
  const char *v = lua_isstring(L, -1) ? lua_tostring(L, -1) : NULL;
  lua_pop(L, 1);
  return v;
}

/* core.runs_list{skill=, status=, since= (ms), until= (ms), trigger=, parent=, limit=}:
** JSON list of run records (without steps), newest first. */
static int c_runs_list(lua_State *L) {
  struct engine *en = up_engine(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  struct run_filter f = {
    .skill = opt_field(L, "skill"), .status = opt_field(L, "status"),
    .trigger = opt_field(L, "trigger"), .parent_id = opt_field(L, "parent"),
  };
  lua_getfield(L, 1, "since");
  f.since = (int64_t)lua_tonumber(L, -1);
  lua_getfield(L, 1, "until");
  f.until = (int64_t)lua_tonumber(L, -1);
  lua_getfield(L, 1, "limit");
  f.limit = lua_isnumber(L, -1) ? (int)lua_tonumber(L, -1) : 100;
  lua_pop(L, 3);
  cJSON *runs;
  err_t e;
  if (store_list_runs(en->store, &f, &runs, &e)) return fail(L, e.msg);
  return push_json(L, runs);
}

/* core.batch_events(run_id): the JSON list of the events batched into a
** run (flow control's batch), or nil when it has none. */
static int c_batch_events(lua_State *L) {
  struct engine *en = up_engine(L);
  char *js = NULL;
  err_t e;
  if (store_batch_events(en->store, luaL_checkstring(L, 1), &js, &e)) return luaL_error(L, "%s", e.msg);
  if (!js) return 0;
  lua_pushstring(L, js);
  free(js);
  return 1;
}

/* core.runs_get(id): JSON run record with steps, or nil, message. */
static int c_runs_get(lua_State *L) {
  struct engine *en = up_engine(L);
  cJSON *run;
  err_t e;
  if (store_get_run(en->store, luaL_checkstring(L, 1), 1, &run, &e)) return fail(L, e.msg);
  return push_json(L, run);
}

/* core.runs_stats{skill=, since= (ms), until= (ms), interval= (ms)}: the
** health figures as JSON (store_stats_skill with a skill, else
** store_stats_overview), or nil, message, and "not_found" for a skill
** neither registered nor run, "invalid" for a bad window. */
static int c_runs_stats(lua_State *L) {
  struct engine *en = up_engine(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  struct stats_query q = {.skill = opt_field(L, "skill")};
  lua_getfield(L, 1, "since");
  q.since = (int64_t)lua_tonumber(L, -1);
  lua_getfield(L, 1, "until");
  q.until = lua_isnumber(L, -1) ? (int64_t)lua_tonumber(L, -1) : units_now_ms();
  lua_getfield(L, 1, "interval");
  q.interval = (int64_t)lua_tonumber(L, -1);
  lua_pop(L, 3);
  cJSON *st;
  err_t e;
  int rc = q.skill ? store_stats_skill(en->store, &q, &st, &e) : store_stats_overview(en->store, &q, &st, &e);
  if (rc) {
    lua_pushnil(L);
    lua_pushstring(L, e.msg);
    lua_pushstring(L, err_name(rc));
    return 3;
  }
  return push_json(L, st);
}

static int c_skills_list(lua_State *L) {
  struct engine *en = up_engine(L);
  cJSON *skills;
  err_t e;
  if (store_list_skills(en->store, &skills, &e)) return fail(L, e.msg);
  return push_json(L, skills);
}

/* core.skills_get(id): the skill record plus the live version's source. */
static int c_skills_get(lua_State *L) {
  struct engine *en = up_engine(L);
  cJSON *rec;
  err_t e;
  if (store_get_skill(en->store, luaL_checkstring(L, 1), &rec, &e)) return fail(L, e.msg);
  const cJSON *v = cJSON_GetObjectItem(rec, "version");
  char *src = NULL;
  if (cJSON_IsString(v) && !store_get_version(en->store, v->valuestring, &src, NULL, NULL, &e))
    cJSON_AddStringToObject(rec, "source", src);
  free(src);
  return push_json(L, rec);
}

/* core.skills_check(source [, name]): true, id, warnings (JSON or nil) or
** nil, message, line. */
static int c_skills_check(lua_State *L) {
  struct engine *en = up_engine(L);
  /* The source's top level may call skills.check again (lrt.h's guard). */
  lrt_cstack_check(L, "skills.check");
  size_t len;
  const char *src = luaL_checklstring(L, 1, &len);
  const char *name = luaL_optstring(L, 2, "skill.lua");
  char *id = NULL, *warnings = NULL;
  struct skill_error se;
  if (skills_check_warnings(en->skills, src, len, name, 0, &id, &warnings, &se)) {
    lua_pushnil(L);
    lua_pushstring(L, se.err.msg);
    if (se.line) lua_pushinteger(L, se.line);
    else lua_pushnil(L);
    return 3;
  }
  lua_pushboolean(L, 1);
  lua_pushstring(L, id ? id : "");
  if (warnings) lua_pushstring(L, warnings);
  else lua_pushnil(L);
  free(id);
  free(warnings);
  return 3;
}

/* Whether skill is in list (a configuration list such as `deployers`). */
static int listed(char **list, const char *skill) {
  for (char **d = list; skill && d && *d; d++)
    if (!strcmp(*d, skill)) return 1;
  return 0;
}

/* Whether another skill with a live version was registered from file:
** a deploy never writes over another skill's file. */
static int file_of_other(struct engine *en, const char *id, const char *file) {
  cJSON *all;
  err_t e;
  if (store_list_skills(en->store, &all, &e)) return 1;
  int other = 0;
  const cJSON *k;
  cJSON_ArrayForEach(k, all) {
    const cJSON *f = cJSON_GetObjectItem(k, "file"), *v = cJSON_GetObjectItem(k, "version");
    const cJSON *kid = cJSON_GetObjectItem(k, "id");
    if (cJSON_IsString(f) && !strcmp(f->valuestring, file) && cJSON_IsString(v) &&
        cJSON_IsString(kid) && strcmp(kid->valuestring, id))
      other = 1;
  }
  cJSON_Delete(all);
  return other;
}

/* The skill of the run whose task is running (the caller of a module
** function), or NULL outside a run. */
static const char *caller_skill(struct engine *en, struct task **tp) {
  struct task *t = en->sched ? sched__current(en->sched) : NULL;
  if (tp) *tp = t;
  return t && t->run->skill ? t->run->skill->id : NULL;
}

/* The file a deploy of id writes: the file that registered it, when that
** is inside the workspace (on its real path) and no other live skill's,
** else WORKSPACE/<id with '-' as '_'>.lua. Whatever a PUT's ?file= said,
** the write lands inside the workspace; workspace_write checks it again. */
static void deploy_path(struct engine *en, const char *id, char *out, size_t n) {
  cJSON *rec;
  err_t e;
  const char *ws = en->cfg->workspace;
  if (!store_get_skill(en->store, id, &rec, &e)) {
    const cJSON *f = cJSON_GetObjectItem(rec, "file");
    if (cJSON_IsString(f) && strncmp(f->valuestring, "//", 2) &&
        !workspace_inside(ws, f->valuestring, &e) && !file_of_other(en, id, f->valuestring)) {
      snprintf(out, n, "%s", f->valuestring);
      cJSON_Delete(rec);
      return;
    }
    cJSON_Delete(rec);
  }
  char base[200];
  snprintf(base, sizeof base, "%s", id);
  for (char *p = base; *p; p++)
    if (*p == '-') *p = '_';
  snprintf(out, n, "%s/%s.lua", ws, base);
}

/* Whether id is a skill id ([a-z0-9][a-z0-9._-]*, at most 128 bytes, as
** skill.lua checks a source's): it becomes a file name. */
static int is_skill_id(const char *id) {
  size_t n = strlen(id);
  if (!n || n > 128) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          (i && (c == '.' || c == '_' || c == '-'))))
      return 0;
  }
  return 1;
}

/* core.skills_deploy(id, source): {file, version} or nil, message. */
static int c_skills_deploy(lua_State *L) {
  struct engine *en = up_engine(L);
  const char *id = luaL_checkstring(L, 1);
  size_t len;
  const char *src = luaL_checklstring(L, 2, &len);
  const char *caller = caller_skill(en, NULL);
  char msg[1200];
  if (!listed(en->cfg->deployers, caller)) {
    /* Fatal (third value): retrying cannot give a permission. */
    snprintf(msg, sizeof msg, "skills.deploy: skill '%s' is not allowed to deploy: add it to "
             "`deployers` in the configuration (deployers = { \"%s\" } in moonloop.conf.lua)",
             caller ? caller : "?", caller ? caller : "SKILL");
    fail(L, msg);
    lua_pushliteral(L, "fatal");
    return 3;
  }
  if (!is_skill_id(id)) {
    snprintf(msg, sizeof msg, "skills.deploy: '%.200s' is not a skill id ([a-z0-9][a-z0-9._-]*, "
             "at most 128 characters)", id);
    return fail(L, msg);
  }
  char path[1024];
  deploy_path(en, id, path, sizeof path);
  char *got = NULL;
  struct skill_error se;
  if (skills_check(en->skills, src, len, path, &got, &se)) return fail(L, se.err.msg);
  if (strcmp(got, id)) {
    snprintf(msg, sizeof msg, "skills.deploy: the source declares id '%s', not '%s'", got, id);
    free(got);
    return fail(L, msg);
  }
  free(got);
  err_t re;
  if (en->sched && sched_skill_refusal(en->sched, id, path, src, len, &re)) {
    snprintf(msg, sizeof msg, "skills.deploy: the engine would refuse it: %s", re.msg);
    return fail(L, msg);
  }
  mkdir(en->cfg->workspace, 0755);
  err_t we;
  if (workspace_write(en->cfg->workspace, path, src, len, &we)) {
    snprintf(msg, sizeof msg, "skills.deploy: %s", we.msg);
    return fail(L, msg);
  }
  char version[65];
  ids_sha256_hex(src, len, version);
  lua_createtable(L, 0, 2);
  lua_pushstring(L, path), lua_setfield(L, -2, "file");
  lua_pushstring(L, version), lua_setfield(L, -2, "version");
  return 1;
}

/* ---- runs.cancel ---- */

/* core.runs_cancel(id): the checks made before runs.cancel yields OP_CANCEL:
** true, or nil, message, how: "fatal" when the caller may not cancel (not
** in `cancellers`, or the run is its own), "answer" when id names no run. */
static int c_runs_cancel(lua_State *L) {
  struct engine *en = up_engine(L);
  const char *id = luaL_checkstring(L, 1);
  struct task *t;
  const char *caller = caller_skill(en, &t);
  char msg[600];
  const char *how = "fatal";
  if (!t) {
    snprintf(msg, sizeof msg, "runs.cancel can only be called inside a run (in a step body); "
             "from a shell: moonloop cancel RUN_ID");
  } else if (!listed(en->cfg->cancellers, caller)) {
    snprintf(msg, sizeof msg, "runs.cancel: skill '%s' is not allowed to cancel runs: add it to "
             "`cancellers` in the configuration (cancellers = { \"%s\" } in moonloop.conf.lua)",
             caller ? caller : "?", caller ? caller : "SKILL");
  } else if (!strcmp(id, t->run->id)) {
    snprintf(msg, sizeof msg, "runs.cancel: a run cannot cancel itself: return, or raise "
             "error(fatal(\"why\")) to fail it");
  } else if (strlen(id) != 26) {
    snprintf(msg, sizeof msg, "no run with id '%.40s'", id);
    how = "answer";
  } else {
    lua_pushboolean(L, 1);
    return 1;
  }
  fail(L, msg);
  lua_pushstring(L, how);
  return 3;
}

/* A runs.cancel waiting for its cancel entry to be applied. */
struct cancel_ctx {
  struct task *t;
  char run_id[27];
  char reason[400];
};

/* The cancel is durable: answer runs.cancel as `moonloop cancel` answers,
** and stop the run at once when this engine holds it. */
static void on_cancel_applied(void *arg, const struct jentry *je) {
  struct cancel_ctx *cc = arg;
  struct task *t = cc->t;
  struct run *r = t->run;
  const char *st = je->result;
  int poll = 0;
  if (!r->aborted && !r->finished) {
    char buf[160];
    int rc;
    if (!st || !strcmp(st, "notfound")) {
      snprintf(buf, sizeof buf, "no run with id '%s'", cc->run_id);
      rc = run__push_values(t, "zs", buf);
    } else if (!strncmp(st, "ended:", 6)) {
      snprintf(buf, sizeof buf, "run %s is already %s: nothing to cancel", cc->run_id, st + 6);
      rc = run__push_values(t, "zs", buf);
    } else {
      /* Held here: stopped now (below), with the reason the store kept. */
      poll = sched__find(r->sched, cc->run_id) != NULL;
      snprintf(buf, sizeof buf, "{\"run_id\":\"%s\",\"status\":\"%s\"}", cc->run_id,
               poll ? "cancelled" : st);
      rc = run__push_values(t, "s", buf);
    }
    if (!rc) run__complete(t);
  }
  sched_t *s = r->sched;
  run_unref(r);
  free(cc);
  if (poll) sched__poll_now(s);
}

/* See modules.h: OP_CANCEL (run_id, reason): the same durable cancel as
** `moonloop cancel`, with a reason that names the cancelling run. */
void modules_op_cancel(struct task *t, const struct op_cancel *a) {
  struct run *r = t->run;
  lua_State *co = t->co;
  struct cancel_ctx *cc = mem_calloc(1, sizeof *cc);
  const char *why = a->reason;
  cc->t = t;
  snprintf(cc->run_id, sizeof cc->run_id, "%s", a->run_id);
  snprintf(cc->reason, sizeof cc->reason, "cancelled by run %s of skill %s%s%s", r->id,
           r->skill ? r->skill->id : "?", why && *why ? ": " : "", why ? why : "");
  lua_settop(co, 0);
  struct cancel_row c = {.run_id = cc->run_id, .reason = cc->reason, .at = units_now_ms()};
  journal_cancel(sched__journal(r->sched), &c);
  r->refs++;
  sched__after_entry(r->sched, on_cancel_applied, cc);
  run__park(t, 1);
}

void modules_register(struct engine *en) {
  lrt_register(en->lrt, "runs_list", c_runs_list, en);
  lrt_register(en->lrt, "runs_get", c_runs_get, en);
  lrt_register(en->lrt, "runs_stats", c_runs_stats, en);
  lrt_register(en->lrt, "skills_list", c_skills_list, en);
  lrt_register(en->lrt, "skills_get", c_skills_get, en);
  lrt_register(en->lrt, "skills_check", c_skills_check, en);
  lrt_register(en->lrt, "skills_deploy", c_skills_deploy, en);
  lrt_register(en->lrt, "runs_cancel", c_runs_cancel, en);
  lrt_register(en->lrt, "batch_events", c_batch_events, en);
}
