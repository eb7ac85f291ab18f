/*
** test_op.c: the op protocol's checked decoder (engine/core/op.h): every
** argument is checked against its row before a handler can read it, and a
** malformed op is refused with a message naming the op and the argument.
*/
#include <lauxlib.h>
#include <lualib.h>

#include "core/op.h"
#include "test.h"

/* One Lua state; each test starts from an empty stack and pushes an op. */
static lua_State *L;
static void fresh(void) { lua_settop(L, 0); }

TEST(decodes_commit_with_every_field) {
  fresh();
  lua_pushinteger(L, OP_COMMIT);
  lua_pushinteger(L, 3);
  lua_pushliteral(L, "fetch");
  lua_pushliteral(L, "run");
  lua_pushliteral(L, "{\"a\":1}");
  lua_pushinteger(L, 2);
  lua_pushnumber(L, 1700000000123.0);
  lua_pushnumber(L, 1700000000456.0);
  struct op op;
  err_t e;
  CHECK_INT_EQ(op_decode(L, &op, &e), 0);
  CHECK_INT_EQ(op.code, OP_COMMIT);
  CHECK_STR_EQ(op.name, "COMMIT");
  CHECK_INT_EQ(op.u.commit.seq, 3);
  CHECK_STR_EQ(op.u.commit.id, "fetch");
  CHECK_STR_EQ(op.u.commit.kind, "run");
  CHECK_STR_EQ(op.u.commit.output, "{\"a\":1}");
  CHECK_INT_EQ(op.u.commit.attempts, 2);
  CHECK_INT_EQ(op.u.commit.started, 1700000000123LL);
  CHECK_INT_EQ(op.u.commit.ended, 1700000000456LL);
}

TEST(optional_arguments_may_be_nil_or_left_out) {
  fresh();
  lua_pushinteger(L, OP_INVOKE);
  lua_pushinteger(L, 1);
  lua_pushliteral(L, "child");
  lua_pushliteral(L, "other");
  lua_pushliteral(L, "null");
  lua_pushinteger(L, 0);
  lua_pushinteger(L, 5);
  struct op op;
  err_t e;
  CHECK_INT_EQ(op_decode(L, &op, &e), 0); /* child left out */
  CHECK(op.u.invoke.child == NULL);
  lua_pushnil(L);
  CHECK_INT_EQ(op_decode(L, &op, &e), 0); /* child nil */
  CHECK(op.u.invoke.child == NULL);
}

TEST(a_missing_or_mistyped_argument_is_refused_by_name) {
  fresh();
  lua_pushinteger(L, OP_FAIL);
  lua_pushinteger(L, 1);
  lua_pushliteral(L, "s");
  lua_pushliteral(L, "run");
  lua_pushinteger(L, 1);
  /* message missing: the next one is a number */
  struct op op;
  err_t e;
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "op FAIL: argument 5 (message) is no value, expected a string");
  lua_pushinteger(L, 7);
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "argument 5 (message) is number, expected a string");
}

TEST(extra_arguments_and_unknown_codes_are_refused) {
  fresh();
  lua_pushinteger(L, OP_DELAY);
  lua_pushinteger(L, 100);
  lua_pushinteger(L, 200);
  struct op op;
  err_t e;
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "op DELAY takes 1 arguments, got 2");
  fresh();
  lua_pushinteger(L, 99);
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "unknown op 99");
  fresh();
  lua_pushliteral(L, "COMMIT");
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "without an op code");
}

TEST(parallel_takes_the_rest_as_coroutines) {
  fresh();
  lua_pushinteger(L, OP_PARALLEL);
  lua_pushinteger(L, 4);
  lua_pushliteral(L, "fan");
  lua_pushinteger(L, 9);
  lua_newthread(L);
  lua_newthread(L);
  struct op op;
  err_t e;
  CHECK_INT_EQ(op_decode(L, &op, &e), 0);
  CHECK_INT_EQ(op.u.parallel.tasks.first, 5);
  CHECK_INT_EQ(op.u.parallel.tasks.n, 2);
  lua_pushliteral(L, "not a coroutine");
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "argument 6 (tasks) is string, expected coroutines");
  lua_settop(L, 4);
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "no tasks given");
}

TEST(a_step_kind_must_be_one_of_the_vocabulary) {
  fresh();
  lua_pushinteger(L, OP_PAUSE);
  lua_pushinteger(L, 1);
  lua_pushliteral(L, "s");
  lua_pushliteral(L, "nap");
  struct op op;
  err_t e;
  CHECK_INT_EQ(op_decode(L, &op, &e), ERR_INVALID);
  CHECK_CONTAINS(e.msg, "argument 3 (kind) is 'nap', not a step kind (run, sleep, wait");
  lua_pop(L, 1);
  lua_pushliteral(L, "sleep");
  CHECK_INT_EQ(op_decode(L, &op, &e), 0);
  CHECK_STR_EQ(op.u.pause.kind, "sleep");
}

TEST(names_come_from_the_table) {
  CHECK_STR_EQ(op_name(OP_PAUSE), "PAUSE");
  CHECK_STR_EQ(op_name(OP_HTTP), "HTTP");
  CHECK(op_name(0) == NULL);
}

int main(void) {
  L = luaL_newstate();
  RUN(decodes_commit_with_every_field);
  RUN(optional_arguments_may_be_nil_or_left_out);
  RUN(a_missing_or_mistyped_argument_is_refused_by_name);
  RUN(extra_arguments_and_unknown_codes_are_refused);
  RUN(parallel_takes_the_rest_as_coroutines);
  RUN(a_step_kind_must_be_one_of_the_vocabulary);
  RUN(names_come_from_the_table);
  lua_close(L);
  return test_summary();
}
