/*
** json.c: Lua values <-> JSON through cJSON (the rules are in json.h).
**
** Invariants: json.null is lua_pushlightuserdata(L, NULL). Every array made
** here carries the one array metatable of its lua_State, kept in the registry
** under the address of array_mt_key; json.object marks a table by making it
** a key of a weak-keyed set (object_set_key). Encoding walks the Lua value with raw
** access only (no metamethods), keeping the path of the current value in a
** stack of frames so that an error can name where it happened; building the
** path text is left to the error case. Failures leave the Lua stack as found.
*/
#include "lua/json.h"

#include <float.h>
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/jsontext.h"
#include "base/mem.h"
#include "base/units.h"
#include "lua/lrt.h"

#define KEY_SHOW_BYTES 48  /* longest key shown whole in a path */
#define PATH_SHOW_BYTES 400

static const char array_mt_key = 'a';

/* Push the array metatable of L, creating it on first use. */
static void push_array_mt(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&array_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_istable(L, -1)) return;
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  /* A marker field, so that a person printing the metatable sees what it is. */
  lua_pushliteral(L, "array");
  lua_setfield(L, -2, "__jsontype");
  lua_pushlightuserdata(L, (void *)&array_mt_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

/* True if the table at idx (absolute) carries the array metatable. */
static int has_array_mt(lua_State *L, int idx) {
  if (!lua_getmetatable(L, idx)) return 0;
  push_array_mt(L);
  int yes = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return yes;
}

/* The tables json.object marked live as keys of one weak-keyed table of L
** (a mark neither keeps its table alive nor takes its metatable), kept in
** the registry under the address of object_set_key. */
static const char object_set_key = 'o';

/* Push the set of object-marked tables; create it first when create is
** set, else push nil when there is none yet. */
static void push_object_set(lua_State *L, int create) {
  lua_pushlightuserdata(L, (void *)&object_set_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_istable(L, -1) || !create) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushlightuserdata(L, (void *)&object_set_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

/* True if the table at idx (absolute) was marked by json.object. */
static int has_object_mark(lua_State *L, int idx) {
  push_object_set(L, 0);
  if (!lua_istable(L, -1)) return lua_pop(L, 1), 0;
  lua_pushvalue(L, idx);
  lua_rawget(L, -2);
  int yes = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return yes;
}

/* Mark (on) or unmark the table at idx (absolute) as an object. */
static void set_object_mark(lua_State *L, int idx, int on) {
  push_object_set(L, on);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  lua_pushvalue(L, idx);
  if (on) lua_pushboolean(L, 1);
  else lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

static int abs_index(lua_State *L, int idx) {
  return (idx < 0 && idx > LUA_REGISTRYINDEX) ? lua_gettop(L) + idx + 1 : idx;
}

int json_is_null(lua_State *L, int idx) {
  return lua_type(L, idx) == LUA_TLIGHTUSERDATA && lua_touserdata(L, idx) == NULL;
}

/* ---- JSON -> Lua ------------------------------------------------------- */

static int push_item(lua_State *L, const cJSON *item, int depth, err_t *e);

/* A raw item holds JSON text (json_from_lua makes them for exact numbers). */
static int push_raw(lua_State *L, const cJSON *item, int depth, err_t *e) {
  cJSON *parsed = item->valuestring ? cJSON_Parse(item->valuestring) : NULL;
  if (!parsed) return err_set(e, ERR_INVALID, "a raw cJSON item does not hold valid JSON");
  int rc = push_item(L, parsed, depth, e);
  cJSON_Delete(parsed);
  return rc;
}

/* Push item; on failure the caller restores the stack. */
static int push_item(lua_State *L, const cJSON *item, int depth, err_t *e) {
  if (depth > CJSON_NESTING_LIMIT)
    return err_set(e, ERR_INVALID, "JSON nested deeper than %d levels", CJSON_NESTING_LIMIT);
  if (!lua_checkstack(L, 4))
    return err_set(e, ERR_NOMEM, "out of Lua stack space at JSON nesting level %d", depth);
  const cJSON *c;
  int n = 0, rc;
  switch (item->type & 0xFF) {
  case cJSON_False: lua_pushboolean(L, 0); return 0;
  case cJSON_True: lua_pushboolean(L, 1); return 0;
  case cJSON_NULL: lua_pushlightuserdata(L, NULL); return 0;
  case cJSON_Number: lua_pushnumber(L, item->valuedouble); return 0;
  case cJSON_String: lua_pushstring(L, item->valuestring ? item->valuestring : ""); return 0;
  case cJSON_Raw: return push_raw(L, item, depth, e);
  case cJSON_Array:
    for (c = item->child; c; c = c->next) n++;
    lua_createtable(L, n, 0);
    push_array_mt(L);
    lua_setmetatable(L, -2);
    n = 0;
    for (c = item->child; c; c = c->next) {
      if ((rc = push_item(L, c, depth + 1, e))) return rc;
      lua_rawseti(L, -2, ++n);
    }
    return 0;
  case cJSON_Object:
    for (c = item->child; c; c = c->next) n++;
    lua_createtable(L, 0, n);
    for (c = item->child; c; c = c->next) {
      if (!c->string) return err_set(e, ERR_INVALID, "a cJSON object member has no key");
      lua_pushstring(L, c->string);
      if ((rc = push_item(L, c, depth + 1, e))) return rc;
      /* rawset on an existing key replaces it: duplicate keys, the last wins. */
      lua_rawset(L, -3);
    }
    return 0;
  default:
    return err_set(e, ERR_INVALID, "cannot convert a cJSON item of type %d", item->type);
  }
}

int json_push(lua_State *L, const cJSON *item, err_t *e) {
  if (!item) return err_set(e, ERR_INVALID, "no JSON item to push");
  int top = lua_gettop(L);
  int rc = push_item(L, item, 1, e);
  if (rc) lua_settop(L, top);
  return rc;
}

int json_decode_push(lua_State *L, const char *s, size_t len, err_t *e) {
  cJSON *root;
  if (jsontext_parse(s, len, &root, e)) return e->code;
  int rc = json_push(L, root, e);
  cJSON_Delete(root);
  return rc;
}

/* See json.h. */
int json_decode_bounded(lua_State *L, const char *s, size_t len, err_t *e) {
  size_t cap = lrt_json_cap(L);
  cJSON *root;
  mem_json_bound(cap);
  int rc = jsontext_parse(s, len, &root, e);
  int hit = mem_json_bound_hit();
  mem_json_bound(0);
  if (rc && hit) {
    char max[32];
    units_fmt_size((int64_t)cap, max, sizeof max);
    return err_set(e, ERR_TOOBIG, "the text would take more than the run's memory budget of %s "
                   "while it is read (about %d bytes a value: limits.run_memory)", max,
                   JSON_TREE_VALUE_BYTES);
  }
  if (rc) return rc;
  rc = json_push(L, root, e);
  cJSON_Delete(root);
  return rc;
}

/* ---- Lua -> JSON ------------------------------------------------------- */

/* One step of the path to the value being encoded. */
typedef struct frame {
  enum { FR_INDEX, FR_STR, FR_NUM } kind;
  double num;     /* FR_INDEX, FR_NUM */
  const char *s;  /* FR_STR: the key, alive on the Lua stack meanwhile */
  size_t n;
} frame_t;

typedef struct enc {
  lua_State *L;
  err_t *e;
  size_t used, budget; /* bytes of text the values met so far would take, and the most allowed */
  size_t tree_cap;     /* the most the cJSON tree may take (lrt_json_cap), 0: no bound */
  size_t values;
  int nframes;
  int nopen;  /* tables being encoded, outermost first: for cycles and depth */
  frame_t path[JSON_MAX_DEPTH + 1];
  const void *open[JSON_MAX_DEPTH];
} enc_t;

/* Text of a number key: integers without ".0", others with %.17g. */
static void key_text(double d, char *out, size_t cap) {
  if (d == 0) snprintf(out, cap, "0");  /* not "-0" */
  else if (d == floor(d) && fabs(d) < 1e21) snprintf(out, cap, "%.0f", d);
  else snprintf(out, cap, "%.17g", d);
}

/* Render one frame (.name, ["odd key"], [3]); returns its length. out holds
** at least KEY_SHOW_BYTES * 6 + 16 bytes. */
static size_t frame_text(const frame_t *f, char *out) {
  if (f->kind != FR_STR) {
    char num[40];
    key_text(f->num, num, sizeof num);
    return (size_t)sprintf(out, "[%s]", num);
  }
  /* Long keys are cut, and marked with "...". */
  size_t n = f->n > KEY_SHOW_BYTES ? KEY_SHOW_BYTES - 3 : f->n, k = 0;
  if (jsontext_is_ident(f->s, f->n))
    return (size_t)sprintf(out, ".%.*s%s", (int)n, f->s, n < f->n ? "..." : "");
  out[k++] = '[';
  out[k++] = '"';
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)f->s[i];
    if (ch == '"' || ch == '\\') out[k++] = '\\', out[k++] = (char)ch;
    else if (ch < 0x20 || ch == 0x7F) k += (size_t)sprintf(out + k, "\\u%04X", ch);
    else out[k++] = (char)ch;
  }
  if (n < f->n) k += (size_t)sprintf(out + k, "...");
  out[k++] = '"';
  out[k++] = ']';
  out[k] = 0;
  return k;
}

/* Render the current path into out (cap bytes). A path too long to read is
** shown as its first frames, "...", and its last frames. */
static void path_text(const enc_t *x, char *out, size_t cap) {
  char fr[KEY_SHOW_BYTES * 6 + 16];
  size_t lens[JSON_MAX_DEPTH + 1], total = 1;
  for (int i = 0; i < x->nframes; i++) total += lens[i] = frame_text(&x->path[i], fr);
  size_t budget = cap - 1 < PATH_SHOW_BYTES ? cap - 1 : PATH_SHOW_BYTES;
  int head = x->nframes, tail = x->nframes;
  if (total > budget) {
    size_t used = 1 + 3;
    for (head = 0; head < x->nframes && used + lens[head] <= budget / 3; head++) used += lens[head];
    for (tail = x->nframes; tail > head && used + lens[tail - 1] <= budget; tail--) used += lens[tail - 1];
  }
  size_t k = 0;
  out[k++] = '$';
  for (int i = 0; i < x->nframes; i++) {
    if (i == head && head < tail) memcpy(out + k, "...", 3), k += 3, i = tail;
    if (i >= x->nframes) break;
    frame_text(&x->path[i], out + k);
    k += lens[i];
  }
  out[k] = 0;
}

/* Fill e with "<what> at <path>[: <why>]"; returns NULL for the caller. */
static cJSON *enc_fail(enc_t *x, int code, const char *why, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
static cJSON *enc_fail(enc_t *x, int code, const char *why, const char *fmt, ...) {
  char what[512], path[PATH_SHOW_BYTES + 1];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  path_text(x, path, sizeof path);
  err_set(x->e, code, "%s at %s%s%s", what, path, why ? ": " : "", why ? why : "");
  return NULL;
}

/* "a function", "a boolean", "json.null": the value at idx, for messages. */
static const char *type_phrase(lua_State *L, int idx) {
  switch (lua_type(L, idx)) {
  case LUA_TLIGHTUSERDATA: return lua_touserdata(L, idx) ? "a light userdata" : "json.null";
  case LUA_TBOOLEAN: return "a boolean";
  case LUA_TTABLE: return "a table";
  case LUA_TFUNCTION: return "a function";
  case LUA_TTHREAD: return "a thread (coroutine)";
  case LUA_TUSERDATA: return "a userdata";
  default: return lua_typename(L, lua_type(L, idx));  /* LuaJIT's "cdata" */
  }
}

static cJSON *enc_number(enc_t *x, double d) {
  if (isnan(d)) return enc_fail(x, ERR_INVALID, NULL, "NaN is not a JSON number");
  if (isinf(d)) return enc_fail(x, ERR_INVALID, NULL, "%s is not a JSON number", d > 0 ? "infinity" : "-infinity");
  cJSON *num = cJSON_CreateNumber(d);
  /* Integers of up to 15 digits come out of cJSON exactly; for the rest,
  ** compare its text with the exact one and swap in a raw item if needed. */
  if (d == floor(d) && fabs(d) < 1e15) return num;
  char want[40], got[64];
  jsontext_number_text(d, want, sizeof want);
  if (cJSON_PrintPreallocated(num, got, (int)sizeof got, 0) && !strcmp(got, want)) return num;
  cJSON_Delete(num);
  cJSON *raw = cJSON_CreateRaw(want);
  raw->valuedouble = d;
  raw->valueint = d >= INT_MAX ? INT_MAX : d <= INT_MIN ? INT_MIN : (int)d;
  return raw;
}

static cJSON *enc_value(enc_t *x, int idx);

/* Encode t[1..n] of the table at idx as an array, nil as null. */
static cJSON *enc_array(enc_t *x, int idx, size_t n) {
  lua_State *L = x->L;
  cJSON *arr = cJSON_CreateArray();
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, (int)i);
    x->path[x->nframes++] = (frame_t){.kind = FR_INDEX, .num = (double)i};
    cJSON *v = enc_value(x, lua_gettop(L));
    if (!v) return cJSON_Delete(arr), NULL;
    x->nframes--;
    lua_pop(L, 1);
    cJSON_AddItemToArray(arr, v);
  }
  return arr;
}

/* An object key: a string key's bytes (alive in the table meanwhile) or the
** decimal text of a number key. */
typedef struct objkey {
  const char *s;
  size_t n;
  int is_num;
  double d;
  char num[32];
} objkey_t;

/* The bytes of a key. A number key's text lives in the struct, which qsort
** moves, so it is not kept as a pointer. */
static const char *key_bytes(const objkey_t *k) {
  return k->is_num ? k->num : k->s;
}

static int key_cmp(const void *pa, const void *pb) {
  const objkey_t *a = pa, *b = pb;
  int c = memcmp(key_bytes(a), key_bytes(b), a->n < b->n ? a->n : b->n);
  return c ? c : (a->n > b->n) - (a->n < b->n);
}

/* Encode the count keys of the table at idx as an object, number keys as
** decimal strings. Keys are sorted by their bytes: the text is then the same
** for equal tables, whatever their history, which the round trip needs. */
static cJSON *enc_object(enc_t *x, int idx, size_t count) {
  lua_State *L = x->L;
  objkey_t *keys = mem_alloc(count * sizeof *keys);
  cJSON *obj = cJSON_CreateObject();
  size_t n = 0;
  int top = lua_gettop(L);
  lua_pushnil(L);
  while (n < count && lua_next(L, idx)) {
    objkey_t *k = &keys[n++];
    /* lua_tolstring is safe on string keys only: it would turn a number key
    ** into a string in place and derail lua_next. */
    if ((k->is_num = lua_type(L, -2) == LUA_TNUMBER)) {
      k->d = lua_tonumber(L, -2);
      key_text(k->d, k->num, sizeof k->num);
      k->s = NULL;
      k->n = strlen(k->num);
    } else {
      k->s = lua_tolstring(L, -2, &k->n);
    }
    lua_pop(L, 1);
  }
  lua_settop(L, top);
  qsort(keys, n, sizeof *keys, key_cmp);

  for (size_t i = 0; i < n; i++) {
    objkey_t *k = &keys[i];
    /* Sorted, a number key and a string key of the same text are neighbours. */
    if (i + 1 < n && !key_cmp(k, k + 1)) {
      enc_fail(x, ERR_INVALID, "both would become the same JSON key",
               "the number key %.*s and the string key \"%.*s\" clash", (int)k->n, key_bytes(k),
               (int)k->n, key_bytes(k));
      goto fail;
    }
    if (k->is_num) {
      x->path[x->nframes++] = (frame_t){.kind = FR_NUM, .num = k->d};
      lua_pushnumber(L, k->d);
    } else {
      x->path[x->nframes++] = (frame_t){.kind = FR_STR, .s = k->s, .n = k->n};
      if (memchr(k->s, 0, k->n)) {
        enc_fail(x, ERR_INVALID, "NUL bytes are not supported in JSON strings",
                 "cannot encode a key containing a NUL byte");
        goto fail;
      }
      lua_pushlstring(L, k->s, k->n);
    }
    lua_rawget(L, idx);
    cJSON *v = enc_value(x, lua_gettop(L));
    if (!v) goto fail;
    x->nframes--;
    lua_pop(L, 1);
    cJSON_AddItemToObject(obj, key_bytes(k), v);
  }
  free(keys);
  return obj;
fail:
  cJSON_Delete(obj);
  free(keys);
  return NULL;
}

/* Encode the table at idx: by its array metatable or object mark, else by
** its keys. */
static cJSON *enc_table(enc_t *x, int idx) {
  lua_State *L = x->L;
  const void *p = lua_topointer(L, idx);
  for (int i = 0; i < x->nopen; i++)
    if (x->open[i] == p) return enc_fail(x, ERR_INVALID, "a table cannot contain itself", "cycle");
  if (x->nopen >= JSON_MAX_DEPTH)
    return enc_fail(x, ERR_INVALID, NULL, "tables nested deeper than %d levels", JSON_MAX_DEPTH);
  if (!lua_checkstack(L, 8)) return enc_fail(x, ERR_NOMEM, NULL, "out of Lua stack space");
  if (has_array_mt(L, idx)) {
    x->open[x->nopen++] = p;
    cJSON *r = enc_array(x, idx, lua_objlen(L, idx));
    x->nopen--;
    return r;
  }

  /* Look at the keys first: their types and range decide the shape. */
  size_t count = 0;
  double max = 0;
  int all_index = 1;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    int kt = lua_type(L, -1);
    if (kt == LUA_TNUMBER) {
      double k = lua_tonumber(L, -1);
      if (k >= 1 && k <= 9007199254740992.0 && k == floor(k)) max = k > max ? k : max;
      else all_index = 0;
    } else if (kt == LUA_TSTRING) {
      all_index = 0;
    } else {
      return enc_fail(x, ERR_INVALID, "object keys must be strings or numbers", "cannot use %s as a key",
                      type_phrase(L, -1));
    }
    count++;
  }
  cJSON *r;
  if (count == 0) return cJSON_CreateObject();
  x->open[x->nopen++] = p;
  /* A sequence (max == count) is an array; so is a table with holes, as long
  ** as the nulls filling them stay few. json.object's mark says object. */
  if (all_index && (max <= 2.0 * (double)count || max <= 16) && !has_object_mark(L, idx))
    r = enc_array(x, idx, (size_t)max);
  else r = enc_object(x, idx, count);
  x->nopen--;
  return r;
}

