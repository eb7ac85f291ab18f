/*
** watcher_scan.c: how the workspace watcher finds changes (see watcher.h
** and watcher_int.h): one libuv fs event watch per folder, added as
** folders appear and closed as they go, the scan of a folder's files, and
** the periodic rescan that is the safety net behind the events.
**
** Invariants: at most MAX_DIRS folders are watched, and folders are
** entered at most MAX_DEPTH deep (symbolic links to folders never); each
** watch remembers its folder's inode, so a folder removed and recreated
** gets a new watch; a file is only marked due here (the batch reads it).
*/
#include "base/mem.h"
#include "base/term.h"
#include "sidecar/watcher_int.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH WATCHER_MAX_DEPTH
#define MAX_DIRS 4096

static void on_event(uv_fs_event_t *h, const char *filename, int events, int status);

/* A line about the workspace folder itself, on the status log (stderr in
** both serve and the standalone sidecar), flushed at once: it is a warning
** an operator must see now, not when a buffer fills. */
__attribute__((format(printf, 2, 3))) static void status_line(watcher_t *w, const char *fmt, ...) {
  if (!w->o.status_log) return;
  va_list ap;
  va_start(ap, fmt);
  char *text = mem_vprintf(fmt, ap);
  va_end(ap);
  /* The folder's name is the operator's, but escaped like every line. */
  term_printf(w->o.status_log, "%s%s\n", w->status_prefix, text);
  free(text);
  fflush(w->o.status_log);
}

/* The watched folder rel, or NULL. */
static struct wdir *find_dir(watcher_t *w, const char *rel) {
  for (struct wdir *d = w->dirs; d; d = d->next)
    if (!strcmp(d->rel, rel)) return d;
  return NULL;
}

/* A folder's watch is closed: its record goes. */
static void on_dir_closed(uv_handle_t *h) {
  struct wdir *d = h->data;
  free(d->rel);
  free(d);
}

/* See watcher_int.h. */
void watcher__close_dir(watcher_t *w, struct wdir *d) {
  for (struct wdir **pp = &w->dirs; *pp; pp = &(*pp)->next) {
    if (*pp != d) continue;
    *pp = d->next;
    break;
  }
  w->ndirs--;
  uv_fs_event_stop(&d->h);
  uv_close((uv_handle_t *)&d->h, on_dir_closed);
}

/* Watch the folder rel (whose lstat is st). Returns 1 when a new watch was
** added (its files may predate it: the caller scans it), 0 when it was
** watched already, -1 when it cannot be watched. */
static int watch_dir(watcher_t *w, const char *rel, const struct stat *st) {
  struct wdir *d = find_dir(w, rel);
  if (d && d->ino == st->st_ino && d->dev == st->st_dev) {
    d->gen = w->gen;
    return 0;
  }
  if (d) watcher__close_dir(w, d); /* removed and recreated: the old watch is dead */
  if (w->ndirs >= MAX_DIRS) {
    if (!w->dirs_full_logged)
      status_line(w, "workspace %s: more than %d folders: %s is not watched (the rescan "
                  "still sees it)", w->root, MAX_DIRS, rel);
    w->dirs_full_logged = 1;
    return -1;
  }
  d = mem_calloc(1, sizeof *d);
  char *path = watcher__local_path(w, rel);
  d->rel = mem_strdup(rel);
  d->w = w;
  d->dev = st->st_dev;
  d->ino = st->st_ino;
  d->gen = w->gen;
  uv_fs_event_init(w->o.loop, &d->h);
  d->h.data = d;
  int rc = uv_fs_event_start(&d->h, on_event, path, 0);
  free(path);
  if (rc) {
    /* Gone already, or out of inotify watches: the rescan covers it. */
    uv_close((uv_handle_t *)&d->h, on_dir_closed);
    return -1;
  }
  d->next = w->dirs;
  w->dirs = d;
  w->ndirs++;
  return 1;
}

/* A file the scan found: dirty when new or when its stat changed. */
static void file_seen(watcher_t *w, const char *rel, const struct stat *st, int64_t delay) {
  struct wfile *f = watcher__find_file(w, rel);
  int fresh = !f;
  if (!f) f = watcher__add_file(w, rel);
  f->gen = w->gen;
  struct wstat ws;
  watcher__wstat_of(st, &ws);
  int changed = fresh || !f->have_st || !watcher__wstat_same(&ws, &f->st) || f->version[0] == 0;
  if (changed && !f->due) watcher__touch(w, f, delay, 0);
}

