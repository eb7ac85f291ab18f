/*
** engine.h: one engine in one process: the loop, the store, the Lua
** runtime, the skill cache, the HTTP client and the scheduler, opened and
** closed together in the right order. The CLI commands and the server use
** it; they never wire the parts by hand.
*/
#ifndef ML_ENGINE_H
#define ML_ENGINE_H
#include <uv.h>

#include "base/err.h"
#include "core/httpc.h"
#include "core/sched.h"
#include "lua/config.h"
#include "lua/lrt.h"
#include "lua/skill.h"
#include "store/store.h"

struct engine {
  const struct config *cfg;
  uv_loop_t loop;
  int loop_open;
  store_t *store;
  lrt_t *lrt;
  skills_t *skills;
  httpc_t *http;
  sched_t *sched;
};

/* Once per process, before anything else: cJSON, libcurl and libuv
** allocate through base/mem.h, so an allocation the system refuses ends the
** process with a message wherever it happens (mem.h's policy). */
void engine_process_init(void);

/* Open only the store (commands that read or write state without running skills). */
int engine_open_store(struct engine *en, const struct config *cfg, err_t *e);

/* Open only the Lua runtime and the skill cache (moonloop check). */
int engine_open_runtime(struct engine *en, const struct config *cfg, err_t *e);

/* Open everything, with the scheduler in mode (not started yet). */
int engine_open(struct engine *en, const struct config *cfg, enum sched_mode mode, int verbose,
                err_t *e);

/* Load a skill file, and journal its version (and, if register, make it
** the skill's live version in the registry; ERR_CONFLICT, saying why, when
** the registry refuses it: a concurrency scope it names has another limit
** in another live skill). */
int engine_load_file(struct engine *en, const char *path, int register_it, struct skill **out,
                     struct skill_error *se);

/* Load the live version of a registered skill (from the skill cache, else
** its source from the store), for the CLI's run and the REPL. ERR_NOTFOUND
** says when id is neither a file nor a registered skill, or has no live
** version. (Added by the refactor: cli_run.c and repl.c had a copy each.) */
int engine_load_registered(struct engine *en, const char *id, struct skill **out, err_t *e);

/* Run the loop until the scheduler stops. */
int engine_run(struct engine *en);

void engine_close(struct engine *en);

#endif
