/*
** watcher.h: the workspace watcher. It watches a folder and its subfolders
** for skill files (*.lua) with libuv's file events, and feeds every change
** to a registry (the "sink": the scheduler in `serve`, the HTTP API in
** `moonloop sidecar`) in batches, one batch at a time.
**
** A file's life, as the watcher sees it:
**
**   event or rescan                 debounce (100 ms of quiet,      read it: unchanged
**   (create, write, rename, --->    800 ms at most since the  --->  size and mtime across
**    delete, attrib)                first event)                    the read, not empty
**                                                                        |
**        +---------------- same SHA-256 as last answered: nothing -------+
**        |                                                               |
**        v                                                               v
**   (nothing)                        gone: UNLOAD the id it holds   LOAD the source
**                                                                        |
**                                    answered: ok (its id, now live) or rejected (the
**                                    sink keeps the reason; the old version stays live)
**
** Which files count: names ending in ".lua" that do not start with '.' or
** '#' (so editor swap, backup, lock and temporary files never do: `.x.swp`,
** `x.lua~`, `#x.lua#`, `.#x.lua`, `x.lua.tmp`); folders whose name starts
** with '.' are not entered.
**
** Invariants:
**   - at most one batch is in flight; every op of it is answered before the
**     next batch is built, so the registry never sees two changes of one
**     file, or a stale answer, out of order;
**   - in a batch, unloads come before loads (a file renamed while its id
**     is declared: the old name lets go of the id before the new one takes
**     it), and no two loads claim the same id (the later one waits for the
**     next batch, where the registry's duplicate check sees the first);
**   - a periodic rescan (every 2 s; every 200 ms while the folder is
**     missing) compares every file's inode, size and times with the last
**     look, so an event the kernel dropped (queue overflow, a folder
**     created and filled before its watch was added, the folder removed and
**     recreated) costs at most one rescan period, never a change;
**   - a load refused because another file holds its id is tried again when
**     an id is let go (that file was deleted, renamed, or now declares
**     another id);
**   - at start, ids registered from files of this workspace that no longer
**     exist, or that now declare another id, are unloaded (`known`).
**
** Lifetime: watcher_start, then the loop runs; watcher_stop closes every
** handle (ops in flight are still answered, and ignored); watcher_free once
** the loop no longer runs (after its handles' close callbacks, and after the
** sink can no longer answer).
*/
#ifndef ML_WATCHER_H
#define ML_WATCHER_H
#include <stddef.h>
#include <stdio.h>

#include <uv.h>

#include "base/err.h"
#include "lua/skill.h"

typedef struct watcher watcher_t;

#define WATCHER_DEBOUNCE_MS 100  /* quiet time after a file's last event */
#define WATCHER_MAX_WAIT_MS 800  /* a file written without pause is read after this */
#define WATCHER_RESCAN_MS 2000   /* the safety-net rescan */
#define WATCHER_MISSING_MS 200   /* how often a missing workspace is looked for */
#define WATCHER_MAX_DEPTH 32     /* folders are entered at most this deep */

enum watcher_op_kind { WATCHER_LOAD, WATCHER_UNLOAD };

/* One change for the registry. Strings are valid until watcher_done. */
struct watcher_op {
  enum watcher_op_kind kind;
  const char *path;        /* the file's registered name (prefix + rel) */
  const char *rel;         /* the file relative to the workspace */
  /* LOAD: the id the source declares (NULL when it does not load: the sink
  ** then records the error on fallback_id, the id the file registered
  ** before or its default id). UNLOAD: the id to unregister, only if its
  ** live version (or, with none, its recorded refusal) still comes from path. */
  const char *id, *fallback_id;
  const char *source;      /* LOAD: the whole file */
  size_t len;
  const char *version;     /* LOAD: SHA-256 hex of source */
};

/* The registry's answer. rc: 0; ERR_CONFLICT (the id is held by another
** file); ERR_NOTFOUND for an UNLOAD (nothing to unregister: fine); another
** code for a rejected source; ERR_IO, ERR_BUSY or ERR_INTERNAL when the
** registry could not be reached or failed: the op is tried again later. */
struct watcher_result {
  int rc;
  const char *id;      /* rc == 0: the skill id */
  const char *message; /* rc != 0: why */
};

/* submit: hand op to the registry and call watcher_done(token, result)
** exactly once, later, from the loop. A nonzero return (with e) means it
** failed at once and watcher_done is never called for it. */
struct watcher_sink {
  void *ud;
  int (*submit)(void *ud, const struct watcher_op *op, void *token, err_t *e);
};

/* A skill of the registry that came from this workspace (found at start). */
struct watcher_known {
  const char *id;
  const char *path; /* its registered name */
};

/* The known skills among the registry's records (a cJSON array of skill
** records, as GET /v1/skills lists them): those with a live version, or a
** refused load and none, and a file. Their strings point into skills;
** *n is how many; NULL-terminated, free() it. */
struct cJSON;
struct watcher_known *watcher_known_of(const struct cJSON *skills, size_t *n);

struct watcher_opts {
  uv_loop_t *loop;
  const char *root;        /* the workspace folder */
  const char *prefix;      /* registered name = prefix + rel; NULL: root + "/" */
  skills_t *skills;        /* learns the id a source declares before it is submitted */
  struct watcher_sink sink;
  FILE *log;               /* one line per file answered (NULL: none) */
  const char *log_prefix;  /* before each line, e.g. "moonloop: " */
  int log_rel;             /* name files by rel (else by registered name) in the log */
  /* Lines about the workspace folder itself (missing, gone, back, too many
  ** folders); NULL: log and log_prefix. */
  FILE *status_log;
  const char *status_prefix;
  /* After the first scan's batch was answered, with the number of files
  ** loaded and rejected. */
  void (*on_ready)(void *arg, int loaded, int rejected);
  void *ready_arg;
  const struct watcher_known *known; /* copied */
  size_t nknown;
};

/* Scan the workspace (every file counts as changed) and start watching.
** The folder need not exist: it is looked for until it does. Fails only
** for bad options or out of memory. */
int watcher_start(const struct watcher_opts *o, watcher_t **out, err_t *e);

/* The registry answered an op (see struct watcher_sink). */
void watcher_done(void *token, const struct watcher_result *r);

/* Stop watching: close every handle. Answers still due are ignored. */
void watcher_stop(watcher_t *w);

/* Free the watcher (see Lifetime above). NULL is ignored. */
void watcher_free(watcher_t *w);

/* Whether a file name (no folder) is a skill file the watcher counts. */
int watcher_counts(const char *name);

#endif
