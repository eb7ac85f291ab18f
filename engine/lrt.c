/*
** lrt.c: the Lua runtime (see lrt.h for the budget and the boot sequence).
*/
#include "lrt.h"
#include "cron.h"
#include "embed.h"
#include "ids.h"
#include "json.h"
#include "units.h"

#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOOK_COUNT 10000

struct lrt {
  lua_State *L;
  int core_ref;
  size_t mem_used, mem_cap;
  int killed_ref; /* weak set of coroutines that were killed once */
  /* the slice in progress */
  int in_slice;
  int killed;
  int in_run;    /* the slice is a run's coroutine (lrt_resume), not lrt_pcall */
  int mem_over;  /* grew past judge_at: the hook collects, then judges */
  int hook_fast; /* the hook runs at every instruction until it judged */
  uint64_t deadline_ns;
  size_t mem_base, mem_limit;
  size_t judge_at; /* heap size past which the memory is judged again */
  int64_t slice_ms;
  char kill_reason[200];
  /* The REPL (engine/repl.c): a Ctrl-C asks the running slice to stop
  ** (set from a signal handler, read by the hook), and the coroutine
  ** that may yield ops to the engine outside a run (core.can_yield). */
  volatile sig_atomic_t interrupt;
  lua_State *yieldable;
};

static uint64_t coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void l_hook(lua_State *L, lua_Debug *ar);

/* Memory budget. A slice may grow the heap by mem_limit bytes. Garbage
** counts too until the collector has run, so growth past the budget only
** raises mem_over and makes the count hook run at the next instruction:
** it runs a full collection and kills the slice if what is left is still
** over budget, with an error that names the budget. If it is not, the next
** judgement waits until the heap grew by half a budget more (judge_at), so
** a slice that keeps close to its budget does not pay a full collection
** per allocation. A slice that outruns the hook (one C call allocating a
** lot) is refused more than four budgets past judge_at: that raises Lua's own
** "not enough memory" (LUA_ERRMEM) and marks the slice killed, so
** lrt_pcall, task_finished and the sandbox's pcall report the budget (a
** step body's error keeps Lua's message). A slice that yields or returns
** while over budget is judged there. */
static void fmt_bytes(char *buf, size_t n, size_t v) {
  if (v >= ((size_t)1 << 20) && v % ((size_t)1 << 20) == 0) snprintf(buf, n, "%zu MB", v >> 20);
  else if (v >= ((size_t)1 << 20)) snprintf(buf, n, "%.1f MB", (double)v / (1 << 20));
  else if (v >= 1024) snprintf(buf, n, "%zu KB", v >> 10);
  else snprintf(buf, n, "%zu bytes", v);
}

static void kill_memory(lrt_t *r) {
  char b[32];
  fmt_bytes(b, sizeof b, r->mem_limit);
  r->killed = 1;
  snprintf(r->kill_reason, sizeof r->kill_reason,
           "stopped: %s used more than its memory budget of %s without yielding "
           "(limits.run_memory)", r->in_run ? "the run" : "skill code", b);
}

static void kill_time(lrt_t *r) {
  r->killed = 1;
  snprintf(r->kill_reason, sizeof r->kill_reason,
           "stopped: %s ran for more than %lld ms without yielding "
           "(limits.run_seconds_between_yields)", r->in_run ? "the run" : "skill code",
           (long long)r->slice_ms);
}

static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize);

int lrt_time_up(lua_State *L) {
  void *ud;
  if (lua_getallocf(L, &ud) != l_alloc) return 0;
  lrt_t *r = ud;
  if (r->killed) return 1;
  if (!r->in_slice || coarse_ns() <= r->deadline_ns) return 0;
  kill_time(r);
  return 1;
}

/* Raise the kill in L, where the code was stopped ("file.lua:12: ..."). */
static int raise_kill(lua_State *L, int level) {
  luaL_where(L, level);
  lua_pushstring(L, lrt_from(L)->kill_reason);
  lua_concat(L, 2);
  return lua_error(L);
}

