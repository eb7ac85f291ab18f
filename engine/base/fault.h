/*
** fault.h: fault injection points for crash tests. MOONLOOP_FAULT holds
** "point=ms,point=ms"; at a named point the process sleeps that long, so
** a test can SIGKILL it there (for instance halfway through a commit).
** Compiled in when MOONLOOP_FAULTS is defined (the default build; a
** release build may leave it out with -DMOONLOOP_FAULTS=OFF).
**
** Points: "commit" (inside the transaction, before COMMIT).
**
** Crash points: fault_crash(name, text) kills the process with SIGSEGV
** when MOONLOOP_FAULT holds "name=TEXT" and text is TEXT, so a test can
** make a real crash happen where a run is executing (recorded as a crash
** by core/crash.c's handler, as a bad pointer's would be). Point:
** "crash_on_log" (a run logs the line TEXT: log.info("TEXT")).
*/
#ifndef ML_FAULT_H
#define ML_FAULT_H

#ifdef MOONLOOP_FAULTS
#include <signal.h>
void fault_point(const char *name);
void fault_crash(const char *name, const char *text);
/* Set by fault_crash before it raises: crash.c's handler then dies with the
** plain default (no sanitizer report) after recording the crash. */
extern volatile sig_atomic_t fault_crash_requested;
#else
#define fault_point(name) ((void)0)
#define fault_crash(name, text) ((void)0)
#endif

#endif
