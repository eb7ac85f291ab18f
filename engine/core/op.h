/*
** op.h: the op protocol, in one table. Every yield of a run's coroutine
** to the core is an op: its code first, then its arguments by position.
** OP_TABLE below is the one definition of the ops; from it come
**
**   - enum run_op, the op codes (the Lua side gets them as core.OP);
**   - one struct of arguments per op (struct op_commit, ...) and
**     struct op, the decoded op: op_decode checks every argument's type
**     and count before any handler reads it, so a run that yields a
**     malformed op fails with a message naming the op and the argument,
**     instead of a handler reading a stack slot that is not there;
**   - the core's dispatch (op_dispatch: each op's handler is named in
**     the table, so an op without one does not link);
**   - the Lua runtime's view (op_register): core.OP (name -> code),
**     core.OP_ARGS (name -> the argument names in order) and
**     core.op_args(code, ...), which checks an op with the same decoder
**     and returns its name and its arguments by name. `moonloop test`'s
**     driver (lua/testing_driver.lua) interprets ops through it, and
**     refuses at load a handler for an op the table does not have, or a
**     table op it has no handler for.
**
** A row is X(NAME, code, lname, handler, ARGS, answer): ARGS lists the
** arguments as A(field, type, need), type one of
**
**   INT      a Lua number, as an int (step seqs, attempt numbers)
**   MS       a Lua number, as an int64_t (times and durations in ms)
**   STR      a Lua string (numbers are refused), as a const char * into
**            the coroutine's stack: valid until the handler pops it
**   KIND     a STR that is a step kind of base/vocab.h ("run", "sleep"...)
**   TABLE    a Lua table, as its stack index
**   THREADS  the rest of the arguments, each a coroutine: their first
**            index and count (the last argument only)
**
** and need REQ (must be there) or OPT (nil or absent: NULL, 0). The
** answer says what the run is resumed with. Adding an op: a row here and
** its handler (plus, in `moonloop test`, the driver's interpretation).
*/
#ifndef ML_OP_H
#define ML_OP_H
#include <stdint.h>

#include <lua.h>

#include "base/err.h"
#include "lua/lrt.h"

#define OP_COMMIT_ARGS(A)                                                                       \
  A(seq, INT, REQ) A(id, STR, REQ) A(kind, KIND, REQ) A(output, STR, REQ) A(attempts, INT, REQ) \
  A(started, MS, REQ) A(ended, MS, REQ)
#define OP_RETRY_ARGS(A)                                                                 \
  A(seq, INT, REQ) A(id, STR, REQ) A(n, INT, REQ) A(message, STR, REQ)                  \
  A(traceback, STR, OPT) A(attempt_started, MS, REQ) A(delay, MS, REQ) A(started, MS, REQ)
#define OP_FAIL_ARGS(A)                                                                      \
  A(seq, INT, REQ) A(id, STR, REQ) A(kind, KIND, REQ) A(n, INT, REQ) A(message, STR, REQ)   \
  A(traceback, STR, OPT) A(attempt_started, MS, REQ) A(ended, MS, REQ) A(started, MS, REQ)
#define OP_SLEEP_ARGS(A) A(seq, INT, REQ) A(id, STR, REQ) A(wake_at, MS, REQ) A(started, MS, REQ)
#define OP_BACKOFF_ARGS(A) A(seq, INT, REQ) A(retry_at, MS, REQ)
#define OP_HTTP_ARGS(A) A(request, TABLE, REQ)
#define OP_WAIT_ARGS(A)                                                                     \
  A(seq, INT, REQ) A(id, STR, REQ) A(event, STR, REQ) A(match, STR, OPT)                   \
  A(timeout_at, MS, REQ) A(started, MS, REQ)
#define OP_INVOKE_ARGS(A)                                                                   \
  A(seq, INT, REQ) A(id, STR, REQ) A(skill, STR, REQ) A(data, STR, REQ)                    \
  A(timeout_at, MS, REQ) A(started, MS, REQ) A(child, STR, OPT)
#define OP_SEND_ARGS(A) A(seq, INT, REQ) A(id, STR, REQ) A(events, STR, REQ) A(started, MS, REQ)
#define OP_PARALLEL_ARGS(A) A(seq, INT, REQ) A(id, STR, REQ) A(started, MS, REQ) A(tasks, THREADS, REQ)
#define OP_DELAY_ARGS(A) A(ms, MS, REQ)
#define OP_CANCEL_ARGS(A) A(run_id, STR, REQ) A(reason, STR, OPT)
#define OP_PAUSE_ARGS(A) A(seq, INT, REQ) A(id, STR, REQ) A(kind, KIND, REQ)

