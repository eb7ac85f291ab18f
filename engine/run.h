/*
** run.h: the run context: what a run and its tasks are inside the engine,
** and the ops their coroutines yield (the Lua side is lua/run.lua).
**
** A run has one main task (its coroutine); step.parallel adds child tasks.
** A task is always in exactly one state:
**
**              resume                 yield op
**    READY ------------> RUNNING ------------------> PARKED
**      ^                    |                          |
**      |                    | returns / errors         | completion (group durable,
**      |                    v                          |  timer, HTTP response):
**      |                  DONE                         |  push the values to
**      +-----------------------------------------------+  resume with
**
** Runs go  running -> (sleeping | waiting -> running)* -> completed | failed | cancelled.
** A run that is aborted (timeout, cancel, lost lease) stops at once: its
** timers and transfers are cancelled; a commit it waits on cannot be, so
** the run is kept (by reference count) until that commit reports back.
**
** This header is internal to the scheduler and the run context.
*/
#ifndef ML_RUN_H
#define ML_RUN_H
#include <stdint.h>

#include <lua.h>

#include "httpc.h"
#include "sched.h"
#include "skill.h"

/* Ops a run's coroutine yields; the Lua side gets them as core.OP. */
enum run_op {
  OP_COMMIT = 1, /* a step body returned: record its result */
  OP_RETRY,      /* a step attempt failed: record it, wait the backoff */
  OP_FAIL,       /* a step failed for good: record it */
  OP_SLEEP,      /* durable sleep until a time */
  OP_BACKOFF,    /* replay: wait out a recorded backoff */
  OP_HTTP,       /* an HTTP request */
};

/* A timer in the scheduler's heap. */
struct stimer {
  int64_t at;  /* ms since the epoch */
  size_t idx;  /* position in the heap, 0 when not armed */
  void (*fn)(struct stimer *t);
};

enum task_state { T_READY, T_RUNNING, T_PARKED, T_DONE };

struct run;

struct task {
  struct run *run;
  lua_State *co;
  int co_ref;
  enum task_state state;
  int nres;             /* values pushed on co to resume with */
  int waits;            /* completions still due before it is ready */
  struct task *next_ready;
  struct stimer timer;  /* sleeps and backoffs */
  httpc_xfer *xfer;     /* an HTTP request in flight */
  /* the step whose body is running, if any */
  int step_seq, step_attempt;
  char *step_id;
  int64_t step_started;
  int step_marked;      /* its "running" row has been journaled */
  int step_timed_out;
  int64_t step_timeout_ms;
  struct stimer step_timer;
};

struct run {
  char id[27];
  sched_t *sched;
  struct skill *skill;
  char *trigger, *input, *parent_id, *fail_error;
  const char *entry; /* "run" or "on_failure" */
  int64_t created_at, started_at, deadline_at;
  struct task main;
  int refs;          /* pending completions that cannot be cancelled, plus one while live */
  int finished;      /* its terminal status is journaled */
  int aborted;
  struct stimer deadline;
  struct run *prev, *next; /* the scheduler's list of live runs */
};

/* Build a run from a stored row, push its coroutine (replaying journal,
** a cJSON array from store_get_steps or NULL) and make its main task ready.
** On failure the run is not created. */
int run_start(sched_t *s, struct run *r, const cJSON *journal, err_t *e);

/* Resume a ready task once and handle what it yields. */
void run_resume(struct task *t);

/* Abort a run: cancel what can be cancelled, journal status (unless
** NULL) with error, and release it. */
void run_abort(struct run *r, const char *status, const char *error_json);

/* Release a reference; frees the run at zero. */
void run_unref(struct run *r);

/* Register the run context's C functions in core (log, step_begin, ...). */
void run_register_core(lrt_t *lrt, sched_t *s);

/* ---- scheduler internals used by the run context ---- */
journal_t *sched__journal(sched_t *s);
void sched__after_commit(sched_t *s, void (*fn)(void *arg), void *arg);
void sched__timer_start(sched_t *s, struct stimer *t, int64_t at_ms);
void sched__timer_stop(sched_t *s, struct stimer *t);
void sched__ready(sched_t *s, struct task *t);
struct task *sched__current(sched_t *s);
void sched__set_current(sched_t *s, struct task *t);
const struct sched_opts *sched__opts(const sched_t *s);
/* A run reached a terminal status and that status is durable. */
void sched__run_done(sched_t *s, struct run *r, const char *status, const char *output,
                     const char *error);
void sched__run_unlink(sched_t *s, struct run *r);
void sched__run_link(sched_t *s, struct run *r);

#endif
