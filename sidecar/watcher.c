/*
** watcher.c: the workspace watcher (see watcher.h for what it promises,
** watcher_int.h for its state): paths, the file records and when they are
** due, and the watcher's start, stop and free. Folders and rescans are in
** watcher_scan.c; reading due files and the batches in watcher_batch.c.
**
** Invariants: a file record is in the table once (by rel); every change of
** a record's due time, and every stale id added, re-arms the due timer
** (watcher__arm_due, which waits while a batch is in flight: the batch's
** end arms it); a stale id is listed once per (id, path).
*/
#include "sidecar/watcher_int.h"
#include "base/mem.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

/* See watcher_int.h. */
char *watcher__join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *p = mem_alloc(la + lb + 2);
  if (la) {
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
  } else {
    memcpy(p, b, lb + 1);
  }
  return p;
}

/* See watcher_int.h. */
char *watcher__local_path(const watcher_t *w, const char *rel) {
  return *rel ? watcher__join(w->root, rel) : mem_strdup(w->root);
}

/* See watcher.h. */
int watcher_counts(const char *name) {
  size_t n = strlen(name);
  /* (issue 6) "*_test.lua" files are skill tests (moonloop test), not skills. */
  if (n > 9 && !strcmp(name + n - 9, "_test.lua")) return 0;
  return n > 4 && name[0] != '.' && name[0] != '#' && !strcmp(name + n - 4, ".lua");
}

/* ---- file records ----------------------------------------------------- */

/* Free a record and its strings. */
static void file_free(struct wfile *f) {
  free(f->rel), free(f->path), free(f->id), free(f->rejected);
  free(f);
}

/* See watcher_int.h. */
struct wfile *watcher__find_file(watcher_t *w, const char *rel) {
  for (size_t i = 0; i < w->nfiles; i++)
    if (!strcmp(w->files[i]->rel, rel)) return w->files[i];
  return NULL;
}

/* See watcher_int.h. */
struct wfile *watcher__add_file(watcher_t *w, const char *rel) {
  struct wfile *f = watcher__find_file(w, rel);
  if (f) return f;
  if (w->nfiles == w->capfiles) {
    w->capfiles = w->capfiles ? w->capfiles * 2 : 64;
    w->files = mem_realloc(w->files, w->capfiles * sizeof *w->files);
  }
  f = mem_calloc(1, sizeof *f);
  f->rel = mem_strdup(rel);
  size_t lp = strlen(w->prefix), lr = strlen(rel);
  f->path = mem_alloc(lp + lr + 1);
  memcpy(f->path, w->prefix, lp);
  memcpy(f->path + lp, rel, lr + 1);
  f->gen = w->gen;
  w->files[w->nfiles++] = f;
  return f;
}

/* See watcher_int.h. */
void watcher__remove_file(watcher_t *w, struct wfile *f) {
  for (size_t i = 0; i < w->nfiles; i++) {
    if (w->files[i] != f) continue;
    w->files[i] = w->files[--w->nfiles];
    break;
  }
  file_free(f);
}

/* See watcher_int.h. */
void watcher__touch(watcher_t *w, struct wfile *f, int64_t delay, int extend) {
  int64_t now = watcher__now_ms(), at = now + delay;
  if (!f->due) {
    f->first = now;
    f->due = at;
  } else if (extend) {
    if (at > f->due) f->due = at;
    if (f->due > f->first + WATCHER_MAX_WAIT_MS) f->due = f->first + WATCHER_MAX_WAIT_MS;
  } else if (at < f->due) {
    f->due = at;
  }
  watcher__arm_due(w);
}

/* See watcher_int.h. */
void watcher__push_stale(watcher_t *w, const char *id, const char *path) {
  for (struct stale *s = w->stale; s; s = s->next)
    if (!strcmp(s->id, id) && !strcmp(s->path, path)) return;
  struct stale *s = mem_calloc(1, sizeof *s);
  s->id = mem_strdup(id);
  s->path = mem_strdup(path);
  s->next = w->stale;
  w->stale = s;
  watcher__arm_due(w);
}

/* ---- start and stop ----------------------------------------------------- */

