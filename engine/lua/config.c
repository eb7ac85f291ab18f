/*
** config.c: reading moonloop.conf.lua and MOONLOOP_* variables (see config.h).
*/
#include "lua/config.h"
#include "base/mem.h"
#include "base/units.h"
#include "lua/embed.h"
#include "lua/skill.h"

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void config_set(char **field, const char *value) {
  free(*field);
  *field = value ? mem_strdup(value) : NULL;
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
  c->run_logs = 16 << 20;
  c->invoke_depth = 64;
  c->run_tree = 10000;
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

static void free_skill_env(struct config *c) {
  for (int i = 0; i < c->nskill_env; i++) {
    free(c->skill_env[i].skill);
    free_list(c->skill_env[i].names);
  }
  free(c->skill_env);
  c->skill_env = NULL;
  c->nskill_env = 0;
}

void config_free(struct config *c) {
  free_skill_env(c);
  free(c->file), free(c->db), free(c->workspace), free(c->listen), free(c->server);
  free(c->token_env), free(c->llm_base_url), free(c->llm_model), free(c->llm_api_key_env);
  free(c->otlp_endpoint), free(c->otlp_service);
  free_list(c->env);
  free_list(c->deployers);
  free_list(c->allowed_hosts);
  free_list(c->cancellers);
  memset(c, 0, sizeof *c);
}

/* ---- naming a problem ---------------------------------------------------- */

/* The file being read, for errors: its name, its text (to find the line
** of a key), and the table whose keys are being read ("limits"; NULL at
** the top). */
struct cfgsrc {
  const char *path;
  const char *text;
  const char *table;
};

/* A fresh state holding lua/api.lua's module, whose helpers (line_of,
** suggest) skill validation uses to find a key's line and suggest a
** misspelt key; NULL when it cannot be made. Made only to explain an
** error, apart from the state the configuration ran in. */
static lua_State *helpers_open(void) {
  const struct embed_file *f = embed_files;
  while (f->name && strcmp(f->name, "api")) f++;
  lua_State *L = f->name ? luaL_newstate() : NULL;
  if (!L) return NULL;
  lua_pushcfunction(L, luaopen_base), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_string), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_table), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_math), lua_call(L, 0, 0);
  if (luaL_loadbuffer(L, f->text, f->len, "=moonloop/api.lua") || lua_pcall(L, 0, 1, 0) ||
      !lua_istable(L, -1)) {
    lua_close(L);
    return NULL;
  }
  return L;
}

/* The line where `key =` is written in text (api.lua's line_of), or 0. */
static int key_line(const char *text, const char *key) {
  if (!text || !key) return 0;
  lua_State *H = helpers_open();
  if (!H) return 0;
  int line = 0;
  lua_getfield(H, -1, "line_of");
  lua_pushstring(H, text);
  lua_pushstring(H, key);
  if (!lua_pcall(H, 2, 1, 0) && lua_type(H, -1) == LUA_TNUMBER) line = (int)lua_tointeger(H, -1);
  lua_close(H);
  return line;
}

/* " (did you mean 'K'?)" for the known key K nearest to key (api.lua's
** suggest, so both say it alike), or "" when none is near. */
static void key_suggestion(const char *key, const char *const *known, char *out, size_t n) {
  out[0] = 0;
  lua_State *H = helpers_open();
  if (!H) return;
  lua_getfield(H, -1, "suggest");
  lua_pushstring(H, key);
  lua_newtable(H);
  for (const char *const *k = known; *k; k++) lua_pushboolean(H, 1), lua_setfield(H, -2, *k);
  if (!lua_pcall(H, 2, 1, 0) && lua_type(H, -1) == LUA_TSTRING)
    snprintf(out, n, "%s", lua_tostring(H, -1));
  lua_close(H);
}

/* Fill e with "FILE:LINE: message", LINE being where key is set when the
** text shows it (else "FILE: message"); returns ERR_INVALID. */
__attribute__((format(printf, 4, 5))) static int cfg_fail(const struct cfgsrc *s, const char *key,
                                                          err_t *e, const char *fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line = key_line(s->text, key);
  if (line > 0) return err_set(e, ERR_INVALID, "%s:%d: %s", s->path, line, msg);
  return err_set(e, ERR_INVALID, "%s: %s", s->path, msg);
}