/* Scan the folder rel: watch its subfolders, note its skill files. */
static void scan_dir(watcher_t *w, const char *rel, int depth, int64_t delay) {
  char *path = watcher__local_path(w, rel);
  DIR *dir = opendir(path);
  free(path);
  if (!dir) return;
  struct dirent *de;
  while ((de = readdir(dir))) {
    const char *name = de->d_name;
    if (name[0] == '.') continue; /* ., .., dotfiles and dot-folders */
    char *child = watcher__join(rel, name);
    char *cpath = watcher__local_path(w, child);
    struct stat st;
    if (lstat(cpath, &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        /* Symbolic links to folders are not followed: no cycles. A folder
        ** that cannot be watched (too many) is still scanned. */
        if (depth < MAX_DEPTH) {
          watch_dir(w, child, &st);
          scan_dir(w, child, depth + 1, delay);
        }
      } else if (watcher_counts(name)) {
        if (S_ISLNK(st.st_mode) && stat(cpath, &st)) st.st_mode = 0;
        if (S_ISREG(st.st_mode)) file_seen(w, child, &st, delay);
      }
    }
    free(cpath);
    free(child);
  }
  closedir(dir);
}

/* The workspace folder is gone: drop every watch; its files go too, unless
** it comes back before they are due. */
static void root_gone(watcher_t *w) {
  if (w->root_state != 0)
    status_line(w, "workspace %s %s: watching for it", w->root,
                w->root_state < 0 ? "does not exist" : "is gone");
  w->root_state = 0;
  while (w->dirs) watcher__close_dir(w, w->dirs);
  for (size_t i = 0; i < w->nfiles; i++)
    watcher__touch(w, w->files[i], w->ready ? WATCHER_MISSING_MS + WATCHER_DEBOUNCE_MS : 0, 0);
}

/* See watcher_int.h. */
void watcher__rescan(watcher_t *w) {
  w->gen++;
  int64_t delay = w->ready ? WATCHER_DEBOUNCE_MS : 0;
  struct stat st;
  if (stat(w->root, &st) || !S_ISDIR(st.st_mode)) {
    root_gone(w);
    return;
  }
  if (w->root_state == 0) status_line(w, "workspace %s is back: watching it", w->root);
  w->root_state = 1;
  watch_dir(w, "", &st);
  scan_dir(w, "", 0, delay);
  /* Files not seen: deleted (the look at due time decides). */
  for (size_t i = 0; i < w->nfiles; i++) {
    struct wfile *f = w->files[i];
    if (f->gen != w->gen && !f->due && (f->have_st || f->id || !w->ready)) watcher__touch(w, f, delay, 0);
  }
  /* Folders not seen: gone. */
  for (struct wdir *d = w->dirs, *next; d; d = next) {
    next = d->next;
    if (d->gen != w->gen) watcher__close_dir(w, d);
  }
}

/* The scan timer: rescan, then plan the next one. */
static void on_scan(uv_timer_t *t) {
  watcher_t *w = t->data;
  if (w->stopping) return;
  watcher__rescan(w);
  watcher__want_scan(w, w->root_state == 1 ? WATCHER_RESCAN_MS : WATCHER_MISSING_MS);
}

/* See watcher_int.h. */
void watcher__want_scan(watcher_t *w, int64_t delay) {
  if (w->stopping) return;
  int64_t at = watcher__now_ms() + delay;
  if (uv_is_active((uv_handle_t *)&w->scan_timer) && w->scan_at <= at) return;
  w->scan_at = at;
  uv_timer_start(&w->scan_timer, on_scan, (uint64_t)delay, 0);
}

/* A file event in a watched folder. */
static void on_event(uv_fs_event_t *h, const char *filename, int events, int status) {
  (void)events;
  struct wdir *d = h->data;
  watcher_t *w = d->w;
  if (w->stopping) return;
  if (status < 0 || !filename || !*filename) {
    watcher__want_scan(w, 10);
    return;
  }
  char *rel = watcher__join(d->rel, filename);
  char *path = watcher__local_path(w, rel);
  struct stat st;
  if (watcher_counts(filename)) {
    watcher__touch(w, watcher__add_file(w, rel), WATCHER_DEBOUNCE_MS, 1);
  } else if (filename[0] != '.' && strchr(filename, '/') == NULL) {
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
      int depth = 1;
      for (const char *p = rel; *p; p++) depth += *p == '/';
      if (depth <= MAX_DEPTH && watch_dir(w, rel, &st) == 1) scan_dir(w, rel, depth, WATCHER_DEBOUNCE_MS);
    } else if (find_dir(w, rel)) {
      watcher__want_scan(w, 10); /* a watched folder went away (or was renamed) */
    }
  }
  /* The watched folder itself removed or renamed: its watch is dead. */
  char *self = watcher__local_path(w, d->rel);
  if (self && (stat(self, &st) || st.st_ino != d->ino || st.st_dev != d->dev)) watcher__want_scan(w, 10);
  free(self);
  free(path);
  free(rel);
}
