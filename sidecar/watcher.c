/*
** watcher.c: the workspace watcher (see watcher.h for what it promises).
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
** close_dir for a folder that went away); a folder's record is freed by its
** close callback.
*/
#include "watcher.h"
#include "ids.h"
#include "units.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 32
#define MAX_DIRS 4096
#define MAX_SOURCE ((size_t)16 << 20)
#define RETRY_MIN_MS 500
#define RETRY_MAX_MS 30000

struct wstat {
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns, ctime_ns;
};

struct wfile {
  char *rel, *path;  /* relative to the root; the registered name */
  char *id;          /* the id whose live version this file holds, or NULL */
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

struct wdir {
  watcher_t *w;
  char *rel;         /* "" for the root */
  dev_t dev;
  ino_t ino;
  unsigned gen;
  uv_fs_event_t h;
  struct wdir *next;
};

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

struct watcher {
  struct watcher_opts o;
  char *root, *prefix, *log_prefix;
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

static int64_t now_ms(void) { return (int64_t)(units_mono_ns() / 1000000); }

/* strdup that passes NULL through. */
static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

/* a + "/" + b, or b when a is empty (malloc'd). */
static char *join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *p = malloc(la + lb + 2);
  if (!p) return NULL;
  if (la) {
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
  } else {
    memcpy(p, b, lb + 1);
  }
  return p;
}

/* The local path of rel ("" is the root), malloc'd. */
static char *local_path(const watcher_t *w, const char *rel) {
  return *rel ? join(w->root, rel) : strdup(w->root);
}

/* See watcher.h. */
int watcher_counts(const char *name) {
  size_t n = strlen(name);
  /* (issue 6) "*_test.lua" files are skill tests (moonloop test), not skills. */
  if (n > 9 && !strcmp(name + n - 9, "_test.lua")) return 0;
  return n > 4 && name[0] != '.' && name[0] != '#' && !strcmp(name + n - 4, ".lua");
}

/* The parts of a stat that say a file changed. */
static void wstat_of(const struct stat *st, struct wstat *ws) {
  ws->dev = st->st_dev;
  ws->ino = st->st_ino;
  ws->size = st->st_size;
  ws->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  ws->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* Whether two looks saw the same file, unchanged. */
static int wstat_same(const struct wstat *a, const struct wstat *b) {
  return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
         a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

/* ---- the log ------------------------------------------------------------ */

/* One line: "<prefix><word>  <file>: <text>". */
static void log_line(watcher_t *w, const char *word, const char *rel, const char *path,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void log_line(watcher_t *w, const char *word, const char *rel, const char *path,
                     const char *fmt, ...) {
  if (!w->o.log) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(w->o.log, "%s%-8s  %s: ", w->log_prefix, word, w->o.log_rel ? rel : path);
  vfprintf(w->o.log, fmt, ap);
  fputc('\n', w->o.log);
  fflush(w->o.log);
  va_end(ap);
}

/* ---- file records ----------------------------------------------------- */

/* The record of rel, or NULL. */
static struct wfile *find_file(watcher_t *w, const char *rel) {
  for (size_t i = 0; i < w->nfiles; i++)
    if (!strcmp(w->files[i]->rel, rel)) return w->files[i];
  return NULL;
}

/* The record of rel, made when missing; NULL when out of memory. */
static struct wfile *add_file(watcher_t *w, const char *rel) {
  struct wfile *f = find_file(w, rel);
  if (f) return f;
  if (w->nfiles == w->capfiles) {
    size_t cap = w->capfiles ? w->capfiles * 2 : 64;
    struct wfile **p = realloc(w->files, cap * sizeof *p);
    if (!p) return NULL;
    w->files = p;
    w->capfiles = cap;
  }
  f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->rel = strdup(rel);
  size_t lp = strlen(w->prefix), lr = strlen(rel);
  f->path = malloc(lp + lr + 1);
  if (!f->rel || !f->path) {
    free(f->rel), free(f->path), free(f);
    return NULL;
  }
  memcpy(f->path, w->prefix, lp);
  memcpy(f->path + lp, rel, lr + 1);
  f->gen = w->gen;
  w->files[w->nfiles++] = f;
  return f;
}

/* Drop a record (not busy): the last record takes its place in the table. */
static void remove_file(watcher_t *w, struct wfile *f) {
  for (size_t i = 0; i < w->nfiles; i++) {
    if (w->files[i] != f) continue;
    w->files[i] = w->files[--w->nfiles];
    break;
  }
  free(f->rel), free(f->path), free(f->id);
  free(f);
}

static void arm_due(watcher_t *w);

/* Mark f dirty: look at it delay ms from now. extend: an event (push a
** pending look back, up to WATCHER_MAX_WAIT_MS after the first event);
** otherwise an earlier due time stays. */
static void touch(watcher_t *w, struct wfile *f, int64_t delay, int extend) {
  int64_t now = now_ms(), at = now + delay;
  if (!f->due) {
    f->first = now;
    f->due = at;
  } else if (extend) {
    if (at > f->due) f->due = at;
    if (f->due > f->first + WATCHER_MAX_WAIT_MS) f->due = f->first + WATCHER_MAX_WAIT_MS;
  } else if (at < f->due) {
    f->due = at;
  }
  arm_due(w);
}

/* Unload id (registered from path) in the next batch. */
static void push_stale(watcher_t *w, const char *id, const char *path) {
  for (struct stale *s = w->stale; s; s = s->next)
    if (!strcmp(s->id, id) && !strcmp(s->path, path)) return;
  struct stale *s = calloc(1, sizeof *s);
  if (!s || !(s->id = strdup(id)) || !(s->path = strdup(path))) {
    if (s) free(s->id), free(s);
    return;
  }
  s->next = w->stale;
  w->stale = s;
  arm_due(w);
}

/* ---- folders ------------------------------------------------------------ */

static void on_event(uv_fs_event_t *h, const char *filename, int events, int status);

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

/* Stop watching d and unlink it; its record goes with the close callback. */
static void close_dir(watcher_t *w, struct wdir *d) {
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
  if (d) close_dir(w, d); /* removed and recreated: the old watch is dead */
  if (w->ndirs >= MAX_DIRS) {
    if (!w->dirs_full_logged && w->o.log)
      fprintf(w->o.log, "%sworkspace %s: more than %d folders: %s is not watched (the rescan "
              "still sees it)\n", w->log_prefix, w->root, MAX_DIRS, rel);
    w->dirs_full_logged = 1;
    return -1;
  }
  d = calloc(1, sizeof *d);
  char *path = local_path(w, rel);
  if (!d || !path || !(d->rel = strdup(rel))) {
    if (d) free(d->rel);
    free(d), free(path);
    return -1;
  }
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
  struct wfile *f = find_file(w, rel);
  int fresh = !f;
  if (!f && !(f = add_file(w, rel))) return;
  f->gen = w->gen;
  struct wstat ws;
  wstat_of(st, &ws);
  int changed = fresh || !f->have_st || !wstat_same(&ws, &f->st) || f->version[0] == 0;
  if (changed && !f->due) touch(w, f, delay, 0);
}

/* Scan the folder rel: watch its subfolders, note its skill files. */
static void scan_dir(watcher_t *w, const char *rel, int depth, int64_t delay) {
  char *path = local_path(w, rel);
  DIR *dir = path ? opendir(path) : NULL;
  free(path);
  if (!dir) return;
  struct dirent *de;
  while ((de = readdir(dir))) {
    const char *name = de->d_name;
    if (name[0] == '.') continue; /* ., .., dotfiles and dot-folders */
    char *child = join(rel, name);
    char *cpath = child ? local_path(w, child) : NULL;
    struct stat st;
    if (cpath && lstat(cpath, &st) == 0) {
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

static void want_scan(watcher_t *w, int64_t delay);

/* The workspace folder is gone: drop every watch; its files go too, unless
** it comes back before they are due. */
static void root_gone(watcher_t *w) {
  if (w->root_state != 0 && w->o.log)
    fprintf(w->o.log, "%sworkspace %s %s: watching for it\n", w->log_prefix, w->root,
            w->root_state < 0 ? "does not exist" : "is gone");
  w->root_state = 0;
  while (w->dirs) close_dir(w, w->dirs);
  for (size_t i = 0; i < w->nfiles; i++)
    touch(w, w->files[i], w->ready ? WATCHER_MISSING_MS + WATCHER_DEBOUNCE_MS : 0, 0);
}

/* The rescan: the safety net behind the events (see watcher.h). */
static void rescan(watcher_t *w) {
  w->gen++;
  int64_t delay = w->ready ? WATCHER_DEBOUNCE_MS : 0;
  struct stat st;
  if (stat(w->root, &st) || !S_ISDIR(st.st_mode)) {
    root_gone(w);
    return;
  }
  if (w->root_state == 0 && w->o.log)
    fprintf(w->o.log, "%sworkspace %s is back: watching it\n", w->log_prefix, w->root);
  w->root_state = 1;
  watch_dir(w, "", &st);
  scan_dir(w, "", 0, delay);
  /* Files not seen: deleted (the look at due time decides). */
  for (size_t i = 0; i < w->nfiles; i++) {
    struct wfile *f = w->files[i];
    if (f->gen != w->gen && !f->due && (f->have_st || f->id || !w->ready)) touch(w, f, delay, 0);
  }
  /* Folders not seen: gone. */
  for (struct wdir *d = w->dirs, *next; d; d = next) {
    next = d->next;
    if (d->gen != w->gen) close_dir(w, d);
  }
}

/* The scan timer: rescan, then plan the next one. */
static void on_scan(uv_timer_t *t) {
  watcher_t *w = t->data;
  if (w->stopping) return;
  rescan(w);
  want_scan(w, w->root_state == 1 ? WATCHER_RESCAN_MS : WATCHER_MISSING_MS);
}

/* Run the rescan within delay ms (sooner than planned, never later). */
static void want_scan(watcher_t *w, int64_t delay) {
  if (w->stopping) return;
  int64_t at = now_ms() + delay;
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
    want_scan(w, 10);
    return;
  }
  char *rel = join(d->rel, filename);
  char *path = rel ? local_path(w, rel) : NULL;
  if (!path) {
    free(rel);
    want_scan(w, 10);
    return;
  }
  struct stat st;
  if (watcher_counts(filename)) {
    struct wfile *f = add_file(w, rel);
    if (f) touch(w, f, WATCHER_DEBOUNCE_MS, 1);
  } else if (filename[0] != '.' && strchr(filename, '/') == NULL) {
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
      int depth = 1;
      for (const char *p = rel; *p; p++) depth += *p == '/';
      if (depth <= MAX_DEPTH && watch_dir(w, rel, &st) == 1) scan_dir(w, rel, depth, WATCHER_DEBOUNCE_MS);
    } else if (find_dir(w, rel)) {
      want_scan(w, 10); /* a watched folder went away (or was renamed) */
    }
  }
  /* The watched folder itself removed or renamed: its watch is dead. */
  char *self = local_path(w, d->rel);
  if (self && (stat(self, &st) || st.st_ino != d->ino || st.st_dev != d->dev)) want_scan(w, 10);
  free(self);
  free(path);
  free(rel);
}

/* ---- batches ------------------------------------------------------------ */

static void build_batch(watcher_t *w);

/* The due timer: the earliest dirty file is due. */
static void on_due(uv_timer_t *t) { build_batch(t->data); }

/* Set the due timer to the earliest due file (or stale id); none while a
** batch is in flight (its end calls this again). */
static void arm_due(watcher_t *w) {
  if (w->stopping || w->pending) return;
  int64_t next = w->stale ? now_ms() : INT64_MAX;
  for (size_t i = 0; i < w->nfiles; i++) {
    const struct wfile *f = w->files[i];
    if (f->due && !f->busy && f->due < next) next = f->due;
  }
  if (next == INT64_MAX) {
    uv_timer_stop(&w->due_timer);
    return;
  }
  int64_t delay = next - now_ms();
  uv_timer_start(&w->due_timer, on_due, delay > 0 ? (uint64_t)delay : 0, 0);
}

/* Read a file whole, and only if nothing changed it during the read.
** Returns 0 with *src (malloc'd) and *st, 1 when it is being written (look
** again later), -1 when it is gone or not a regular file, -2 when it is
** too large. */
static int read_whole(const char *path, char **src, size_t *len, struct wstat *ws) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return -1;
  struct stat a, b, c;
  if (fstat(fd, &a) || !S_ISREG(a.st_mode)) {
    close(fd);
    return -1;
  }
  if ((size_t)a.st_size > MAX_SOURCE) {
    close(fd);
    return -2;
  }
  size_t cap = (size_t)a.st_size + 1, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return 1;
  }
  for (;;) {
    if (n + 1 >= cap) {
      if (cap > MAX_SOURCE) break;
      char *p = realloc(buf, cap * 2);
      if (!p) break;
      buf = p;
      cap *= 2;
    }
    ssize_t got = read(fd, buf + n, cap - n - 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n += (size_t)got;
  }
  int bad = fstat(fd, &b);
  close(fd);
  bad = bad || stat(path, &c);
  struct wstat wa, wb, wc;
  wstat_of(&a, &wa);
  if (!bad) wstat_of(&b, &wb), wstat_of(&c, &wc);
  /* Written to, truncated or replaced while we read: not complete yet. */
  if (bad || !wstat_same(&wa, &wb) || !wstat_same(&wb, &wc) || n != (size_t)b.st_size) {
    free(buf);
    return bad ? -1 : 1;
  }
  buf[n] = 0;
  *src = buf;
  *len = n;
  *ws = wb;
  return 0;
}

/* Look at a due file: an op for the batch (1), nothing to do (0), or the
** record is no longer needed (-1). loads[0..*nloads) are the batch's loads
** so far: a load whose id one of them claims waits for the next batch,
** unless f is the file that holds that id now: then the other one waits
** (it is dropped from loads, and *nloads shrinks). */
static int look(watcher_t *w, struct wfile *f, struct wop *loads, size_t *nloads, struct wop *op) {
  char *path = local_path(w, f->rel);
  if (!path) {
    touch(w, f, RETRY_MIN_MS, 0);
    return 0;
  }
  char *src = NULL;
  size_t len = 0;
  struct wstat ws;
  int rc = read_whole(path, &src, &len, &ws);
  free(path);
  if (rc == 1) {
    touch(w, f, WATCHER_DEBOUNCE_MS, 1);
    return 0;
  }
  if (rc == -1) {
    f->have_st = 0;
    if (!f->id) return -1;
    op->op.kind = WATCHER_UNLOAD;
    op->id = strdup(f->id);
    op->f = f;
    return 1;
  }
  if (rc == -2) {
    if (!f->quiet) log_line(w, "ignored", f->rel, f->path, "larger than 16 MB: not a skill file");
    f->quiet = 1;
    return 0;
  }
  f->st = ws;
  f->have_st = 1;
  if (len == 0) {
    /* Truncated, and the new content is not there yet (or an empty file,
    ** which is no skill either): the live version stays. */
    free(src);
    return 0;
  }
  f->quiet = 0;
  char version[65];
  ids_sha256_hex(src, len, version);
  if (!f->force && !strcmp(version, f->version)) {
    free(src);
    return 0;
  }
  f->force = 0;
  struct skill *sk = NULL;
  struct skill_error se = {0};
  const char *id = NULL;
  if (w->o.skills && !skills_load(w->o.skills, src, len, f->path, &sk, &se)) id = sk->id;
  for (size_t i = 0; id && i < *nloads; i++) {
    struct wop *other = &loads[i];
    if (!other->id || strcmp(other->id, id)) continue;
    int holds = f->id && !strcmp(f->id, id);
    int other_holds = other->f->id && !strcmp(other->f->id, id);
    if (!holds || other_holds) {
      free(src);
      f->due = f->first = now_ms(); /* the next batch */
      return 0;
    }
    /* f holds the id now: it goes first, the other file waits. */
    struct wfile *of = other->f;
    of->busy = 0;
    of->due = of->first = now_ms();
    free(other->path), free(other->rel), free(other->id), free(other->fallback);
    free(other->source);
    memmove(other, other + 1, (*nloads - i - 1) * sizeof *other);
    (*nloads)--;
    break;
  }
  char dflt[256];
  skills_default_id(f->rel, dflt, sizeof dflt);
  op->op.kind = WATCHER_LOAD;
  op->id = dupstr(id);
  op->fallback = strdup(f->id ? f->id : dflt);
  op->source = src;
  op->op.len = len;
  memcpy(op->version, version, sizeof op->version);
  op->f = f;
  return 1;
}

static void handle(struct wop *op, const struct watcher_result *r);
static void batch_end(watcher_t *w);

/* The registry could not be reached or could not write: try again later. */
static int is_transport(int rc) { return rc == ERR_IO || rc == ERR_BUSY; }

/* Records by name, for qsort. */
static int cmp_file(const void *a, const void *b) {
  return strcmp((*(struct wfile *const *)a)->rel, (*(struct wfile *const *)b)->rel);
}

/* Build the next batch from the due files and the stale ids, and submit it.
** Files are taken in name order, so which of two new files declaring one
** id comes first does not depend on the folder's order. */
static void build_batch(watcher_t *w) {
  if (w->stopping || w->pending) return;
  int64_t now = now_ms();
  if (w->nfiles > 1) qsort(w->files, w->nfiles, sizeof *w->files, cmp_file);
  size_t nstale = 0;
  for (struct stale *s = w->stale; s; s = s->next) nstale++;
  size_t cap = nstale + w->nfiles;
  struct wop *unloads = calloc(cap + 1, sizeof *unloads), *loads = calloc(cap + 1, sizeof *loads);
  if (!unloads || !loads) {
    free(unloads), free(loads);
    uv_timer_start(&w->due_timer, on_due, RETRY_MIN_MS, 0);
    return;
  }
  size_t nu = 0, nl = 0;
  while (w->stale) {
    struct stale *s = w->stale;
    w->stale = s->next;
    struct wop *op = &unloads[nu++];
    op->op.kind = WATCHER_UNLOAD;
    op->id = s->id;
    op->path = s->path;
    const char *rel = s->path;
    if (!strncmp(rel, w->prefix, strlen(w->prefix))) rel += strlen(w->prefix);
    op->rel = strdup(rel);
    free(s);
  }
  for (size_t i = 0; i < w->nfiles;) {
    struct wfile *f = w->files[i];
    if (!f->due || f->busy || f->due > now) {
      i++;
      continue;
    }
    f->due = 0;
    struct wop tmp = {0};
    int rc = look(w, f, loads, &nl, &tmp);
    if (rc < 0) {
      remove_file(w, f); /* the table's last record moved to i */
      continue;
    }
    i++;
    if (rc == 0) continue;
    tmp.path = strdup(f->path);
    tmp.rel = strdup(f->rel);
    f->busy = 1;
    if (tmp.op.kind == WATCHER_UNLOAD) unloads[nu++] = tmp;
    else loads[nl++] = tmp;
  }
  /* Unloads first, then loads. */
  memcpy(unloads + nu, loads, nl * sizeof *loads);
  free(loads);
  w->batch = unloads;
  w->nbatch = nu + nl;
  w->pending = w->nbatch;
  if (w->nbatch == 0) {
    batch_end(w);
    return;
  }
  uv_timer_stop(&w->due_timer);
  /* Count first: a submit that fails at once answers through handle(). */
  for (size_t i = 0; i < w->nbatch; i++) {
    struct wop *op = &w->batch[i];
    op->w = w;
    op->op.path = op->path;
    op->op.rel = op->rel;
    op->op.id = op->id;
    op->op.fallback_id = op->fallback;
    op->op.source = op->source;
    op->op.version = op->version;
  }
  w->submitting = 1;
  for (size_t i = 0; i < w->nbatch && !w->stopping; i++) {
    struct wop *op = &w->batch[i];
    err_t e = {0};
    if (w->o.sink.submit(w->o.sink.ud, &op->op, op, &e)) {
      struct watcher_result r = {e.code ? e.code : ERR_INTERNAL, NULL, e.msg};
      handle(op, &r);
    }
  }
  w->submitting = 0;
  if (w->pending == 0 && !w->stopping) batch_end(w);
}

/* The registry's answer to one op of the batch. */
static void handle(struct wop *op, const struct watcher_result *r) {
  watcher_t *w = op->w;
  struct wfile *f = op->f;
  const char *msg = r->message && *r->message ? r->message : err_name(r->rc);
  if (op->op.kind == WATCHER_LOAD) {
    f->busy = 0;
    if (r->rc == 0) {
      const char *id = r->id ? r->id : op->id ? op->id : op->fallback;
      if (f->id && strcmp(f->id, id)) push_stale(w, f->id, f->path);
      free(f->id);
      f->id = strdup(id);
      memcpy(f->version, op->version, sizeof f->version);
      f->conflict = 0;
      f->retries = 0;
      if (!w->ready) w->loaded++;
      log_line(w, "ok", f->rel, f->path, "skill '%s', version %.12s", id, op->version);
    } else if (is_transport(r->rc)) {
      int64_t delay = (int64_t)RETRY_MIN_MS << (f->retries < 6 ? f->retries : 6);
      if (delay > RETRY_MAX_MS) delay = RETRY_MAX_MS;
      if (!f->retries)
        log_line(w, "waiting", f->rel, f->path, "%s (trying again)", msg);
      f->retries++;
      if (!w->stopping) touch(w, f, delay, 0);
    } else {
      memcpy(f->version, op->version, sizeof f->version);
      f->conflict = r->rc == ERR_CONFLICT;
      f->retries = 0;
      if (!w->ready) w->rejected++;
      log_line(w, "rejected", f->rel, f->path, "%s", msg);
    }
  } else {
    if (r->rc == 0 || r->rc == ERR_NOTFOUND) {
      if (r->rc == 0) {
        w->freed = 1;
        if (f && f->have_st)
          log_line(w, "removed", op->rel, op->path, "skill '%s' unregistered", op->id);
        else if (f)
          log_line(w, "removed", op->rel, op->path, "skill '%s' unregistered (the file is gone)",
                   op->id);
        else
          log_line(w, "removed", op->rel, op->path, "skill '%s' unregistered (no file declares "
                   "it any more)", op->id);
      }
      if (f) {
        f->busy = 0;
        free(f->id);
        f->id = NULL;
        f->version[0] = 0;
        if (!f->have_st && !f->due) remove_file(w, f);
        op->f = NULL;
      }
    } else if (is_transport(r->rc)) {
      if (f) {
        f->busy = 0;
        if (!w->stopping) touch(w, f, RETRY_MIN_MS, 0);
      } else if (!w->stopping) {
        push_stale(w, op->id, op->path);
      }
      log_line(w, "waiting", op->rel, op->path, "%s (trying again)", msg);
    } else {
      if (f) f->busy = 0;
      log_line(w, "error", op->rel, op->path, "cannot unregister skill '%s': %s", op->id, msg);
    }
  }
  if (--w->pending == 0 && !w->submitting) batch_end(w);
}

/* See watcher.h. */
void watcher_done(void *token, const struct watcher_result *r) {
  struct wop *op = token;
  if (op->w->stopping) {
    /* Nobody waits any more; the batch is freed with the watcher. */
    if (op->w->pending) op->w->pending--;
    return;
  }
  handle(op, r);
}

/* Every op of the batch was answered: free it, retry refused duplicates
** if an id was let go, say ready after the first scan, arm the next batch. */
static void batch_end(watcher_t *w) {
  for (size_t i = 0; i < w->nbatch; i++) {
    struct wop *op = &w->batch[i];
    free(op->path), free(op->rel), free(op->id), free(op->fallback), free(op->source);
  }
  free(w->batch);
  w->batch = NULL;
  w->nbatch = 0;
  if (w->freed) {
    /* An id was let go: loads refused as duplicates may pass now. */
    w->freed = 0;
    for (size_t i = 0; i < w->nfiles; i++) {
      struct wfile *f = w->files[i];
      if (f->conflict && !f->busy) {
        f->force = 1;
        touch(w, f, 0, 0);
      }
    }
  }
  if (!w->ready) {
    /* The first scan is loaded once the loads it deferred are answered too. */
    int64_t now = now_ms();
    int more = w->stale != NULL;
    for (size_t i = 0; i < w->nfiles && !more; i++)
      more = w->files[i]->due && w->files[i]->due <= now;
    if (more) {
      build_batch(w);
      return;
    }
    w->ready = 1;
    if (w->o.on_ready) w->o.on_ready(w->o.ready_arg, w->loaded, w->rejected);
  }
  arm_due(w);
}

/* ---- start and stop ----------------------------------------------------- */

/* See watcher.h. */
int watcher_start(const struct watcher_opts *o, watcher_t **out, err_t *e) {
  if (!o->loop || !o->root || !*o->root || !o->sink.submit)
    return err_set(e, ERR_INVALID, "watcher: a loop, a folder and a registry are needed");
  watcher_t *w = calloc(1, sizeof *w);
  if (!w) return err_set(e, ERR_NOMEM, "out of memory");
  w->o = *o;
  w->root = strdup(o->root);
  if (w->root) {
    size_t n = strlen(w->root);
    while (n > 1 && w->root[n - 1] == '/') w->root[--n] = 0;
  }
  /* join(root, "") is "root/": registered names as `serve` always made them. */
  w->prefix = o->prefix ? strdup(o->prefix) : w->root ? join(w->root, "") : NULL;
  w->log_prefix = strdup(o->log_prefix ? o->log_prefix : "");
  w->root_state = -1;
  if (!w->root || !w->prefix || !w->log_prefix) {
    watcher_free(w);
    return err_set(e, ERR_NOMEM, "out of memory");
  }
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
    struct wfile *f = add_file(w, k->path + lp);
    if (f && !f->id) f->id = strdup(k->id);
    else if (f) push_stale(w, k->id, k->path);
  }
  w->o.known = NULL;
  w->o.nknown = 0;
  /* The first scan: every file is due at once, and the first batch's end
  ** says the workspace is loaded. */
  rescan(w);
  want_scan(w, w->root_state == 1 ? WATCHER_RESCAN_MS : WATCHER_MISSING_MS);
  uv_timer_start(&w->due_timer, on_due, 0, 0);
  *out = w;
  return 0;
}

/* See watcher.h. */
void watcher_stop(watcher_t *w) {
  if (!w || w->stopping) return;
  w->stopping = 1;
  uv_close((uv_handle_t *)&w->due_timer, NULL);
  uv_close((uv_handle_t *)&w->scan_timer, NULL);
  while (w->dirs) close_dir(w, w->dirs);
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
  for (size_t i = 0; i < w->nbatch; i++) {
    struct wop *op = &w->batch[i];
    free(op->path), free(op->rel), free(op->id), free(op->fallback), free(op->source);
  }
  free(w->batch);
  while (w->stale) {
    struct stale *s = w->stale;
    w->stale = s->next;
    free(s->id), free(s->path), free(s);
  }
  for (size_t i = 0; i < w->nfiles; i++) {
    free(w->files[i]->rel), free(w->files[i]->path), free(w->files[i]->id);
    free(w->files[i]);
  }
  free(w->files);
  free(w->root), free(w->prefix), free(w->log_prefix);
  free(w);
}
