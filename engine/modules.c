/*
** modules.c: core functions behind the `runs` and `skills` modules (see
** modules.h). Reads go to the store's reader connection on the loop
** thread; answers travel to Lua as JSON text, decoded there.
**
** skills.deploy writes a skill file into the workspace (atomically: a
** temporary file renamed over it), so the sidecar registers it the way it
** registers any file an agent writes: deploying is saving a file. Only the
** skills the configuration lists in `deployers` may call it.
*/
#include "modules.h"
#include "engine.h"
#include "ids.h"
#include "run.h"
#include "units.h"

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
  char *s = cJSON_PrintUnformatted(v);
  cJSON_Delete(v);
  if (!s) return luaL_error(L, "out of memory");
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

/* core.runs_get(id): JSON run record with steps, or nil, message. */
static int c_runs_get(lua_State *L) {
  struct engine *en = up_engine(L);
  cJSON *run;
  err_t e;
  if (store_get_run(en->store, luaL_checkstring(L, 1), 1, &run, &e)) return fail(L, e.msg);
  return push_json(L, run);
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

/* core.skills_check(source [, name]): true, id or nil, message, line. */
static int c_skills_check(lua_State *L) {
  struct engine *en = up_engine(L);
  /* The source's top level may call skills.check again (lrt.h's guard). */
  lrt_cstack_check(L, "skills.check");
  size_t len;
  const char *src = luaL_checklstring(L, 1, &len);
  const char *name = luaL_optstring(L, 2, "skill.lua");
  char *id = NULL;
  struct skill_error se;
  if (skills_check(en->skills, src, len, name, &id, &se)) {
    lua_pushnil(L);
    lua_pushstring(L, se.err.msg);
    if (se.line) lua_pushinteger(L, se.line);
    else lua_pushnil(L);
    return 3;
  }
  lua_pushboolean(L, 1);
  lua_pushstring(L, id ? id : "");
  free(id);
  return 2;
}

static int is_deployer(struct engine *en, const char *skill) {
  for (char **d = en->cfg->deployers; d && *d; d++)
    if (!strcmp(*d, skill)) return 1;
  return 0;
}

/* The file a deploy of id writes: the file that registered it, when it is
** in the workspace, else WORKSPACE/<id with '-' as '_'>.lua. */
static void deploy_path(struct engine *en, const char *id, char *out, size_t n) {
  cJSON *rec;
  err_t e;
  const char *ws = en->cfg->workspace;
  if (!store_get_skill(en->store, id, &rec, &e)) {
    const cJSON *f = cJSON_GetObjectItem(rec, "file");
    size_t wl = strlen(ws);
    if (cJSON_IsString(f) && !strncmp(f->valuestring, ws, wl) && f->valuestring[wl] == '/') {
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

/* core.skills_deploy(id, source): {file, version} or nil, message. */
static int c_skills_deploy(lua_State *L) {
  struct engine *en = up_engine(L);
  const char *id = luaL_checkstring(L, 1);
  size_t len;
  const char *src = luaL_checklstring(L, 2, &len);
  struct task *t = en->sched ? sched__current(en->sched) : NULL;
  const char *caller = t && t->run->skill ? t->run->skill->id : NULL;
  char msg[1200];
  if (!caller || !is_deployer(en, caller)) {
    snprintf(msg, sizeof msg, "skills.deploy: skill '%s' is not allowed to deploy (add it to "
             "`deployers` in the configuration)", caller ? caller : "?");
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
  mkdir(en->cfg->workspace, 0755);
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s/.deploy-%ld.tmp", en->cfg->workspace, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f || fwrite(src, 1, len, f) != len || fflush(f) || fsync(fileno(f)) || fclose(f)) {
    snprintf(msg, sizeof msg, "skills.deploy: cannot write %s: %s", tmp, strerror(errno));
    if (f) fclose(f);
    unlink(tmp);
    return fail(L, msg);
  }
  if (rename(tmp, path)) {
    snprintf(msg, sizeof msg, "skills.deploy: cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    return fail(L, msg);
  }
  char version[65];
  ids_sha256_hex(src, len, version);
  lua_createtable(L, 0, 2);
  lua_pushstring(L, path), lua_setfield(L, -2, "file");
  lua_pushstring(L, version), lua_setfield(L, -2, "version");
  return 1;
}

void modules_register(struct engine *en) {
  lrt_register(en->lrt, "runs_list", c_runs_list, en);
  lrt_register(en->lrt, "runs_get", c_runs_get, en);
  lrt_register(en->lrt, "skills_list", c_skills_list, en);
  lrt_register(en->lrt, "skills_get", c_skills_get, en);
  lrt_register(en->lrt, "skills_check", c_skills_check, en);
  lrt_register(en->lrt, "skills_deploy", c_skills_deploy, en);
}
