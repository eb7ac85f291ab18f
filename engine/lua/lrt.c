/*
** lrt.c: the Lua runtime's core: the state and its allocator, the slice
** budget (the count hook, the memory judgement, kills), the boot of the
** runtime's Lua files, and core's plain functions (time, JSON, cron,
** random). See lrt.h for the budget and the boot sequence, lrt_int.h for
** the invariants of struct lrt. The budget-checking copies of
** string.find/match/gmatch/gsub are in lrt_pattern.c.
*/
#include "base/cron.h"
#include "base/fault.h"
#include "base/ids.h"
#include "base/mem.h"
#include "base/units.h"
#include "base/vocab.h"
#include "lua/embed.h"
#include "lua/json.h"
#include "lua/lrt_int.h"

#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HOOK_COUNT 10000

static void l_hook(lua_State *L, lua_Debug *ar);

/* Memory budget. Every block the allocator hands out carries a header
** naming the account it is charged to (struct mhdr): the account in use
** when it was allocated, or last grown (lrt_account_use). A run's
** coroutine has its own account (run.c opens it with the coroutine and
** closes it when the coroutine goes), so what a run holds is known at any
** moment: what it allocated, in any of its slices, and not yet freed,
** wherever the collector frees it later. A slice charged to an account
** ("account mode", every run's) may hold mem_limit bytes in that account,
** counting what it kept from its earlier slices: the budget is per run,
** across its steps. A slice with no account (a skill's top level, the
** runtime's own calls) may grow the heap by mem_limit bytes ("slice
** mode", mem_base is where it started).
**
** Garbage counts too until the collector has run, so holding more than
** the budget only raises mem_over and makes the count hook run at the
** next instruction: it runs a full collection and kills the slice if what
** is left is still over budget, with an error that names the budget. If it
** is not, the next judgement waits until another half budget was
** allocated (judge_at, kept in the account between slices), so code that
** keeps close to its budget does not pay a full collection per
** allocation. A slice that outruns the hook (one C call allocating a lot)
** is refused more than four budgets past judge_at: that raises Lua's own
** "not enough memory" (LUA_ERRMEM) and marks the slice killed, so
** lrt_pcall, task_finished and the sandbox's pcall report the budget (a
** step body's error keeps Lua's message). A slice that yields or returns
** while over budget is judged there.
**
** A closed account (its run ended or was evicted) stays while blocks
** charged to it are alive, counted in its group (a skill version: its
** runs' group). Once two collection cycles have ended since it closed
** (a userdata's finalizer counts them), whatever is still charged to it
** is not garbage: it is what the run left in state the skill's runs
** share (a top-level table, an upvalue). The account is then "settled";
** lrt_group_over compares what a group's settled accounts hold with a
** run's budget, without forcing a collection (a full one of a big heap
** would stall the loop).
**
** The whole state is capped at mem_cap: past it, an allocation in a slice
** fails and kills the slice (the engine's Lua memory is full); outside a
** slice (the engine's own pushes) the cap is mem_cap plus a reserve of one
** budget, so the engine's C code does not meet an error it cannot catch. */

/* The header before every block (16 bytes keep malloc's alignment). */
struct mhdr {
  uint32_t acct, gen;
  uint64_t unused;
};
#define MHDR sizeof(struct mhdr)

enum { ACCT_FREE, ACCT_OPEN, ACCT_CLOSED };

/* Why the allocator last refused a block (r->refused): lrt_protect says so. */
enum { REFUSED_NONE, REFUSED_FULL, REFUSED_SYSTEM };

/* v as text for a kill message: "64 MB", "1.5 MB", "512 KB", "100 bytes". */
static void fmt_bytes(char *buf, size_t n, size_t v) {
  if (v >= ((size_t)1 << 20) && v % ((size_t)1 << 20) == 0) snprintf(buf, n, "%zu MB", v >> 20);
  else if (v >= ((size_t)1 << 20)) snprintf(buf, n, "%.1f MB", (double)v / (1 << 20));
  else if (v >= 1024) snprintf(buf, n, "%zu KB", v >> 10);
  else snprintf(buf, n, "%zu bytes", v);
}

/* What the running slice holds against its budget: its account's bytes,
** or (slice mode) how much it grew the heap. */
static size_t held(const lrt_t *r) {
  if (r->cur) return r->accts[r->cur].bytes;
  return r->mem_used > r->mem_base ? r->mem_used - r->mem_base : 0;
}

/* Mark the slice killed for holding more than its memory budget. */
static void kill_memory(lrt_t *r) {
  char b[32];
  fmt_bytes(b, sizeof b, r->mem_limit);
  r->killed = 1;
  if (r->cur && r->in_run)
    snprintf(r->kill_reason, sizeof r->kill_reason,
             "stopped: the run holds more than its memory budget of %s, counting what it "
             "keeps across its steps (limits.run_memory)", b);
  else
    snprintf(r->kill_reason, sizeof r->kill_reason,
             "stopped: %s used more than its memory budget of %s without yielding "
             "(limits.run_memory)", r->in_run ? "the run" : "skill code", b);
}

/* The message for a state that is full, naming its cap. */
static void total_message(const lrt_t *r, char *out, size_t n) {
  char b[32];
  fmt_bytes(b, sizeof b, r->mem_cap);
  snprintf(out, n, "stopped: the engine's Lua memory is full (%s for all runs and skills "
           "together, limits.total_memory)", b);
}

/* Mark the slice killed for finding the whole state's memory full. */
static void kill_total(lrt_t *r) {
  r->killed = 1;
  total_message(r, r->kill_reason, sizeof r->kill_reason);
}

/* See lrt_int.h. */
void lrt__kill_time(lrt_t *r) {
  r->killed = 1;
  snprintf(r->kill_reason, sizeof r->kill_reason,
           "stopped: %s ran for more than %lld ms without yielding "
           "(limits.run_seconds_between_yields)", r->in_run ? "the run" : "skill code",
           (long long)r->slice_ms);
}

