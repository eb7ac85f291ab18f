/*
** crash.h: which run crashed the engine. A run whose code crashes the
** process (a bug in a C function a skill reaches, a stack the guards miss)
** would crash every engine that resumes it: a crash loop. To quarantine it
** (sched_adopt fails a run with SCHED_MAX_CRASHES crashes), the engine must
** tell a crash from a kill: `kill -9` at any moment is part of the contract
** (DESIGN, guarantee 4) and must never count against a run.
**
** So a crash is recorded by the crashing process itself: a handler for the
** signals of a crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT), on an
** alternate stack, appends the id of the run whose code was executing to a
** file beside the database ("DB-crashes"), with one write(2), then lets the
** signal do what it would have done. The next engine that starts on that
** database counts the recorded crashes against their runs and empties the
** file. A SIGKILL runs no handler: it never counts.
*/
#ifndef ML_CRASH_H
#define ML_CRASH_H

#include "base/err.h"
#include "store/store.h"

/* Arm the handlers for this process, recording into path (NULL: the
** handlers only pass the signal on). Call from the thread that runs skill
** code (its alternate signal stack is set here). Idempotent. */
int crash_arm(const char *path, err_t *e);

/* The run whose code the loop thread executes now (NULL: none): what a
** crash records. run_id must stay valid until it is replaced. */
void crash_set_run(const char *run_id);

/* Count every crash recorded in path against its run (store_count_crash),
** then empty the file; a missing file has none. Holds an exclusive lock on
** the file meanwhile, so engines starting together count each crash once.
** Returns the number counted, or a negative code. */
int crash_collect(store_t *s, const char *path, err_t *e);

#endif
