/*
** fault.h: fault injection points, for tests (modelled on Tarantool's
** errinj.h). Each point is a place in the engine where a failure of the
** outside world can happen (a commit, an fsync, a lease renewal, an HTTP
** transfer, an allocation); armed, the point makes that failure happen
** there, so a test can check the engine's answer to it: it tries again,
** or gives a clear error, and loses nothing it acknowledged.
**
** Compiled only when MOONLOOP_FAULTS is defined (the Makefile's development
** and CI builds); otherwise every point is a constant 0 and MOONLOOP_FAULT
** is ignored. `moonloop version --json` says whether they are compiled in.
**
** Arming. MOONLOOP_FAULT holds "point=value,point=value", read at start
** (fault_init). The value is, by the point's kind:
**   DELAY  milliseconds to sleep there, every time ("commit=400": a test
**          can SIGKILL the process inside each commit)
**   COUNT  how many times it fails, from the next time it is reached on
**          ("commit_fail=3": the next three commits fail)
**   SPAN   milliseconds during which it fails, from when it is armed
**          ("disk_full=2000": the disk is full for two seconds)
**   TEXT   the text that makes it fire ("crash_on_log=BOOM")
** While MOONLOOP_FAULT is set (to anything, even ""), a run's log line
** "fault: SPEC" arms SPEC too, when the run logs it (fault_log): a skill
** can put a fault exactly between two of its steps.
**
** The points (docs/testing.md says which test reaches each):
*/
#ifndef ML_FAULT_H
#define ML_FAULT_H

#include "base/err.h"

/* _(ID, "name", kind, "where it is: what happens there") */
#define FAULT_POINTS(_) \
  _(COMMIT, "commit", FAULT_DELAY, \
    "store_commit, inside the transaction before COMMIT: it holds the write lock that long") \
  _(CLAIM, "claim", FAULT_DELAY, \
    "store_claim, inside the transaction before COMMIT: the runs it took stay locked that long") \
  _(DISPATCH_FAIL, "dispatch_fail", FAULT_COUNT, \
    "store_dispatch, once it found events to dispatch: the transaction fails and is rolled back") \
  _(COMMIT_FAIL, "commit_fail", FAULT_COUNT, \
    "store_commit, before COMMIT: the transaction fails and is rolled back") \
  _(FSYNC_FAIL, "fsync_fail", FAULT_COUNT, \
    "the database's files (a SQLite VFS over the default one): an fsync fails (EIO)") \
  _(DISK_FULL, "disk_full", FAULT_SPAN, \
    "the database's files: every write fails as on a full disk (SQLITE_FULL)") \
  _(LEASE_REFUSED, "lease_refused", FAULT_COUNT, \
    "store_commit's lease renewal: refused as if another process had reaped the lease") \
  _(LEASE_BUSY, "lease_busy", FAULT_COUNT, \
    "taking a lease at start: refused at once as busy, as PostgreSQL at its connection limit") \
  _(READER_BUSY, "reader_busy", FAULT_SPAN, \
    "a read through the reader connection's statements: the database is busy (ERR_BUSY)") \
  _(HTTP_FAIL, "http_fail", FAULT_COUNT, \
    "httpc, as a transfer ends: it fails as a reset connection would") \
  _(ALLOC_FAIL, "alloc_fail", FAULT_COUNT, \
    "base/mem.h's allocation functions: the system refuses the memory") \
  _(LUA_FULL, "lua_full", FAULT_COUNT, \
    "lrt.c's Lua allocator, outside a slice (the engine's own calls into Lua): the block is " \
    "refused as when the state and its reserve are full (limits.total_memory)") \
  _(ACCEPT_EMFILE, "accept_emfile", FAULT_COUNT, \
    "the API's listener: accepting a connection fails for want of file descriptors (EMFILE)") \
  _(CRASH_ON_LOG, "crash_on_log", FAULT_TEXT, \
    "a run logs the line TEXT: the process dies of SIGSEGV there, as on a bad pointer")

enum fault_kind { FAULT_DELAY, FAULT_COUNT, FAULT_SPAN, FAULT_TEXT };

#define FAULT_ENUM(id, name, kind, where) FAULT_##id,
enum fault_id { FAULT_POINTS(FAULT_ENUM) FAULT_NPOINTS };
#undef FAULT_ENUM

#ifdef MOONLOOP_FAULTS
#include <stdatomic.h>

/* Nonzero once any point was armed: the one load a point costs otherwise. */
extern atomic_int fault__armed;
int fault__hit(enum fault_id id);

/* Whether the COUNT or SPAN point id fails this time (a COUNT is counted
** down). Safe on any thread. */
static inline int fault_hit(enum fault_id id) {
  return atomic_load_explicit(&fault__armed, memory_order_relaxed) && fault__hit(id);
}

/* Read MOONLOOP_FAULT and arm what it names. ERR_INVALID, naming the
** points there are, for a point that does not exist or a bad value. */
int fault_init(err_t *e);
/* Arm the points of spec ("point=value,..."), as MOONLOOP_FAULT would. */
int fault_arm(const char *spec, err_t *e);
/* Whether MOONLOOP_FAULT was set at start (fault_log arms, the store's
** files go through the fault VFS). */
int fault_enabled(void);
/* Sleep the milliseconds the DELAY point id is armed with, if any. */
void fault_delay(enum fault_id id);
/* A run logs msg: the TEXT point crash_on_log, and "fault: SPEC" lines. */
void fault_log(const char *msg);
/* Set by crash_on_log before it raises: core/crash.c's handler records the
** crash, then dies with the plain default (no sanitizer report). */
#include <signal.h>
extern volatile sig_atomic_t fault_crash_requested;
#else
static inline int fault_hit(enum fault_id id) { (void)id; return 0; }
static inline int fault_init(err_t *e) { (void)e; return 0; }
static inline int fault_enabled(void) { return 0; }
static inline void fault_delay(enum fault_id id) { (void)id; }
static inline void fault_log(const char *msg) { (void)msg; }
#endif

/* Whether the fault points are compiled into this binary. */
#ifdef MOONLOOP_FAULTS
#define FAULT_COMPILED 1
#else
#define FAULT_COMPILED 0
#endif

#endif
