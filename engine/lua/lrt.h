/*
** lrt.h: the Lua runtime: one LuaJIT state, its sandboxes, and the budget
** that stops runaway skill code.
**
** Budget. Skill code runs in "slices": from a resume (or a protected call)
** to the next yield. A slice may use at most slice_ms of time; a run may
** hold at most run_memory bytes in its memory account (what it keeps
** across its slices counts: see the accounts below), and a slice with no
** account (a skill's top level) may grow the state by as much. Past
** either, the slice is killed: an error naming the budget is raised in it, and the sandbox's
** pcall/xpcall raise it again so skill code cannot swallow it. A killed
** coroutine stays killed (core.killed() is true in its later slices too),
** so a step that failed by a kill cannot be caught in orchestration code.
** Time is checked by a count hook. LuaJIT never calls hooks from compiled
** traces, so skill chunks are loaded with the JIT off for them
** (luaJIT_setmode ALLFUNC|OFF): they always run in the interpreter, where
** the hook fires; the runtime's own Lua keeps the JIT. Memory: growth past
** the budget makes the hook run a full collection at the next instruction
** and judge what is left (garbage does not count); one C call is refused
** memory four budgets past that point. Time inside one C function is
** invisible to hooks: the sandbox's string.find/match/gmatch/gsub are
** budget-checking copies of LuaJIT's (lrt_pattern.c), and string.rep
** checks the memory budget first (core.reserve); other C functions are
** bounded by the memory budget (see the known limits in
** tests/func/test_runaway.py).
**
** The runtime's Lua files (lua/) are registered in package.preload and
** receive `core`, a table of C functions, as their first argument. Other
** modules add functions to `core` with lrt_register before lrt_boot.
*/
#ifndef ML_LRT_H
#define ML_LRT_H
#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include "base/err.h"

typedef struct lrt lrt_t;

struct lrt_opts {
  int64_t slice_ms;     /* time a slice may run without yielding (default 1000) */
  int64_t run_memory;   /* bytes a run may hold, or a slice with no account grow the heap by
                        ** (default 64 MB) */
  int64_t state_memory; /* cap on the whole state (default lrt_default_state_memory()) */
};

/* The default cap on the whole state: half the machine's memory (or of
** the cgroup's limit, in a container), at most 4 GB, at least 256 MB (so a
** hostile skill meets the cap, and its runs fail, before the kernel kills
** the engine for want of memory). */
size_t lrt_default_state_memory(void);

int lrt_new(const struct lrt_opts *o, lrt_t **out, err_t *e);
void lrt_free(lrt_t *r);
lua_State *lrt_L(lrt_t *r);

/* The lrt owning a Lua state (any of its coroutines). */
lrt_t *lrt_from(lua_State *L);

/* Set core[name] to f with ud as its only upvalue (a light userdata). */
void lrt_register(lrt_t *r, const char *name, lua_CFunction f, void *ud);

/* Set core[name] to the value on top of the stack (popped). */
void lrt_register_value(lrt_t *r, const char *name);

/* Load the runtime's Lua modules; call once, after every lrt_register. */
int lrt_boot(lrt_t *r, err_t *e);

/* Push the runtime module `name` (require(name)); returns 0 or fills e. */
int lrt_require(lrt_t *r, const char *name, err_t *e);

/* Compile skill source, text only, with the JIT off for every function in
** it; push the chunk. chunkname is shown in errors ("skills/x.lua"). */
int lrt_load_skill_text(lrt_t *r, const char *src, size_t len, const char *chunkname, err_t *e);

/* Call the function below nargs arguments on the main stack, under the
** slice budget, with a traceback on error (in e). */
int lrt_pcall(lrt_t *r, int nargs, int nresults, err_t *e);

/* Run fn(arg, e) with the state's errors caught: the engine's C code that
** calls the Lua API outside a slice (pushing a run's input, a response, a
** child's result onto a coroutine; making a coroutine; taking a
** reference) does it in fn, so a block the allocator refuses there (the
** state is full: limits.total_memory and its reserve; or the system said
** no) is an error, not a panic that ends the process. Returns fn's code,
** or ERR_NOMEM (ERR_INTERNAL for another Lua error) with e naming what
** was full; the account in use is the one at the call. After an error
** fn's work is half done: any coroutine it pushed onto must not be
** resumed again (fail its run). fn may call lrt_pcall and nest. */
int lrt_protect(lrt_t *r, int (*fn)(void *arg, err_t *e), void *arg, err_t *e);