static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
static int traceback_handler(lua_State *L);
static int c_protected(lua_State *L);

/* See lrt_int.h. */
int lrt__slice_over(lrt_t *r) {
  if (lrt__coarse_ns() <= r->deadline_ns) return 0;
  uint64_t budget = (uint64_t)r->slice_ms * 1000000u, used = lrt__cpu_ns() - r->cpu_start_ns;
  if (used >= budget) return 1;
  r->deadline_ns = lrt__coarse_ns() + (budget - used);
  return 0;
}

/* See lrt.h. */
int lrt_time_up(lua_State *L) {
  void *ud;
  if (lua_getallocf(L, &ud) != l_alloc) return 0;
  lrt_t *r = ud;
  if (r->killed) return 1;
  if (!r->in_slice || !lrt__slice_over(r)) return 0;
  lrt__kill_time(r);
  return 1;
}

/* See lrt.h. */
size_t lrt_json_cap(lua_State *L) {
  void *ud;
  if (lua_getallocf(L, &ud) != l_alloc) return 0;
  lrt_t *r = ud;
  return r->in_slice ? r->mem_limit : 0;
}

/* See lrt_int.h. */
int lrt__raise_kill(lua_State *L, int level) {
  luaL_where(L, level);
  lua_pushstring(L, lrt_from(L)->kill_reason);
  lua_concat(L, 2);
  return lua_error(L);
}

/* ---- accounts (see the memory budget above) ---- */

/* Recycle a closed account once nothing is charged to it: a new
** generation, so a header that still names it (none should) is ignored. */
static void acct_recycle(lrt_t *r, uint32_t i) {
  struct lrt_acct *a = &r->accts[i];
  a->state = ACCT_FREE;
  a->gen++;
  a->next_free = r->acct_free;
  r->acct_free = (int)i;
}

/* Take n bytes off the account h names (a block freed or moved). */
static void uncharge(lrt_t *r, const struct mhdr *h, size_t n) {
  r->mem_used -= n;
  if (h->acct >= (uint32_t)r->naccts) return;
  struct lrt_acct *a = &r->accts[h->acct];
  if (a->gen != h->gen || a->state == ACCT_FREE) return;
  a->bytes -= n;
  if (a->state == ACCT_CLOSED) {
    struct lrt_group *g = &r->groups[a->group];
    g->held -= n;
    if (a->settled) g->settled -= n;
    if (a->bytes == 0) acct_recycle(r, h->acct);
  }
}

/* Charge n bytes to account i and name it in the block's header. */
static void charge(lrt_t *r, struct mhdr *h, uint32_t i, size_t n) {
  struct lrt_acct *a = &r->accts[i];
  r->mem_used += n;
  a->bytes += n;
  if (a->state == ACCT_CLOSED) {
    r->groups[a->group].held += n;
    if (a->settled) r->groups[a->group].settled += n;
  }
  h->acct = i;
  h->gen = a->gen;
}

/* Incremental collection steps lrt_group_over may take per call. */
#define GROUP_GC_STEPS 100

/* A collection cycle ended: settle the closed accounts two cycles old. */
static void settle(lrt_t *r) {
  int k = 0;
  for (int j = 0; j < r->npending; j++) {
    struct lrt_pending p = r->pending[j];
    struct lrt_acct *a = &r->accts[p.acct];
    if (a->gen != p.gen || a->state != ACCT_CLOSED) continue; /* recycled: all freed */
    if (r->gc_cycles - a->closed_at < 2) {
      r->pending[k++] = p;
      continue;
    }
    a->settled = 1;
    r->groups[a->group].settled += a->bytes;
  }
  r->npending = k;
}

/* Arm the cycle counter: a userdata nothing refers to, whose finalizer
** runs at the end of the next collection cycle. */
static void arm_sentinel(lrt_t *r, lua_State *L) {
  lua_newuserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->sentinel_ref);
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
}

/* arm_sentinel for lua_cpcall. */
static int c_arm_sentinel(lua_State *L) {
  arm_sentinel(lua_touserdata(L, 1), L);
  return 0;
}

/* The sentinel's __gc: count a cycle, settle, arm the next one (charged
** to the engine, whichever run's slice the collector ran in, with the
** engine's reserve). A finalizer's error would travel on out of whatever
** allocation ran the collector, protected or not: when the state is too
** full to arm it, lrt_protect arms it later (sentinel_lost). */
static int c_sentinel_gc(lua_State *L) {
  lrt_t *r = lrt_from(L);
  r->gc_cycles++;
  settle(r);
  if (!r->closing) {
    int prev = r->cur, slice = r->in_slice;
    r->cur = 0;
    r->in_slice = 0;
    if (lua_cpcall(L, c_arm_sentinel, r)) {
      lua_pop(L, 1);
      r->sentinel_lost = 1;
    }
    r->cur = prev;
    r->in_slice = slice;
  }
  return 0;
}

/* The account a block is charged to when it is (re)allocated: a new
** block or one that grows goes to the account in use, except that a block
** the engine made (account 0: the runtime's tables, the string table, the
** JIT's buffers) stays the engine's when a run grows it; a block that
** shrinks (the collector does that) keeps its account. */
static uint32_t owner_of(const lrt_t *r, const struct mhdr *h, size_t osize, size_t nsize) {
  if (!h) return (uint32_t)r->cur;
  int valid = h->acct < (uint32_t)r->naccts && r->accts[h->acct].gen == h->gen &&
              r->accts[h->acct].state != ACCT_FREE;
  if (!valid) return (uint32_t)r->cur;
  if (nsize <= osize || h->acct == 0) return h->acct;
  return (uint32_t)r->cur;
}

/* Ask the hook to judge the memory at the very next instruction
** (lua_sethook is safe anywhere, even in a signal handler: it only sets
** the hook fields and the dispatch table). */
static void judge_soon(lrt_t *r) {
  if (r->mem_over) return;
  r->mem_over = 1;
  lua_sethook(r->L, l_hook, LUA_MASKCOUNT, 1);
  r->hook_fast = 1;
}

