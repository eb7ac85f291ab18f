/*
** config.c: reading moonloop.conf.lua and MOONLOOP_* variables (see config.h).
*/
#include "config.h"
#include "units.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void config_set(char **field, const char *value) {
  free(*field);
  *field = value ? strdup(value) : NULL;
}

static void defaults(struct config *c) {
  memset(c, 0, sizeof *c);
  config_set(&c->db, "moonloop.db");
  config_set(&c->workspace, "skills");
  config_set(&c->listen, "127.0.0.1:8288");
  config_set(&c->token_env, "MOONLOOP_TOKEN");
  config_set(&c->llm_base_url, "http://127.0.0.1:11434/v1");
  config_set(&c->llm_model, "llama3");
  config_set(&c->llm_api_key_env, "LLM_API_KEY");
  c->durability_full = 1;
  c->step_output = 1 << 20;
  c->event_limit = 1 << 20;
  c->slice_ms = 1000;
  c->run_memory = 64 << 20;
  c->parked_runs = 10000;
  c->retries = 3;
  c->backoff_ms = 1000;
  c->backoff_max_ms = 600000;
  c->lease_ttl_ms = 15000;
  c->shutdown_grace_ms = 10000;
}

static void free_list(char **l) {
  for (char **p = l; p && *p; p++) free(*p);
  free(l);
}

void config_free(struct config *c) {
  free(c->file), free(c->db), free(c->workspace), free(c->listen), free(c->server);
  free(c->token_env), free(c->llm_base_url), free(c->llm_model), free(c->llm_api_key_env);
  free(c->otlp_endpoint), free(c->otlp_service);
  free_list(c->env);
  free_list(c->deployers);
  memset(c, 0, sizeof *c);
}

/* Validation of the table at the top of L. Each reader checks one key and
** returns 0 or fills e naming the key. */

static int get_string(lua_State *L, const char *key, const char *path, char **out, err_t *e) {
  lua_getfield(L, -1, key);
  int rc = 0;
  if (lua_type(L, -1) == LUA_TSTRING) config_set(out, lua_tostring(L, -1));
  else if (!lua_isnil(L, -1))
    rc = err_set(e, ERR_INVALID, "%s: '%s' must be a string, got %s", path, key,
                 luaL_typename(L, -1));
  lua_pop(L, 1);
  return rc;
}

