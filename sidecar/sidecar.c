/*
** sidecar.c: the in-process sidecar (see sidecar.h): the watcher's sink is
** the scheduler's registry API. Loads go through sched_load_file, which
** validates, refuses an id another existing file holds, records a rejected
** load's error on the skill record, and answers once the registration is
** durable; unloads through sched_unload_skill, only while the id's live
** version still comes from the file that let go of it.
*/
#include "sidecar/sidecar.h"
#include "base/mem.h"
#include "sidecar/watcher.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sidecar {
  struct engine *en;
  watcher_t *w;
};

/* The scheduler's answer, passed on to the watcher. */
static void on_reply(const struct sched_reply *r, void *arg) {
  cJSON *rec = r->rc == 0 && r->json ? cJSON_Parse(r->json) : NULL;
  const cJSON *id = cJSON_GetObjectItem(rec, "id");
  struct watcher_result res = {r->rc, cJSON_IsString(id) ? id->valuestring : NULL, r->message};
  watcher_done(arg, &res);
  cJSON_Delete(rec);
}

/* The watcher's sink: a load or an unload through the registry API. */
static int submit(void *ud, const struct watcher_op *op, void *token, err_t *e) {
  struct sidecar *sc = ud;
  sched_t *s = sc->en->sched;
  if (op->kind == WATCHER_LOAD)
    return sched_load_file(s, op->path, op->source, op->len, on_reply, token, e);
  return sched_unload_skill(s, op->id, op->path, on_reply, token, e);
}

/* See sidecar.h. */
int sidecar_start(struct engine *en, const char *workspace,
                  void (*on_ready)(void *arg, int loaded, int rejected), void *arg,
                  sidecar_t **out, err_t *e) {
  struct sidecar *sc = mem_calloc(1, sizeof *sc);
  sc->en = en;
  /* The registry's skills that came from this workspace: files deleted
  ** while no engine ran are unregistered by the first batch. */
  cJSON *all = NULL;
  err_t le;
  if (store_list_skills(en->store, &all, &le)) all = NULL;
  size_t nk;
  struct watcher_known *known = watcher_known_of(all, &nk);
  struct watcher_opts o = {
    .loop = &en->loop, .root = workspace, .skills = en->skills,
    .sink = {.ud = sc, .submit = submit},
    .log = stderr, .log_prefix = "moonloop: ",
    .on_ready = on_ready, .ready_arg = arg,
    .known = known, .nknown = nk,
  };
  int rc = watcher_start(&o, &sc->w, e);
  free(known);
  cJSON_Delete(all);
  if (rc) {
    free(sc);
    return rc;
  }
  *out = sc;
  return 0;
}

/* See sidecar.h. */
void sidecar_stop(sidecar_t *sc) {
  if (sc) watcher_stop(sc->w);
}

/* See sidecar.h. */
void sidecar_free(sidecar_t *sc) {
  if (!sc) return;
  watcher_free(sc->w);
  free(sc);
}