/* The allocator: keeps the accounts, refuses growth past the state's cap
** and more than four budgets past judge_at (see the memory budget). */
static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lrt_t *r = ud;
  struct mhdr *h = ptr ? (struct mhdr *)ptr - 1 : NULL;
  if (!ptr) osize = 0;
  if (nsize == 0) {
    if (h) {
      uncharge(r, h, osize + MHDR);
      free(h);
    }
    return NULL;
  }
  uint32_t to = owner_of(r, h, osize, nsize);
  if (nsize > osize) {
    size_t grow = nsize - osize + (h ? 0 : MHDR), after = r->mem_used + grow;
    if (after > r->mem_cap) {
      /* Full: a slice is stopped; the engine's own calls get a reserve. */
      r->refused = REFUSED_FULL;
      if (r->in_slice && !r->killed) {
        kill_total(r);
        return NULL;
      }
      if (after > r->mem_cap + r->mem_limit) return NULL;
      r->refused = REFUSED_NONE;
    }
    /* The test build's lua_full: the engine's own calls find the state full. */
    if (!r->in_slice && fault_hit(FAULT_LUA_FULL)) {
      r->refused = REFUSED_FULL;
      return NULL;
    }
    if (r->in_slice && !r->killed) {
      /* What the slice will hold. In account mode: the growth of a block
      ** already its own, the whole of one that comes to it, nothing for
      ** one that stays the engine's. */
      size_t add = grow;
      if (r->cur) add = to != (uint32_t)r->cur ? 0 : h && h->acct == to ? grow : nsize + MHDR;
      size_t will = held(r) + add;
      if (add && will > r->judge_at) {
        if (will - r->judge_at > 4 * r->mem_limit) {
          kill_memory(r);
          return NULL;
        }
        judge_soon(r);
      }
    }
  }
  struct mhdr old = h ? *h : (struct mhdr){0, 0, 0};
  /* A block the system refuses is a Lua memory error (mem.h's exception). */
  struct mhdr *nh = realloc(h, nsize + MHDR); /* not mem.h: the Lua state's own */
  if (!nh) {
    r->refused = REFUSED_SYSTEM;
    return NULL;
  }
  if (h) uncharge(r, &old, osize + MHDR);
  charge(r, nh, to, nsize + MHDR);
  return nh + 1;
}

/* Whether the slice is over its memory budget after a full collection. */
static int mem_judge(lrt_t *r, lua_State *L) {
  r->mem_over = 0;
  lua_gc(L, LUA_GCCOLLECT, 0);
  /* LuaJIT's buffer for building strings shrinks by half per collection:
  ** after a big string was built, a second one gives it back. */
  if (held(r) > r->mem_limit) lua_gc(L, LUA_GCCOLLECT, 0);
  if (held(r) > r->mem_limit) {
    kill_memory(r);
    return 1;
  }
  if (!r->cur && r->mem_used < r->mem_base) {
    /* Slice mode: the base was counted with the garbage of earlier
    ** slices; once that is collected, count from what is left, so the
    ** garbage does not become room for this slice (what the slice holds
    ** now is then forgiven: it may hold at most twice its budget before
    ** it is stopped). */
    r->mem_base = r->mem_used;
  }
  r->judge_at = held(r) + r->mem_limit / 2;
  if (r->judge_at < r->mem_limit) r->judge_at = r->mem_limit;
  if (r->cur) r->accts[r->cur].judge_at = r->judge_at;
  return 0;
}

/* The count hook: kills a slice that ran past its time, or that holds more
** than its memory budget after a full collection. */
static void l_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lrt_t *r = lrt_from(L);
  if (r->hook_fast) {
    r->hook_fast = 0;
    lua_sethook(L, l_hook, LUA_MASKCOUNT, HOOK_COUNT);
  }
  if (!r->in_slice) return;
  /* Killed already, yet running: a nested load (skills.check's, lrt_pcall)
  ** caught its kill and the caller went on. The slice is over all the
  ** same: stop it again, or nothing would stop it. */
  if (r->killed) lrt__raise_kill(L, 0);
  if (r->interrupt) {
    /* Ctrl-C in the REPL: stop whatever runs now (lrt_interrupt). */
    r->killed = 1;
    snprintf(r->kill_reason, sizeof r->kill_reason, "interrupted");
    lrt__raise_kill(L, 0);
  }
  if (lrt__slice_over(r)) {
    lrt__kill_time(r);
    lrt__raise_kill(L, 0);
  }
  if (r->mem_over && mem_judge(r, L)) lrt__raise_kill(L, 0);
}

/* See lrt.h: the allocator's userdata is the lrt. */
lrt_t *lrt_from(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

/* See lrt.h (lrt_L, lrt_killed, lrt_memory). */
lua_State *lrt_L(lrt_t *r) { return r->L; }
const char *lrt_killed(const lrt_t *r) { return r->killed ? r->kill_reason : ""; }
size_t lrt_memory(const lrt_t *r) { return r->mem_used; }

/* See lrt.h. Two cycles: LuaJIT's weak-keyed tables (the runtime's task table) keep a
** dead key's value until the cycle after the key was collected. */
void lrt_gc(lrt_t *r) {
  lua_gc(r->L, LUA_GCCOLLECT, 0);
  lua_gc(r->L, LUA_GCCOLLECT, 0);
}

/* Start a slice: a fresh deadline and memory base, no kill yet. in_run:
** a run's coroutine (kill messages say "the run"), else "skill code". */
static void slice_begin(lrt_t *r, int in_run) {
  r->in_slice = 1;
  r->in_run = in_run;
  r->killed = 0;
  r->mem_over = 0;
  r->kill_reason[0] = 0;
  r->deadline_ns = lrt__coarse_ns() + (uint64_t)r->slice_ms * 1000000u;
  r->cpu_start_ns = lrt__cpu_ns();
  r->mem_base = r->mem_used;
  r->judge_at = r->mem_limit;
  if (r->cur) {
    /* Account mode: what the run kept from its earlier slices counts, and
    ** what was charged to it between slices (an HTTP response) too. */
    struct lrt_acct *a = &r->accts[r->cur];
    r->judge_at = a->judge_at;
    if (a->bytes > a->judge_at) judge_soon(r);
  }
}

/* Whether coroutine L was killed in an earlier slice. */
static int thread_killed(lrt_t *r, lua_State *L) {
  if (L == r->L) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->killed_ref);
  lua_pushthread(L);
  lua_rawget(L, -2);
  int k = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return k;
}