/* Resume co with nargs values on its stack, under the slice budget.
** Returns LUA_YIELD, 0 (finished) or an error status (the error is on co). */
int lrt_resume(lrt_t *r, lua_State *co, int nargs);

/* ---- the REPL (engine/cli/repl.c) ----
** Resume co like lrt_resume, but without the slice's time and memory
** budget: the REPL's own code, which a person stops with Ctrl-C. */
int lrt_resume_unbounded(lrt_t *r, lua_State *co, int nargs);

/* Ask the running slice (and any slice that starts before
** lrt_interrupt_clear) to stop at the hook's next check with the error
** "interrupted", as a kill (core.killed() is true, pcall cannot catch it).
** Async-signal-safe: a SIGINT handler calls it. Code compiled by the JIT
** is not stopped until it leaves the trace, as for the budgets. */
void lrt_interrupt(lrt_t *r);
int lrt_interrupted(const lrt_t *r);
void lrt_interrupt_clear(lrt_t *r);

/* The coroutine that may yield ops to the engine outside a run
** (core.can_yield() is true only while it runs); NULL for none. */
void lrt_set_yieldable(lrt_t *r, lua_State *co);

/* Why the last slice was killed ("" if it was not). */
const char *lrt_killed(const lrt_t *r);

/* For long loops in C over skill data (JSON encoding): whether the running
** slice has used up its time; if so the slice is now killed, and the caller
** should stop and fail. 0 for states that are not an lrt's. */
int lrt_time_up(lua_State *L);

/* For JSON trees C code builds from or for skill data (json.decode's,
** json.encode's): the most bytes such a tree may take, the run's memory
** budget (limits.run_memory), as cJSON's tree lives outside the Lua heap
** and its accounts; 0 outside a bounded slice (the engine's own work, the
** REPL) and for states that are not an lrt's. */
size_t lrt_json_cap(lua_State *L);

/* The C stack guard. LuaJIT bounds each coroutine's Lua stack, but not
** the C stack: C code that calls back into Lua (string.gsub's function or
** table replacement, table.sort's comparator, string.format's __tostring,
** os.time's table, skills.check loading a skill) nests one C frame per
** level, and deep recursion through it would overflow the C stack and
** crash the process. Each such call point checks first that the thread's
** C stack still has its reserve left (a quarter of the stack, at least
** 256 KB and at most 2 MB: room for the error's unwinding, the message
** handlers and any one C call that does not call back). The check reads
** the stack pointer only; no state is kept, so it cannot be unbalanced by
** an error unwinding past it.
**
** lrt_cstack_check raises "stack overflow" in L (at the caller's line)
** when the reserve is reached; lrt_cstack_low answers without raising. */
void lrt_cstack_check(lua_State *L, const char *what);
int lrt_cstack_low(void);

/* ---- memory accounts (lrt.c's memory budget) ----
** Every block is charged to an account; a run's coroutine has its own, so
** a run's memory budget counts what it holds across its steps. Groups
** (one per skill version) sum what closed accounts of their runs still
** hold: what those runs left in state the skill's runs share. */

/* A new group (> 0). */
int lrt_group_new(lrt_t *r);

/* Open an account in group (0: none); returns its id (> 0). */
int lrt_account_open(lrt_t *r, int group);

/* Close an account (its run's coroutine went): what is still charged to
** it counts in its group until freed. 0 is ignored. */
void lrt_account_close(lrt_t *r, int acct);

/* Charge the allocations from now on (and the slices that start) to acct
** (0: the engine's; a slice then has a per-slice budget); returns the
** account charged before. */
int lrt_account_use(lrt_t *r, int acct);

/* Bytes charged to an account now (garbage included until collected). */
size_t lrt_account_bytes(const lrt_t *r, int acct);

/* Whether the closed accounts of group that are two collection cycles old
** (what they hold is kept, not garbage) hold more than a run's budget; what
** they hold goes to *held. Never forces a collection. Once a group was
** found over, it stays over. */
int lrt_group_over(lrt_t *r, int group, size_t *held);

/* A run's memory budget (limits.run_memory), in bytes. */
size_t lrt_budget(const lrt_t *r);

/* Bytes the state holds now. */
size_t lrt_memory(const lrt_t *r);

/* Run a full garbage collection. */
void lrt_gc(lrt_t *r);

#endif