/* See watcher.h. */
int watcher_start(const struct watcher_opts *o, watcher_t **out, err_t *e) {
  if (!o->loop || !o->root || !*o->root || !o->sink.submit)
    return err_set(e, ERR_INVALID, "watcher: a loop, a folder and a registry are needed");
  watcher_t *w = mem_calloc(1, sizeof *w);
  w->o = *o;
  w->root = mem_strdup(o->root);
  size_t n = strlen(w->root);
  while (n > 1 && w->root[n - 1] == '/') w->root[--n] = 0;
  /* watcher__join(root, "") is "root/": registered names as `serve` always made them. */
  w->prefix = o->prefix ? mem_strdup(o->prefix) : watcher__join(w->root, "");
  w->log_prefix = mem_strdup(o->log_prefix ? o->log_prefix : "");
  if (!o->status_log) w->o.status_log = o->log;
  w->status_prefix = mem_strdup(o->status_log && o->status_prefix ? o->status_prefix
                            : o->status_log ? "" : w->log_prefix);
  w->root_state = -1;
  uv_timer_init(o->loop, &w->due_timer);
  uv_timer_init(o->loop, &w->scan_timer);
  w->due_timer.data = w->scan_timer.data = w;
  /* Ids the registry holds from this workspace: a file's record starts with
  ** the id it holds; a second id of one file, or a file outside the prefix,
  ** is stale at once. */
  size_t lp = strlen(w->prefix);
  for (size_t i = 0; i < o->nknown; i++) {
    const struct watcher_known *k = &o->known[i];
    if (!k->id || !k->path || strncmp(k->path, w->prefix, lp) || !k->path[lp]) continue;
    struct wfile *f = watcher__add_file(w, k->path + lp);
    if (!f->id) f->id = mem_strdup(k->id);
    else watcher__push_stale(w, k->id, k->path);
  }
  w->o.known = NULL;
  w->o.nknown = 0;
  /* The first scan: every file is due at once, and the first batch's end
  ** says the workspace is loaded. */
  watcher__rescan(w);
  watcher__want_scan(w, w->root_state == 1 ? WATCHER_RESCAN_MS : WATCHER_MISSING_MS);
  uv_timer_start(&w->due_timer, watcher__on_due, 0, 0);
  *out = w;
  return 0;
}

/* See watcher.h. */
void watcher_stop(watcher_t *w) {
  if (!w || w->stopping) return;
  w->stopping = 1;
  uv_close((uv_handle_t *)&w->due_timer, NULL);
  uv_close((uv_handle_t *)&w->scan_timer, NULL);
  while (w->dirs) watcher__close_dir(w, w->dirs);
}

/* See watcher.h. */
void watcher_free(watcher_t *w) {
  if (!w) return;
  /* Folders still listed were never closed by us (watcher_stop not called):
  ** their handles are closed by now, the loop being done. */
  while (w->dirs) {
    struct wdir *d = w->dirs;
    w->dirs = d->next;
    free(d->rel);
    free(d);
  }
  watcher__batch_free(w);
  while (w->stale) {
    struct stale *s = w->stale;
    w->stale = s->next;
    free(s->id), free(s->path), free(s);
  }
  for (size_t i = 0; i < w->nfiles; i++) file_free(w->files[i]);
  free(w->files);
  free(w->root), free(w->prefix), free(w->log_prefix), free(w->status_prefix);
  free(w);
}

/* See watcher.h: a refused load's record counts, so that the removal of
** its file (while no engine ran, too) clears it. */
struct watcher_known *watcher_known_of(const cJSON *skills, size_t *n) {
  struct watcher_known *known = mem_calloc((size_t)cJSON_GetArraySize(skills) + 1, sizeof *known);
  const cJSON *k;
  *n = 0;
  cJSON_ArrayForEach(k, skills) {
    const cJSON *id = cJSON_GetObjectItem(k, "id"), *f = cJSON_GetObjectItem(k, "file"),
                *v = cJSON_GetObjectItem(k, "version"), *err = cJSON_GetObjectItem(k, "error");
    if (known && cJSON_IsString(id) && cJSON_IsString(f) &&
        (cJSON_IsString(v) || (err && !cJSON_IsNull(err))))
      known[(*n)++] = (struct watcher_known){id->valuestring, f->valuestring};
  }
  return known;
}