/* A duration or size given as a string ("30s", "1MB") or a number. */
static int get_unit(lua_State *L, const char *key, const char *path, int size, double scale,
                    int64_t *out, err_t *e) {
  lua_getfield(L, -1, key);
  int rc = 0;
  if (lua_type(L, -1) == LUA_TNUMBER) {
    *out = (int64_t)(lua_tonumber(L, -1) * scale);
  } else if (lua_type(L, -1) == LUA_TSTRING) {
    err_t sub;
    int64_t v;
    if ((size ? units_size(lua_tostring(L, -1), &v, &sub)
              : units_duration(lua_tostring(L, -1), &v, &sub)))
      rc = err_set(e, ERR_INVALID, "%s: '%s': %s", path, key, sub.msg);
    else *out = v;
  } else if (!lua_isnil(L, -1)) {
    rc = err_set(e, ERR_INVALID, "%s: '%s' must be a %s, got %s", path, key,
                 size ? "size such as \"1MB\"" : "duration such as \"30s\"", luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return rc;
}

static int get_list(lua_State *L, const char *key, const char *path, char ***out, err_t *e) {
  lua_getfield(L, -1, key);
  int rc = 0;
  if (lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1);
    char **l = calloc((size_t)n + 1, sizeof *l);
    for (int i = 1; l && i <= n && !rc; i++) {
      lua_rawgeti(L, -1, i);
      if (lua_type(L, -1) != LUA_TSTRING)
        rc = err_set(e, ERR_INVALID, "%s: '%s' must be a list of strings", path, key);
      else l[i - 1] = strdup(lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    free_list(*out);
    *out = l;
  } else if (!lua_isnil(L, -1)) {
    rc = err_set(e, ERR_INVALID, "%s: '%s' must be a list of strings", path, key);
  }
  lua_pop(L, 1);
  return rc;
}

/* Refuse keys of the table on top that are not in known (NULL-terminated). */
static int only_keys(lua_State *L, const char *path, const char *where,
                     const char *const *known, err_t *e) {
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pop(L, 1);
    int ok = 0;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (const char *const *k = known; *k && !ok; k++) ok = !strcmp(*k, lua_tostring(L, -1));
    if (!ok) {
      err_set(e, ERR_INVALID, "%s: unknown key '%s'%s%s", path,
              lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?", where ? " in " : "",
              where ? where : "");
      lua_pop(L, 1);
      return ERR_INVALID;
    }
  }
  return 0;
}

static int read_table(struct config *c, lua_State *L, const char *path, err_t *e) {
  static const char *const top[] = {"db", "workspace", "listen", "token_env", "durability",
                                    "llm", "env", "deployers", "limits", "retry", "lease",
                                    "shutdown_grace", "retention", "otlp", NULL};
  static const char *const llm[] = {"base_url", "model", "api_key_env", NULL};
  static const char *const limits[] = {"step_output", "event", "run_seconds_between_yields",
                                       "run_memory", "parked_runs", NULL};
  static const char *const retry[] = {"retries", "backoff", "max_backoff", NULL};
  static const char *const otlp[] = {"endpoint", "service_name", NULL};
  char *durability = NULL;
  if (only_keys(L, path, NULL, top, e) || get_string(L, "db", path, &c->db, e) ||
      get_string(L, "workspace", path, &c->workspace, e) ||
      get_string(L, "listen", path, &c->listen, e) ||
      get_string(L, "token_env", path, &c->token_env, e) ||
      get_string(L, "durability", path, &durability, e) ||
      get_list(L, "env", path, &c->env, e) || get_list(L, "deployers", path, &c->deployers, e) ||
      get_unit(L, "lease", path, 0, 1000, &c->lease_ttl_ms, e) ||
      get_unit(L, "shutdown_grace", path, 0, 1000, &c->shutdown_grace_ms, e) ||
      get_unit(L, "retention", path, 0, 1000, &c->retention_ms, e)) {
    free(durability);
    return ERR_INVALID;
  }
  if (durability) {
    int full = !strcmp(durability, "full"), normal = !strcmp(durability, "normal");
    if (!full && !normal) {
      err_set(e, ERR_INVALID, "%s: 'durability' must be \"full\" or \"normal\", got \"%s\"",
              path, durability);
      free(durability);
      return ERR_INVALID;
    }
    c->durability_full = full;
    free(durability);
  }
  lua_getfield(L, -1, "llm");
  if (lua_istable(L, -1) &&
      (only_keys(L, path, "llm", llm, e) || get_string(L, "base_url", path, &c->llm_base_url, e) ||
       get_string(L, "model", path, &c->llm_model, e) ||
       get_string(L, "api_key_env", path, &c->llm_api_key_env, e)))
    return ERR_INVALID;
  lua_pop(L, 1);
  lua_getfield(L, -1, "limits");
  if (lua_istable(L, -1) &&
      (only_keys(L, path, "limits", limits, e) ||
       get_unit(L, "step_output", path, 1, 1, &c->step_output, e) ||
       get_unit(L, "event", path, 1, 1, &c->event_limit, e) ||
       get_unit(L, "run_seconds_between_yields", path, 0, 1000, &c->slice_ms, e) ||
       get_unit(L, "run_memory", path, 1, 1, &c->run_memory, e) ||
       get_unit(L, "parked_runs", path, 1, 1, &c->parked_runs, e)))
    return ERR_INVALID;
  lua_pop(L, 1);
  lua_getfield(L, -1, "otlp");
  if (lua_istable(L, -1) &&
      (only_keys(L, path, "otlp", otlp, e) || get_string(L, "endpoint", path, &c->otlp_endpoint, e) ||
       get_string(L, "service_name", path, &c->otlp_service, e)))
    return ERR_INVALID;
  lua_pop(L, 1);
  lua_getfield(L, -1, "retry");
  if (lua_istable(L, -1)) {
    int64_t retries = c->retries;
    if (only_keys(L, path, "retry", retry, e) ||
        get_unit(L, "retries", path, 1, 1, &retries, e) ||
        get_unit(L, "backoff", path, 0, 1000, &c->backoff_ms, e) ||
        get_unit(L, "max_backoff", path, 0, 1000, &c->backoff_max_ms, e))
      return ERR_INVALID;
    c->retries = (int)retries;
  }
  lua_pop(L, 1);
  return 0;
}

static int load_file(struct config *c, const char *path, err_t *e) {
  lua_State *L = luaL_newstate();
  if (!L) return err_set(e, ERR_NOMEM, "out of memory");
  /* Only pure libraries: a configuration computes values, it does no I/O. */
  lua_pushcfunction(L, luaopen_base), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_string), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_table), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_math), lua_call(L, 0, 0);
  static const char *const unsafe[] = {"dofile", "loadfile", "load", "loadstring", "require",
                                       "module", "getfenv", "setfenv", "collectgarbage", NULL};
  for (const char *const *u = unsafe; *u; u++) lua_pushnil(L), lua_setglobal(L, *u);
  int rc = 0;
  FILE *f = fopen(path, "rb");
  if (!f) {
    lua_close(L);
    return err_set(e, ERR_NOTFOUND, "cannot read configuration '%s': %m", path);
  }
  fclose(f);
  if (luaL_loadfilex(L, path, "t") || lua_pcall(L, 0, 1, 0)) {
    rc = err_set(e, ERR_INVALID, "configuration: %s", lua_tostring(L, -1));
  } else if (!lua_istable(L, -1)) {
    rc = err_set(e, ERR_INVALID, "%s: the file must return a table, got %s", path,
                 luaL_typename(L, -1));
  } else {
    rc = read_table(c, L, path, e);
  }
  lua_close(L);
  if (!rc) config_set(&c->file, path);
  return rc;
}

int config_load(struct config *c, const char *path, err_t *e) {
  defaults(c);
  const char *env_path = getenv("MOONLOOP_CONFIG");
  if (!path && env_path && *env_path) path = env_path;
  if (path) {
    if (load_file(c, path, e)) return e->code;
  } else if (access("moonloop.conf.lua", R_OK) == 0) {
    if (load_file(c, "moonloop.conf.lua", e)) return e->code;
  }
  const char *v;
  if ((v = getenv("MOONLOOP_DB")) && *v) config_set(&c->db, v);
  if ((v = getenv("MOONLOOP_WORKSPACE")) && *v) config_set(&c->workspace, v);
  if ((v = getenv("MOONLOOP_LISTEN")) && *v) config_set(&c->listen, v);
  if ((v = getenv("MOONLOOP_URL")) && *v) config_set(&c->server, v);
  if ((v = getenv("MOONLOOP_OTLP_ENDPOINT")) && *v) config_set(&c->otlp_endpoint, v);
  if ((v = getenv("MOONLOOP_DURABILITY")) && *v) {
    if (strcmp(v, "full") && strcmp(v, "normal"))
      return err_set(e, ERR_INVALID, "MOONLOOP_DURABILITY must be \"full\" or \"normal\", got \"%s\"", v);
    c->durability_full = !strcmp(v, "full");
  }
  return 0;
}