/* The allocator keeps count of the state's memory, refuses growth past the
** state's cap and more than four budgets past judge_at (see above). */
static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lrt_t *r = ud;
  if (!ptr) osize = 0;
  if (nsize == 0) {
    free(ptr);
    r->mem_used -= osize;
    return NULL;
  }
  if (nsize > osize) {
    size_t grow = nsize - osize, after = r->mem_used + grow;
    if (after > r->mem_cap) return NULL;
    if (r->in_slice && !r->killed && after > r->judge_at) {
      if (after - r->judge_at > 4 * r->mem_limit) {
        kill_memory(r);
        return NULL;
      }
      if (!r->mem_over) {
        r->mem_over = 1;
        /* Have the hook judge at the very next instruction (lua_sethook
        ** is safe anywhere, even in a signal handler: it only sets the
        ** hook fields and the dispatch table). */
        lua_sethook(r->L, l_hook, LUA_MASKCOUNT, 1);
        r->hook_fast = 1;
      }
    }
  }
  void *p = realloc(ptr, nsize);
  if (!p) return NULL;
  r->mem_used = r->mem_used - osize + nsize;
  return p;
}

/* Whether the slice is over its memory budget after a full collection. */
static int mem_judge(lrt_t *r, lua_State *L) {
  r->mem_over = 0;
  size_t budget = r->mem_base + r->mem_limit;
  lua_gc(L, LUA_GCCOLLECT, 0);
  /* LuaJIT's buffer for building strings shrinks by half per collection:
  ** after a big string was built, a second one gives it back. */
  if (r->mem_used > budget) lua_gc(L, LUA_GCCOLLECT, 0);
  if (r->mem_used > budget) {
    kill_memory(r);
    return 1;
  }
  /* The base was counted with the garbage of earlier slices: once that is
  ** collected, count from what is left, so the garbage does not become
  ** room for this slice (what the slice holds now is then forgiven: it
  ** may hold at most twice its budget before it is stopped). */
  if (r->mem_used < r->mem_base) {
    r->mem_base = r->mem_used;
    budget = r->mem_base + r->mem_limit;
  }
  r->judge_at = r->mem_used + r->mem_limit / 2;
  if (r->judge_at < budget) r->judge_at = budget;
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
  if (!r->in_slice || r->killed) return;
  if (r->interrupt) {
    /* Ctrl-C in the REPL: stop whatever runs now (lrt_interrupt). */
    r->killed = 1;
    snprintf(r->kill_reason, sizeof r->kill_reason, "interrupted");
    raise_kill(L, 0);
  }
  if (coarse_ns() > r->deadline_ns) {
    kill_time(r);
    raise_kill(L, 0);
  }
  if (r->mem_over && mem_judge(r, L)) raise_kill(L, 0);
}