#define OP_TABLE(X)                                                                             \
  X(COMMIT, 1, commit, run_op_commit, OP_COMMIT_ARGS,                                           \
    "a step body returned: record its result; resumed once the group is durable")              \
  X(RETRY, 2, retry, run_op_retry, OP_RETRY_ARGS,                                               \
    "a step attempt failed: record it; resumed once durable and after the backoff (delay)")    \
  X(FAIL, 3, fail, run_op_fail, OP_FAIL_ARGS,                                                   \
    "a step failed for good: record it; resumed once the group is durable")                    \
  X(SLEEP, 4, sleep, run_op_sleep, OP_SLEEP_ARGS,                                               \
    "durable sleep until wake_at; resumed with the end time")                                  \
  X(BACKOFF, 5, backoff, run_op_backoff, OP_BACKOFF_ARGS,                                       \
    "replay: wait out a recorded backoff; resumed at retry_at")                                \
  X(HTTP, 6, http, run_op_http, OP_HTTP_ARGS,                                                   \
    "an HTTP request {method, url, body, timeout, headers}; resumed with the response, or "    \
    "nil and a message")                                                                       \
  X(WAIT, 7, wait, run_op_wait, OP_WAIT_ARGS,                                                   \
    "wait for an event; resumed with the event (JSON) or nil, and the end time")               \
  X(INVOKE, 8, invoke, run_op_invoke, OP_INVOKE_ARGS,                                           \
    "start a child run (unless a replay names it) and wait for it; resumed with its outcome "  \
    "(JSON) or nil, the end time [, an error]")                                                \
  X(SEND, 9, send, run_op_send, OP_SEND_ARGS,                                                   \
    "send events (a JSON list); resumed with their ids (JSON) and the end time, or nil, the "  \
    "end time and an error")                                                                   \
  X(PARALLEL, 10, parallel, run_op_parallel, OP_PARALLEL_ARGS,                                  \
    "run step bodies in child tasks; resumed with {{ok=, value=}, ...} once every one ended")  \
  X(DELAY, 11, delay, run_op_delay, OP_DELAY_ARGS,                                              \
    "wait inside a step body, not journaled (llm.chat's retries); resumed after ms")           \
  X(CANCEL, 12, cancel, modules_op_cancel, OP_CANCEL_ARGS,                                      \
    "runs.cancel: cancel another run; resumed with the answer (JSON) once durable, or nil "    \
    "and a message")                                                                           \
  X(PAUSE, 40, pause, run_op_pause, OP_PAUSE_ARGS,                                              \
    "the REPL's step_through, before a live step: resumed with \"run\", or \"skip\" and a "    \
    "value (JSON); never after \"stop\"")

/* The op codes. */
enum run_op {
#define OP_ENUM(N, code, l, h, ARGS, answer) OP_##N = code,
  OP_TABLE(OP_ENUM)
#undef OP_ENUM
};

/* The C type of each argument type. */
struct op_threads {
  int first, n; /* stack index of the first coroutine, and how many */
};
#define OP_CTYPE_INT int
#define OP_CTYPE_MS int64_t
#define OP_CTYPE_STR const char *
#define OP_CTYPE_KIND const char *
#define OP_CTYPE_TABLE int
#define OP_CTYPE_THREADS struct op_threads

/* struct op_commit, struct op_retry, ...: an op's arguments. */
#define OP_FIELD(f, type, need) OP_CTYPE_##type f;
#define OP_STRUCT(N, code, l, h, ARGS, answer) \
  struct op_##l {                              \
    ARGS(OP_FIELD)                             \
  };
OP_TABLE(OP_STRUCT)
#undef OP_STRUCT
#undef OP_FIELD

/* A decoded op: its code and its arguments. */
struct op {
  enum run_op code;
  const char *name; /* "COMMIT", ... */
  union {
#define OP_MEMBER(N, code, l, h, ARGS, answer) struct op_##l l;
    OP_TABLE(OP_MEMBER)
#undef OP_MEMBER
  } u;
};

/* Decode the op on co's stack (its code at index 1, its arguments from
** index 2 on) into op, checking the code, the number of arguments and
** each one's type. Strings point into co's stack. Returns 0, or
** ERR_INVALID with a message naming the op and the argument. */
int op_decode(lua_State *co, struct op *op, err_t *e);

/* The name of op code ("COMMIT"), or NULL for a code not in the table. */
const char *op_name(int code);

/* Register core.OP, core.OP_ARGS and core.op_args in the runtime. */
void op_register(lrt_t *lrt);

/* The core's handlers, one per op (named in OP_TABLE). */
struct task;
#define OP_PROTO(N, code, l, h, ARGS, answer) void h(struct task *t, const struct op_##l *a);
OP_TABLE(OP_PROTO)
#undef OP_PROTO

/* Call the handler of a decoded op for task t. */
void op_dispatch(struct task *t, const struct op *op);

#endif