static cJSON *enc_value(enc_t *x, int idx) {
  lua_State *L = x->L;
  cJSON *v;
  /* A table met twice is encoded twice (a DAG is not a cycle): {t, t}
  ** nested twenty times is a million values. Counting the text as it
  ** grows stops such a value early, long before the memory it would take. */
  size_t cost = 4;
  if (lua_type(L, idx) == LUA_TSTRING) cost += lua_objlen(L, idx);
  x->used += cost;
  /* Encoding runs in C, out of the count hook's sight: watch the slice's time. */
  if ((++x->values & 1023) == 0 && lrt_time_up(L))
    return enc_fail(x, ERR_BUSY, "time is up", "%s", lrt_killed(lrt_from(L)));
  if (x->used > x->budget) {
    char max[32];
    units_fmt_size((int64_t)x->budget, max, sizeof max);
    return enc_fail(x, ERR_TOOBIG, "the value is too large to encode",
                    "the value is larger than %s as JSON", max);
  }
  /* cJSON's tree lives outside the Lua heap: bound it by the run's budget. */
  if (x->tree_cap && x->values * JSON_TREE_VALUE_BYTES + x->used > x->tree_cap) {
    char max[32], why[96];
    units_fmt_size((int64_t)x->tree_cap, max, sizeof max);
    snprintf(why, sizeof why, "JSON takes about %d bytes a value while it is encoded (limits.run_memory)",
             JSON_TREE_VALUE_BYTES);
    return enc_fail(x, ERR_TOOBIG, why, "the value would take more than the run's memory budget of %s", max);
  }
  switch (lua_type(L, idx)) {
  case LUA_TNIL: v = cJSON_CreateNull(); break;
  case LUA_TBOOLEAN: v = cJSON_CreateBool(lua_toboolean(L, idx)); break;
  case LUA_TNUMBER: return enc_number(x, lua_tonumber(L, idx));
  case LUA_TTABLE: return enc_table(x, idx);
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    if (memchr(s, 0, n))
      return enc_fail(x, ERR_INVALID, "NUL bytes are not supported in JSON strings",
                      "cannot encode a string containing a NUL byte");
    v = cJSON_CreateString(s);
    break;
  }
  case LUA_TLIGHTUSERDATA:
    if (!lua_touserdata(L, idx)) {
      v = cJSON_CreateNull();
      break;
    }
    /* fall through */
  default:
    return enc_fail(x, ERR_INVALID, "only JSON values (nil, booleans, numbers, strings, tables) can be encoded",
                    "cannot encode %s", type_phrase(L, idx));
  }
  return v;
}