lrt_t *lrt_from(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

lua_State *lrt_L(lrt_t *r) { return r->L; }
const char *lrt_killed(const lrt_t *r) { return r->killed ? r->kill_reason : ""; }
size_t lrt_memory(const lrt_t *r) { return r->mem_used; }
/* Two cycles: LuaJIT's weak-keyed tables (the runtime's task table) keep a
** dead key's value until the cycle after the key was collected. */
void lrt_gc(lrt_t *r) {
  lua_gc(r->L, LUA_GCCOLLECT, 0);
  lua_gc(r->L, LUA_GCCOLLECT, 0);
}

static void slice_begin(lrt_t *r, int in_run) {
  r->in_slice = 1;
  r->in_run = in_run;
  r->killed = 0;
  r->mem_over = 0;
  r->kill_reason[0] = 0;
  r->deadline_ns = coarse_ns() + (uint64_t)r->slice_ms * 1000000u;
  r->mem_base = r->mem_used;
  r->judge_at = r->mem_base + r->mem_limit;
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
  if (n > (lua_Number)(r->mem_base + r->mem_limit) - (lua_Number)r->mem_used) {
    if (r->mem_used > r->mem_base && n < (lua_Number)r->mem_limit) {
      /* Maybe garbage: judge after a collection. */
      lua_gc(L, LUA_GCCOLLECT, 0);
      if (n <= (lua_Number)(r->mem_base + r->mem_limit) - (lua_Number)r->mem_used) return 0;
    }
    kill_memory(r);
    return raise_kill(L, 2); /* where the skill code called string.rep */
  }
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

/* core.decode(s): the value; raises "json.decode: ..." on bad JSON. */
static int c_decode(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  err_t e;
  if (json_decode_push(L, s, len, &e)) return luaL_error(L, "json.decode: %s", e.msg);
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

/* core.can_yield(): whether the running coroutine may yield to the engine
** outside a run (the REPL's coroutines do). */
static int c_can_yield(lua_State *L) {
  lrt_t *r = lrt_from(L);
  lua_pushboolean(L, r->yieldable && L == r->yieldable);
  return 1;
}

/* ---- Pattern matching under the time budget ----
**
** string.find/match/gmatch/gsub spend all their time inside one C call,
** where the count hook never fires: a backtracking pattern such as
** ("a*"):rep(3) .. "b" on a long string runs for hours, and LuaJIT's plain
** find is O(n*m). These are the same functions (Lua 5.1's matcher, with
** LuaJIT's ASCII character classes, its "pattern too complex" depth limit
** and its gmatch/gsub rules), checking the slice's deadline every
** PAT_CHECK steps; the sandbox installs them in the string library that
** skill code sees (and in the string metatable). Plain finds use memmem,
** which is linear. */

#define PAT_MAXCAPTURES 32
#define PAT_MAXDEPTH 200 /* LuaJIT's LJ_MAX_XLEVEL */
#define PAT_CHECK 0x3fff
#define CAP_UNFINISHED (-1)
#define CAP_POSITION (-2)
#define L_ESC '%'
#define PAT_SPECIALS "^$*+?.([%-"

typedef struct {
  const char *src_init, *src_end;
  lua_State *L;
  lrt_t *r;
  int level, depth;
  unsigned steps;
  struct {
    const char *init;
    ptrdiff_t len;
  } capture[PAT_MAXCAPTURES];
} pat_state;

static void pat_tick(pat_state *ms) {
  if ((++ms->steps & PAT_CHECK) != 0) return;
  lrt_t *r = ms->r;
  if (r->in_slice && !r->killed && coarse_ns() > r->deadline_ns) {
    kill_time(r);
    raise_kill(ms->L, 1);
  }
}

/* LuaJIT's character classes: ASCII only, whatever the locale. */
static int pc_upper(int c) { return c >= 'A' && c <= 'Z'; }
static int pc_lower(int c) { return c >= 'a' && c <= 'z'; }
static int pc_alpha(int c) { return pc_upper(c) || pc_lower(c); }
static int pc_digit(int c) { return c >= '0' && c <= '9'; }
static int pc_alnum(int c) { return pc_alpha(c) || pc_digit(c); }
static int pc_space(int c) { return c == ' ' || (c >= 9 && c <= 13); }
static int pc_cntrl(int c) { return c < 32 || c == 127; }
static int pc_punct(int c) { return c > 32 && c < 127 && !pc_alnum(c); }
static int pc_xdigit(int c) { return pc_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int pc_tolower(int c) { return pc_upper(c) ? c + 32 : c; }

static int pat_check_capture(pat_state *ms, int l) {
  l -= '1';
  if (l < 0 || l >= ms->level || ms->capture[l].len == CAP_UNFINISHED)
    return luaL_error(ms->L, "invalid capture index");
  return l;
}

static int pat_capture_to_close(pat_state *ms) {
  int level = ms->level;
  for (level--; level >= 0; level--)
    if (ms->capture[level].len == CAP_UNFINISHED) return level;
  return luaL_error(ms->L, "invalid pattern capture");
}

static const char *pat_classend(pat_state *ms, const char *p) {
  switch (*p++) {
  case L_ESC:
    if (*p == '\0') luaL_error(ms->L, "malformed pattern (ends with '%%')");
    return p + 1;
  case '[':
    if (*p == '^') p++;
    do { /* look for a `]' */
      if (*p == '\0') luaL_error(ms->L, "malformed pattern (missing ']')");
      if (*(p++) == L_ESC && *p != '\0') p++; /* skip escapes (e.g. `%]') */
    } while (*p != ']');
    return p + 1;
  default:
    return p;
  }
}

static int pat_match_class(int c, int cl) {
  int res;
  switch (pc_tolower(cl)) {
  case 'a': res = pc_alpha(c); break;
  case 'c': res = pc_cntrl(c); break;
  case 'd': res = pc_digit(c); break;
  case 'g': res = c > 32 && c < 127; break;
  case 'l': res = pc_lower(c); break;
  case 'p': res = pc_punct(c); break;
  case 's': res = pc_space(c); break;
  case 'u': res = pc_upper(c); break;
  case 'w': res = pc_alnum(c); break;
  case 'x': res = pc_xdigit(c); break;
  case 'z': res = (c == 0); break;
  default: return (cl == c);
  }
  if (pc_upper(cl)) res = !res;
  return res;
}

static int pat_match_bracket(int c, const char *p, const char *ec) {
  int sig = 1;
  if (*(p + 1) == '^') {
    sig = 0;
    p++; /* skip the `^' */
  }
  while (++p < ec) {
    if (*p == L_ESC) {
      p++;
      if (pat_match_class(c, (unsigned char)*p)) return sig;
    } else if (*(p + 1) == '-' && (p + 2 < ec)) {
      p += 2;
      if ((unsigned char)*(p - 2) <= c && c <= (unsigned char)*p) return sig;
    } else if ((unsigned char)*p == c) {
      return sig;
    }
  }
  return !sig;
}

static int pat_single(int c, const char *p, const char *ep) {
  switch (*p) {
  case '.': return 1;
  case L_ESC: return pat_match_class(c, (unsigned char)*(p + 1));
  case '[': return pat_match_bracket(c, p, ep - 1);
  default: return ((unsigned char)*p == c);
  }
}

static const char *pat_match(pat_state *ms, const char *s, const char *p);

static const char *pat_balance(pat_state *ms, const char *s, const char *p) {
  if (*p == 0 || *(p + 1) == 0) luaL_error(ms->L, "unbalanced pattern");
  if (*s != *p) return NULL;
  int b = *p, e = *(p + 1), cont = 1;
  while (++s < ms->src_end) {
    if (*s == e) {
      if (--cont == 0) return s + 1;
    } else if (*s == b) {
      cont++;
    }
  }
  return NULL;
}

static const char *pat_max_expand(pat_state *ms, const char *s, const char *p, const char *ep) {
  ptrdiff_t i = 0;
  while ((s + i) < ms->src_end && pat_single((unsigned char)*(s + i), p, ep)) i++;
  /* try with maximum repetitions; then fewer */
  while (i >= 0) {
    const char *res = pat_match(ms, (s + i), ep + 1);
    if (res) return res;
    i--;
  }
  return NULL;
}

static const char *pat_min_expand(pat_state *ms, const char *s, const char *p, const char *ep) {
  for (;;) {
    const char *res = pat_match(ms, s, ep + 1);
    if (res != NULL) return res;
    if (s < ms->src_end && pat_single((unsigned char)*s, p, ep)) s++;
    else return NULL;
  }
}

static const char *pat_start_capture(pat_state *ms, const char *s, const char *p, int what) {
  int level = ms->level;
  if (level >= PAT_MAXCAPTURES) luaL_error(ms->L, "too many captures");
  ms->capture[level].init = s;
  ms->capture[level].len = what;
  ms->level = level + 1;
  const char *res = pat_match(ms, s, p);
  if (res == NULL) ms->level--; /* undo capture */
  return res;
}

static const char *pat_end_capture(pat_state *ms, const char *s, const char *p) {
  int l = pat_capture_to_close(ms);
  ms->capture[l].len = s - ms->capture[l].init; /* close capture */
  const char *res = pat_match(ms, s, p);
  if (res == NULL) ms->capture[l].len = CAP_UNFINISHED; /* undo capture */
  return res;
}

static const char *pat_match_capture(pat_state *ms, const char *s, int l) {
  l = pat_check_capture(ms, l);
  size_t len = (size_t)ms->capture[l].len;
  if ((size_t)(ms->src_end - s) >= len && memcmp(ms->capture[l].init, s, len) == 0)
    return s + len;
  return NULL;
}

static const char *pat_match(pat_state *ms, const char *s, const char *p) {
  pat_tick(ms);
  if (++ms->depth > PAT_MAXDEPTH) luaL_error(ms->L, "pattern too complex");
init: /* using goto's to optimize tail recursion */
  switch (*p) {
  case '(': /* start capture */
    if (*(p + 1) == ')') s = pat_start_capture(ms, s, p + 2, CAP_POSITION);
    else s = pat_start_capture(ms, s, p + 1, CAP_UNFINISHED);
    break;
  case ')': /* end capture */
    s = pat_end_capture(ms, s, p + 1);
    break;
  case L_ESC:
    switch (*(p + 1)) {
    case 'b': /* balanced string? */
      s = pat_balance(ms, s, p + 2);
      if (s == NULL) break;
      p += 4;
      goto init;
    case 'f': { /* frontier? */
      const char *ep;
      char previous;
      p += 2;
      if (*p != '[') luaL_error(ms->L, "missing '[' after '%%f' in pattern");
      ep = pat_classend(ms, p);
      previous = (s == ms->src_init) ? '\0' : *(s - 1);
      if (pat_match_bracket((unsigned char)previous, p, ep - 1) ||
          !pat_match_bracket((unsigned char)*s, p, ep - 1)) {
        s = NULL;
        break;
      }
      p = ep;
      goto init;
    }
    default:
      if (pc_digit((unsigned char)*(p + 1))) { /* capture results (%0-%9)? */
        s = pat_match_capture(ms, s, (unsigned char)*(p + 1));
        if (s == NULL) break;
        p += 2;
        goto init;
      }
      goto dflt;
    }
    break;
  case '\0': /* end of pattern */
    break;   /* match succeeded */
  case '$':
    if (*(p + 1) != '\0') goto dflt; /* not the last char of the pattern */
    if (s != ms->src_end) s = NULL;  /* check end of string */
    break;
  default:
  dflt: { /* a pattern item */
    const char *ep = pat_classend(ms, p);
    int m = s < ms->src_end && pat_single((unsigned char)*s, p, ep);
    switch (*ep) {
    case '?': {
      const char *res;
      if (m && ((res = pat_match(ms, s + 1, ep + 1)) != NULL)) {
        s = res;
        break;
      }
      p = ep + 1;
      goto init;
    }
    case '*': s = pat_max_expand(ms, s, p, ep); break;
    case '+': s = (m ? pat_max_expand(ms, s + 1, p, ep) : NULL); break;
    case '-': s = pat_min_expand(ms, s, p, ep); break;
    default:
      if (m) {
        s++;
        p = ep;
        goto init;
      }
      s = NULL;
      break;
    }
    break;
  }
  }
  ms->depth--;
  return s;
}

static void pat_push_one(pat_state *ms, int i, const char *s, const char *e) {
  if (i >= ms->level) {
    if (i == 0) lua_pushlstring(ms->L, s, (size_t)(e - s)); /* whole match */
    else luaL_error(ms->L, "invalid capture index");
  } else {
    ptrdiff_t l = ms->capture[i].len;
    if (l == CAP_UNFINISHED) luaL_error(ms->L, "unfinished capture");
    if (l == CAP_POSITION) lua_pushinteger(ms->L, ms->capture[i].init - ms->src_init + 1);
    else lua_pushlstring(ms->L, ms->capture[i].init, (size_t)l);
  }
}

static int pat_push_captures(pat_state *ms, const char *s, const char *e) {
  int nlevels = (ms->level == 0 && s) ? 1 : ms->level;
  luaL_checkstack(ms->L, nlevels, "too many captures");
  for (int i = 0; i < nlevels; i++) pat_push_one(ms, i, s, e);
  return nlevels;
}

static void pat_init(pat_state *ms, lua_State *L, const char *s, size_t ls) {
  ms->L = L;
  ms->r = lrt_from(L);
  ms->src_init = s;
  ms->src_end = s + ls;
  ms->steps = 0;
}

static int pat_has_specials(const char *p, size_t lp) {
  for (size_t i = 0; i < lp; i++)
    if (strchr(PAT_SPECIALS, p[i]) && p[i]) return 1;
  return 0;
}

static int pat_find_aux(lua_State *L, int find) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  ptrdiff_t init = (ptrdiff_t)luaL_optinteger(L, 3, 1);
  if (init < 0) init += (ptrdiff_t)ls;
  else init--;
  if (init < 0) init = 0;
  if ((size_t)init > ls) init = (ptrdiff_t)ls;
  if (find && (lua_toboolean(L, 4) || !pat_has_specials(p, lp))) {
    /* plain search: memmem is linear (two-way), unlike a naive search */
    const char *q = lp == 0 ? s + init : memmem(s + init, ls - (size_t)init, p, lp);
    if (q) {
      lua_pushinteger(L, q - s + 1);
      lua_pushinteger(L, q - s + (ptrdiff_t)lp);
      return 2;
    }
  } else {
    pat_state ms;
    const char *s1 = s + init;
    int anchor = (*p == '^');
    if (anchor) p++;
    pat_init(&ms, L, s, ls);
    do {
      const char *res;
      ms.level = ms.depth = 0;
      if ((res = pat_match(&ms, s1, p)) != NULL) {
        if (find) {
          lua_pushinteger(L, s1 - s + 1); /* start */
          lua_pushinteger(L, res - s);    /* end */
          return pat_push_captures(&ms, NULL, 0) + 2;
        }
        return pat_push_captures(&ms, s1, res);
      }
    } while (s1++ < ms.src_end && !anchor);
  }
  lua_pushnil(L);
  return 1;
}

static int c_str_find(lua_State *L) { return pat_find_aux(L, 1); }
static int c_str_match(lua_State *L) { return pat_find_aux(L, 0); }

static int pat_gmatch_aux(lua_State *L) {
  size_t ls;
  const char *s = lua_tolstring(L, lua_upvalueindex(1), &ls);
  const char *p = lua_tostring(L, lua_upvalueindex(2));
  pat_state ms;
  pat_init(&ms, L, s, ls);
  for (const char *src = s + (size_t)lua_tointeger(L, lua_upvalueindex(3)); src <= ms.src_end;
       src++) {
    const char *e;
    ms.level = ms.depth = 0;
    if ((e = pat_match(&ms, src, p)) != NULL) {
      lua_Integer newstart = e - s;
      if (e == src) newstart++; /* empty match: go at least one position */
      lua_pushinteger(L, newstart);
      lua_replace(L, lua_upvalueindex(3));
      return pat_push_captures(&ms, src, e);
    }
  }
  return 0; /* not found */
}

static int c_str_gmatch(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lua_pushinteger(L, 0);
  lua_pushcclosure(L, pat_gmatch_aux, 3);
  return 1;
}

static void pat_add_s(pat_state *ms, luaL_Buffer *b, const char *s, const char *e) {
  size_t l;
  const char *news = lua_tolstring(ms->L, 3, &l);
  for (size_t i = 0; i < l; i++) {
    if (news[i] != L_ESC) {
      luaL_addchar(b, news[i]);
    } else {
      i++; /* skip ESC */
      if (!pc_digit((unsigned char)news[i])) {
        luaL_addchar(b, news[i]);
      } else if (news[i] == '0') {
        luaL_addlstring(b, s, (size_t)(e - s));
      } else {
        pat_push_one(ms, news[i] - '1', s, e);
        luaL_addvalue(b); /* add capture to accumulated result */
      }
    }
  }
}

static void pat_add_value(pat_state *ms, luaL_Buffer *b, const char *s, const char *e) {
  lua_State *L = ms->L;
  switch (lua_type(L, 3)) {
  case LUA_TNUMBER:
  case LUA_TSTRING: pat_add_s(ms, b, s, e); return;
  case LUA_TFUNCTION: {
    lua_pushvalue(L, 3);
    int n = pat_push_captures(ms, s, e);
    lua_call(L, n, 1);
    break;
  }
  case LUA_TTABLE:
    pat_push_one(ms, 0, s, e);
    lua_gettable(L, 3);
    break;
  }
  if (!lua_toboolean(L, -1)) { /* nil or false? */
    lua_pop(L, 1);
    lua_pushlstring(L, s, (size_t)(e - s)); /* keep original text */
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  }
  luaL_addvalue(b); /* add result to accumulator */
}

static int c_str_gsub(lua_State *L) {
  size_t srcl;
  const char *src = luaL_checklstring(L, 1, &srcl);
  const char *p = luaL_checkstring(L, 2);
  int tr = lua_type(L, 3);
  lua_Integer max_s = luaL_optinteger(L, 4, (lua_Integer)srcl + 1);
  int anchor = (*p == '^');
  if (anchor) p++;
  lua_Integer n = 0;
  pat_state ms;
  luaL_Buffer b;
  luaL_argcheck(L, tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION || tr == LUA_TTABLE,
                3, "string/function/table expected");
  luaL_buffinit(L, &b);
  pat_init(&ms, L, src, srcl);
  while (n < max_s) {
    const char *e;
    ms.level = ms.depth = 0;
    e = pat_match(&ms, src, p);
    if (e) {
      n++;
      pat_add_value(&ms, &b, src, e);
    }
    if (e && e > src) src = e; /* non empty match: skip it */
    else if (src < ms.src_end) luaL_addchar(&b, *src++);
    else break;
    if (anchor) break;
  }
  luaL_addlstring(&b, src, (size_t)(ms.src_end - src));
  luaL_pushresult(&b);
  lua_pushinteger(L, n); /* number of substitutions */
  return 2;
}

int lrt_new(const struct lrt_opts *o, lrt_t **out, err_t *e) {
  lrt_t *r = calloc(1, sizeof *r);
  if (!r) return err_set(e, ERR_NOMEM, "out of memory");
  r->slice_ms = o && o->slice_ms > 0 ? o->slice_ms : 1000;
  r->mem_limit = o && o->run_memory > 0 ? (size_t)o->run_memory : (size_t)64 << 20;
  r->mem_cap = o && o->state_memory > 0 ? (size_t)o->state_memory : (size_t)4 << 30;
  r->L = lua_newstate(l_alloc, r);
  if (!r->L) {
    free(r);
    return err_set(e, ERR_NOMEM, "cannot create a Lua state");
  }
  lua_State *L = r->L;
  luaL_openlibs(L);
  lua_newtable(L);
  r->core_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  lua_newtable(L);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  r->killed_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lrt_register(r, "killed", c_killed, NULL);
  lrt_register(r, "kill_reason", c_kill_reason, NULL);
  lrt_register(r, "reserve", c_reserve, NULL);
  lrt_register(r, "now", c_now, NULL);
  lrt_register(r, "duration", c_duration, NULL);
  lrt_register(r, "parse_time", c_parse_time, NULL);
  lrt_register(r, "encode", c_encode, NULL);
  lrt_register(r, "decode", c_decode, NULL);
  lrt_register(r, "cron_check", c_cron_check, NULL);
  lrt_register(r, "random", c_random, NULL);
  lrt_register(r, "http_date", c_http_date, NULL);
  lrt_register(r, "can_yield", c_can_yield, NULL);
  lrt_register(r, "str_find", c_str_find, NULL);
  lrt_register(r, "str_match", c_str_match, NULL);
  lrt_register(r, "str_gmatch", c_str_gmatch, NULL);
  lrt_register(r, "str_gsub", c_str_gsub, NULL);
  json_open(L);
  lrt_register_value(r, "json");
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

void lrt_free(lrt_t *r) {
  if (!r) return;
  lua_close(r->L);
  free(r);
}

void lrt_register(lrt_t *r, const char *name, lua_CFunction f, void *ud) {
  lua_State *L = r->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->core_ref);
  lua_pushlightuserdata(L, ud);
  lua_pushcclosure(L, f, 1);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

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

int lrt_require(lrt_t *r, const char *name, err_t *e) {
  lua_State *L = r->L;
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

int lrt_pcall(lrt_t *r, int nargs, int nresults, err_t *e) {
  lua_State *L = r->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback_handler);
  lua_insert(L, base);
  int outer = r->in_slice;
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
    err_set(e, rc == LUA_ERRMEM ? ERR_NOMEM : ERR_INVALID, "%s",
            r->killed ? r->kill_reason : msg ? msg : "error");
    lua_pop(L, 1);
    lua_remove(L, base);
    return e ? e->code : ERR_INVALID;
  }
  lua_remove(L, base);
  return 0;
}

int lrt_resume_unbounded(lrt_t *r, lua_State *co, int nargs) {
  slice_begin(r, 0);
  /* No deadline and no memory judgement: only an interrupt stops it. */
  r->deadline_ns = UINT64_MAX;
  r->judge_at = SIZE_MAX;
  int rc = lua_resume(co, nargs);
  r->in_slice = 0;
  return rc;
}

void lrt_interrupt(lrt_t *r) { r->interrupt = 1; }
int lrt_interrupted(const lrt_t *r) { return r->interrupt != 0; }
void lrt_interrupt_clear(lrt_t *r) { r->interrupt = 0; }
void lrt_set_yieldable(lrt_t *r, lua_State *co) { r->yieldable = co; }

int lrt_resume(lrt_t *r, lua_State *co, int nargs) {
  slice_begin(r, 1);
  int rc = lua_resume(co, nargs);
  /* A slice that yields past its memory budget before the hook could
  ** judge it is killed here: what it yielded is dropped. */
  if (rc == LUA_YIELD && r->mem_over && !r->killed && mem_judge(r, r->L)) {
    lua_settop(co, 0);
    lua_pushstring(co, r->kill_reason);
    rc = LUA_ERRMEM;
  }
  r->in_slice = 0;
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
  return rc;
}
