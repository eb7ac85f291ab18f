/*
** op.c: the op protocol's decoder, dispatch and Lua view, all made from
** OP_TABLE (see op.h).
**
** Each op gets a decoder (decode_commit, ...) that walks the coroutine's
** stack with one typed getter per argument: index 1 is the code, index
** 2 + i argument i; a THREADS argument takes every index from its own to
** the top. Nothing is read that has not been checked first, and an op
** with more arguments than its row names is refused too (a yield whose
** arguments moved by one place would otherwise be read quietly wrong).
** A descriptor per op (its name and its arguments' names and types)
** serves the Lua view and the messages.
*/
#include "base/units.h"
#include "core/op.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

#include "base/vocab.h"
#include "core/modules.h"
#include "core/run.h"
#include "core/run_pause.h"

enum op_type { OPT_INT, OPT_MS, OPT_STR, OPT_KIND, OPT_TABLE, OPT_THREADS };
#define REQ 1
#define OPT 0

static const char *const type_words[] = {"a number", "a number", "a string", "a step kind",
                                         "a table", "coroutines"};

struct op_arg {
  const char *name;
  enum op_type type;
  int need;
};

struct op_desc {
  int code;
  const char *name;
  const struct op_arg *args;
  int nargs;
};

/* The arguments of each op: args_commit[], ... */
#define OP_ARG(f, type, need) {#f, OPT_##type, need},
#define OP_ARGLIST(N, code, l, h, ARGS, answer) static const struct op_arg args_##l[] = {ARGS(OP_ARG)};
OP_TABLE(OP_ARGLIST)
#undef OP_ARGLIST
#undef OP_ARG

