/*
** run_pause.h: pausing a run before each live step, for the REPL's
** step_through. A run whose pause is enabled yields OP_PAUSE before every
** step past the end of its journal (lua/run_pause.lua); the core asks the
** pause handler what to do, and may block while a person decides:
**
**   PAUSE_RUN   the step runs as usual
**   PAUSE_SKIP  the step completes with a value (JSON) without running:
**               its completed row is journaled as if its body returned it
**   PAUSE_STOP  the run is dropped here without a write (run_abort with no
**               status): it stays resumable from its journal
**   PAUSE_WAIT  decide later: the run stays parked until run_pause_answer
**               (the REPL asks the person from outside the loop's callbacks)
**
** Steps that replay from the journal never pause. One handler per process.
*/
#ifndef ML_RUN_PAUSE_H
#define ML_RUN_PAUSE_H
#include <lua.h>

#include "base/err.h"
#include "core/sched.h"

enum run_pause_decision { PAUSE_RUN, PAUSE_SKIP, PAUSE_STOP, PAUSE_WAIT };

/* The step a run is about to take. Strings are valid during the call. */
struct run_pause_step {
  const char *run_id, *skill, *step_id, *kind;
  int seq;
};

/* Decide about one step. For PAUSE_SKIP, *value gets the step's result as
** JSON text (malloc'd; the core frees it). */
typedef enum run_pause_decision (*run_pause_cb)(const struct run_pause_step *p, char **value,
                                                void *arg);

/* Set the handler for the runs of s (NULL: every paused step runs). */
void run_pause_handler(sched_t *s, run_pause_cb cb, void *arg);

/* Pause run_id, a run of s that is live in memory (not parked without its
** coroutine), before each of its live steps from now on. ERR_NOTFOUND if
** there is no such run. Call it outside any resume (between loop turns). */
int run_pause_enable(sched_t *s, const char *run_id, err_t *e);

/* Answer a pause the handler left waiting (PAUSE_WAIT) with RUN, SKIP
** (value: the step's result, JSON text) or STOP. ERR_NOTFOUND when run_id
** is not waiting on a pause (it ended, or was dropped meanwhile). */
int run_pause_answer(sched_t *s, const char *run_id, enum run_pause_decision d, const char *value,
                     err_t *e);

/* Its op, OP_PAUSE, is handled by run_op_pause (declared by core/op.h). */

#endif
