/*
** skill.c: loading, validating and caching skill versions (see skill.h).
*/
#include "base/jsontext.h"
#include "lua/skill.h"
#include "base/ids.h"
#include "base/mem.h"
#include "base/units.h"
#include "lua/json.h"

#include <fcntl.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct skills {
  lrt_t *r;
  struct skill *head;
  int env_ref;    /* {NAME = value} of the global env list */
  int grants_ref; /* {[skill id] = {NAME = value}} of skill_env */
  int names_ref;  /* the same with every value false: the grants' names only */
};

/* Push a table of the variables names lists (NAME = value): false for one
** that is not set (granted, so env.NAME reads nil rather than raising), or
** for every one when values is 0 (the names of a grant, not its values). */
static void push_values(lua_State *L, char *const *names, int values) {
  lua_newtable(L);
  for (char *const *n = names; n && *n; n++) {
    const char *v = values ? getenv(*n) : NULL;
    if (v) lua_pushstring(L, v);
    else lua_pushboolean(L, 0);
    lua_setfield(L, -2, *n);
  }
}

skills_t *skills_new(lrt_t *r, const char *const *env_names, const struct skill_env *grants,
                     int ngrants) {
  skills_t *c = mem_calloc(1, sizeof *c);
  c->r = r;
  lua_State *L = lrt_L(r);
  push_values(L, (char *const *)env_names, 1);
  c->env_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  for (int values = 1; values >= 0; values--) {
    lua_newtable(L);
    for (int i = 0; i < ngrants; i++) {
      push_values(L, grants[i].names, values);
      lua_setfield(L, -2, grants[i].skill);
    }
    if (values) c->grants_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    else c->names_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return c;
}

/* Free what a skill holds outside the Lua state, and the skill. */
static void skill_free_c(struct skill *s) {
  free(s->id), free(s->file), free(s->description), free(s->source);
  free(s->triggers), free(s->cancel_on), free(s->limits);
  free(s);
}

static void skill_free(lrt_t *r, lua_State *L, struct skill *s) {
  lrt_account_close(r, s->mem_acct);
  if (L) luaL_unref(L, LUA_REGISTRYINDEX, s->def_ref);
  if (L && s->cfg_ref) luaL_unref(L, LUA_REGISTRYINDEX, s->cfg_ref);
  skill_free_c(s);
}

void skills_free(skills_t *c) {
  if (!c) return;
  lua_State *L = lrt_L(c->r);
  for (struct skill *s = c->head, *next; s; s = next) {
    next = s->next;
    skill_free(c->r, L, s);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, c->env_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, c->grants_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, c->names_ref);
  free(c);
}

struct skill *skills_find(skills_t *c, const char *version) {
  for (struct skill *s = c->head; s; s = s->next)
    if (!strcmp(s->version, version)) return s;
  return NULL;
}

/* See skill.h. */
char *skills_scopes(const struct skill *sk) {
  cJSON *list = sk->limits ? cJSON_Parse(sk->limits) : NULL, *out = NULL;
  const cJSON *l;
  cJSON_ArrayForEach(l, list) {
    const char *scope = cJSON_GetStringValue(cJSON_GetObjectItem(l, "scope"));
    const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(l, "key"));
    if (!scope) continue;
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "scope", scope);
    if (key) cJSON_AddStringToObject(x, "key", key);
    cJSON_AddNumberToObject(x, "limit", cJSON_GetNumberValue(cJSON_GetObjectItem(l, "limit")));
    if (!out) out = cJSON_CreateArray();
    cJSON_AddItemToArray(out, x);
  }
  cJSON_Delete(list);
  char *js = out ? jsontext_print_text(out) : NULL;
  cJSON_Delete(out);
  return js;
}

/* See skill.h. */
char *skills_limit_key(const char *tag, const char *path, const char *value) {
  if (!path) return mem_strdup(tag ? tag : "");
  return mem_printf("%s%s%s=%s", tag ? tag : "", tag ? ":" : "", path, value ? value : "");
}

/* See skill.h. */
char *skills_slot_limits(const struct skill *sk) {
  cJSON *list = sk->limits ? cJSON_Parse(sk->limits) : NULL, *out = NULL;
  const cJSON *l;
  cJSON_ArrayForEach(l, list) {
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(l, "kind"));
    if (kind && strcmp(kind, "concurrency")) continue;
    const char *scope = cJSON_GetStringValue(cJSON_GetObjectItem(l, "scope"));
    char *key = skills_limit_key(cJSON_GetStringValue(cJSON_GetObjectItem(l, "tag")),
                                 cJSON_GetStringValue(cJSON_GetObjectItem(l, "key")), NULL);
    char *q = scope ? mem_printf("@%s", scope) : mem_strdup(sk->id);
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "q", q);
    cJSON_AddStringToObject(x, "key", key);
    cJSON_AddNumberToObject(x, "limit", cJSON_GetNumberValue(cJSON_GetObjectItem(l, "limit")));
    free(q), free(key);
    if (!out) out = cJSON_CreateArray();
    cJSON_AddItemToArray(out, x);
  }
  cJSON_Delete(list);
  char *js = out ? jsontext_print_text(out) : NULL;
  cJSON_Delete(out);
  return js;
}