/* core.killed(): whether the current slice was killed, or the running
** coroutine (a run) was killed in an earlier slice: a kill is final for
** the run, so skill code cannot catch it with pcall in a later slice. */
static int c_killed(lua_State *L) {
  lrt_t *r = lrt_from(L);
  lua_pushboolean(L, r->killed || thread_killed(r, L));
  return 1;
}

/* core.kill_reason(): the message of the current kill, or nil. */
static int c_kill_reason(lua_State *L) {
  lrt_t *r = lrt_from(L);
  if (r->killed) lua_pushstring(L, r->kill_reason);
  else lua_pushnil(L);
  return 1;
}

/* core.reserve(n): kill the slice now if n more bytes would take it past
** its memory budget (for C functions that allocate their result at once,
** such as string.rep, so that the error names the budget). */
static int c_reserve(lua_State *L) {
  lrt_t *r = lrt_from(L);
  lua_Number n = luaL_checknumber(L, 1);
  if (!r->in_slice || r->killed) return 0;
  if (n > (lua_Number)r->mem_limit - (lua_Number)held(r)) {
    if (held(r) > 0 && n < (lua_Number)r->mem_limit) {
      /* Maybe garbage: judge after a collection. */
      lua_gc(L, LUA_GCCOLLECT, 0);
      if (n <= (lua_Number)r->mem_limit - (lua_Number)held(r)) return 0;
    }
    kill_memory(r);
    return lrt__raise_kill(L, 2); /* where the skill code called string.rep */
  }
  return 0;
}

/* ---- the C stack guard (see lrt.h) ---- */

#define CSTACK_RESERVE_MIN ((size_t)256 << 10)
#define CSTACK_RESERVE_MAX ((size_t)2 << 20)

/* The lowest address the running thread's C code may reach before a call
** back into Lua is refused: the stack's low end plus its reserve. Found
** once per thread (for the main thread, glibc reads it from the stack
** limit and /proc/self/maps). */
static _Thread_local uintptr_t cstack_floor;

static uintptr_t cstack_floor_get(void) {
  if (cstack_floor) return cstack_floor;
  void *lo = NULL;
  size_t size = 0;
  pthread_attr_t a;
  if (!pthread_getattr_np(pthread_self(), &a)) {
    if (pthread_attr_getstack(&a, &lo, &size)) lo = NULL;
    pthread_attr_destroy(&a);
  }
  uintptr_t here = (uintptr_t)__builtin_frame_address(0);
  if (!lo || !size || here < (uintptr_t)lo || here - (uintptr_t)lo > size) {
    /* Unknown: assume the common 8 MB below the current frame, less a margin. */
    lo = (void *)(here - ((size_t)7 << 20));
    size = (size_t)7 << 20;
  }
  size_t reserve = size / 4;
  if (reserve < CSTACK_RESERVE_MIN) reserve = CSTACK_RESERVE_MIN;
  if (reserve > CSTACK_RESERVE_MAX) reserve = CSTACK_RESERVE_MAX;
  cstack_floor = (uintptr_t)lo + reserve;
  return cstack_floor;
}

/* See lrt.h. */
int lrt_cstack_low(void) {
  return (uintptr_t)__builtin_frame_address(0) < cstack_floor_get();
}

/* Raise the guard's error in L; level as for luaL_where. */
static int cstack_raise(lua_State *L, int level, const char *what) {
  luaL_where(L, level);
  lua_pushfstring(L, "stack overflow: %s calls back into Lua too deeply nested (a function "
                  "that calls itself without end?)", what);
  lua_concat(L, 2);
  return lua_error(L);
}

/* See lrt.h. */
void lrt_cstack_check(lua_State *L, const char *what) {
  if (lrt_cstack_low()) cstack_raise(L, 1, what);
}

/* core.cstack(what): the guard for the sandbox's Lua wrappers around the
** library's C functions that call back (string.format, table.sort,
** os.time); the error points at the skill's line, which called the
** wrapper. */
static int c_cstack(lua_State *L) {
  if (lrt_cstack_low()) return cstack_raise(L, 2, luaL_optstring(L, 1, "a C function"));
  return 0;
}

/* core.now(): wall-clock milliseconds. */
static int c_now(lua_State *L) {
  lua_pushnumber(L, (lua_Number)units_now_ms());
  return 1;
}

/* core.duration(s): milliseconds, or nil and a message. */
static int c_duration(lua_State *L) {
  int64_t ms;
  err_t e;
  if (lua_type(L, 1) == LUA_TNUMBER) {
    lua_pushnumber(L, lua_tonumber(L, 1) * 1000);
    return 1;
  }
  if (units_duration(luaL_checkstring(L, 1), &ms, &e)) {
    lua_pushnil(L);
    lua_pushstring(L, e.msg);
    return 2;
  }
  lua_pushnumber(L, (lua_Number)ms);
  return 1;
}

/* core.parse_time(s): milliseconds since the epoch from RFC 3339, or nil and a message. */
static int c_parse_time(lua_State *L) {
  int64_t ms;
  err_t e;
  if (units_parse_rfc3339(luaL_checkstring(L, 1), &ms, &e)) {
    lua_pushnil(L);
    lua_pushstring(L, e.msg);
    return 2;
  }
  lua_pushnumber(L, (lua_Number)ms);
  return 1;
}