/* The key as users write it in errors: "limits.step_output", "db". */
static const char *qual(const struct cfgsrc *s, const char *key, char *buf, size_t n) {
  if (!s->table) return key;
  snprintf(buf, n, "%s.%s", s->table, key);
  return buf;
}

/* ---- readers: each checks one key of the table on top of L ---------------- */

/* A string at key (replacing *out); nothing when it is nil. */
static int get_string(lua_State *L, const struct cfgsrc *s, const char *key, char **out, err_t *e) {
  char q[64];
  lua_getfield(L, -1, key);
  int rc = 0;
  if (lua_type(L, -1) == LUA_TSTRING) config_set(out, lua_tostring(L, -1));
  else if (!lua_isnil(L, -1))
    rc = cfg_fail(s, key, e, "'%s' must be a string, got %s", qual(s, key, q, sizeof q),
                  luaL_typename(L, -1));
  lua_pop(L, 1);
  return rc;
}

enum numkind {
  NUM_SIZE,     /* bytes: a number, or a string such as "1MB" */
  NUM_DURATION, /* milliseconds: a number of seconds, or a string such as "30s" */
  NUM_COUNT,    /* a whole number, never a string */
};

/* What a numeric key accepts: its kind, and its range in the kind's unit
** (bytes, milliseconds, a count), with the words that say it. zero_ok:
** 0 is allowed too, outside the range (it means "off"). */
struct numrange {
  enum numkind kind;
  int64_t min, max;
  int zero_ok;
  const char *words;
};

#define KB 1024LL
#define MB (1024LL * KB)
#define GB (1024LL * MB)
#define SEC 1000LL
#define DAY (86400LL * SEC)

static const struct numrange
  R_STEP_OUTPUT = {NUM_SIZE, 16, 256 * MB, 0, "a size from 16 B to 256 MB"},
  R_EVENT = {NUM_SIZE, 16, 256 * MB, 0, "a size from 16 B to 256 MB"},
  R_SLICE = {NUM_DURATION, 10, 3600 * SEC, 0, "a duration from 10ms to 1h"},
  R_MEMORY = {NUM_SIZE, 1 * MB, 16 * GB, 0, "a size from 1 MB to 16 GB"},
  R_TOTAL_MEMORY = {NUM_SIZE, 16 * MB, 1024 * GB, 0, "a size from 16 MB to 1024 GB"},
  R_PARKED = {NUM_COUNT, 1, 10000000, 0, "a whole number from 1 to 10000000"},
  R_RUN_LOGS = {NUM_SIZE, 64 * KB, 16 * GB, 0, "a size from 64 KB to 16 GB"},
  R_DEPTH = {NUM_COUNT, 1, 10000, 0, "a whole number from 1 to 10000"},
  R_TREE = {NUM_COUNT, 1, 10000000, 0, "a whole number from 1 to 10000000"},
  R_RETRIES = {NUM_COUNT, 0, 100, 0, "a whole number from 0 to 100"},
  R_BACKOFF = {NUM_DURATION, 1, DAY, 0, "a duration from 1ms to 1d"},
  R_MAX_BACKOFF = {NUM_DURATION, 1, 7 * DAY, 0, "a duration from 1ms to 7d"},
  R_LEASE = {NUM_DURATION, SEC, DAY, 0, "a duration from 1s to 1d"},
  R_GRACE = {NUM_DURATION, 0, 3600 * SEC, 0, "a duration from 0s to 1h"},
  R_RETENTION = {NUM_DURATION, 60 * SEC, 36500 * DAY, 1,
                 "0 (keep runs forever) or a duration from 1m to 36500d"};

