/*
** repl.h: the REPL's engine side: an engine (SCHED_REPL) and the Lua
** half (lua/repl.lua) that evaluates chunks in a coroutine the engine
** resumes. The terminal (line editing, history, the prompt) is
** cli_repl.c's; this unit never reads the terminal itself, it asks
** through repl_ask_cb when a run pauses before a step (step_through),
** from repl_eval (never from inside a loop callback): the question may
** call repl_pump while it waits, as the prompt does.
**
** An evaluation runs the loop until its chunk is done: runs it starts go
** on, and their steps are printed (stderr) as they become durable. The
** chunk's values go to stdout, its error to stderr. Between evaluations
** the caller keeps the engine alive with repl_pump (lease, commits).
**
** Ctrl-C: repl_interrupt (async-signal-safe) stops the evaluation in
** progress: the Lua running now is stopped by the count hook
** (lrt_interrupt), every run of this process is dropped without a write
** (they stay resumable), and the evaluation ends with status 2.
*/
#ifndef ML_REPL_H
#define ML_REPL_H
#include "base/err.h"
#include "lua/config.h"

typedef struct repl repl_t;

/* Read one line for a question (step_through's "step> "): a malloc'd line
** without its newline, or NULL at the end of the input or on Ctrl-C. */
typedef char *(*repl_ask_cb)(const char *prompt, void *arg);

struct repl_opts {
  const struct config *cfg;
  int color;           /* ANSI colors in what it prints */
  int load_workspace;  /* register the skill files of cfg->workspace (as serve does) */
  repl_ask_cb ask;
  void *ask_arg;
};

/* Open the engine and the REPL's globals. On failure *out is NULL. */
int repl_open(const struct repl_opts *o, repl_t **out, err_t *e);

/* Stop the engine (its lease is released: runs left unfinished become
** resumable by others) and free everything. */
void repl_close(repl_t *rp);

/* 1 if src is a complete chunk (or one with a syntax error that only
** evaluating reports), 0 if it ends too early (read another line). */
int repl_complete(repl_t *rp, const char *src);

/* Evaluate a chunk to its end: 0 done, 1 it raised an error (printed),
** 2 interrupted. */
int repl_eval(repl_t *rp, const char *src);

/* Names completing word ("json.en" -> "json.encode"): a NULL-terminated
** array of malloc'd strings (free each and the array), or NULL. */
char **repl_completions(repl_t *rp, const char *word);

/* Let the engine work without blocking (commits, lease); call it often
** while waiting at the prompt. */
void repl_pump(repl_t *rp);

/* SIGINT, from a signal handler: stop the evaluation in progress. Returns
** 1 if one was in progress, 0 if not (nothing is done then). */
int repl_interrupt(repl_t *rp);

#endif