/* json_from_lua with a bound on the text's size (bytes, 0: JSON_MAX_TEXT). */
static cJSON *from_lua_bounded(lua_State *L, int idx, size_t budget, err_t *e) {
  idx = abs_index(L, idx);
  int top = lua_gettop(L);
  enc_t *x = mem_alloc(sizeof *x);
  x->L = L;
  x->e = e;
  x->used = x->values = 0;
  x->budget = budget ? budget : JSON_MAX_TEXT;
  x->tree_cap = lrt_json_cap(L);
  x->nframes = x->nopen = 0;
  cJSON *root = enc_value(x, idx);
  free(x);
  lua_settop(L, top);
  return root;
}

cJSON *json_from_lua(lua_State *L, int idx, err_t *e) { return from_lua_bounded(L, idx, 0, e); }

/* json_encode with a choice of compact or indented text. */
static char *encode_text(lua_State *L, int idx, size_t limit, int pretty, size_t *len, err_t *e) {
  /* The estimate counts at least the text's bytes: past limit (with room
  ** for it to be an overestimate) the exact check below would fail anyway. */
  cJSON *root = from_lua_bounded(L, idx, limit ? limit * 4 + 4096 : 0, e);
  if (!root) return NULL;
  char *text = pretty ? jsontext_print_pretty(root) : jsontext_print_text(root);
  cJSON_Delete(root);
  size_t n = strlen(text);
  if (limit && n > limit) {
    char have[32], max[32];
    units_fmt_over((int64_t)n, (int64_t)limit, have, max, sizeof have);
    err_set(e, ERR_TOOBIG, "JSON text is %s, over the limit of %s", have, max);
    free(text);
    return NULL;
  }
  if (len) *len = n;
  return text;
}

