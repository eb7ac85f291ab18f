/*
** sidecar.h: the sidecar inside `moonloop serve`: the workspace watcher
** (watcher.h) wired to the scheduler's skill registry (sched_load_file,
** sched_unload_skill). Every change is validated as `moonloop check` does
** in a fresh sandbox, checked against the ids other files hold, and made
** live for new runs once durable; a rejected file's error goes on its
** skill's record and into serve's log (stderr), and its previous version
** stays live.
*/
#ifndef ML_SIDECAR_H
#define ML_SIDECAR_H
#include "base/err.h"
#include "core/engine.h"

typedef struct sidecar sidecar_t;

/* Start watching workspace for the engine en (opened in SCHED_SERVE mode,
** started). on_ready fires once, from the loop, when the first scan's
** files were registered (or rejected). */
int sidecar_start(struct engine *en, const char *workspace,
                  void (*on_ready)(void *arg, int loaded, int rejected), void *arg,
                  sidecar_t **out, err_t *e);

/* Stop watching (before the scheduler stops). */
void sidecar_stop(sidecar_t *sc);

/* Free it, after engine_close (no registry answer can come any more). */
void sidecar_free(sidecar_t *sc);

#endif