/* core.encode(v, limit): JSON text, or nil and a message naming what is wrong. */
static int c_encode(lua_State *L) {
  size_t len, limit = (size_t)luaL_optnumber(L, 2, 0);
  err_t e;
  lua_settop(L, 2);
  char *s = json_encode(L, 1, limit, &len, &e);
  if (!s) {
    lua_pushnil(L);
    lua_pushstring(L, e.msg);
    return 2;
  }
  lua_pushlstring(L, s, len);
  free(s);
  return 1;
}

/* core.decode(s, bounded): the value; raises "json.decode: ..." on bad
** JSON. bounded: text from outside (an HTTP response), whose tree counts
** against the run's budget (json_decode_bounded). */
static int c_decode(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  err_t e;
  int rc = lua_toboolean(L, 2) ? json_decode_bounded(L, s, len, &e) : json_decode_push(L, s, len, &e);
  if (rc) return luaL_error(L, "json.decode: %s", e.msg);
  return 1;
}

/* core.cron_check(expr, tz): true, or nil and a message. */
static int c_cron_check(lua_State *L) {
  cron_t *c;
  err_t e;
  if (cron_parse(luaL_checkstring(L, 1), luaL_optstring(L, 2, NULL), &c, &e)) {
    lua_pushnil(L);
    lua_pushstring(L, e.msg);
    return 2;
  }
  cron_free(c);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.http_date(s): milliseconds since the epoch of an HTTP date
** ("Sun, 06 Nov 1994 08:49:37 GMT"), or nil. */
static int c_http_date(lua_State *L) {
  struct tm tm = {0};
  const char *s = luaL_checkstring(L, 1);
  const char *end = strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end || *end) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushnumber(L, (lua_Number)timegm(&tm) * 1000);
  return 1;
}

/* core.random(): a double in [0, 1) from the OS, for jitter. */
static int c_random(lua_State *L) {
  lua_pushnumber(L, ids_random_unit());
  return 1;
}

