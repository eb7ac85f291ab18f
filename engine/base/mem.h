/*
** mem.h: the engine's allocation functions, and its one out-of-memory
** policy.
**
** The engine is crash-safe by construction: nothing is acknowledged before
** it is durable, and a restarted engine takes every unfinished run up again
** from its journal. So an allocation the system refuses does not travel up
** as an error code through every caller (most of which could only give up
** too, often leaving a promise half kept: a task that wrote and can no
** longer be resumed). It ends the process at once, with a message that
** says so, as Redis's zmalloc does: mem_alloc and its siblings never return
** NULL, and their callers do not check.
**
** Who follows it: every allocation of the engine's C code (these functions;
** tests/lint/alloc.py finds a plain malloc), cJSON, libcurl and libuv (their
** allocators are pointed here at start, engine_process_init); H2O already
** aborts on a failed allocation. Two exceptions, each with its own answer:
**
**   - the Lua state: its allocator (lrt.c) enforces the budgets; a run over
**     its budget, or a block the system refuses, is a Lua memory error for
**     the code that asked, never an abort (a skill cannot kill the engine);
**   - SQLite keeps its allocator and reports SQLITE_NOMEM as an error of
**     the statement; to the engine that is a store error like a full disk
**     (a commit is tried again, a read answers 503).
**
** In test builds the fault point "alloc_fail" (base/fault.h) makes the next
** allocation through these functions fail, so the policy can be seen at
** work: tests/func/test_faults.py.
*/
#ifndef ML_MEM_H
#define ML_MEM_H
#include <stdarg.h>
#include <stddef.h>

/* malloc, calloc, realloc, strdup and strndup that never return NULL: on
** failure they end the process (mem_oom). Sizes of 0 are allowed and give
** a block that must be freed. Free their blocks with free(). */
void *mem_alloc(size_t n);
void *mem_calloc(size_t count, size_t size);
void *mem_realloc(void *p, size_t n);
char *mem_strdup(const char *s);
char *mem_strndup(const char *s, size_t n);
/* A new string formatted like printf's; never NULL. */
char *mem_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *mem_vprintf(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/* The system refused n bytes: say so on stderr and abort (a core dump, as
** for any crash). Also for a library that reports its own allocation
** failure (vasprintf, open_memstream). */
_Noreturn void mem_oom(size_t n);

/* Point cJSON's allocation at these functions (engine_process_init does it,
** with libcurl's and libuv's, before anything allocates). */
void mem_init(void);

/* Bound what cJSON may allocate on this thread from now on to cap bytes
** (0: no bound), with the count at zero: past it, cJSON's allocation
** fails (cJSON_Parse returns NULL) instead of growing. json.decode sets it
** around a parse done for a run, so that a small text cannot become a
** tree of gigabytes outside the run's memory budget; mem_json_bound_hit
** says whether the bound refused a block since it was set. */
void mem_json_bound(size_t cap);
int mem_json_bound_hit(void);

#endif