char *json_encode(lua_State *L, int idx, size_t limit, size_t *len, err_t *e) {
  return encode_text(L, idx, limit, 0, len, e);
}

/* ---- the Lua module ---------------------------------------------------- */

/* Raise "bad argument #arg to 'fn' (table expected, got nil)" unless the
** argument has the type. luaL_checktype would do, but LuaJIT cannot name
** functions called through a module table and would say '?'. */
static void check_arg(lua_State *L, int arg, int type, const char *fn) {
  if (lua_type(L, arg) != type)
    luaL_error(L, "bad argument #%d to '%s' (%s expected, got %s)", arg, fn, lua_typename(L, type),
               luaL_typename(L, arg));
}

/* json.encode(v [, {pretty=true}]) -> text; raises on values JSON cannot hold. */
static int l_encode(lua_State *L) {
  if (lua_isnone(L, 1)) return luaL_error(L, "bad argument #1 to 'json.encode' (value expected)");
  int pretty = 0;
  if (!lua_isnoneornil(L, 2)) {
    check_arg(L, 2, LUA_TTABLE, "json.encode");
    lua_getfield(L, 2, "pretty");
    pretty = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  err_t e;
  size_t n;
  char *text = encode_text(L, 1, 0, pretty, &n, &e);
  if (!text) {
    lua_pushfstring(L, "json.encode: %s", e.msg);
    return lua_error(L);
  }
  lua_pushlstring(L, text, n);
  free(text);
  return 1;
}

/* json.decode(text) -> value; raises on invalid JSON. */
static int l_decode(lua_State *L) {
  check_arg(L, 1, LUA_TSTRING, "json.decode");
  size_t n;
  const char *s = lua_tolstring(L, 1, &n);
  err_t e;
  if (json_decode_bounded(L, s, n, &e)) {
    lua_pushfstring(L, "json.decode: %s", e.msg);
    return lua_error(L);
  }
  return 1;
}

/* json.array(t) -> t, marked to encode as an array (an object mark goes). */
static int l_array(lua_State *L) {
  check_arg(L, 1, LUA_TTABLE, "json.array");
  lua_settop(L, 1);
  set_object_mark(L, 1, 0);
  push_array_mt(L);
  lua_setmetatable(L, 1);
  return 1;
}

/* json.object(t) -> t, marked to encode as an object whatever its keys: the
** array mark goes, other metatables stay (the mark is not a metatable). */
static int l_object(lua_State *L) {
  check_arg(L, 1, LUA_TTABLE, "json.object");
  lua_settop(L, 1);
  if (has_array_mt(L, 1)) {
    lua_pushnil(L);
    lua_setmetatable(L, 1);
  }
  set_object_mark(L, 1, 1);
  return 1;
}

int json_open(lua_State *L) {
  lua_createtable(L, 0, 5);
  lua_pushcfunction(L, l_encode);
  lua_setfield(L, -2, "encode");
  lua_pushcfunction(L, l_decode);
  lua_setfield(L, -2, "decode");
  lua_pushcfunction(L, l_array);
  lua_setfield(L, -2, "array");
  lua_pushcfunction(L, l_object);
  lua_setfield(L, -2, "object");
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  return 1;
}
