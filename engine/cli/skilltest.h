/*
** skilltest.h: the engine under `moonloop test`: a Lua runtime, a
** throwaway store and a virtual clock, driving the cases of *_test.lua
** files (the driver itself is lua/testing_driver.lua).
**
** A test engine is an engine without a scheduler loop: the skill's run
** coroutine is made by lua/run.lua's run.new (the same step code as in
** production) and its ops are interpreted by lua/testing_driver.lua, which mocks
** step bodies by id, answers HTTP requests from mocks, delivers supplied
** events and moves a virtual clock instead of waiting. What the runs did
** is journaled into the throwaway store with store_commit, so their
** records have the shape `moonloop trace` prints.
**
** Budgets: a test file's top level runs under lrt_pcall; each case runs
** in a driver coroutine resumed with lrt_resume, and the driver yields back
** here after every slice of skill code it resumes, so each slice gets the
** engine's time and memory budget as in production.
**
** core functions added for lua/testing*.lua (and nothing else):
**   now()                    the virtual clock (ms) while one is set, else the wall clock
**   test_clock(ms or nil)    set or clear the virtual clock
**   test_compile(src, name)  compile like a skill file (text only, JIT off); main state only
**   test_read(path)          a file's text, or nil, message
**   test_is_file(path)       whether path is a regular file
**   test_registered(id)      source, file of a registered skill's live version
**                            (from the configured database), or nil, message
**   test_sha256(s), test_ulid(ms), test_fmt_duration(ms), test_default_id(file)
**   test_journal(kind, row)  append a row ("version", "skill", "run_new",
**                            "run_set", "step", "attempt", "log")
**   test_commit()            commit the rows appended so far: true, or nil, message
**   test_trace(run_id)       the run record (DESIGN's JSON shape) as a table
**   test_config              {retries, backoff_ms, backoff_max_ms, output_limit}
*/
#ifndef ML_SKILLTEST_H
#define ML_SKILLTEST_H
#include <stdint.h>

#include "base/err.h"
#include "lua/config.h"
#include "lua/lrt.h"
#include "store/store.h"

typedef struct skilltest skilltest_t;

/* One finished case (or a test file that failed to load: name is NULL). */
struct skilltest_result {
  const char *file;
  int line;            /* the line to point at: the failing assertion, or the case */
  const char *name;    /* the case's name */
  int ok;
  const char *message; /* why it failed (several lines), or NULL */
  const char *run_id;  /* the case's last run, or NULL */
  double ms;           /* wall time the case took */
};

typedef void (*skilltest_cb)(const struct skilltest_result *r, void *arg);

/* Open a test engine on a fresh database at db_path, with cfg's limits
** and retry settings; cfg->db is only read to find registered skills. */
int skilltest_open(const struct config *cfg, const char *db_path, skilltest_t **out, err_t *e);
void skilltest_close(skilltest_t *t);

/* Load the test file at path and run its cases in order, calling cb once
** per case (or once, with name NULL, if the file cannot be loaded).
** Returns 0, or a negative code when the engine itself failed. */
int skilltest_run_file(skilltest_t *t, const char *path, skilltest_cb cb, void *arg, err_t *e);

/* The store of the test engine (to print the trace of a run). */
store_t *skilltest_store(skilltest_t *t);

/* moonloop replay: replay run_id of the store src from its journal against
** its own version, as an engine does after a crash, without running
** anything: every recorded step returns or raises what it recorded. *ok
** says whether the code took the journal's path (and ended as the run
** did); *message (malloc'd) says what happened: where it would go on live,
** or the line where it left the journal. Returns 0, or a negative code
** when the run cannot be replayed at all (unknown run, version missing). */
int skilltest_replay(skilltest_t *t, store_t *src, const char *run_id, int *ok, char **message,
                     err_t *e);

#endif