/* A number at key, checked against r; nothing when it is nil. */
static int get_num(lua_State *L, const struct cfgsrc *s, const char *key,
                   const struct numrange *r, int64_t *out, err_t *e) {
  char q[64], got[96];
  const char *name = qual(s, key, q, sizeof q);
  lua_getfield(L, -1, key);
  int t = lua_type(L, -1), rc = 0, ok = 0;
  double v = 0;
  if (t == LUA_TNUMBER) {
    double n = lua_tonumber(L, -1);
    if (n != n) snprintf(got, sizeof got, "nan");
    else snprintf(got, sizeof got, "%.14g", n);
    v = r->kind == NUM_DURATION ? n * 1000 : n;
    ok = isfinite(v) && (r->kind == NUM_DURATION || v == floor(v));
  } else if (t == LUA_TSTRING && r->kind != NUM_COUNT) {
    const char *str = lua_tostring(L, -1);
    snprintf(got, sizeof got, "\"%.60s\"", str);
    int64_t x;
    err_t sub;
    if (r->kind == NUM_SIZE ? units_size(str, &x, &sub) : units_duration(str, &x, &sub))
      rc = cfg_fail(s, key, e, "'%s' must be %s: %s", name, r->words, sub.msg);
    v = (double)x;
    ok = 1;
  } else if (t == LUA_TSTRING) {
    snprintf(got, sizeof got, "the string \"%.60s\"", lua_tostring(L, -1));
  } else if (t != LUA_TNIL) {
    snprintf(got, sizeof got, "%s", luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  if (t == LUA_TNIL || rc) return rc;
  if (ok && ((r->zero_ok && v == 0) || (v >= (double)r->min && v <= (double)r->max))) {
    *out = (int64_t)llround(v);
    return 0;
  }
  return cfg_fail(s, key, e, "'%s' must be %s, got %s", name, r->words, got);
}

/* A list of strings at key (replacing *out); nothing when it is nil. */
static int get_list(lua_State *L, const struct cfgsrc *s, const char *key, char ***out, err_t *e) {
  lua_getfield(L, -1, key);
  int rc = 0;
  if (lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1);
    char **l = mem_calloc((size_t)n + 1, sizeof *l);
    for (int i = 1; l && i <= n && !rc; i++) {
      lua_rawgeti(L, -1, i);
      if (lua_type(L, -1) != LUA_TSTRING)
        rc = cfg_fail(s, key, e, "'%s' must be a list of strings", key);
      else l[i - 1] = mem_strdup(lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    free_list(*out);
    *out = l;
  } else if (!lua_isnil(L, -1)) {
    rc = cfg_fail(s, key, e, "'%s' must be a list of strings", key);
  }
  lua_pop(L, 1);
  return rc;
}

/* allowed_hosts: a list of host names (or IP addresses, an IPv6 one in
** brackets) that a request's Host header may name, for an engine reached
** through a name of its own (a proxy, a LAN name). Only names: the port is
** never compared, and a scheme or a path means the entry was misread. */
static int get_hosts(lua_State *L, const struct cfgsrc *s, char ***out, err_t *e) {
  if (get_list(L, s, "allowed_hosts", out, e)) return ERR_INVALID;
  for (char **h = *out; h && *h; h++) {
    const char *v = *h;
    size_t n = strlen(v);
    int ok = n > 0 && n < 254;
    if (ok && v[0] == '[') {
      ok = n > 2 && v[n - 1] == ']';
      for (size_t i = 1; ok && i + 1 < n; i++) ok = isxdigit((unsigned char)v[i]) || v[i] == ':' || v[i] == '.';
    } else {
      for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)v[i]) || v[i] == '-' || v[i] == '.' || v[i] == '_';
    }
    if (!ok)
      return cfg_fail(s, "allowed_hosts", e, "'allowed_hosts' entries are host names such as "
                      "\"loop.example.com\" or addresses such as \"192.168.1.5\" or "
                      "\"[fd00::5]\", without a scheme, port or path; got \"%.80s\"", v);
  }
  return 0;
}

/* skill_env: a table of skill id -> list of variable names (replacing
** c->skill_env); nothing when it is nil. */
static int get_skill_env(lua_State *L, const struct cfgsrc *s, struct config *c, err_t *e) {
  lua_getfield(L, -1, "skill_env");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return 0;
  }
  if (!lua_istable(L, -1)) {
    const char *type = luaL_typename(L, -1);
    lua_pop(L, 1);
    return cfg_fail(s, "skill_env", e, "'skill_env' must be a table of skill ids and lists of "
                    "variable names, got %s", type);
  }
  free_skill_env(c);
  int rc = 0;
  lua_pushnil(L);
  while (!rc && lua_next(L, -2)) {
    /* key at -2, value at -1 */
    if (lua_type(L, -2) != LUA_TSTRING || !lua_tostring(L, -2)[0]) {
      rc = cfg_fail(s, "skill_env", e, "'skill_env' keys must be skill ids, such as "
                    "[\"update-skill\"] = { \"GITHUB_TOKEN\" }");
      lua_pop(L, 2);
      break;
    }
    const char *id = lua_tostring(L, -2);
    c->skill_env = mem_realloc(c->skill_env, (size_t)(c->nskill_env + 1) * sizeof *c->skill_env);
    struct skill_env *g = &c->skill_env[c->nskill_env++];
    g->skill = mem_strdup(id);
    g->names = NULL;
    int n = lua_istable(L, -1) ? (int)lua_objlen(L, -1) : -1;
    char **l = n >= 0 ? mem_calloc((size_t)n + 1, sizeof *l) : NULL;
    for (int i = 1; l && i <= n && !rc; i++) {
      lua_rawgeti(L, -1, i);
      if (lua_type(L, -1) != LUA_TSTRING) rc = ERR_INVALID;
      else l[i - 1] = mem_strdup(lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    g->names = l;
    if (!l || rc)
      rc = cfg_fail(s, id, e, "'skill_env[\"%s\"]' must be a list of variable names", id);
    lua_pop(L, 1);
    if (rc) lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return rc;
}

/* See config.h: a word of the name (split at '_', '-' and '.') is one of
** the short words that say "secret" (KEY, PASS, PWD, AUTH...), or the name
** holds one of the long ones anywhere (GITHUBTOKEN, DB_PASSWORD_FILE). */
int config_secret_name(const char *name) {
  static const char *const words[] = {"KEY", "PASS", "PWD", "AUTH", "PRIVATE", "PAT", NULL};
  static const char *const parts[] = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL",
                                      "APIKEY", "API_KEY", NULL};
  char up[256];
  size_t n = 0;
  for (const char *p = name; *p && n < sizeof up - 1; p++)
    up[n++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
  up[n] = 0;
  for (const char *const *k = parts; *k; k++)
    if (strstr(up, *k)) return 1;
  for (char *w = up, *end; *w; w = *end ? end + 1 : end) {
    end = w + strcspn(w, "_-.");
    char save = *end;
    *end = 0;
    for (const char *const *k = words; *k; k++)
      if (!strcmp(w, *k)) return 1;
    *end = save;
  }
  return 0;
}

/* See config.h. */
int config_env_warning(const struct config *c, char *out, size_t n) {
  int count = 0;
  size_t k = 0;
  out[0] = 0;
  for (char **v = c->env; v && *v; v++) {
    if (!config_secret_name(*v)) continue;
    if (k < n) k += (size_t)snprintf(out + k, n - k, "%s%s", count ? ", " : "", *v);
    count++;
  }
  if (!count) return 0;
  char names[600];
  snprintf(names, sizeof names, "%s", out);
  snprintf(out, n, "warning: %s: the global `env` list hands %s to every skill; grant %s only "
           "to the skills that need %s, with skill_env = { [\"SKILL-ID\"] = { \"NAME\" } }",
           c->file ? c->file : "the configuration", names, count == 1 ? "it" : "them",
           count == 1 ? "it" : "them");
  return count;
}

/* Refuse keys of the table on top that are not in known (NULL-terminated),
** naming the line and the nearest known key. */
static int only_keys(lua_State *L, const struct cfgsrc *s, const char *const *known, err_t *e) {
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pop(L, 1);
    int ok = 0;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (const char *const *k = known; *k && !ok; k++) ok = !strcmp(*k, lua_tostring(L, -1));
    if (!ok) {
      if (lua_type(L, -1) != LUA_TSTRING) {
        if (s->table)
          cfg_fail(s, NULL, e, "'%s' has a key that is not a name (a %s)", s->table,
                   luaL_typename(L, -1));
        else
          cfg_fail(s, NULL, e, "the table has a key that is not a name (a %s)", luaL_typename(L, -1));
      } else {
        char hint[128];
        key_suggestion(lua_tostring(L, -1), known, hint, sizeof hint);
        cfg_fail(s, lua_tostring(L, -1), e, "unknown key '%s'%s%s%s", lua_tostring(L, -1),
                 s->table ? " in " : "", s->table ? s->table : "", hint);
      }
      lua_pop(L, 1);
      return ERR_INVALID;
    }
  }
  return 0;
}

/* Push the sub-table at key (nil is fine: nothing to read); anything else
** is refused. Returns 1 when a table was pushed, 0 when nothing was, or
** ERR_INVALID. */
static int open_table(lua_State *L, struct cfgsrc *s, const char *key, err_t *e) {
  lua_getfield(L, -1, key);
  if (lua_istable(L, -1)) {
    s->table = key;
    return 1;
  }
  int nil = lua_isnil(L, -1);
  const char *type = luaL_typename(L, -1);
  lua_pop(L, 1);
  return nil ? 0 : cfg_fail(s, key, e, "'%s' must be a table, got %s", key, type);
}

/* Pop the sub-table open_table pushed. */
static void close_table(lua_State *L, struct cfgsrc *s) {
  lua_pop(L, 1);
  s->table = NULL;
}

/* Read the configuration table on top of L into c, refusing what is
** unknown, of the wrong type or out of range. */
static int read_table(struct config *c, lua_State *L, struct cfgsrc *s, err_t *e) {
  static const char *const top[] = {"db", "workspace", "listen", "token_env", "durability",
                                    "llm", "env", "skill_env", "deployers", "cancellers", "limits",
                                    "retry", "lease", "shutdown_grace", "retention", "otlp",
                                    "allowed_hosts", NULL};
  static const char *const llm[] = {"base_url", "model", "api_key_env", NULL};
  static const char *const limits[] = {"step_output", "event", "run_seconds_between_yields",
                                       "run_memory", "total_memory", "parked_runs", "run_logs",
                                       "invoke_depth", "run_tree", NULL};
  static const char *const retry[] = {"retries", "backoff", "max_backoff", NULL};
  static const char *const otlp[] = {"endpoint", "service_name", NULL};
  char *durability = NULL;
  if (only_keys(L, s, top, e) || get_string(L, s, "db", &c->db, e) ||
      get_string(L, s, "workspace", &c->workspace, e) ||
      get_string(L, s, "listen", &c->listen, e) ||
      get_string(L, s, "token_env", &c->token_env, e) ||
      get_string(L, s, "durability", &durability, e) ||
      get_list(L, s, "env", &c->env, e) || get_skill_env(L, s, c, e) ||
      get_list(L, s, "deployers", &c->deployers, e) ||
      get_hosts(L, s, &c->allowed_hosts, e) ||
      get_list(L, s, "cancellers", &c->cancellers, e) ||
      get_num(L, s, "lease", &R_LEASE, &c->lease_ttl_ms, e) ||
      get_num(L, s, "shutdown_grace", &R_GRACE, &c->shutdown_grace_ms, e) ||
      get_num(L, s, "retention", &R_RETENTION, &c->retention_ms, e)) {
    free(durability);
    return ERR_INVALID;
  }
  if (durability) {
    int full = !strcmp(durability, "full"), normal = !strcmp(durability, "normal");
    if (!full && !normal) {
      cfg_fail(s, "durability", e, "'durability' must be \"full\" or \"normal\", got \"%s\"",
               durability);
      free(durability);
      return ERR_INVALID;
    }
    c->durability_full = full;
    free(durability);
  }
  int rc;
  if ((rc = open_table(L, s, "llm", e)) < 0) return rc;
  if (rc) {
    rc = only_keys(L, s, llm, e) || get_string(L, s, "base_url", &c->llm_base_url, e) ||
         get_string(L, s, "model", &c->llm_model, e) ||
         get_string(L, s, "api_key_env", &c->llm_api_key_env, e);
    close_table(L, s);
    if (rc) return ERR_INVALID;
  }
  if ((rc = open_table(L, s, "limits", e)) < 0) return rc;
  if (rc) {
    rc = only_keys(L, s, limits, e) ||
         get_num(L, s, "step_output", &R_STEP_OUTPUT, &c->step_output, e) ||
         get_num(L, s, "event", &R_EVENT, &c->event_limit, e) ||
         get_num(L, s, "run_seconds_between_yields", &R_SLICE, &c->slice_ms, e) ||
         get_num(L, s, "run_memory", &R_MEMORY, &c->run_memory, e) ||
         get_num(L, s, "total_memory", &R_TOTAL_MEMORY, &c->total_memory, e) ||
         get_num(L, s, "parked_runs", &R_PARKED, &c->parked_runs, e) ||
         get_num(L, s, "run_logs", &R_RUN_LOGS, &c->run_logs, e) ||
         get_num(L, s, "invoke_depth", &R_DEPTH, &c->invoke_depth, e) ||
         get_num(L, s, "run_tree", &R_TREE, &c->run_tree, e);
    close_table(L, s);
    if (rc) return ERR_INVALID;
    if (c->total_memory && c->total_memory < c->run_memory)
      return cfg_fail(s, "total_memory", e, "'limits.total_memory' must be at least "
                      "'limits.run_memory' (one run's budget)");
  }
  if ((rc = open_table(L, s, "otlp", e)) < 0) return rc;
  if (rc) {
    rc = only_keys(L, s, otlp, e) || get_string(L, s, "endpoint", &c->otlp_endpoint, e) ||
         get_string(L, s, "service_name", &c->otlp_service, e);
    close_table(L, s);
    if (rc) return ERR_INVALID;
  }
  if ((rc = open_table(L, s, "retry", e)) < 0) return rc;
  if (rc) {
    int64_t retries = c->retries;
    rc = only_keys(L, s, retry, e) || get_num(L, s, "retries", &R_RETRIES, &retries, e) ||
         get_num(L, s, "backoff", &R_BACKOFF, &c->backoff_ms, e) ||
         get_num(L, s, "max_backoff", &R_MAX_BACKOFF, &c->backoff_max_ms, e);
    close_table(L, s);
    if (rc) return ERR_INVALID;
    c->retries = (int)retries;
  }
  return 0;
}

/* How long a configuration file may compute (ms): it only builds a table. */
#define CONFIG_TIME_MS 2000

/* The count hook of a configuration's state: stops a file that computes
** past CONFIG_TIME_MS (a loop without end would hold every command). */
static void config_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_getfield(L, LUA_REGISTRYINDEX, "moonloop.config_until");
  int64_t until = (int64_t)lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (units_now_ms() > until)
    luaL_error(L, "the file ran for more than %d s: a configuration returns a table, and a loop "
               "in it must end", CONFIG_TIME_MS / 1000);
}

/* Run the configuration file at path in a sandbox and read its table into c. */
static int load_file(struct config *c, const char *path, err_t *e) {
  size_t len = 0;
  char *text = NULL;
  err_t sub;
  if (skills_read_file(path, &text, &len, &sub))
    return err_set(e, sub.code, "configuration: %s", sub.msg);
  lua_State *L = luaL_newstate();
  if (!L) mem_oom(0); /* LuaJIT's own allocator could not map its first arena */
  /* Only pure libraries: a configuration computes values, it does no I/O. */
  lua_pushcfunction(L, luaopen_base), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_string), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_table), lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_math), lua_call(L, 0, 0);
  static const char *const unsafe[] = {"dofile", "loadfile", "load", "loadstring", "require",
                                       "module", "getfenv", "setfenv", "collectgarbage", NULL};
  for (const char *const *u = unsafe; *u; u++) lua_pushnil(L), lua_setglobal(L, *u);
  /* Interpreted (compiled traces skip count hooks), with a deadline. */
  luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  lua_pushnumber(L, (lua_Number)(units_now_ms() + CONFIG_TIME_MS));
  lua_setfield(L, LUA_REGISTRYINDEX, "moonloop.config_until");
  lua_sethook(L, config_hook, LUA_MASKCOUNT, 100000);
  int rc = 0;
  char chunk[1100];
  snprintf(chunk, sizeof chunk, "@%s", path);
  struct cfgsrc s = {path, text, NULL};
  if (luaL_loadbufferx(L, text, len, chunk, "t") || lua_pcall(L, 0, 1, 0)) {
    rc = err_set(e, ERR_INVALID, "configuration: %s", lua_tostring(L, -1));
  } else if (!lua_istable(L, -1)) {
    rc = err_set(e, ERR_INVALID, "%s: the file must return a table, got %s", path,
                 luaL_typename(L, -1));
  } else {
    rc = read_table(c, L, &s, e);
  }
  lua_close(L);
  free(text);
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
