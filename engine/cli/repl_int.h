/*
** repl_int.h: the REPL's engine side, shared by its files and nothing else
** (the interface is repl.h):
**
**   repl.c        the evaluation: its coroutine, the ops it yields, the
**                 loop it turns while parked; opening and closing
**   repl_watch.c  what is shown and asked while runs go on: their steps as
**                 they become durable, and step_through's question
**   repl_core.c   the C functions lua/repl.lua finds in core (send,
**                 enqueue, runs, trace, show)
**
** Invariants: all of it runs on the loop thread (or from repl_eval between
** loop turns); only repl_interrupt, from a signal handler, touches the
** volatile flags. Writes outside the scheduler go through aux, never the
** scheduler's writer connection (it belongs to the commit thread).
*/
#ifndef ML_REPL_INT_H
#define ML_REPL_INT_H
#include <signal.h>

#include "cli/repl.h"
#include "core/engine.h"
#include "core/run_pause.h"

/* Ops of the REPL's coroutine, apart from run.h's (it also yields OP_HTTP). */
enum repl_op { ROP_SKILL = 101, ROP_RUN, ROP_RESUME, ROP_WAIT, ROP_SLEEP };

/* The evaluation's state (drawn in repl.c). */
enum co_state { CO_NONE, CO_READY, CO_RUNNING, CO_PARKED };

#define MAX_WATCH 64
#define MAX_SKIPS 32
#define REPL_TRIGGER "{\"kind\":\"invoke\",\"by\":\"repl\"}"

#define C_GREEN "\033[32m"
#define C_RED "\033[31m"
#define C_YELLOW "\033[33m"
#define C_CYAN "\033[36m"
#define C_DIM "\033[2m"
#define C_RESET "\033[0m"

struct repl {
  struct engine en;
  const struct config *cfg;
  store_t *aux; /* writes outside the scheduler (see the top of this file) */
  int color;
  repl_ask_cb ask;
  void *ask_arg;
  int mod_ref;  /* lua/repl.lua's module table */
  /* the evaluation in progress */
  lua_State *co;
  int co_ref;
  enum co_state state;
  int nres;     /* values pushed on co to resume with */
  int result;   /* repl_eval's answer */
  httpc_xfer *xfer;
  /* the timeout of the ctx.step.run body running at the prompt (opts.timeout):
  ** its requests end when it passes, as a run's step timer ends them */
  int64_t step_deadline, step_timeout_ms; /* 0: none */
  char step_id[256];
  char wait_id[27]; /* the run it waits for */
  int64_t wait_started;
  uv_timer_t poll;  /* ROP_WAIT, ROP_SLEEP, and a request's step timeout */
  uv_async_t wake;  /* a signal handler wakes the loop */
  volatile sig_atomic_t evaluating, interrupted;
  /* the runs whose steps are printed: the one waited for first */
  char watch[MAX_WATCH][27];
  char watch_skill[MAX_WATCH][64];
  int nwatch;
  /* steps completed by step_through's skip, to print them as such */
  struct { char run_id[27]; int seq; } skips[MAX_SKIPS];
  int nskips;
  char *last_attempt_error; /* of the attempt row journaled before a step row */
  /* a run parked before a step, waiting for the person's answer */
  struct {
    int pending;
    char run_id[27], step_id[256], kind[16];
    int seq;
  } pause;
};

/* ---- repl.c ---- */

/* Call lua/repl.lua's fn(arg) on the main state with nres results (left on
** the stack above the module table: the caller resets the stack). */
int repl__call_module(struct repl *rp, const char *fn, const char *arg, int nres, err_t *e);

/* ---- repl_watch.c ---- */

/* The color c, or "" when the REPL prints without colors. */
const char *repl__col(const struct repl *rp, const char *c);
/* Print the steps of run_id from now on (up to MAX_WATCH runs). */
void repl__watch_add(struct repl *rp, const char *run_id, const char *skill);
/* The scheduler's observer (sched_observe): prints the watched runs' steps. */
void repl__observe(const struct jentry *je, void *arg);
/* The scheduler's pause handler (run_pause_handler): notes the step. */
enum run_pause_decision repl__on_pause(const struct run_pause_step *p, char **value, void *arg);
/* Ask what to do with the paused step (Enter, s VALUE, q) and answer. */
void repl__answer_pause(struct repl *rp);

/* ---- repl_core.c ---- */

/* Register the C functions and op codes lua/repl.lua finds in core. */
void repl__register_core(struct repl *rp);

#endif