/* Push a NULL-terminated word list as a Lua list. */
static void push_words(lua_State *L, const char *const *words) {
  lua_newtable(L);
  for (int i = 0; words[i]; i++) {
    lua_pushstring(L, words[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* core.VOCAB: base/vocab.h's lists (run_statuses, step_statuses,
** step_kinds, trigger_kinds) and ended (the terminal run statuses, a
** set), so the runtime's Lua checks words against the engine's own. */
static void register_vocab(lrt_t *r) {
  lua_State *L = r->L;
  lua_createtable(L, 0, 5);
  push_words(L, vocab_run_statuses), lua_setfield(L, -2, "run_statuses");
  push_words(L, vocab_step_statuses), lua_setfield(L, -2, "step_statuses");
  push_words(L, vocab_step_kinds), lua_setfield(L, -2, "step_kinds");
  push_words(L, vocab_trigger_kinds), lua_setfield(L, -2, "trigger_kinds");
  lua_newtable(L);
  for (int i = 0; vocab_run_statuses[i]; i++) {
    if (!vocab_run_ended(vocab_run_statuses[i])) continue;
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, vocab_run_statuses[i]);
  }
  lua_setfield(L, -2, "ended");
  lrt_register_value(r, "VOCAB");
}

/* core.can_yield(): whether the running coroutine may yield to the engine
** outside a run (the REPL's coroutines do). */
static int c_can_yield(lua_State *L) {
  lrt_t *r = lrt_from(L);
  lua_pushboolean(L, r->yieldable && L == r->yieldable);
  return 1;
}

/* An error outside every protected call: a bug in the engine (skill code
** always runs protected, and the engine's own calls into Lua go through
** lrt_pcall or lrt_protect). LuaJIT would exit(1) without a word; say
** what it was (for a memory error, which limit was met) and abort, so it
** shows as the crash it is. */
static int l_panic(lua_State *L) {
  lrt_t *r = lrt_from(L);
  char full[200] = "";
  if (r->refused == REFUSED_FULL) total_message(r, full, sizeof full);
  else if (r->refused == REFUSED_SYSTEM) snprintf(full, sizeof full, "the system refused memory");
  const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
  fprintf(stderr, "moonloop: internal error: unprotected Lua error: %s%s%s\n", msg,
          *full ? " (" : "", *full ? full : "");
  if (*full) fprintf(stderr, "moonloop: internal error: an engine call into Lua outside "
                     "lrt_protect met it: a bug, please report it\n");
  abort();
  return 0;
}

/* See lrt.h: the state, core with its functions, and the count hook. */
int lrt_new(const struct lrt_opts *o, lrt_t **out, err_t *e) {
  lrt_t *r = mem_calloc(1, sizeof *r);
  r->slice_ms = o && o->slice_ms > 0 ? o->slice_ms : 1000;
  r->mem_limit = o && o->run_memory > 0 ? (size_t)o->run_memory : (size_t)64 << 20;
  r->mem_cap = o && o->state_memory > 0 ? (size_t)o->state_memory : lrt_default_state_memory();
  /* Account 0, the engine's, and group 0 (no group). */
  r->accts = mem_calloc(16, sizeof *r->accts);
  r->groups = mem_calloc(16, sizeof *r->groups);
  r->acct_cap = r->group_cap = 16;
  r->naccts = r->ngroups = 1;
  r->acct_free = -1;
  r->accts[0].state = ACCT_OPEN;
  r->accts[0].judge_at = r->mem_limit;
  r->L = lua_newstate(l_alloc, r);
  if (!r->L) {
    /* LuaJIT could not map its first arena (no memory, or no address space
    ** where it wants it): a state of its own, not the engine's allocation. */
    free(r->accts), free(r->groups), free(r);
    return err_set(e, ERR_NOMEM, "cannot create a Lua state");
  }
  lua_State *L = r->L;
  lua_atpanic(L, l_panic);
  /* LuaJIT's buffer for building strings is made on its first use and
  ** only grows and shrinks after: make it now, so it is the engine's
  ** (account 0) and a run that grows it is not charged for it forever. */
  lua_pushfstring(L, "%s%d", "moonloop", 1);
  lua_pop(L, 1);
  luaL_openlibs(L);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, c_sentinel_gc);
  lua_setfield(L, -2, "__gc");
  r->sentinel_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  arm_sentinel(r, L);
  lua_newtable(L);
  r->core_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushcfunction(L, traceback_handler);
  r->traceback_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushcfunction(L, c_protected);
  r->protect_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  /* The registry's free list (its key 0) is made by the first luaL_unref:
  ** make it now, so no later unref allocates (releasing a run's coroutine
  ** must work when the state is full). */
  lua_pushboolean(L, 1);
  luaL_unref(L, LUA_REGISTRYINDEX, luaL_ref(L, LUA_REGISTRYINDEX));
  lua_newtable(L);
  lua_newtable(L);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  r->killed_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lrt_register(r, "killed", c_killed, NULL);
  lrt_register(r, "kill_reason", c_kill_reason, NULL);
  lrt_register(r, "reserve", c_reserve, NULL);
  lrt_register(r, "cstack", c_cstack, NULL);
  lrt_register(r, "now", c_now, NULL);
  lrt_register(r, "duration", c_duration, NULL);
  lrt_register(r, "parse_time", c_parse_time, NULL);
  lrt_register(r, "encode", c_encode, NULL);
  lrt_register(r, "decode", c_decode, NULL);
  lrt_register(r, "cron_check", c_cron_check, NULL);
  lrt_register(r, "random", c_random, NULL);
  lrt_register(r, "http_date", c_http_date, NULL);
  lrt_register(r, "can_yield", c_can_yield, NULL);
  lrt__patterns_open(r);
  json_open(L);
  lrt_register_value(r, "json");
  register_vocab(r);
#ifdef LRT_BENCH_BUDGET
  /* Benchmark builds only (tests/bench/sandbox_cost.sh): 0 = JIT on and no
  ** hook, 1 = JIT off and no hook, 2 = JIT on and the hook. */
  fprintf(stderr, "moonloop: benchmark build (LRT_BENCH_BUDGET=%d): runaway code is NOT stopped\n",
          LRT_BENCH_BUDGET);
  if (LRT_BENCH_BUDGET == 2)
#endif
  lua_sethook(L, l_hook, LUA_MASKCOUNT, HOOK_COUNT);
  *out = r;
  return 0;
}

/* See lrt.h. NULL is ignored. */
void lrt_free(lrt_t *r) {
  if (!r) return;
  r->closing = 1;
  lua_close(r->L);
  free(r->accts);
  free(r->groups);
  free(r->pending);
  free(r);
}

/* ---- accounts and groups (see lrt.h) ---- */

/* See lrt.h. */
int lrt_group_new(lrt_t *r) {
  if (r->ngroups == r->group_cap) {
    r->groups = mem_realloc(r->groups, (size_t)r->group_cap * 2 * sizeof *r->groups);
    r->group_cap *= 2;
  }
  memset(&r->groups[r->ngroups], 0, sizeof *r->groups);
  return r->ngroups++;
}

/* See lrt.h. */
int lrt_account_open(lrt_t *r, int group) {
  int i = r->acct_free;
  if (i >= 0) {
    r->acct_free = r->accts[i].next_free;
  } else {
    if (r->naccts == r->acct_cap) {
      r->accts = mem_realloc(r->accts, (size_t)r->acct_cap * 2 * sizeof *r->accts);
      r->acct_cap *= 2;
    }
    i = r->naccts++;
    r->accts[i].gen = 0;
  }
  struct lrt_acct *a = &r->accts[i];
  a->bytes = 0;
  a->judge_at = r->mem_limit;
  a->state = ACCT_OPEN;
  a->group = group > 0 && group < r->ngroups ? group : 0;
  return i;
}

/* See lrt.h. */
void lrt_account_close(lrt_t *r, int i) {
  if (i <= 0 || i >= r->naccts || r->accts[i].state != ACCT_OPEN) return;
  if (r->cur == i) r->cur = 0;
  struct lrt_acct *a = &r->accts[i];
  if (a->bytes == 0) {
    acct_recycle(r, (uint32_t)i);
    return;
  }
  if (r->npending == r->pending_cap) {
    int cap = r->pending_cap ? r->pending_cap * 2 : 64;
    r->pending = mem_realloc(r->pending, (size_t)cap * sizeof *r->pending);
    r->pending_cap = cap;
  }
  r->pending[r->npending++] = (struct lrt_pending){i, a->gen};
  a->state = ACCT_CLOSED;
  a->settled = 0;
  a->closed_at = r->gc_cycles;
  r->groups[a->group].held += a->bytes;
}

/* See lrt.h. */
int lrt_account_use(lrt_t *r, int i) {
  int prev = r->cur;
  r->cur = i > 0 && i < r->naccts && r->accts[i].state == ACCT_OPEN ? i : 0;
  return prev;
}

/* See lrt.h. */
size_t lrt_account_bytes(const lrt_t *r, int i) {
  return i >= 0 && i < r->naccts ? r->accts[i].bytes : 0;
}

/* See lrt.h. */
int lrt_group_over(lrt_t *r, int group, size_t *held_out) {
  if (group <= 0 || group >= r->ngroups) return 0;
  struct lrt_group *g = &r->groups[group];
  /* Over a budget not yet settled (garbage, or kept): LuaJIT starts a
  ** cycle only once the heap doubled, so help the collector on with a
  ** bounded number of incremental steps (never a whole collection). */
  for (int i = 0; i < GROUP_GC_STEPS && !g->over && g->held - g->settled > r->mem_limit; i++)
    lua_gc(r->L, LUA_GCSTEP, 0);
  if (held_out) *held_out = g->settled;
  if (!g->over && g->settled > r->mem_limit) {
    /* For good: the state stays, and a skill that refused runs only while
    ** it is over would let every other run grow it again. */
    g->over = 1;
  }
  return g->over;
}

/* See lrt.h. */
size_t lrt_budget(const lrt_t *r) { return r->mem_limit; }

/* The memory limit of the process's cgroup (v2, then v1), or 0 for none. */
static size_t cgroup_memory(void) {
  static const char *const files[] = {"/sys/fs/cgroup/memory.max",
                                      "/sys/fs/cgroup/memory/memory.limit_in_bytes", NULL};
  for (const char *const *f = files; *f; f++) {
    FILE *fp = fopen(*f, "r");
    if (!fp) continue;
    unsigned long long v = 0;
    int n = fscanf(fp, "%llu", &v); /* "max" (no limit) reads nothing */
    fclose(fp);
    if (n == 1 && v > 0 && v < ((unsigned long long)1 << 50)) return (size_t)v;
  }
  return 0;
}

/* See lrt.h: half the machine's memory (or of its cgroup's limit, in a
** container), at most 4 GB, at least 256 MB. */
size_t lrt_default_state_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  size_t cap = (size_t)4 << 30, mem = 0;
  if (pages > 0 && size > 0) mem = (size_t)pages * (size_t)size;
  size_t cg = cgroup_memory();
  if (cg && (!mem || cg < mem)) mem = cg;
  if (mem && mem / 2 < cap) cap = mem / 2;
  if (cap < ((size_t)256 << 20)) cap = (size_t)256 << 20;
  return cap;
}