/* Every op's descriptor, in the table's order. */
static const struct op_desc descs[] = {
#define OP_DESC(N, code, l, h, ARGS, answer) \
  {code, #N, args_##l, (int)(sizeof args_##l / sizeof args_##l[0])},
    OP_TABLE(OP_DESC)
#undef OP_DESC
};
#define NDESCS ((int)(sizeof descs / sizeof descs[0]))

/* The descriptor of an op code, or NULL. */
static const struct op_desc *desc_of(int code) {
  for (int i = 0; i < NDESCS; i++)
    if (descs[i].code == code) return &descs[i];
  return NULL;
}

/* See op.h. */
const char *op_name(int code) {
  const struct op_desc *d = desc_of(code);
  return d ? d->name : NULL;
}

/* The message for argument name of op (at stack index i) that is not
** what its row says. */
static int bad_arg(lua_State *co, int i, const char *op, const char *name, enum op_type type,
                   err_t *e) {
  return err_set(e, ERR_INVALID, "internal error: op %s: argument %d (%s) is %s, expected %s", op,
                 i - 1, name, lua_typename(co, lua_type(co, i)), type_words[type]);
}

/* The getters: check stack index *i of co against an argument's row,
** store it, and move *i on. An optional argument that is nil or absent
** gets 0 or NULL. */
static int get_INT(lua_State *co, int *i, const char *op, const char *name, int need, int *out,
                   err_t *e) {
  *out = 0;
  if (!need && lua_isnoneornil(co, *i)) return ++*i, 0;
  if (lua_type(co, *i) != LUA_TNUMBER) return bad_arg(co, *i, op, name, OPT_INT, e);
  *out = (int)lua_tointeger(co, (*i)++);
  return 0;
}

static int get_MS(lua_State *co, int *i, const char *op, const char *name, int need,
                  int64_t *out, err_t *e) {
  *out = 0;
  if (!need && lua_isnoneornil(co, *i)) return ++*i, 0;
  if (lua_type(co, *i) != LUA_TNUMBER) return bad_arg(co, *i, op, name, OPT_MS, e);
  *out = units_ms_of(lua_tonumber(co, (*i)++));
  return 0;
}

static int get_STR(lua_State *co, int *i, const char *op, const char *name, int need,
                   const char **out, err_t *e) {
  *out = NULL;
  if (!need && lua_isnoneornil(co, *i)) return ++*i, 0;
  if (lua_type(co, *i) != LUA_TSTRING) return bad_arg(co, *i, op, name, OPT_STR, e);
  size_t n;
  *out = lua_tolstring(co, (*i)++, &n);
  /* C reads it up to its first NUL: a name cut short there ("a\0b" as
  ** "a") would name something else. */
  if (strlen(*out) != n)
    return err_set(e, ERR_INVALID, "the %s given (op %s) holds a NUL byte (\\0), which names "
                   "nothing", name, op);
  return 0;
}

static int get_KIND(lua_State *co, int *i, const char *op, const char *name, int need,
                    const char **out, err_t *e) {
  int at = *i;
  if (get_STR(co, i, op, name, need, out, e)) return e->code;
  if (*out && vocab_step_kind(*out) == VOCAB_NONE)
    return err_set(e, ERR_INVALID, "internal error: op %s: argument %d (%s) is '%.40s', not a step "
                   "kind (%s)", op, at - 1, name, *out, VOCAB_STEP_KINDS);
  return 0;
}

static int get_TABLE(lua_State *co, int *i, const char *op, const char *name, int need, int *out,
                     err_t *e) {
  *out = 0;
  if (!need && lua_isnoneornil(co, *i)) return ++*i, 0;
  if (!lua_istable(co, *i)) return bad_arg(co, *i, op, name, OPT_TABLE, e);
  *out = (*i)++;
  return 0;
}

static int get_THREADS(lua_State *co, int *i, const char *op, const char *name, int need,
                       struct op_threads *out, err_t *e) {
  int top = lua_gettop(co);
  out->first = *i;
  out->n = top >= *i ? top - *i + 1 : 0;
  if (need && !out->n)
    return err_set(e, ERR_INVALID, "internal error: op %s: no %s given", op, name);
  for (int k = *i; k <= top; k++)
    if (!lua_isthread(co, k)) return bad_arg(co, k, op, name, OPT_THREADS, e);
  *i = top + 1;
  return 0;
}

/* The decoders: decode_commit(co, &op->u.commit, e), ... */
#define OP_GET(f, type, need) \
  if (get_##type(co, &i, name, #f, need, &a->f, e)) return e->code;
#define OP_DECODER(N, code, l, h, ARGS, answer)                                        \
  static int decode_##l(lua_State *co, struct op_##l *a, err_t *e) {                   \
    const char *name = #N;                                                             \
    int i = 2;                                                                         \
    ARGS(OP_GET)                                                                       \
    if (lua_gettop(co) >= i)                                                           \
      return err_set(e, ERR_INVALID, "internal error: op %s takes %d arguments, got %d", \
                     name, i - 2, lua_gettop(co) - 1);                                 \
    return 0;                                                                          \
  }
OP_TABLE(OP_DECODER)
#undef OP_DECODER
#undef OP_GET

/* See op.h. */
int op_decode(lua_State *co, struct op *op, err_t *e) {
  memset(op, 0, sizeof *op);
  if (lua_type(co, 1) != LUA_TNUMBER)
    return err_set(e, ERR_INVALID, "internal error: a yield without an op code (%s)",
                   lua_typename(co, lua_type(co, 1)));
  int code = (int)lua_tointeger(co, 1);
  switch (code) {
#define OP_CASE(N, c, l, h, ARGS, answer) \
  case c:                                 \
    op->code = OP_##N;                    \
    op->name = #N;                        \
    return decode_##l(co, &op->u.l, e);
    OP_TABLE(OP_CASE)
#undef OP_CASE
  default:
    return err_set(e, ERR_INVALID, "internal error: unknown op %d yielded", code);
  }
}

/* See op.h. */
void op_dispatch(struct task *t, const struct op *op) {
  switch (op->code) {
#define OP_CALL(N, c, l, h, ARGS, answer) \
  case OP_##N:                            \
    h(t, &op->u.l);                       \
    break;
    OP_TABLE(OP_CALL)
#undef OP_CALL
  }
}

/* ---- the Lua view ---- */

/* core.op_args(code, ...): the op's name and a table of its arguments by
** name (THREADS as a list), checked by op_decode; raises its message for
** a malformed op. The test driver reads ops through this, so that it and
** the core read the same positions with the same checks. */
static int c_op_args(lua_State *L) {
  struct op op;
  err_t e;
  if (op_decode(L, &op, &e)) return luaL_error(L, "%s", e.msg);
  const struct op_desc *d = desc_of(op.code);
  int top = lua_gettop(L);
  lua_pushstring(L, d->name);
  lua_createtable(L, 0, d->nargs);
  for (int k = 0, i = 2; k < d->nargs; k++, i++) {
    const struct op_arg *a = &d->args[k];
    if (a->type == OPT_THREADS) {
      lua_createtable(L, top >= i ? top - i + 1 : 0, 0);
      for (int j = i; j <= top; j++) {
        lua_pushvalue(L, j);
        lua_rawseti(L, -2, j - i + 1);
      }
    } else if (i <= top) {
      lua_pushvalue(L, i);
    } else {
      lua_pushnil(L); /* an optional argument left out */
    }
    lua_setfield(L, -2, a->name);
  }
  return 2;
}

/* See op.h. */
void op_register(lrt_t *lrt) {
  lua_State *L = lrt_L(lrt);
  lua_createtable(L, 0, NDESCS);
  for (int i = 0; i < NDESCS; i++) {
    lua_pushinteger(L, descs[i].code);
    lua_setfield(L, -2, descs[i].name);
  }
  lrt_register_value(lrt, "OP");
  lua_createtable(L, 0, NDESCS);
  for (int i = 0; i < NDESCS; i++) {
    lua_createtable(L, descs[i].nargs, 0);
    for (int k = 0; k < descs[i].nargs; k++) {
      lua_pushstring(L, descs[i].args[k].name);
      lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, descs[i].name);
  }
  lrt_register_value(lrt, "OP_ARGS");
  lrt_register(lrt, "op_args", c_op_args, NULL);
}
