/*
** watcher_int.h: what the files of the workspace watcher share (watcher.c:
** the state, file records, start and stop; watcher_scan.c: folders, events
** and rescans; watcher_batch.c: reading due files and the batches sent to
** the registry). Nothing else includes it: the interface is watcher.h.
**
** State:
**   files   one record per skill file seen (or still holding an id): its
**           registered id, the SHA-256 of the last source the registry
**           answered for, its last stat, and when it is due to be looked at
**           (0: not dirty). A linear table: workspaces hold tens to a few
**           thousand files, and every lookup is one event.
**   dirs    one uv_fs_event per watched folder (inotify is not recursive):
**           the root and every subfolder, added as they appear; each
**           remembers its inode, so a folder removed and recreated under
**           the same name gets a new watch.
**   stale   ids to unload that no file record holds any more (a file that
**           now declares another id; registry entries found at start).
**   batch   the ops in flight, answered through watcher_done.
**
** Timers: `due` fires at the earliest due file (never while a batch is in
** flight: the batch's end re-arms it); `scan` runs the rescan, every
** WATCHER_RESCAN_MS, or WATCHER_MISSING_MS while the folder is missing, or
** at once when an event says a folder went away.
**
** Every libuv handle is closed in exactly one place, watcher_stop (or
** watcher__close_dir for a folder that went away); a folder's record is
** freed by its close callback.
*/
#ifndef ML_WATCHER_INT_H
#define ML_WATCHER_INT_H
#include "base/units.h"
#include "sidecar/watcher.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* The parts of a file's stat that say it changed. */
struct wstat {
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns, ctime_ns;
};

/* A skill file's record (the `files` table). */
struct wfile {
  char *rel, *path;  /* relative to the root; the registered name */
  char *id;          /* the id whose live version this file holds, or NULL */
  char *rejected;    /* else the id its last refused load was recorded on, or NULL */
  char version[65];  /* the last source the registry answered for ("" none) */
  struct wstat st;
  int have_st;       /* st is the file's stat at the last look */
  int64_t due, first;/* due: when to look (0: not dirty); first: first event since */
  int force;         /* look even if the source is unchanged */
  int conflict;      /* the last load was refused: another file holds the id */
  int busy;          /* an op for it is in the batch */
  int retries;       /* registry failures in a row */
  int quiet;         /* "empty" or "too large" already logged */
  unsigned gen;      /* the rescan that last saw it */
};

/* A watched folder (the `dirs` list); freed by its handle's close callback. */
struct wdir {
  watcher_t *w;
  char *rel;         /* "" for the root */
  dev_t dev;
  ino_t ino;
  unsigned gen;
  uv_fs_event_t h;
  struct wdir *next;
};

/* An id to unload in the next batch (the `stale` list). */
struct stale {
  char *id, *path;
  struct stale *next;
};

/* One op of the batch in flight; its strings are owned. */
struct wop {
  watcher_t *w;
  struct watcher_op op;
  struct wfile *f;   /* NULL: a stale id's unload */
  char *path, *rel, *id, *fallback, *source;
  char version[65];
};

/* The watcher (watcher_t). */
struct watcher {
  struct watcher_opts o;
  char *root, *prefix, *log_prefix, *status_prefix;
  uv_timer_t due_timer, scan_timer;
  int64_t scan_at;   /* when the scan timer fires */
  int stopping;
  int root_state;    /* 1 present, 0 missing, -1 not looked at yet */
  struct wfile **files;
  size_t nfiles, capfiles;
  struct wdir *dirs;
  size_t ndirs;
  int dirs_full_logged;
  struct stale *stale;
  struct wop *batch;
  size_t nbatch, pending;
  int submitting;    /* inside build_batch's submit loop: batch_end waits */
  int freed;         /* in this batch, an id was let go */
  int ready;         /* the first batch was answered */
  int loaded, rejected;
  unsigned gen;
};

/* The monotonic clock in ms: when files are due, when the scan runs. */
static inline int64_t watcher__now_ms(void) { return (int64_t)(units_mono_ns() / 1000000); }

/* The parts of a stat that say a file changed. */
static inline void watcher__wstat_of(const struct stat *st, struct wstat *ws) {
  ws->dev = st->st_dev;
  ws->ino = st->st_ino;
  ws->size = st->st_size;
  ws->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  ws->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* Whether two looks saw the same file, unchanged. */
static inline int watcher__wstat_same(const struct wstat *a, const struct wstat *b) {
  return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
         a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

/* ---- watcher.c: paths and file records ---- */

/* a + "/" + b, or b when a is empty (malloc'd). */
char *watcher__join(const char *a, const char *b);

/* The local path of rel ("" is the root), malloc'd. */
char *watcher__local_path(const watcher_t *w, const char *rel);

/* The record of rel, or NULL. */
struct wfile *watcher__find_file(watcher_t *w, const char *rel);

/* The record of rel, made when missing. */
struct wfile *watcher__add_file(watcher_t *w, const char *rel);

/* Drop a record (not busy): the last record takes its place in the table. */
void watcher__remove_file(watcher_t *w, struct wfile *f);

/* Mark f dirty: look at it delay ms from now. extend: an event (push a
** pending look back, up to WATCHER_MAX_WAIT_MS after the first event);
** otherwise an earlier due time stays. */
void watcher__touch(watcher_t *w, struct wfile *f, int64_t delay, int extend);

/* Unload id (registered from path) in the next batch. */
void watcher__push_stale(watcher_t *w, const char *id, const char *path);

/* ---- watcher_scan.c: folders, events, rescans ---- */

/* Stop watching d and unlink it; its record goes with the close callback. */
void watcher__close_dir(watcher_t *w, struct wdir *d);

/* The rescan: the safety net behind the events (see watcher.h). */
void watcher__rescan(watcher_t *w);

/* Run the rescan within delay ms (sooner than planned, never later). */
void watcher__want_scan(watcher_t *w, int64_t delay);

/* ---- watcher_batch.c: batches ---- */

/* Set the due timer to the earliest due file (or stale id); none while a
** batch is in flight (its end calls this again). */
void watcher__arm_due(watcher_t *w);

/* The due timer: the earliest dirty file is due; build and submit a batch. */
void watcher__on_due(uv_timer_t *t);

/* Free the batch (answered, or no longer awaited) and the strings it owns. */
void watcher__batch_free(watcher_t *w);

#endif