/* See lrt.h. */
void lrt_register(lrt_t *r, const char *name, lua_CFunction f, void *ud) {
  lua_State *L = r->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->core_ref);
  lua_pushlightuserdata(L, ud);
  lua_pushcclosure(L, f, 1);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* See lrt.h. */
void lrt_register_value(lrt_t *r, const char *name) {
  lua_State *L = r->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->core_ref);
  lua_insert(L, -2);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* package.preload loader for an embedded file: upvalue 1 is the compiled
** chunk; it is called with `core`. */
static int embedded_loader(lua_State *L) {
  lrt_t *r = lrt_from(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->core_ref);
  lua_call(L, 1, 1);
  return 1;
}

/* The message handler of lrt_pcall and lrt_require: the error's text (or
** an error table's message, or its type) with a traceback. */
static int traceback_handler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (lua_istable(L, 1)) {
      lua_getfield(L, 1, "message");
      msg = lua_tostring(L, -1);
    }
    if (!msg) msg = luaL_typename(L, 1);
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* See lrt.h: every embedded file becomes a package.preload loader. */
int lrt_boot(lrt_t *r, err_t *e) {
  lua_State *L = r->L;
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  for (const struct embed_file *f = embed_files; f->name; f++) {
    char chunkname[96];
    snprintf(chunkname, sizeof chunkname, "=moonloop/%s.lua", f->name);
    if (luaL_loadbuffer(L, f->text, f->len, chunkname)) {
      err_set(e, ERR_INTERNAL, "runtime file %s.lua: %s", f->name, lua_tostring(L, -1));
      lua_pop(L, 3);
      return ERR_INTERNAL;
    }
    lua_pushcclosure(L, embedded_loader, 1);
    lua_setfield(L, -2, f->name);
  }
  lua_pop(L, 2);
  return 0;
}

/* See lrt.h. A module loaded already is taken from package.loaded (the
** registry's _LOADED, which require itself reads first) without the call
** through require: every run's start asks for "run". */
int lrt_require(lrt_t *r, const char *name, err_t *e) {
  lua_State *L = r->L;
  lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
  lua_getfield(L, -1, name);
  lua_remove(L, -2);
  if (lua_toboolean(L, -1)) return 0;
  lua_pop(L, 1);
  lua_pushcfunction(L, traceback_handler);
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  if (lua_pcall(L, 1, 1, -3)) {
    err_set(e, ERR_INTERNAL, "loading runtime module '%s': %s", name, lua_tostring(L, -1));
    lua_pop(L, 2);
    return ERR_INTERNAL;
  }
  lua_remove(L, -2);
  return 0;
}

/* See lrt.h. */
int lrt_load_skill_text(lrt_t *r, const char *src, size_t len, const char *chunkname, err_t *e) {
  lua_State *L = r->L;
  char name[512];
  snprintf(name, sizeof name, "@%s", chunkname);
  /* "t": text only. Bytecode could break out of any sandbox. */
  if (len > 0 && src[0] == LUA_SIGNATURE[0])
    return err_set(e, ERR_INVALID, "%s: a skill file must be Lua source text, not bytecode",
                   chunkname);
  if (luaL_loadbufferx(L, src, len, name, "t")) {
    int code = ERR_INVALID;
    err_set(e, code, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return code;
  }
#ifdef LRT_BENCH_BUDGET
  if (LRT_BENCH_BUDGET == 1)
#endif
  luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF);
  return 0;
}

/* lrt_protect's call: fn and its argument, its error record and code. */
struct protect_ctx {
  lrt_t *r;
  int (*fn)(void *arg, err_t *e);
  void *arg;
  err_t *e;
  int rc;
};

/* lrt_protect's function, called with the context as a light userdata: arms the collector's sentinel
** again if it could not arm itself, then calls fn. */
static int c_protected(lua_State *L) {
  struct protect_ctx *p = lua_touserdata(L, 1);
  lua_pop(L, 1);
  if (p->r->sentinel_lost) {
    int prev = p->r->cur;
    p->r->cur = 0;
    arm_sentinel(p->r, L);
    p->r->cur = prev;
    p->r->sentinel_lost = 0;
  }
  p->rc = p->fn(p->arg, p->e);
  return 0;
}

