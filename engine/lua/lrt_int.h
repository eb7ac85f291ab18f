/*
** lrt_int.h: what the files of the Lua runtime share (lrt.c, the state,
** the budget and the boot; lrt_pattern.c, the string functions that check
** the time budget as they go). Nothing outside engine/lrt*.c includes it:
** the public interface is lrt.h.
**
** Invariants of struct lrt (kept by lrt.c):
**   - in_slice is 1 exactly while lrt_pcall, lrt_resume or
**     lrt_resume_unbounded runs skill code; killed, kill_reason, in_run,
**     deadline_ns, mem_base and judge_at describe that slice only (judge_at
**     is in bytes held: the account's, or the slice's growth; an account
**     keeps its own between slices);
**   - killed is 1 from the moment a budget (or an interrupt) stopped the
**     slice, and kill_reason then holds the message raised in skill code;
**   - mem_used counts every byte the allocator handed out and not freed,
**     headers included; it is the sum of every account's bytes;
**   - an open account is charged by blocks of the run whose coroutine it
**     belongs to; a closed one is freed when its bytes reach 0.
*/
#ifndef ML_LRT_INT_H
#define ML_LRT_INT_H
#include "lua/lrt.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* A memory account (lrt.c's memory budget): what blocks charged to it
** hold. Account 0 is the engine's and never closes. */
struct lrt_acct {
  size_t bytes;    /* allocated (with headers) and not freed */
  size_t judge_at; /* its slices judge the memory again past this */
  uint32_t gen;    /* bumped when the slot is recycled */
  int state;       /* ACCT_FREE, ACCT_OPEN, ACCT_CLOSED */
  int group;       /* its group (a skill version), 0 for none */
  int next_free;   /* free list, while free */
  int settled;     /* closed two collection cycles ago: what is left is kept by someone */
  uint32_t closed_at; /* the collection cycle it was closed in */
};

/* A group of accounts: what its closed accounts still hold. */
struct lrt_group {
  size_t held;     /* bytes still charged to its closed accounts (garbage included) */
  size_t settled;  /* of those, what its settled accounts hold: kept, not garbage */
  int over;        /* it was found over budget once: it stays so */
};

/* A closed account waiting for two collection cycles to end. */
struct lrt_pending {
  int acct;
  uint32_t gen;
};

struct lrt {
  lua_State *L;
  int core_ref;
  size_t mem_used, mem_cap;
  struct lrt_acct *accts;
  int naccts, acct_cap, acct_free; /* acct_free: first free slot, or -1 */
  int cur;                         /* the account charged now (0: the engine) */
  struct lrt_group *groups;
  int ngroups, group_cap;
  struct lrt_pending *pending; /* closed accounts not yet settled */
  int npending, pending_cap;
  uint32_t gc_cycles;          /* collection cycles ended (a finalizer counts them) */
  int sentinel_ref;            /* the metatable of the finalizer's userdata */
  int closing;                 /* lrt_free: the finalizer stops re-arming */
  int killed_ref; /* weak set of coroutines that were killed once */
  int sentinel_lost; /* the finalizer could not re-arm (no memory): lrt_protect does */
  int traceback_ref; /* lrt_pcall's message handler (pushed without allocating) */
  int protect_ref;   /* lrt_protect's function (lua_cpcall would allocate a closure) */
  int refused;       /* why the allocator last refused a block (enum in lrt.c), for lrt_protect */
  /* the slice in progress */
  int in_slice;
  int killed;
  int in_run;    /* the slice is a run's coroutine (lrt_resume), not lrt_pcall */
  int mem_over;  /* grew past judge_at: the hook collects, then judges */
  int hook_fast; /* the hook runs at every instruction until it judged */
  uint64_t deadline_ns;
  uint64_t cpu_start_ns;   /* the thread's CPU time when the slice began */
  size_t mem_base, mem_limit;
  size_t judge_at; /* heap size past which the memory is judged again */
  int64_t slice_ms;
  char kill_reason[200];
  /* The REPL (engine/cli/repl.c): a Ctrl-C asks the running slice to stop
  ** (set from a signal handler, read by the hook), and the coroutine
  ** that may yield ops to the engine outside a run (core.can_yield). */
  volatile sig_atomic_t interrupt;
  lua_State *yieldable;
};

/* The monotonic clock, coarse (a few ms): cheap enough for every check of
** the slice's deadline. */
static inline uint64_t lrt__coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The CPU time this thread has used: a system call (no vDSO), so read at
** a slice's start and when the coarse clock says its time may be up. */
static inline uint64_t lrt__cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether the running slice has used its time. The coarse wall clock says
** when to look; the thread's CPU time decides, so a slice is not charged
** for time the machine gave to other processes (its deadline moves on by
** what it has left). */
int lrt__slice_over(lrt_t *r);

/* Mark the slice killed for running past its time (sets kill_reason). */
void lrt__kill_time(lrt_t *r);

/* Raise the kill in L, where the code was stopped ("file.lua:12: ...");
** level as for luaL_where. Does not return. */
int lrt__raise_kill(lua_State *L, int level);

/* Register core.str_find, str_match, str_gmatch and str_gsub
** (lrt_pattern.c): the sandbox's string.find/match/gmatch/gsub. */
void lrt__patterns_open(lrt_t *r);

#endif