void skills_default_id(const char *file, char *out, size_t n) {
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  size_t len = strlen(base);
  if (len > 4 && !strcmp(base + len - 4, ".lua")) len -= 4;
  if (len >= n) len = n - 1;
  for (size_t i = 0; i < len; i++) {
    char ch = base[i];
    out[i] = ch == '_' ? '-' : (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
  }
  out[len] = 0;
}

int skills_read_file(const char *path, char **out, size_t *len, err_t *e) {
  /* Opened without waiting: a FIFO named x.lua with no writer would block
  ** the open for good; reading it then ends at once (empty). A pipe that
  ** has a writer (moonloop check <(...)) is read to its end as before. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  int flags = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
  if (!f) {
    err_set(e, ERR_NOTFOUND, "cannot read '%s': %m", path);
    if (fd >= 0) close(fd);
    return e ? e->code : ERR_NOTFOUND;
  }
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      if (cap > (size_t)16 << 20) {
        fclose(f);
        free(buf);
        return err_set(e, ERR_TOOBIG, "'%s' is larger than 16 MB: not a skill file", path);
      }
      buf = mem_realloc(buf, cap);
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return err_set(e, ERR_IO, "error reading '%s'", path);
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
  return 0;
}

static char *opt_string(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  char *v = lua_isstring(L, -1) ? mem_strdup(lua_tostring(L, -1)) : NULL;
  lua_pop(L, 1);
  return v;
}

static int64_t opt_int(lua_State *L, int idx, const char *key, int64_t dflt) {
  lua_getfield(L, idx, key);
  int64_t v = lua_isnumber(L, -1) ? units_ms_of(lua_tonumber(L, -1)) : dflt;
  lua_pop(L, 1);
  return v;
}

/* JSON text of spec[key], or NULL when absent. */
static char *opt_json(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  char *v = NULL;
  if (!lua_isnil(L, -1)) {
    size_t len;
    err_t e;
    v = json_encode(L, lua_gettop(L), 0, &len, &e);
  }
  lua_pop(L, 1);
  return v;
}

/* Compile, run and validate source; on success the definition table and
** the spec are left on the stack (2 values). granted: give the skill its
** skill_env grant (a load that becomes a live version); a check never
** does, so that checking a source that claims an id (skills.check from
** another skill) cannot read that id's secrets: it gets the grant's names,
** granted and unset. recorded: the source is a version registered before
** (lua/loader.lua skips the static checks). env_known: the configuration
** is the one the skill will run with (not so for skills.check from a
** skill), so a literal env.NAME it does not grant is a static error. */
static int load_def(skills_t *c, const char *src, size_t len, const char *file, int granted,
                    int recorded, int env_known, struct skill_error *se) {
  lrt_t *r = c->r;
  lua_State *L = lrt_L(r);
  err_t *e = &se->err;
  se->line = 0;
  int top = lua_gettop(L);
  if (lrt_require(r, "loader", e)) return e->code;
  lua_getfield(L, -1, "try_load");
  lua_remove(L, -2);
  if (lrt_load_skill_text(r, src, len, file, e)) {
    lua_settop(L, top);
    /* "file:12: message": take the line. */
    const char *p = strstr(e->msg, file);
    if (p && p[strlen(file)] == ':') se->line = atoi(p + strlen(file) + 1);
    return e->code;
  }
  char id[160];
  skills_default_id(file, id, sizeof id);
  lua_pushstring(L, file);
  lua_pushlstring(L, src, len);
  lua_pushstring(L, id);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->env_ref);
  lua_pushnil(L); /* extra modules: none */
  lua_rawgeti(L, LUA_REGISTRYINDEX, granted ? c->grants_ref : c->names_ref);
  lua_pushboolean(L, recorded);
  lua_pushstring(L, env_known ? "engine" : "check");
  if (lrt_pcall(r, 9, 3, e)) {
    lua_settop(L, top);
    return err_prefix(e, "%s", file);
  }
  if (!lua_toboolean(L, -3)) {
    err_set(e, ERR_INVALID, "%s", lua_tostring(L, -2));
    se->line = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
    lua_settop(L, top);
    return ERR_INVALID;
  }
  lua_remove(L, -3);
  return 0;
}

int skills_check(skills_t *c, const char *source, size_t len, const char *file, char **id,
                 struct skill_error *se) {
  return skills_check_warnings(c, source, len, file, 1, id, NULL, se);
}

struct check {
  skills_t *c;
  const char *source, *file;
  size_t len;
  int env_known;
  char *id, *warnings;
  struct skill_error *se;
};

/* skills_check_warnings's calls into Lua, under lrt_protect. */
static int check_protected(void *arg, err_t *e) {
  struct check *k = arg;
  lua_State *L = lrt_L(k->c->r);
  int top = lua_gettop(L);
  (void)e;
  int rc = load_def(k->c, k->source, k->len, k->file, 0, 0, k->env_known, k->se);
  if (rc) return rc;
  k->id = opt_string(L, -1, "id");
  k->warnings = opt_json(L, lua_gettop(L), "warnings");
  lua_settop(L, top);
  return 0;
}

/* Protected (lrt_protect): a Lua state too full to check the source is
** the check's error, naming the limit. */
int skills_check_warnings(skills_t *c, const char *source, size_t len, const char *file,
                          int env_known, char **id, char **warnings, struct skill_error *se) {
  struct check k = {c, source, file, len, env_known, NULL, NULL, se};
  if (warnings) *warnings = NULL;
  se->line = 0;
  int rc = lrt_protect(c->r, check_protected, &k, &se->err);
  if (rc || !id) free(k.id);
  if (rc || !warnings) free(k.warnings);
  if (rc) return rc;
  if (id) *id = k.id;
  if (warnings) *warnings = k.warnings;
  return 0;
}

struct load {
  skills_t *c;
  const char *source;
  size_t len;
  const char *file;
  int recorded;
  struct skill *s;
  struct skill_error *se;
};

static int load_protected(void *arg, err_t *e);

/* skills_load and skills_load_recorded: recorded skips the static checks.
** Protected (lrt_protect): a Lua state too full to load the skill is the
** load's error, naming the limit; the previous version stays live. */
static int load_version(skills_t *c, const char *source, size_t len, const char *file,
                        int recorded, struct skill **out, struct skill_error *se) {
  char version[65];
  ids_sha256_hex(source, len, version);
  struct skill *s = skills_find(c, version);
  if (s) {
    *out = s;
    return 0;
  }
  /* What the top level makes is charged to an account of the version's
  ** own (not the engine's), so that a run growing it is charged for the
  ** growth (lrt.c's memory budget). */
  s = mem_calloc(1, sizeof *s);
  s->mem_group = lrt_group_new(c->r);
  s->mem_acct = lrt_account_open(c->r, s->mem_group);
  memcpy(s->version, version, sizeof version);
  struct load ld = {c, source, len, file, recorded, s, se};
  se->line = 0;
  int prev = lrt_account_use(c->r, s->mem_acct);
  int rc = lrt_protect(c->r, load_protected, &ld, &se->err);
  lrt_account_use(c->r, prev);
  if (rc) {
    /* def_ref is taken last: a failure before it leaves nothing to unref. */
    lrt_account_close(c->r, s->mem_acct);
    skill_free_c(s);
    return rc;
  }
  s->next = c->head;
  c->head = s;
  *out = s;
  return 0;
}

/* load_version's calls into Lua, under lrt_protect: load the definition
** and read its fields into the skill. */
static int load_protected(void *arg, err_t *e) {
  struct load *ld = arg;
  skills_t *c = ld->c;
  struct skill *s = ld->s;
  const char *source = ld->source, *file = ld->file;
  size_t len = ld->len;
  lua_State *L = lrt_L(c->r);
  int top = lua_gettop(L);
  (void)e;
  int rc = load_def(c, source, len, file, 1, ld->recorded, 1, ld->se);
  if (rc) return rc;
  int spec = lua_gettop(L);
  s->id = opt_string(L, spec, "id");
  s->description = opt_string(L, spec, "description");
  s->file = mem_strdup(file);
  s->source = mem_alloc(len + 1);
  if (s->source) {
    memcpy(s->source, source, len);
    s->source[len] = 0;
  }
  s->retries = (int)opt_int(L, spec, "retries", -1);
  s->backoff_ms = opt_int(L, spec, "backoff_ms", 0);
  s->timeout_ms = opt_int(L, spec, "timeout_ms", 0);
  s->triggers = opt_json(L, spec, "triggers");
  s->cancel_on = opt_json(L, spec, "cancel_on");
  lua_getfield(L, spec, "has_on_failure");
  s->has_on_failure = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, spec, "has_priority");
  s->has_priority = lua_toboolean(L, -1);
  lua_pop(L, 1);
  /* Flow control: what a run asks before it starts (lua/skill.lua's flow). */
  s->limits = opt_json(L, spec, "flow");
  lua_getfield(L, spec, "flow");
  s->nlimits = lua_istable(L, -1) ? (int)lua_objlen(L, -1) : 0;
  lua_pop(L, 2); /* concurrency, spec */
  s->def_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_settop(L, top);
  return 0;
}

int skills_load(skills_t *c, const char *source, size_t len, const char *file,
                struct skill **out, struct skill_error *se) {
  return load_version(c, source, len, file, 0, out, se);
}

int skills_load_recorded(skills_t *c, const char *source, size_t len, const char *file,
                         struct skill **out, struct skill_error *se) {
  return load_version(c, source, len, file, 1, out, se);
}