/* See lrt.h. A call made inside a slice (outer) runs in that slice. */
int lrt_pcall(lrt_t *r, int nargs, int nresults, err_t *e) {
  lua_State *L = r->L;
  int base = lua_gettop(L) - nargs;
  /* From the registry: a new closure could fail to allocate, unprotected. */
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->traceback_ref);
  lua_insert(L, base);
  int outer = r->in_slice;
  if (outer && lrt_cstack_low()) {
    /* A call nested in a slice (skills.check loading a skill that calls
    ** skills.check...): refused near the end of the C stack (lrt.h). */
    lua_settop(L, base - 1);
    return err_set(e, ERR_INVALID, "stack overflow: skill loads nested too deeply");
  }
  if (!outer) slice_begin(r, 0);
  int rc = lua_pcall(L, nargs, nresults, base);
  if (!outer) {
    /* Grew past the budget and ended before the hook could judge it. */
    if (!rc && r->mem_over && !r->killed && mem_judge(r, L)) {
      lua_pop(L, nresults == LUA_MULTRET ? lua_gettop(L) - base : nresults);
      lua_pushstring(L, r->kill_reason);
      rc = LUA_ERRMEM;
    }
    r->in_slice = 0;
  }
  if (rc) {
    const char *msg = lua_tostring(L, -1);
    char full[200];
    if (rc == LUA_ERRMEM && !r->killed && r->refused == REFUSED_FULL) {
      /* Refused outside a slice (the engine's reserve is spent too). */
      total_message(r, full, sizeof full);
      msg = full;
    }
    err_set(e, rc == LUA_ERRMEM ? ERR_NOMEM : ERR_INVALID, "%s",
            r->killed ? r->kill_reason : msg ? msg : "error");
    lua_pop(L, 1);
    lua_remove(L, base);
    return e ? e->code : ERR_INVALID;
  }
  lua_remove(L, base);
  return 0;
}

/* See lrt.h. */
int lrt_resume_unbounded(lrt_t *r, lua_State *co, int nargs) {
  slice_begin(r, 0);
  /* No deadline and no memory judgement: only an interrupt stops it. */
  r->deadline_ns = UINT64_MAX;
  r->judge_at = SIZE_MAX;
  int rc = lua_resume(co, nargs);
  r->in_slice = 0;
  return rc;
}

/* See lrt.h (lrt_interrupt, lrt_interrupted, lrt_interrupt_clear,
** lrt_set_yieldable). */
void lrt_interrupt(lrt_t *r) { r->interrupt = 1; }
int lrt_interrupted(const lrt_t *r) { return r->interrupt != 0; }
void lrt_interrupt_clear(lrt_t *r) { r->interrupt = 0; }
void lrt_set_yieldable(lrt_t *r, lua_State *co) { r->yieldable = co; }

/* See lrt.h. */
int lrt_protect(lrt_t *r, int (*fn)(void *arg, err_t *e), void *arg, err_t *e) {
  struct protect_ctx p = {r, fn, arg, e, 0};
  int cur = r->cur, slice = r->in_slice;
  r->refused = REFUSED_NONE;
  /* A function made once and a light userdata: nothing is allocated
  ** before the call is protected (lua_cpcall makes a closure first). */
  lua_rawgeti(r->L, LUA_REGISTRYINDEX, r->protect_ref);
  lua_pushlightuserdata(r->L, &p);
  int rc = lua_pcall(r->L, 1, 0, 0);
  if (!rc) return p.rc;
  /* Thrown past fn: put back what it may have left half switched. */
  r->cur = cur;
  r->in_slice = slice;
  char msg[200];
  if (rc == LUA_ERRMEM && r->refused == REFUSED_SYSTEM)
    snprintf(msg, sizeof msg, "stopped: the system refused memory to the engine's Lua state");
  else if (rc == LUA_ERRMEM)
    total_message(r, msg, sizeof msg);
  else
    snprintf(msg, sizeof msg, "%s", lua_type(r->L, -1) == LUA_TSTRING ? lua_tostring(r->L, -1)
                                                                       : "error in the engine's Lua call");
  lua_pop(r->L, 1);
  /* LuaJIT collects no garbage when an allocation fails: a state full of
  ** what is garbage already (the refused run's input) would refuse every
  ** call after this one. A full collection now gives the next call room. */
  if (rc == LUA_ERRMEM) {
    int prev = r->cur;
    r->cur = 0;
    lua_gc(r->L, LUA_GCCOLLECT, 0);
    r->cur = prev;
  }
  return err_set(e, rc == LUA_ERRMEM ? ERR_NOMEM : ERR_INTERNAL, "%s", msg);
}

/* What lrt_resume does once the coroutine is back, in lrt_protect: judge
** a slice that yielded past its memory budget (a collection, whose
** finalizers allocate) and mark a killed coroutine (a new key in a table). */
struct resumed {
  lrt_t *r;
  lua_State *co;
  int rc;
};

static int after_resume(void *arg, err_t *e) {
  struct resumed *a = arg;
  lrt_t *r = a->r;
  lua_State *co = a->co;
  (void)e;
  /* A slice that yields past its memory budget before the hook could
  ** judge it is killed here: what it yielded is dropped. */
  if (a->rc == LUA_YIELD && r->mem_over && !r->killed && mem_judge(r, r->L)) {
    lua_settop(co, 0);
    lua_pushstring(co, r->kill_reason);
    a->rc = LUA_ERRMEM;
  }
  if (r->killed && co != r->L) {
    /* The kill is final for this coroutine (see c_killed). */
    lua_State *L = r->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->killed_ref);
    lua_pushthread(co);
    lua_xmove(co, L, 1);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
  return 0;
}

/* See lrt.h. A coroutine whose after-part failed (the state full even for
** the engine) is reported killed with the reason: it must not go on. */
int lrt_resume(lrt_t *r, lua_State *co, int nargs) {
  slice_begin(r, 1);
  struct resumed a = {r, co, lua_resume(co, nargs)};
  err_t e;
  r->in_slice = 0; /* the after-part is the engine's: it has the reserve */
  /* Most resumes need no after-part: no protected call for them. */
  int after = (a.rc == LUA_YIELD && r->mem_over && !r->killed) || (r->killed && co != r->L);
  if (after && lrt_protect(r, after_resume, &a, &e)) {
    r->killed = 1;
    snprintf(r->kill_reason, sizeof r->kill_reason, "%.199s", e.msg);
    a.rc = LUA_ERRMEM;
  }
  r->in_slice = 0;
  return a.rc;
}
